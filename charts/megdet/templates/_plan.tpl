{{/*
The plan for the given values, as YAML (use: include "megdet.plan" . | fromYaml).

Helm templates cannot call Python, so this mirrors megdet.plan.plan_run for the numbers the
chart needs (nodes, processes per node, global batch, LR, rescaled schedule). It is not a
second source of truth: tests/chart/test_chart_notes.py renders a matrix of values and asserts
that every number here equals plan_run's; the trainer re-plans from the real world size anyway.

Integer results use exact integer arithmetic: round_half_up(n / k) with k = batch / reference
is floor((2 * n * reference + batch) / (2 * batch)). Sprig has no sqrt, so the sqrt rule uses
Newton's iteration x <- (x + k / x) / 2 from x = max(1, k), which converges quadratically; 60
steps reach the float64 fixed point for any k this chart accepts (global batch <= 2^31).
*/}}
{{- define "megdet.plan" -}}
{{- $v := .Values -}}
{{- $gpus := int64 $v.gpus -}}
{{- $gpn := int64 $v.gpusPerNode -}}
{{- $nodes := div (add $gpus $gpn -1) $gpn -}}
{{- $procs := min $gpus $gpn -}}
{{- $batch := mul $gpus (int64 $v.imagesPerGpu) (int64 $v.accumulationSteps) -}}
{{- $ref := int64 $v.referenceBatch -}}
{{- $k := divf $batch $ref -}}
{{- $lr := float64 $v.baseLr -}}
{{- if eq $v.scaling "linear" -}}
{{- $lr = mulf $v.baseLr $k -}}
{{- else if eq $v.scaling "sqrt" -}}
{{- $x := maxf 1.0 $k -}}
{{- range until 60 -}}{{- $x = mulf 0.5 (addf $x (divf $k $x)) -}}{{- end -}}
{{- $lr = mulf $v.baseLr $x -}}
{{- end -}}
{{- $maxIter := div (add (mul 2 (int64 $v.maxIter) $ref) $batch) (mul 2 $batch) -}}
{{- $steps := list -}}
{{- range $v.steps -}}
{{- $steps = append $steps (div (add (mul 2 (int64 .) $ref) $batch) (mul 2 $batch)) -}}
{{- end -}}
{{- $warmup := div (add (mul 2 (int64 $v.warmupIters) $ref) $batch) (mul 2 $batch) -}}
nodes: {{ $nodes }}
workers: {{ sub $nodes 1 }}
procsPerNode: {{ $procs }}
worldSize: {{ $gpus }}
globalBatch: {{ $batch }}
scale: {{ $k }}
lr: {{ $lr }}
maxIter: {{ $maxIter }}
steps: {{ toJson $steps }}
warmupIters: {{ $warmup }}
{{- end -}}

{{/*
Cross-field rules that JSON Schema cannot express. values.schema.json has already checked
types, ranges and enums. Wording follows megdet.plan.SpecError, with the chart's value names.
*/}}
{{- define "megdet.validate" -}}
{{- include "megdet.validateJobName" . -}}
{{- $v := .Values -}}
{{- $gpus := int64 $v.gpus -}}
{{- $gpn := int64 $v.gpusPerNode -}}
{{- if and (gt $gpus $gpn) (ne (mod $gpus $gpn) 0) -}}
{{- fail (printf "gpus=%d is not a multiple of gpusPerNode=%d (multi-node runs use whole nodes)" $gpus $gpn) -}}
{{- end -}}
{{- $maxIter := int64 $v.maxIter -}}
{{- $prev := 0 -}}
{{- range $v.steps -}}
{{- if le (int64 .) (int64 $prev) -}}
{{- fail (printf "steps=%s must be strictly increasing" (toJson $v.steps)) -}}
{{- end -}}
{{- $prev = . -}}
{{- end -}}
{{- if and $v.steps (ge (int64 (last $v.steps)) $maxIter) -}}
{{- fail (printf "steps=%s must all be below maxIter=%d" (toJson $v.steps) $maxIter) -}}
{{- end -}}
{{- if ge (int64 $v.warmupIters) $maxIter -}}
{{- fail (printf "warmupIters=%d must be below maxIter=%d" (int64 $v.warmupIters) $maxIter) -}}
{{- end -}}
{{- $plan := include "megdet.plan" . | fromYaml -}}
{{- $batch := int64 $plan.globalBatch -}}
{{- if lt (int64 $plan.maxIter) 1 -}}
{{- fail (printf "maxIter=%d iterations at batch %d is less than one iteration at global batch %d" $maxIter (int64 $v.referenceBatch) $batch) -}}
{{- end -}}
{{- if eq $v.schedule "step" -}}
{{- $collapsed := false -}}
{{- $prev = 0 -}}
{{- range $plan.steps -}}
{{- if le (int64 .) (int64 $prev) -}}{{- $collapsed = true -}}{{- end -}}
{{- $prev = . -}}
{{- end -}}
{{- if and $plan.steps (ge (int64 (last $plan.steps)) (int64 $plan.maxIter)) -}}{{- $collapsed = true -}}{{- end -}}
{{- if $collapsed -}}
{{- fail (printf "steps=%s collapse to %s at global batch %d (maxIter %d); use a longer maxIter or a smaller batch" (toJson $v.steps) (toJson $plan.steps) $batch (int64 $plan.maxIter)) -}}
{{- end -}}
{{- end -}}
{{- if and $v.nccl.ib.enabled (not $v.nccl.ib.rdmaResourceName) -}}
{{- fail "nccl.ib.enabled=true needs nccl.ib.rdmaResourceName: the extended resource your RDMA device plugin advertises (e.g. rdma/rdma_shared_device_a, rdma/hca_shared_devices_a, nvidia.com/hostdev)" -}}
{{- end -}}
{{- if ne (empty $v.dataset.valJson) (empty $v.dataset.valImages) -}}
{{- fail (printf "dataset.valJson=%q and dataset.valImages=%q: set both (evaluate) or neither (train only)" $v.dataset.valJson $v.dataset.valImages) -}}
{{- end -}}
{{- include "megdet.validateOverrides" . -}}
{{- include "megdet.validateResources" . -}}
{{- include "megdet.validateScheduling" . -}}
{{- include "megdet.validatePodMetadata" . -}}
{{- include "megdet.validateNetworkPolicy" . -}}
{{- end -}}

{{/*
Pod label keys that podLabels must not set. The chart's own labels select a run's pods (the
NetworkPolicy; the operator chart's PodMonitor and alerts by app.kubernetes.io/instance and
component), Kueue reads kueue.x-k8s.io/queue-name, the job operators and JobSet label their pods
under training.kubeflow.org/, trainer.kubeflow.org/, jobset.sigs.k8s.io/ and batch.kubernetes.io/,
scheduler-plugins groups a gang by scheduling.x-k8s.io/pod-group and Volcano by its own. A
podLabels key there would put the pods in another run's metrics, alerts, policy, queue or gang.
Kubernetes reserves kubernetes.io and k8s.io with their subdomains; x-k8s.io, kubeflow.org and
volcano.sh are the add-ons'. The prefix is the part before "/"; it matches a domain or any
subdomain of one.
*/}}
{{- define "megdet.reservedLabelPattern" -}}^([^/]*\.)?(kubernetes\.io|k8s\.io|x-k8s\.io|kubeflow\.org|volcano\.sh)/{{- end -}}

{{/* Pod annotation keys that podAnnotations must not set: the one the chart writes itself, and
the job operators' and JobSet's own (the gang's PodGroup, their bookkeeping). */}}
{{- define "megdet.reservedAnnotations" -}}
keys:
  k8s.v1.cni.cncf.io/networks: "the chart sets it from network.multusNetworks; use that value"
  scheduling.k8s.io/group-name: "the training operator puts each pod into its gang's PodGroup with it"
prefixes: [training.kubeflow.org/, trainer.kubeflow.org/, jobset.sigs.k8s.io/]
{{- end -}}

{{- define "megdet.validatePodMetadata" -}}
{{- $pattern := include "megdet.reservedLabelPattern" . -}}
{{- range $key := keys (default (dict) .Values.podLabels) | sortAlpha -}}
{{- if regexMatch $pattern $key -}}
{{- fail (printf "podLabels: %q is reserved: keys under kubernetes.io/, k8s.io/, x-k8s.io/, kubeflow.org/, volcano.sh/ or a subdomain of them (app.kubernetes.io/, kueue.x-k8s.io/, training.kubeflow.org/, trainer.kubeflow.org/, jobset.sigs.k8s.io/, ...) are how the chart, the monitors and alerts, Kueue, the job operators and the gang schedulers select a run's pods; use a key of your own, e.g. team or example.com/team" $key) -}}
{{- end -}}
{{- end -}}
{{- $reserved := include "megdet.reservedAnnotations" . | fromYaml -}}
{{- range $key := keys (default (dict) .Values.podAnnotations) | sortAlpha -}}
{{- with get $reserved.keys $key -}}
{{- fail (printf "podAnnotations: %q is reserved: %s" $key .) -}}
{{- end -}}
{{- range $prefix := $reserved.prefixes -}}
{{- if hasPrefix $prefix $key -}}
{{- fail (printf "podAnnotations: %q is reserved: the job operators annotate their pods under %s; use a key of your own" $key (join ", " $reserved.prefixes)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* networkPolicy values that would do nothing. */}}
{{- define "megdet.validateNetworkPolicy" -}}
{{- $np := .Values.networkPolicy -}}
{{- if and $np.enabled .Values.network.hostNetwork -}}
{{- fail "networkPolicy.enabled=true with network.hostNetwork=true: a NetworkPolicy does not apply to host-network pods (their traffic is the node's), so it would isolate nothing; turn one of them off" -}}
{{- end -}}
{{- if and $np.extraEgress (not (and $np.enabled $np.restrictEgress)) -}}
{{- fail "networkPolicy.extraEgress: its rules take effect only with networkPolicy.enabled=true and networkPolicy.restrictEgress=true (otherwise egress is open); set both, or remove it" -}}
{{- end -}}
{{- end -}}

{{/*
extraOverrides must not set a key that a named value owns (megdet/overrides.py OWNED_OVERRIDES,
generated into files/owned-overrides.yaml): the trainer would run something other than the plan.
The message is megdet.overrides.owned_override_message's, word for word.
*/}}
{{- define "megdet.validateOverrides" -}}
{{- $owned := .Files.Get "files/owned-overrides.yaml" | fromYaml -}}
{{- if not $owned -}}
{{- fail "files/owned-overrides.yaml is missing from the chart (python -m megdet.overrides writes it)" -}}
{{- end -}}
{{- range $key := keys .Values.extraOverrides | sortAlpha -}}
{{- with get $owned $key -}}
{{- fail (printf "extraOverrides: %s is set by the value %s; use %s" $key . .) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Guaranteed QoS needs limits = requests for CPU and memory, and the static CPU manager pins
whole CPUs only (a fractional request runs on the shared pool).
*/}}
{{- define "megdet.validateResources" -}}
{{- $r := .Values.resources -}}
{{- if eq $r.qos "Guaranteed" -}}
{{- $cpu := toString $r.cpu -}}
{{- if not (regexMatch "^([1-9][0-9]*|[1-9][0-9]*000m)$" $cpu) -}}
{{- fail (printf "resources.cpu=%q is not a whole number of CPUs; with resources.qos=Guaranteed the kubelet's static CPU manager pins whole CPUs only: use e.g. \"32\", or set resources.qos=Burstable" $cpu) -}}
{{- end -}}
{{- if $r.memoryLimit -}}
{{- fail (printf "resources.memoryLimit=%q: with resources.qos=Guaranteed the memory limit equals resources.memory (%s); leave memoryLimit empty or set resources.qos=Burstable" (toString $r.memoryLimit) (toString $r.memory)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Scheduling values that the training operator would drop without a word (kubeflow/trainer v1.9.x
pkg/controller.v1/common/job.go ReconcileJobs): Volcano's PodGroup gets no timeout and
scheduler-plugins' PodGroup gets no queue. Kueue owns runPolicy.suspend.
*/}}
{{- define "megdet.validateScheduling" -}}
{{- $g := .Values.gang -}}
{{- if $g.enabled -}}
{{- $volcano := eq (lower $g.schedulerName) "volcano" -}}
{{- if and $volcano (not (kindIs "invalid" $g.scheduleTimeoutSeconds)) -}}
{{- fail (printf "gang.scheduleTimeoutSeconds=%d has no effect with gang.schedulerName=volcano: the training operator copies it only into scheduler-plugins' PodGroup; remove it (Volcano has no per-job gang timeout here)" (int64 $g.scheduleTimeoutSeconds)) -}}
{{- end -}}
{{- if and (not $volcano) $g.queue -}}
{{- fail (printf "gang.queue=%q has no effect with gang.schedulerName=%s: the training operator copies the queue only into Volcano's PodGroup; remove it, or use Kueue (kueue.queueName) for queueing" $g.queue $g.schedulerName) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.kueue.queueName .Values.runPolicy.suspend -}}
{{- fail (printf "runPolicy.suspend=true with kueue.queueName=%q: Kueue owns suspend (its webhook creates the job suspended and Kueue resumes it on admission), so the chart leaves the field out; to hold the run, hold its queue (stopPolicy: Hold)" .Values.kueue.queueName) -}}
{{- end -}}
{{- end -}}

{{/*
Rules against the job that already exists on `helm upgrade` (.existing: the PyTorchJob as the
API server returns it, or empty). schedulingPolicy.queue is immutable in kubeflow.org/v1
(v1.9 CRD rule "self == oldSelf"), and the operator keeps an existing Volcano PodGroup's queue
anyway, so a changed gang.queue would be refused or ignored: fail here, naming the value.
*/}}
{{- define "megdet.validateUpgrade" -}}
{{- $v := .root.Values -}}
{{- with .existing -}}
{{- $oldQueue := dig "spec" "runPolicy" "schedulingPolicy" "queue" "" . -}}
{{- $newQueue := ternary $v.gang.queue "" $v.gang.enabled -}}
{{- if ne $oldQueue $newQueue -}}
{{- fail (printf "gang.queue: the existing PyTorchJob %s/%s has schedulingPolicy.queue %q and this upgrade sets %q; the queue cannot change on a running job (immutable in kubeflow.org/v1). Keep gang.queue=%q, or delete the job (checkpoints on /output stay) and install again" .metadata.namespace .metadata.name $oldQueue $newQueue $oldQueue) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The `megdet plan` flags for these values, so NOTES can show the equivalent command. */}}
{{- define "megdet.planFlags" -}}
{{- $v := .Values -}}
--gpus {{ $v.gpus | int64 }} --gpus-per-node {{ $v.gpusPerNode | int64 }} --images-per-gpu {{ $v.imagesPerGpu | int64 }} --accumulation-steps {{ $v.accumulationSteps | int64 }} --base-lr {{ $v.baseLr }} --reference-batch {{ $v.referenceBatch | int64 }} --max-iter {{ $v.maxIter | int64 }} --warmup-iters {{ $v.warmupIters | int64 }} --steps{{ range $v.steps }} {{ . | int64 }}{{ end }} --scaling {{ $v.scaling }} --schedule {{ $v.schedule }}
{{- end -}}

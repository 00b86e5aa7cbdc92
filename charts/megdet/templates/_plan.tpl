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
types, ranges and enums. The messages are megdet/messages.py's (the megdet.msg.* templates
generated into _messages.tpl), shared with megdet.plan and the CRD's CEL rules.
*/}}
{{- define "megdet.validate" -}}
{{- include "megdet.validateJobName" . -}}
{{- $v := .Values -}}
{{- $gpus := int64 $v.gpus -}}
{{- $gpn := int64 $v.gpusPerNode -}}
{{- if and (gt $gpus $gpn) (ne (mod $gpus $gpn) 0) -}}
{{- fail (include "megdet.msg.gpusMultiple" (dict "gpus" $gpus "gpusPerNode" $gpn)) -}}
{{- end -}}
{{- $minGpus := int64 $v.elastic.minGpus -}}
{{- $maxGpus := int64 $v.elastic.maxGpus -}}
{{- if and (or (ne $minGpus 0) (ne $maxGpus 0)) (or (lt $minGpus 1) (gt $minGpus $gpus) (gt $gpus $maxGpus)) -}}
{{- fail (include "megdet.msg.elasticBounds" (dict "gpus" $gpus "elastic.minGpus" $minGpus "elastic.maxGpus" $maxGpus)) -}}
{{- end -}}
{{- $maxIter := int64 $v.maxIter -}}
{{- $prev := 0 -}}
{{- range $v.steps -}}
{{- if le (int64 .) (int64 $prev) -}}
{{- fail (include "megdet.msg.stepsIncreasing" (dict "steps" (toJson $v.steps))) -}}
{{- end -}}
{{- $prev = . -}}
{{- end -}}
{{- if and $v.steps (ge (int64 (last $v.steps)) $maxIter) -}}
{{- fail (include "megdet.msg.stepsBelowMaxIter" (dict "steps" (toJson $v.steps) "maxIter" $maxIter)) -}}
{{- end -}}
{{- if ge (int64 $v.warmupIters) $maxIter -}}
{{- fail (include "megdet.msg.warmupBelowMaxIter" (dict "warmupIters" (int64 $v.warmupIters) "maxIter" $maxIter)) -}}
{{- end -}}
{{- $plan := include "megdet.plan" . | fromYaml -}}
{{- $batch := int64 $plan.globalBatch -}}
{{- if lt (int64 $plan.maxIter) 1 -}}
{{- fail (include "megdet.msg.maxIterTooShort" (dict "maxIter" $maxIter "referenceBatch" (int64 $v.referenceBatch) "globalBatch" $batch)) -}}
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
{{- fail (include "megdet.msg.stepsCollapse" (dict "steps" (toJson $v.steps) "plannedSteps" (toJson $plan.steps) "globalBatch" $batch "plannedMaxIter" (int64 $plan.maxIter))) -}}
{{- end -}}
{{- end -}}
{{- if and $v.nccl.ib.enabled (not $v.nccl.ib.rdmaResourceName) -}}
{{- fail (include "megdet.msg.ibResource" (dict "nccl.ib.enabled" $v.nccl.ib.enabled)) -}}
{{- end -}}
{{- if ne (empty $v.dataset.valJson) (empty $v.dataset.valImages) -}}
{{- fail (include "megdet.msg.valDataset" (dict "dataset.valJson" $v.dataset.valJson "dataset.valImages" $v.dataset.valImages)) -}}
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
{{- fail (include "megdet.msg.reservedLabel" (dict "key" $key)) -}}
{{- end -}}
{{- end -}}
{{- $reserved := include "megdet.reservedAnnotations" . | fromYaml -}}
{{- range $key := keys (default (dict) .Values.podAnnotations) | sortAlpha -}}
{{- with get $reserved.keys $key -}}
{{- fail (include "megdet.msg.reservedAnnotationKey" (dict "key" $key "reason" .)) -}}
{{- end -}}
{{- range $prefix := $reserved.prefixes -}}
{{- if hasPrefix $prefix $key -}}
{{- fail (include "megdet.msg.reservedAnnotationPrefix" (dict "key" $key "prefixes" (join ", " $reserved.prefixes))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* networkPolicy values that would do nothing. */}}
{{- define "megdet.validateNetworkPolicy" -}}
{{- $np := .Values.networkPolicy -}}
{{- if and $np.enabled .Values.network.hostNetwork -}}
{{- fail (include "megdet.msg.networkPolicyHostNetwork" (dict)) -}}
{{- end -}}
{{- if and $np.extraEgress (not (and $np.enabled $np.restrictEgress)) -}}
{{- fail (include "megdet.msg.networkPolicyExtraEgress" (dict)) -}}
{{- end -}}
{{- end -}}

{{/*
extraOverrides must not set a key that a named value owns (megdet/overrides.py OWNED_OVERRIDES,
generated into files/owned-overrides.yaml): the trainer would run something other than the plan.
The message is megdet.overrides.owned_override_message's (megdet/messages.py ownedOverride).
*/}}
{{- define "megdet.validateOverrides" -}}
{{- $owned := .Files.Get "files/owned-overrides.yaml" | fromYaml -}}
{{- if not $owned -}}
{{- fail "files/owned-overrides.yaml is missing from the chart (python -m megdet.overrides writes it)" -}}
{{- end -}}
{{- range $key := keys .Values.extraOverrides | sortAlpha -}}
{{- with get $owned $key -}}
{{- fail (include "megdet.msg.ownedOverride" (dict "field" "extraOverrides" "key" $key "value" .)) -}}
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
{{- fail (include "megdet.msg.guaranteedCpu" (dict "resources.cpu" $cpu)) -}}
{{- end -}}
{{- if $r.memoryLimit -}}
{{- fail (include "megdet.msg.guaranteedMemoryLimit" (dict "resources.memoryLimit" (toString $r.memoryLimit) "resources.memory" (toString $r.memory))) -}}
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
{{- fail (include "megdet.msg.volcanoTimeout" (dict "gang.scheduleTimeoutSeconds" (int64 $g.scheduleTimeoutSeconds))) -}}
{{- end -}}
{{- if and (not $volcano) $g.queue -}}
{{- fail (include "megdet.msg.gangQueue" (dict "gang.queue" $g.queue "gang.schedulerName" $g.schedulerName)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.kueue.queueName .Values.runPolicy.suspend -}}
{{- fail (include "megdet.msg.kueueSuspend" (dict "kueue.queueName" .Values.kueue.queueName)) -}}
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
{{- fail (include "megdet.msg.gangQueueUpgrade" (dict "namespace" .metadata.namespace "name" .metadata.name "oldQueue" $oldQueue "newQueue" $newQueue)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The `megdet plan` flags for these values, so NOTES can show the equivalent command. */}}
{{- define "megdet.planFlags" -}}
{{- $v := .Values -}}
--gpus {{ $v.gpus | int64 }} --gpus-per-node {{ $v.gpusPerNode | int64 }} --images-per-gpu {{ $v.imagesPerGpu | int64 }} --accumulation-steps {{ $v.accumulationSteps | int64 }} --base-lr {{ $v.baseLr }} --reference-batch {{ $v.referenceBatch | int64 }} --max-iter {{ $v.maxIter | int64 }} --warmup-iters {{ $v.warmupIters | int64 }} --steps{{ range $v.steps }} {{ . | int64 }}{{ end }} --scaling {{ $v.scaling }} --schedule {{ $v.schedule }}
{{- end -}}

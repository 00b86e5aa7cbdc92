{{/*
Helpers for target=trainjob: a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1)
and the namespaced TrainingRuntime it references, written against Trainer v2.3.0
(kubeflow/trainer tag v2.3.0, commit 658725bdae5c7e3a0854d93ac6ff492e109a22ab) and the JobSet
v0.12.0 it builds on. docs/trainer-v2.md explains each choice; the sources are cited there.
*/}}

{{/* The runtime a run's TrainJob references: one per run, named after the run. */}}
{{- define "megdet.trainingRuntimeName" -}}
{{- include "megdet.fullname" . -}}
{{- end -}}

{{/*
Names Trainer v2 accepts. The TrainJob CRD requires an RFC 1035 label (a letter first; both
targets check that, megdet.validateJobName), and JobSet's webhook (jobset v0.12.0
pkg/webhooks/jobset_webhook.go) refuses a JobSet whose pod names <job>-node-0-<index>-<5 random>
would exceed 63 characters. A refused JobSet leaves the TrainJob stuck, so fail here, naming
the limit.
*/}}
{{- define "megdet.validateTrainJob" -}}
{{- $name := include "megdet.fullname" .root -}}
{{- $suffix := printf "-node-0-%d-abcde" (sub (int64 .plan.nodes) 1) -}}
{{- $max := sub 63 (len $suffix) -}}
{{- if gt (len $name) (int $max) -}}
{{- fail (printf "target=trainjob: the job name %q is %d characters; with %d nodes it can have at most %d, so that JobSet's pod names %s%s fit in 63 (use a shorter release name or fullnameOverride)" $name (len $name) (int64 .plan.nodes) $max $name $suffix) -}}
{{- end -}}
{{- end -}}

{{/*
The trainer pod for Trainer v2: the PyTorchJob path's pod (megdet.podTemplate, the same helper)
with the three things Trainer v2 and JobSet dictate, passed to it as arguments rather than by
forking it (and not by re-serializing its YAML, which would lose the quoting of its strings):
- the container is named `node` (Trainer's TrainingRuntime webhook requires it for the
  `trainer` ancestor; the torch plugin injects PET_* env only into `node`);
- app.kubernetes.io/component is `node`: one replicated job serves every node, so there is no
  master/worker split to label;
- restartPolicy Never: a failed pod fails its Job (backoffLimit 0) and JobSet recreates the
  whole gang (failurePolicy), instead of one container restarting in place while the others
  wait on a dead rendezvous. The v1 operator sets the pod's restartPolicy itself.
*/}}
{{- define "megdet.trainJobPodTemplate" -}}
{{- include "megdet.podTemplate" (dict "root" .root "plan" .plan "role" "node" "container" "node" "restartPolicy" "Never") -}}
{{- end -}}

{{/*
The runtime's podGroupPolicy for gang.enabled: Volcano's plugin when gang.schedulerName is
volcano, otherwise scheduler-plugins' coscheduling. Trainer sets minMember to the node count
itself; the queue travels as a JobSet annotation (megdet.jobSetAnnotations).
*/}}
{{- define "megdet.podGroupPolicy" -}}
{{- $g := .Values.gang -}}
{{- if eq (lower $g.schedulerName) "volcano" -}}
volcano: {}
{{- else if kindIs "invalid" $g.scheduleTimeoutSeconds -}}
coscheduling: {}
{{- else -}}
coscheduling:
  scheduleTimeoutSeconds: {{ $g.scheduleTimeoutSeconds | int64 }}
{{- end -}}
{{- end -}}

{{/*
JobSet failurePolicy from restartPolicy and runPolicy.backoffLimit. A failed pod fails its Job,
and JobSet restarts every Job of the set (the whole gang) up to maxRestarts times:
- OnFailure: any failure restarts the gang, up to backoffLimit times;
- Never: the first failure fails the run (maxRestarts 0);
- ExitCode: exit codes 1-127 (the trainer's own errors) fail the run at once through the Job's
  podFailurePolicy (megdet.podFailurePolicy) and this rule; signals (128+) restart the gang,
  and unlike kubeflow.org/v1 they count against backoffLimit (kubeflow/trainer#2045).
*/}}
{{- define "megdet.jobSetFailurePolicy" -}}
{{- $v := .Values -}}
maxRestarts: {{ ternary 0 ($v.runPolicy.backoffLimit | int64) (eq $v.restartPolicy "Never") }}
{{- if eq $v.restartPolicy "ExitCode" }}
rules:
  - name: TrainerExitCode
    action: FailJobSet
    onJobFailureReasons: ["PodFailurePolicy"]
{{- end }}
{{- end -}}

{{/*
The Job's podFailurePolicy for restartPolicy=ExitCode: exit codes 1-127 are permanent. An empty
onPodConditions because Kubernetes before 1.29 requires the field.
*/}}
{{- define "megdet.podFailurePolicy" -}}
rules:
  - action: FailJob
    onExitCodes:
      containerName: node
      operator: In
      values: {{ untilStep 1 128 1 | toJson }}
    onPodConditions: []
{{- end -}}

{{/*
Rules against what already exists on `helm upgrade` (.trainjob: the TrainJob, .pytorchjob: a
PyTorchJob of the same name, as the API server returns them, or empty; lookup is empty under
`helm template` and dry runs). Trainer v2.3.0's CRD makes spec.trainer and
spec.activeDeadlineSeconds immutable ("self == oldSelf"); say which value changed instead of
the API server's "field is immutable". A PyTorchJob of the same run means the target changed on
a live run: two jobs would train into one output folder.
*/}}
{{- define "megdet.validateTrainJobUpgrade" -}}
{{- $v := .root.Values -}}
{{- with .pytorchjob -}}
{{- fail (printf "target=trainjob: the run already has a PyTorchJob %s/%s; switching target on a live run would start a second training into the same output folder. Keep target=pytorchjob, or delete the PyTorchJob (checkpoints on /output stay) and upgrade again" .metadata.namespace .metadata.name) -}}
{{- end -}}
{{- with .trainjob -}}
{{- $oldNodes := int64 (dig "spec" "trainer" "numNodes" 0 .) -}}
{{- $oldProcs := int64 (dig "spec" "trainer" "numProcPerNode" 0 .) -}}
{{- $nodes := int64 $.plan.nodes -}}
{{- $procs := int64 $.plan.procsPerNode -}}
{{- if or (ne $oldNodes $nodes) (ne $oldProcs $procs) -}}
{{- fail (printf "gpus=%d, gpusPerNode=%d: the existing TrainJob %s/%s runs %d nodes x %d processes and this upgrade asks for %d x %d; spec.trainer cannot change on a TrainJob (immutable in Trainer v2). Keep gpus and gpusPerNode, or delete the TrainJob (checkpoints on /output stay) and install again" (int64 $v.gpus) (int64 $v.gpusPerNode) .metadata.namespace .metadata.name $oldNodes $oldProcs $nodes $procs) -}}
{{- end -}}
{{- $oldDeadline := int64 (dig "spec" "activeDeadlineSeconds" 0 .) -}}
{{- $deadline := int64 (default 0 $v.runPolicy.activeDeadlineSeconds) -}}
{{- if ne $oldDeadline $deadline -}}
{{- fail (printf "runPolicy.activeDeadlineSeconds: the existing TrainJob %s/%s has %d (0: none) and this upgrade sets %d; it cannot change on a TrainJob (immutable in Trainer v2). Keep the old value, or delete the TrainJob and install again" .metadata.namespace .metadata.name $oldDeadline $deadline) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* target=pytorchjob on upgrade: a TrainJob of the same run (the argument, or empty) means the
target changed on a live run. */}}
{{- define "megdet.validateSwitchFromTrainJob" -}}
{{- with . -}}
{{- fail (printf "target=pytorchjob: the run already has a TrainJob %s/%s; switching target on a live run would start a second training into the same output folder. Keep target=trainjob, or delete the TrainJob (checkpoints on /output stay) and upgrade again" .metadata.namespace .metadata.name) -}}
{{- end -}}
{{- end -}}

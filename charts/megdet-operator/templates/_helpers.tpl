{{/*
Names and labels of the operator chart, defined once (the monitoring templates use them too).
*/}}

{{/* Chart name, truncated to 63 characters (the DNS label limit). */}}
{{- define "megdet-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Release fullname, truncated to 63 characters: "<release>" when it already contains the chart
name, else "<release>-<chart>" (Helm's convention).
*/}}
{{- define "megdet-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* chart label value: name-version. */}}
{{- define "megdet-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: stable across upgrades. */}}
{{- define "megdet-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "megdet-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{/* Common labels on every object. */}}
{{- define "megdet-operator.labels" -}}
helm.sh/chart: {{ include "megdet-operator.chart" . }}
{{ include "megdet-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: megdet
{{- end -}}

{{/* The controller's ServiceAccount. */}}
{{- define "megdet-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "megdet-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The kopf peering object the replicas share (cluster-scoped, so unique per release). */}}
{{- define "megdet-operator.peeringName" -}}
{{- default (include "megdet-operator.fullname" .) .Values.controller.peering.name -}}
{{- end -}}

{{/* The Service the runs' pods report progress to (every controller replica). */}}
{{- define "megdet-operator.progressServiceName" -}}
{{- printf "%s-progress" (include "megdet-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Secret with the progress endpoint's CA and certificate that the replicas share. */}}
{{- define "megdet-operator.progressCASecretName" -}}
{{- printf "%s-progress-ca" (include "megdet-operator.fullname" . | trunc 48 | trimSuffix "-") -}}
{{- end -}}

{{/* repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "megdet-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
The rules for the namespaced resources the controller serves: granted cluster-wide by the
ClusterRole, or per namespace by a Role when controller.watchNamespaces lists namespaces.
Exactly the verbs and resources the controller uses (tests/controller/test_operator_rbac.py
checks them against every API call it makes against kmock). No secrets, no wildcards.
*/}}
{{- define "megdet-operator.runRules" -}}
# MegDetRuns: kopf lists and watches them and patches its annotations (and removes the
# finalizer earlier controllers added); the job mirror reads a run by name.
- apiGroups: ["megdet.io"]
  resources: ["megdetruns"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["megdet.io"]
  resources: ["megdetruns/status"]
  verbs: ["patch"]
# Owner references with blockOwnerDeletion need update on the owner's finalizers
# (the OwnerReferencesPermissionEnforcement admission plugin).
- apiGroups: ["megdet.io"]
  resources: ["megdetruns/finalizers"]
  verbs: ["update"]
# The jobs it creates and owns: looked up by name, created, suspended/resumed (patch),
# watched for status (kopf lists and watches), and deleted (that incarnation, in the
# foreground) only to resize an elastic run, which then gets its job again at the new size.
# A deleted run's job goes with it through the garbage collector (owner references).
- apiGroups: ["kubeflow.org"]
  resources: ["pytorchjobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["trainer.kubeflow.org"]
  resources: ["trainjobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# A TrainJob's per-run runtime: created next to it, brought to the new size (patch) before a
# resize creates the TrainJob again, collected with the run.
- apiGroups: ["trainer.kubeflow.org"]
  resources: ["trainingruntimes"]
  verbs: ["get", "create", "patch"]
# A run's NetworkPolicy (spec.networkPolicy.enabled): created next to its job, patched when
# the spec changes it, deleted by name when the spec drops it (collected with the run).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch", "delete"]
# kopf posts an Event on every phase transition and for refused specs.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# The runs' trainer pods (label app.kubernetes.io/part-of=megdet), watched, never written: why
# a pod cannot start (the kubelet's reason) goes to its run's PodsStarted condition. The
# progress endpoint finds the pod a report's token is bound to in this watch
# (controller/progress_binding.py): no pod is read.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# Kueue's Workloads of the runs' jobs, watched, never written: a run waiting for admission says
# Kueue's reason (condition Admitted, stage Queued). Without Kueue nothing is watched.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "watch"]
{{- if .Values.controller.progressEnabled }}
# Progress reporting (controller/progress.py): the endpoint's CA published in each namespace
# with runs as the ConfigMap megdet-progress-ca. Watching and updating are limited to that name;
# create cannot be (Kubernetes checks no name on create), and creates no access to others.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["configmaps"]
  resourceNames: ["megdet-progress-ca"]
  verbs: ["patch", "list", "watch"]
# ... watched (a list and watch of that one name: fieldSelector metadata.name), so that one
# that is missing or that a namespace editor changed is written (back).
{{- end }}
{{- end -}}

{{/*
The rule for kopf peering: the ClusterKopfPeering when serving all namespaces (in the
ClusterRole), the KopfPeering of each served namespace otherwise (in its Role).
*/}}
{{- define "megdet-operator.peeringRules" -}}
{{- if .Values.controller.peering.enabled }}
# kopf peering: replicas register in the peering object's status and watch it.
- apiGroups: ["kopf.dev"]
  resources: [{{ ternary "kopfpeerings" "clusterkopfpeerings" (not (empty .Values.controller.watchNamespaces)) | quote }}]
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- end -}}

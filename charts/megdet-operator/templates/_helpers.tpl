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

{{/* repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "megdet-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
Names and labels, defined once. Templates added later (controller, monitoring) use the same
helpers, so every object of a release carries the same app.kubernetes.io/* labels.
*/}}

{{/* Chart name, truncated to 63 characters (the DNS label limit). */}}
{{- define "megdet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release fullname, truncated to 63 characters; names the PyTorchJob. */}}
{{- define "megdet.fullname" -}}
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

{{/* A component's object name: <fullname>-<component>, still within 63 characters. */}}
{{- define "megdet.componentName" -}}
{{- $full := include "megdet.fullname" .root -}}
{{- printf "%s-%s" ($full | trunc (int (sub 62 (len .component)))) .component | trimSuffix "-" -}}
{{- end -}}

{{/* chart label value: name-version. */}}
{{- define "megdet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: stable across upgrades. */}}
{{- define "megdet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "megdet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Common labels for every object. */}}
{{- define "megdet.labels" -}}
helm.sh/chart: {{ include "megdet.chart" . }}
{{ include "megdet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: megdet
{{- end -}}

{{/* The run's output folder name under /output. */}}
{{- define "megdet.runName" -}}
{{- default (include "megdet.fullname" .) .Values.runName -}}
{{- end -}}

{{/* The training image reference. */}}
{{- define "megdet.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
A value as Python/yacs will read it back with literal_eval: floats keep a decimal point
(yacs refuses an int where the config holds a float), booleans are True/False.
*/}}
{{- define "megdet.pyFloat" -}}
{{- $s := toString (float64 .) -}}
{{- if or (contains "." $s) (contains "e" $s) -}}{{ $s }}{{- else -}}{{ $s }}.0{{- end -}}
{{- end -}}

{{- define "megdet.pyValue" -}}
{{- if kindIs "bool" . -}}{{ ternary "True" "False" . }}
{{- else if kindIs "float64" . -}}
{{- if eq (float64 (int64 .)) . -}}{{ int64 . }}{{- else -}}{{ include "megdet.pyFloat" . }}{{- end -}}
{{- else -}}{{ toString . }}
{{- end -}}
{{- end -}}

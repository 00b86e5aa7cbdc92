{{/*
Names and labels, defined once. Templates added later (controller, monitoring) use the same
helpers, so every object of a release carries the same app.kubernetes.io/* labels.
*/}}

{{/* Chart name, truncated to 63 characters (the DNS label limit). */}}
{{- define "megdet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The longest job name: the training operator names each replica's Pod and Service
<job>-<replica type>-<index> (kubeflow/trainer v1.9 pkg/controller.v1/common/util.go
GenGeneralName), and a Service name is a DNS label of at most 63 characters. The longest suffix
is "-worker-99998" (13 characters: gpus <= 100000 in the schema), so 63 - 13 = 50. Python's copy
with the same derivation is megdet/naming.py MAX_JOB_NAME_LENGTH; a test keeps them equal.
*/}}
{{- define "megdet.maxJobNameLength" -}}50{{- end -}}

{{/*
Release fullname; names the PyTorchJob. A name the user chose (fullnameOverride, or a release
name that is used as is) that is too long fails rather than being cut: a cut name could collide
with another run's and would not be the name the user looks for. Only the derived
"<release>-<chart>" form is truncated, Helm's convention.
*/}}
{{- define "megdet.fullname" -}}
{{- $max := int (include "megdet.maxJobNameLength" .) -}}
{{- $why := printf "at most %d characters, so that the training operator's Services <job>-worker-<index> fit in 63" $max -}}
{{- if .Values.fullnameOverride -}}
{{- if gt (len .Values.fullnameOverride) $max -}}
{{- fail (printf "fullnameOverride=%q is %d characters; the job name can have %s" .Values.fullnameOverride (len .Values.fullnameOverride) $why) -}}
{{- end -}}
{{- .Values.fullnameOverride | trimSuffix "-" -}}
{{- else -}}
{{- if gt (len .Release.Name) $max -}}
{{- fail (printf "release name %q is %d characters; the job name can have %s (use a shorter release name or fullnameOverride)" .Release.Name (len .Release.Name) $why) -}}
{{- end -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc $max | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The job name must be an RFC 1035 label (a letter first, then lower-case letters, digits, '-')
for both targets: the PyTorchJob webhook refuses other names (kubeflow/trainer v1.9.x
pkg/webhooks/pytorch/pytorchjob_webhook.go, NameIsDNS1035Label) and so does the TrainJob CRD.
Helm itself accepts release names such as "1run" or "a.b".
*/}}
{{- define "megdet.validateJobName" -}}
{{- $name := include "megdet.fullname" . -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "the job name %q must start with a letter and be lower-case letters, digits and '-' (an RFC 1035 label: the PyTorchJob webhook and the TrainJob CRD refuse other names); use another release name or fullnameOverride" $name) -}}
{{- end -}}
{{- end -}}

{{/* chart label value: name-version. */}}
{{- define "megdet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: stable across upgrades. */}}
{{- define "megdet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "megdet.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{/* The labels that select exactly one run's pods (the NetworkPolicy's podSelector). */}}
{{- define "megdet.runSelector" -}}
{{ include "megdet.selectorLabels" . }}
app.kubernetes.io/part-of: "megdet"
{{- end -}}

{{/* Common labels for every object. */}}
{{- define "megdet.labels" -}}
helm.sh/chart: {{ include "megdet.chart" . | quote }}
{{ include "megdet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/part-of: "megdet"
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

{{/*
A value of any shape as block YAML: maps (keys sorted, as toYaml sorts them) and lists, every
string scalar double-quoted with `quote` (Go's %q: control and non-printing characters escaped),
other scalars as JSON (numbers, true/false, null), empty maps and lists as {} and []. toYaml
leaves some strings plain that a YAML 1.1 reader such as PyYAML (the controller's) retypes or
refuses ("=" is YAML 1.1's value type, "<<" a merge key; an exponent without a point is a string
there), and a plain string is one YAML reading away from "yes" -> true or "1:30" -> 90. A key
stays plain when it is a name (a letter, then letters, digits, '-', '_', '.', '/') that no reader
takes for a boolean or null. String scalars are written inline, without an include each: a
pod has a few hundred of them. Use with nindent.
*/}}
{{- define "megdet.yaml" -}}
{{- if and (kindIs "map" .) . -}}
{{- $m := . -}}
{{- range $i, $k := keys $m | sortAlpha -}}
{{- if $i }}{{ "\n" }}{{ end -}}
{{- $x := get $m $k -}}
{{- if and $k (eq (trimAll "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./" $k) "") (contains (substr 0 1 $k) "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") (not (contains (printf " %s " $k) " y Y yes Yes YES n N no No NO true True TRUE false False FALSE on On ON off Off OFF null Null NULL ")) }}{{ $k }}{{ else }}{{ quote $k }}{{ end }}:
{{- if kindIs "string" $x }} {{ quote $x }}
{{- else if and (or (kindIs "map" $x) (kindIs "slice" $x)) $x -}}
{{- include "megdet.yaml" $x | nindent 2 -}}
{{- else }} {{ include "megdet.yaml" $x }}{{ end -}}
{{- end -}}
{{- else if and (kindIs "slice" .) . -}}
{{- range $i, $x := . -}}
{{- if $i }}{{ "\n" }}{{ end -}}
- {{ if kindIs "string" $x }}{{ quote $x }}{{ else }}{{ include "megdet.yaml" $x | indent 2 | trimPrefix "  " }}{{ end }}
{{- end -}}
{{- else if kindIs "string" . -}}
{{- quote . -}}
{{- else if kindIs "float64" . -}}
{{- /* JSON writes 1e-07 as 1e-7; YAML 1.1 reads a float only with a point: 1.0e-7. */ -}}
{{- $json := toJson . -}}
{{- if and (contains "e" $json) (not (contains "." $json)) -}}{{ replace "e" ".0e" $json }}{{- else -}}{{ $json }}{{- end -}}
{{- else -}}
{{- toJson . -}}
{{- end -}}
{{- end -}}

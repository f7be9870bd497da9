{{/*
The effective values: the top-level values, overridden by a `gpu-operator:` block
when a values file nests everything under it (the umbrella-chart form marketplace
samples use). Templates read `include "gpuop.values" . | fromYaml`.
*/}}
{{- define "gpuop.values" -}}
{{- $values := deepCopy .Values -}}
{{- $nested := index .Values "gpu-operator" | default dict -}}
{{- if $nested -}}
{{- $values = mustMergeOverwrite $values (deepCopy $nested) -}}
{{- end -}}
{{- $_ := unset $values "gpu-operator" -}}
{{- /* monitoring.labels join every ServiceMonitor's additionalLabels (its own win). */ -}}
{{- $labels := (($values.monitoring | default dict).labels | default dict) -}}
{{- if $labels -}}
{{- $op := $values.operator | default dict -}}
{{- $metrics := $op.metrics | default dict -}}
{{- $_ := set $op "metrics" $metrics -}}
{{- $_ := set $values "operator" $op -}}
{{- $exporter := $values.nodeStatusExporter | default dict -}}
{{- $_ := set $values "nodeStatusExporter" $exporter -}}
{{- $dcgm := $values.dcgmExporter | default dict -}}
{{- $_ := set $values "dcgmExporter" $dcgm -}}
{{- range $owner := list $metrics $exporter $dcgm -}}
{{- $monitor := $owner.serviceMonitor | default dict -}}
{{- $own := $monitor.additionalLabels | default dict -}}
{{- $_ := set $monitor "additionalLabels" (merge (deepCopy $own) $labels) -}}
{{- $_ := set $owner "serviceMonitor" $monitor -}}
{{- end -}}
{{- end -}}
{{- toYaml $values -}}
{{- end -}}

{{/*
The app.kubernetes.io/name label of the chart's own objects: nameOverride, else the
chart's name, as upstream's chart. Object names stay fixed (upstream's do too: its
templates never use a full name, so fullnameOverride changes nothing there either), and
so do the operator's selector labels and NFD's labels.
*/}}
{{- define "gpuop.name" -}}
{{- $nested := index .Values "gpu-operator" | default dict -}}
{{- $nested.nameOverride | default .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuop.chart" -}}
{{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Labels every object of the release carries. */}}
{{- define "gpuop.labels" -}}
helm.sh/chart: {{ include "gpuop.chart" . }}
app.kubernetes.io/name: {{ include "gpuop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/*
Selector labels of the operator pods: upstream's, exactly (a Deployment's selector is
immutable, so `helm upgrade` over a release of NVIDIA's chart needs the same one).
*/}}
{{- define "gpuop.selectorLabels" -}}
app: gpu-operator
app.kubernetes.io/component: gpu-operator
{{- end -}}

{{/* Name of the operator's ServiceAccount, Roles and bindings. */}}
{{- define "gpuop.serviceAccount" -}}
gpu-operator
{{- end -}}

{{/*
The operator image: repository/image:version, version defaulting to appVersion.
NVIDIA's operator image (what upstream's values.yaml names) is refused: it is not gpuop,
and with gpuop's appVersion as its tag it does not even exist.
*/}}
{{- define "gpuop.operatorImage" -}}
{{- $op := .operator -}}
{{- $version := $op.version | default .appVersion -}}
{{- $name := $op.image -}}
{{- if $op.repository -}}
{{- $name = printf "%s/%s" (trimSuffix "/" $op.repository) $op.image -}}
{{- end -}}
{{- if eq $name "nvcr.io/nvidia/gpu-operator" -}}
{{- fail (printf "operator.repository/operator.image name NVIDIA's operator image (nvcr.io/nvidia/gpu-operator), which gpuop cannot run: set operator.repository=ghcr.io/gpuop and operator.image=gpuop (or your mirror of gpuop's image) and operator.version to its tag (empty: the chart's appVersion %s)" .appVersion) -}}
{{- end -}}
{{ $name }}:{{ $version }}
{{- end -}}

{{/*
Image and container fields of one ClusterPolicy section, each written only when set,
so an unset part falls back to the operator's default. Argument: the section's values.
*/}}
{{- define "gpuop.imageFields" -}}
{{- with .repository }}
repository: {{ . | quote }}
{{- end }}
{{- with .image }}
image: {{ . | quote }}
{{- end }}
{{- with .version }}
version: {{ . | toString | quote }}
{{- end }}
{{- with .imagePullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- with .imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* imageFields plus resources, args and env (the knobs every operand has). */}}
{{- define "gpuop.componentFields" -}}
{{- include "gpuop.imageFields" . }}
{{- with .resources }}
resources:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .args }}
args:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .env }}
env:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- if .hostNetwork }}
hostNetwork: true
{{- end }}
{{- end -}}

{{/* A section with an on/off switch: enabled plus componentFields. */}}
{{- define "gpuop.component" -}}
enabled: {{ .enabled }}
{{- include "gpuop.componentFields" . }}
{{- end -}}

{{/* A dcgmExporter section (ClusterPolicy and GPUCluster take the same fields). */}}
{{- define "gpuop.dcgmExporter" -}}
{{- include "gpuop.component" . }}
{{- with (.config | default dict).name }}
config:
  name: {{ . | quote }}
{{- end }}
{{- with .service }}
{{- if or .type .internalTrafficPolicy }}
service:
  {{- with .type }}
  type: {{ . }}
  {{- end }}
  {{- with .internalTrafficPolicy }}
  internalTrafficPolicy: {{ . }}
  {{- end }}
{{- end }}
{{- end }}
{{- with .serviceMonitor }}
{{- if .enabled }}
serviceMonitor:
  enabled: true
  {{- with .interval }}
  interval: {{ . | quote }}
  {{- end }}
  {{- with .scrapeTimeout }}
  scrapeTimeout: {{ . | quote }}
  {{- end }}
  honorLabels: {{ .honorLabels | default false }}
  {{- with .additionalLabels }}
  additionalLabels:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .relabelings }}
  relabelings:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}
{{- with .annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .hostPID }}
hostPID: true
{{- end }}
{{- if .enablePodLabels }}
enablePodLabels: true
{{- end }}
{{- if .enablePodUID }}
enablePodUID: true
{{- end }}
{{- with .podLabelAllowlistRegex }}
podLabelAllowlistRegex:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .hpcJobMapping }}
hpcJobMapping:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* NFD's labels and selector labels. */}}
{{- define "gpuop.nfdSelectorLabels" -}}
app.kubernetes.io/name: node-feature-discovery
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpuop.nfdImage" -}}
{{- $image := index . "image" -}}
{{ $image.repository }}:{{ $image.tag }}
{{- end -}}

{{/* The chart's rules for an operator or exporter not scraped (files/, one source with
components/data), their jobs set from monitoring.operatorDown. */}}
{{- define "gpuop.downRules" -}}
{{- $down := .down -}}
{{- .root.Files.Get "files/gpu-operator-down.rules.yaml"
    | replace "job=\"gpu-operator\"" (printf "job=%q" ($down.job | default "gpu-operator"))
    | replace "job=\"nvidia-node-status-exporter\"" (printf "job=%q" ($down.nodeStatusExporterJob | default "nvidia-node-status-exporter")) -}}
{{- end -}}

{{/* Bundled NFD (v0.19.0): the object names, labels and service accounts upstream's
chart gets from its node-feature-discovery subchart, so `helm upgrade` from upstream's
release finds the same objects. Each takes (dict "root" $ "nfd" $nfd). */}}
{{- define "gpuop.nfd.fullname" -}}
{{- if contains "node-feature-discovery" .Release.Name -}}
{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}
{{ printf "%s-node-feature-discovery" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end -}}
{{- end -}}

{{- define "gpuop.nfd.labels" -}}
helm.sh/chart: {{ include "gpuop.chart" .root }}
app.kubernetes.io/name: node-feature-discovery
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .nfd.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{/* A role's service account: its serviceAccount.name, else the fullname (master) or
fullname-<role>, as NFD's chart names them. Takes (dict "root" $ "nfd" $nfd "role" r). */}}
{{- define "gpuop.nfd.serviceAccount" -}}
{{- $sa := (index .nfd .role).serviceAccount | default dict -}}
{{- $base := include "gpuop.nfd.fullname" .root -}}
{{- $default := ternary $base (printf "%s-%s" $base .role) (eq .role "master") -}}
{{- $sa.name | default $default -}}
{{- end -}}

{{- define "gpuop.nfd.imagePullSecrets" -}}
{{- with .imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ if kindIs "map" . }}{{ .name }}{{ else }}{{ . }}{{ end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "gpuop.nfd.containerSecurityContext" -}}
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
readOnlyRootFilesystem: true
runAsNonRoot: true
{{- end -}}

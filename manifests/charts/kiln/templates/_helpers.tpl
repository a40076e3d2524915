{{/* The name of every namespaced and cluster-wide object: `<release>-operator` (`kiln-operator`
for the release `kiln`, as in the kustomize base). */}}
{{- define "kiln.fullname" -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object: the kustomize base's `part-of`, and Helm's own bookkeeping. */}}
{{- define "kiln.labels" -}}
app.kubernetes.io/part-of: kiln
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The operator pods' selector; pod templates carry exactly these labels. */}}
{{- define "kiln.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kiln.fullname" . }}
{{- end -}}

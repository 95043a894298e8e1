{{/*
Labels of every object: the part-of label config/default puts on everything, plus Helm's.
*/}}
{{- define "numalign.labels" -}}
app.kubernetes.io/part-of: numalign
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The one image of the operator and the agent. */}}
{{- define "numalign.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end }}

{{/*
The agent runs as root (every capability dropped, no privilege escalation, the root file
system read-only) only where it must connect to a root-owned socket: the kubelet's
PodResources socket (kubeletResources) or the runtime's NRI socket (nri).
*/}}
{{- define "numalign.agentAsRoot" -}}
{{- if or .Values.kubeletResources.enabled .Values.nri.enabled }}true{{ end -}}
{{- end }}

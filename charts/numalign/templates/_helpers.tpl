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

{{/*
The second scheduler's KubeSchedulerConfiguration (config/scheduler/scheduler-config.yaml):
the profile numalign-scheduler, numalign's extender over mutual TLS (its Service by cluster
DNS unless scheduler.extenderURL says otherwise; serverName: the name the extender's
certificate carries), leader election on the Lease numalign-scheduler.
*/}}
{{- define "numalign.schedulerConfig" -}}
{{- $svc := printf "numalign-extender.%s.svc" .Release.Namespace -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceLock: leases
  resourceName: numalign-scheduler
  resourceNamespace: {{ .Release.Namespace }}
profiles:
  - schedulerName: numalign-scheduler
extenders:
  - urlPrefix: {{ .Values.scheduler.extenderURL | default (printf "https://%s:%v" $svc .Values.extender.port) }}
    filterVerb: filter
    prioritizeVerb: prioritize
    bindVerb: bind
    weight: 1
    nodeCacheCapable: true
    ignorable: true
    enableHTTPS: true
    httpTimeout: 5s
    tlsConfig:
      serverName: {{ $svc }}
      caFile: /etc/numalign/extender-client/ca.crt
      certFile: /etc/numalign/extender-client/scheduler.crt
      keyFile: /etc/numalign/extender-client/scheduler.key
{{- end }}

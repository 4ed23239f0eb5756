{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "weightswarm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Resource name prefix. 52 characters leave room for the "-agent"/"-tracker"/"-tracker-token"
suffixes within the 63 a name allows.
*/}}
{{- define "weightswarm.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "weightswarm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "weightswarm.labels" -}}
helm.sh/chart: {{ include "weightswarm.chart" . }}
app.kubernetes.io/name: {{ include "weightswarm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "agent"). */}}
{{- define "weightswarm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weightswarm.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Full labels of one component's objects. */}}
{{- define "weightswarm.componentLabels" -}}
{{ include "weightswarm.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "weightswarm.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{- define "weightswarm.agent.fullname" -}}
{{ include "weightswarm.fullname" . }}-agent
{{- end }}

{{- define "weightswarm.tracker.fullname" -}}
{{ include "weightswarm.fullname" . }}-tracker
{{- end }}

{{- define "weightswarm.agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{ default (include "weightswarm.agent.fullname" .) .Values.serviceAccount.name }}
{{- else -}}
{{ default "default" .Values.serviceAccount.name }}
{{- end -}}
{{- end }}

{{/* The Secret (name, key) holding the agent<->tracker token. */}}
{{- define "weightswarm.trackerToken.secretName" -}}
{{ .Values.trackerToken.existingSecret | default (printf "%s-tracker-token" (include "weightswarm.fullname" .)) }}
{{- end }}
{{- define "weightswarm.trackerToken.secretKey" -}}
{{ ternary .Values.trackerToken.existingSecretKey "token" (ne .Values.trackerToken.existingSecret "") }}
{{- end }}

{{/* The Secret (name, key) holding the HF token; empty name: no token. */}}
{{- define "weightswarm.hfToken.secretName" -}}
{{- if .Values.hfToken.existingSecret -}}
{{ .Values.hfToken.existingSecret }}
{{- else if .Values.hfToken.value -}}
{{ include "weightswarm.fullname" . }}-hf-token
{{- end -}}
{{- end }}
{{- define "weightswarm.hfToken.secretKey" -}}
{{ ternary .Values.hfToken.existingSecretKey "token" (ne .Values.hfToken.existingSecret "") }}
{{- end }}

{{/* The Secret (name, key) holding the tracker's Redis URL (it may carry a password). */}}
{{- define "weightswarm.redis.secretName" -}}
{{ .Values.tracker.store.redis.existingSecret | default (printf "%s-tracker-redis" (include "weightswarm.fullname" .)) }}
{{- end }}
{{- define "weightswarm.redis.secretKey" -}}
{{ ternary .Values.tracker.store.redis.existingSecretKey "url" (ne .Values.tracker.store.redis.existingSecret "") }}
{{- end }}

{{/* Tracker URL the agents use; empty: none (origin-only agents). */}}
{{- define "weightswarm.agent.trackerUrl" -}}
{{- if .Values.agent.trackerUrl -}}
{{ .Values.agent.trackerUrl }}
{{- else if .Values.tracker.enabled -}}
http://{{ include "weightswarm.tracker.fullname" . }}.{{ .Release.Namespace }}.svc:{{ .Values.tracker.service.port }}
{{- end -}}
{{- end }}

{{/*
Where the agent API binds. On the pod network the pod's own namespace is private, so all
interfaces is safe and lets the kubelet probe it. On the host network we bind the node IP
only, so the API is not exposed on every interface of the node.
*/}}
{{- define "weightswarm.agent.apiListen" -}}
{{- if .Values.agent.hostNetwork -}}
$(POD_IP):{{ .Values.agent.api.port }}
{{- else -}}
0.0.0.0:{{ .Values.agent.api.port }}
{{- end -}}
{{- end }}

{{/* Container paths of the hostPath volumes; the host side is agent.hostPathRoot. */}}
{{- define "weightswarm.agent.hubDir" -}}/var/lib/weightswarm/hub{{- end }}
{{- define "weightswarm.agent.stateDir" -}}/var/lib/weightswarm/state{{- end }}
{{- define "weightswarm.tokenDir" -}}/etc/weightswarm/tracker-token{{- end }}

{{/* Checks that no schema can express with a readable message. */}}
{{- define "weightswarm.validate" -}}
{{- if and (gt (int .Values.tracker.replicas) 1) (ne .Values.tracker.store.type "redis") }}
{{- fail (printf "tracker.replicas=%d needs tracker.store.type=redis: the SQLite store is a single-writer file on one volume; set tracker.replicas=1 or use Redis" (int .Values.tracker.replicas)) }}
{{- end }}
{{- if and .Values.tracker.enabled (eq .Values.tracker.store.type "redis") (not .Values.tracker.store.redis.url) (not .Values.tracker.store.redis.existingSecret) }}
{{- fail "tracker.store.type=redis needs tracker.store.redis.url or tracker.store.redis.existingSecret" }}
{{- end }}
{{- if and .Values.networkPolicy.enabled .Values.agent.hostNetwork }}
{{- fail "networkPolicy.enabled=true cannot select agents with agent.hostNetwork=true (they use node IPs); disable one of them" }}
{{- end }}
{{- end }}

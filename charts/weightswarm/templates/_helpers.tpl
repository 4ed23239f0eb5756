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
{{- $repo := required "image.repository is empty: no weightswarm image is published; build the repository's Dockerfile, push it to your registry and set image.repository (the repository's README, \"Kubernetes and vLLM\")" .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{ $repo }}@{{ .Values.image.digest }}
{{- else -}}
{{ $repo }}:{{ .Values.image.tag | default .Chart.AppVersion }}
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

{{/*
The Secrets (name, key) of the tracker's credentials: the agent-role token, the announce passkey
and the publisher-role token. Each is a file in the pods, never an env var or an argument.
*/}}
{{- define "weightswarm.trackerToken.secretName" -}}
{{ .Values.trackerToken.existingSecret | default (printf "%s-tracker-token" (include "weightswarm.fullname" .)) }}
{{- end }}
{{- define "weightswarm.trackerToken.secretKey" -}}
{{ ternary .Values.trackerToken.existingSecretKey "token" (ne .Values.trackerToken.existingSecret "") }}
{{- end }}
{{- define "weightswarm.announcePasskey.secretName" -}}
{{ .Values.announcePasskey.existingSecret | default (printf "%s-announce-passkey" (include "weightswarm.fullname" .)) }}
{{- end }}
{{- define "weightswarm.announcePasskey.secretKey" -}}
{{ ternary .Values.announcePasskey.existingSecretKey "passkey" (ne .Values.announcePasskey.existingSecret "") }}
{{- end }}
{{- define "weightswarm.publisherToken.secretName" -}}
{{ .Values.publisherToken.existingSecret | default (printf "%s-publisher-token" (include "weightswarm.fullname" .)) }}
{{- end }}
{{- define "weightswarm.publisherToken.secretKey" -}}
{{ ternary .Values.publisherToken.existingSecretKey "token" (ne .Values.publisherToken.existingSecret "") }}
{{- end }}

{{/*
A generated credential's value: `value` if given, else the one an earlier install stored in the
Secret (so upgrades do not cut agents off the tracker), else a new random one. Offline rendering
(helm template) has no cluster: lookup is empty and a new one is made each time.
Call with (dict "ctx" $ "name" SECRET "key" KEY "value" VALUE).
*/}}
{{- define "weightswarm.credential" -}}
{{- $value := .value }}
{{- if not $value }}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace .name }}
{{- if and $existing $existing.data (index $existing.data .key) }}
{{- $value = index $existing.data .key | b64dec }}
{{- else }}
{{- $value = randAlphaNum 48 }}
{{- end }}
{{- end }}
{{- $value }}
{{- end }}

{{/*
The projected volume of tracker credentials, as files under weightswarm.secretDir. Call with
(dict "ctx" $ "publisher" BOOL): the publisher token only where it is used.
*/}}
{{- define "weightswarm.credentialsVolume" -}}
- name: credentials
  projected:
    defaultMode: 0440
    sources:
      - secret:
          name: {{ include "weightswarm.trackerToken.secretName" .ctx }}
          items:
            - key: {{ include "weightswarm.trackerToken.secretKey" .ctx }}
              path: tracker-token
      - secret:
          name: {{ include "weightswarm.announcePasskey.secretName" .ctx }}
          items:
            - key: {{ include "weightswarm.announcePasskey.secretKey" .ctx }}
              path: announce-passkey
      {{- if .publisher }}
      - secret:
          name: {{ include "weightswarm.publisherToken.secretName" .ctx }}
          items:
            - key: {{ include "weightswarm.publisherToken.secretKey" .ctx }}
              path: publisher-token
      {{- end }}
{{- end }}

{{/*
The publisher's keys (publisherKeys): "true" when a public key is configured; the projected volume
(mode 0440, at weightswarm.publisherKeysDir) with the public key for every agent and, for agents
that publish, the signing key. Call the volume with (dict "ctx" $ "sign" BOOL).
*/}}
{{- define "weightswarm.publisherKeysDir" -}}/etc/weightswarm/publisher{{- end }}
{{- define "weightswarm.publisherKeys.public" -}}
{{- with .Values.publisherKeys.publicKey }}{{ if or .existingSecret .existingConfigMap }}true{{ end }}{{ end }}
{{- end }}
{{- define "weightswarm.publisherKeysVolume" -}}
{{- $public := .ctx.Values.publisherKeys.publicKey }}
{{- $signing := .ctx.Values.publisherKeys.signingKey }}
- name: publisher-keys
  projected:
    defaultMode: 0440
    sources:
      {{- if $public.existingSecret }}
      - secret:
          name: {{ $public.existingSecret }}
          items:
            - key: {{ $public.key }}
              path: publisher.pub
      {{- else if $public.existingConfigMap }}
      - configMap:
          name: {{ $public.existingConfigMap }}
          items:
            - key: {{ $public.key }}
              path: publisher.pub
      {{- end }}
      {{- if .sign }}
      - secret:
          name: {{ $signing.existingSecret }}
          items:
            - key: {{ $signing.key }}
              path: publisher.key
      {{- end }}
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
Where the agent's network listener binds (health, metrics, the HF endpoint; nothing that acts
on the node): the pod's IP only, from the downward API (status.podIP), which is the node's IP
with agent.hostNetwork. Not 0.0.0.0: on the host network that would expose it on every
interface of the node, and on the pod network loopback needs nothing from it (the node's CLI
uses the admin socket). The agent splits HOST:PORT at the last colon, so an IPv6 pod IP works.
*/}}
{{- define "weightswarm.agent.apiListen" -}}
$(POD_IP):{{ .Values.agent.api.port }}
{{- end }}

{{/*
Container paths of the hostPath volumes; the host side is agent.hostPathRoot. The admin socket
(mode 0600, every route) lives in the state dir, which only the agent mounts; the pods' socket
(mode 0666) in run/, which workload pods mount at the same path.
*/}}
{{- define "weightswarm.agent.hubDir" -}}/var/lib/weightswarm/hub{{- end }}
{{- define "weightswarm.agent.stateDir" -}}/var/lib/weightswarm/state{{- end }}
{{- define "weightswarm.agent.runDir" -}}/run/weightswarm{{- end }}
{{- define "weightswarm.agent.adminSocket" -}}{{ include "weightswarm.agent.stateDir" . }}/admin.sock{{- end }}
{{- define "weightswarm.agent.podsSocket" -}}{{ include "weightswarm.agent.runDir" . }}/pods.sock{{- end }}
{{- define "weightswarm.secretDir" -}}/etc/weightswarm/credentials{{- end }}
{{- /* Where buckets.credentials.filesSecret is mounted in the agent container (its keys as files). */}}
{{- define "weightswarm.bucketsDir" -}}/etc/weightswarm/buckets{{- end }}
{{- /* Where registries.credentials.existingSecret's docker config is mounted in the agent container. */}}
{{- define "weightswarm.registriesDir" -}}/etc/weightswarm/registries{{- end }}

{{/* Host path of one agent hostPath volume: call with (list $ "hub"). */}}
{{- define "weightswarm.agent.hostPath" -}}
{{ printf "%s/%s" (trimSuffix "/" (index . 0).Values.agent.hostPathRoot) (index . 1) }}
{{- end }}

{{/* Agents publish (and so hold the publisher token) only where publish roots are set. */}}
{{- define "weightswarm.agent.publishes" -}}
{{- if and .Values.agent.publishRoots (include "weightswarm.agent.trackerUrl" .) }}true{{ end }}
{{- end }}

{{/* "true" when the chart creates the ValidatingAdmissionPolicy (see admissionPolicy.enabled). */}}
{{- define "weightswarm.admissionPolicy.create" -}}
{{- $mode := toString .Values.admissionPolicy.enabled }}
{{- if eq $mode "auto" }}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" }}true{{ end }}
{{- else if eq $mode "true" }}true
{{- end }}
{{- end }}

{{/* Checks that no schema can express with a readable message. */}}
{{- define "weightswarm.validate" -}}
{{- if and (gt (int .Values.tracker.replicas) 1) (ne .Values.tracker.store.type "redis") }}
{{- fail (printf "tracker.replicas=%d needs tracker.store.type=redis: the SQLite store is a single-writer file on one volume; set tracker.replicas=1 or use Redis" (int .Values.tracker.replicas)) }}
{{- end }}
{{- if and .Values.tracker.enabled (eq .Values.tracker.store.type "redis") (not .Values.tracker.store.redis.url) (not .Values.tracker.store.redis.existingSecret) }}
{{- fail "tracker.store.type=redis needs tracker.store.redis.url or tracker.store.redis.existingSecret" }}
{{- end }}
{{- if and .Values.networkPolicy.enabled .Values.agent.hostNetwork .Values.tracker.enabled (not .Values.networkPolicy.tracker.extraFrom) }}
{{- fail "agent.hostNetwork=true with networkPolicy.enabled=true: agents reach the tracker from node addresses, which no pod selector matches; list them in networkPolicy.tracker.extraFrom (e.g. [{ipBlock: {cidr: <node CIDR>}}]) or set networkPolicy.enabled=false" }}
{{- end }}
{{- if and .Values.agent.publishRoots (not (include "weightswarm.agent.trackerUrl" .)) }}
{{- fail "agent.publishRoots needs a tracker (tracker.enabled=true or agent.trackerUrl): publishing registers manifests there" }}
{{- end }}
{{- if and .Values.agent.publishRoots (not .Values.publisherToken.enabled) }}
{{- fail "agent.publishRoots needs publisherToken.enabled=true: the tracker registers manifests only with the publisher-role token" }}
{{- end }}
{{- if and .Values.agent.publishRoots (not .Values.publisherKeys.signingKey.existingSecret) }}
{{- fail "agent.publishRoots needs publisherKeys.signingKey.existingSecret: agents sign the manifests they publish (make the pair with `agent keygen DIR`, then kubectl create secret generic NAME --from-file=DIR/publisher.key)" }}
{{- end }}
{{- if and .Values.agent.publishRoots (not (include "weightswarm.publisherKeys.public" .)) }}
{{- fail "agent.publishRoots needs publisherKeys.publicKey (existingConfigMap or existingSecret): without it no agent fetches what is published" }}
{{- end }}
{{- if hasKey .Values.agent.config "WEIGHTSWARM_BUCKET" }}
{{- fail "agent.config.WEIGHTSWARM_BUCKET: list bucket prefixes in buckets.allow instead (the agent's --bucket arguments, which take precedence over the variable)" }}
{{- end }}
{{- if hasKey .Values.agent.config "WEIGHTSWARM_REGISTRY" }}
{{- fail "agent.config.WEIGHTSWARM_REGISTRY: list registry prefixes in registries.allow instead (the agent's --registry arguments, which take precedence over the variable)" }}
{{- end }}
{{- if hasKey .Values.agent.config "WEIGHTSWARM_OCI_PLAIN_HTTP" }}
{{- fail "agent.config.WEIGHTSWARM_OCI_PLAIN_HTTP: list plain-HTTP registries in registries.plainHttp instead" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.agent.metricsOnNetwork) }}
{{- fail "serviceMonitor.enabled=true needs agent.metricsOnNetwork=true: with it off the agents serve /metrics on their admin socket only" }}
{{- end }}
{{- if and .Values.agent.trackerUrl (not .Values.tracker.enabled) }}
{{- if not (or .Values.trackerToken.value .Values.trackerToken.existingSecret) }}
{{- fail "agent.trackerUrl with tracker.enabled=false needs the external tracker's agent-role token: set trackerToken.existingSecret (or trackerToken.value)" }}
{{- end }}
{{- if not (or .Values.announcePasskey.value .Values.announcePasskey.existingSecret) }}
{{- fail "agent.trackerUrl with tracker.enabled=false needs the external tracker's announce passkey: set announcePasskey.existingSecret (or announcePasskey.value)" }}
{{- end }}
{{- if and .Values.agent.publishRoots (not (or .Values.publisherToken.value .Values.publisherToken.existingSecret)) }}
{{- fail "agent.publishRoots with an external tracker needs its publisher token: set publisherToken.existingSecret (or publisherToken.value)" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The node label that says "this node holds model REF", as the agents set it on their own Node
(value: the 40-hex commit the node holds), for node affinities in your own templates:

  {{ include "weightswarm.modelLabel" "Qwen/Qwen2.5-72B-Instruct" }}
  -> model.weightswarm.io/Qwen2.5-72B-Instruct.<first 10 hex of sha256("Qwen/Qwen2.5-72B-Instruct@main")>

Call it with the ref string "org/name" or "org/name@rev" (no @rev: @main), exactly as the pod or
the ModelPreheat asks for it. The name is <slug>.<h>: h = the first 10 hex characters of the
sha256 of "org/name@rev"; slug = the name part with every character outside [A-Za-z0-9._-]
replaced by "-", non-alphanumerics stripped from both ends, cut to 52 characters and stripped
again at the end (52 + 1 + 10 = 63, the limit of a label name); a name with no letter or digit
at all gives just <h>. The same rule as the agent's agent/kube/labels.py model_label_key.
*/}}
{{- define "weightswarm.modelLabel" -}}
{{- $ref := toString . }}
{{- if not (contains "@" $ref) }}
{{- $ref = printf "%s@main" $ref }}
{{- end }}
{{- $repo := index (splitList "@" $ref) 0 }}
{{- $name := regexReplaceAll "^[^/]*/" $repo "" }}
{{- $slug := regexReplaceAll "[^A-Za-z0-9._-]" $name "-" }}
{{- $slug = regexReplaceAll "^[^A-Za-z0-9]+|[^A-Za-z0-9]+$" $slug "" | trunc 52 }}
{{- $slug = regexReplaceAll "[^A-Za-z0-9]+$" $slug "" }}
{{- $h := sha256sum $ref | trunc 10 }}
{{- if $slug }}model.weightswarm.io/{{ $slug }}.{{ $h }}{{ else }}model.weightswarm.io/{{ $h }}{{ end }}
{{- end }}

{{/*
The agent's RBAC rules on cluster-scoped objects, in a ClusterRole even with agent.watchNamespace:
- preheat.enabled: ModelPreheats (cluster-scoped) get/list/watch, and a merge patch of their
  status subresource, where each agent writes its own node's entry (get: to read it back);
- nodeLabels.enabled: nodes get/list/watch (its own Node, watched with the field selector
  metadata.name=$NODE_NAME; nodes listed by a preheat's label selector to count the nodes it
  wants) and patch (its own `model.weightswarm.io/` labels; the admission policy allows nothing
  else). Empty when both are off.
*/}}
{{- define "weightswarm.agent.clusterRules" -}}
{{- if .Values.preheat.enabled }}
- apiGroups: ["weightswarm.io"]
  resources: ["modelpreheats"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["weightswarm.io"]
  resources: ["modelpreheats/status"]
  verbs: ["get", "patch"]
{{- end }}
{{- if .Values.nodeLabels.enabled }}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}

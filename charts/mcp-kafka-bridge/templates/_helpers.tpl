{{/*
Shared names, labels and derived settings of the chart. Every template includes these, so a
name or a rule (when do the replicas divide the partitions, which job topics exist) is decided
here once.
*/}}

{{- define "bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-mcp-kafka-bridge, or the release name alone when it already names the chart. */}}
{{- define "bridge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "bridge.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The headless Service that gives each server pod its DNS name. */}}
{{- define "bridge.peers" -}}
{{- printf "%s-peers" (include "bridge.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "bridge.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; selectors use bridge.selectorLabels (name, instance) + component. */}}
{{- define "bridge.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "bridge.selectorLabels" . }}
app.kubernetes.io/part-of: mcp-kafka-bridge
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "bridge.image" -}}
{{- if .Values.image.digest -}}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" .Values.image.digest) -}}
{{- fail (printf "image.digest must be sha256:<64 hex digits>, not %q" .Values.image.digest) -}}
{{- end -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if eq $tag "latest" -}}
{{- fail "image.tag: pin a released version (or image.digest), not latest" -}}
{{- end -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the server replicas divide the events partitions (ownership "group"): more than one
replica, or an autoscaler that may add some. Checks the counts against the partitions here, so
every template that includes it refuses the same bad values.
*/}}
{{- define "bridge.divides" -}}
{{- $partitions := int .Values.topics.partitions -}}
{{- if .Values.autoscaling.enabled -}}
{{- $min := int .Values.autoscaling.minReplicas -}}
{{- $max := int .Values.autoscaling.maxReplicas -}}
{{- if or (lt $min 1) (lt $max $min) -}}
{{- fail (printf "autoscaling: need 1 <= minReplicas (%d) <= maxReplicas (%d)" $min $max) -}}
{{- end -}}
{{- if gt $max $partitions -}}
{{- fail (printf "autoscaling.maxReplicas (%d) exceeds topics.partitions (%d): a replica beyond the events partitions would own nothing" $max $partitions) -}}
{{- end -}}
{{- if gt $max 1 -}}true{{- end -}}
{{- else -}}
{{- $replicas := int .Values.server.replicas -}}
{{- if lt $replicas 1 -}}
{{- fail (printf "server.replicas must be at least 1, not %d" $replicas) -}}
{{- end -}}
{{- if gt $replicas $partitions -}}
{{- fail (printf "server.replicas (%d) exceeds topics.partitions (%d): a replica beyond the events partitions would own nothing" $replicas $partitions) -}}
{{- end -}}
{{- if gt $replicas 1 -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* The peer Secret's name: the user's, or the one the chart generates. */}}
{{- define "bridge.peerSecretName" -}}
{{- default (printf "%s-peer" (include "bridge.fullname" .)) .Values.peerSecret.existingSecret -}}
{{- end -}}

{{/* The identity keyring's Secret: the user's, or the one the chart generates. */}}
{{- define "bridge.identitySecretName" -}}
{{- default (printf "%s-identity" (include "bridge.fullname" .)) .Values.identity.existingSecret -}}
{{- end -}}

{{/*
The key files the server mounts from Secrets, each (dict "name" volume "env" setting "dir"
mount "secret" name "key" key "file" name in the mount), as a JSON list: the task identity
keyring always (the user's Secret or the generated one), the webhook sealing key only when a
Secret is named (without one, webhook delivery stays off). statefulset.yaml mounts each
read-only and sets its setting; NOTES.txt says which are on.
*/}}
{{- define "bridge.keyFiles" -}}
{{- $files := list (dict "name" "identity-keys" "env" "BRIDGE_IDENTITY__KEYS_FILE" "dir" "/etc/mcp-kafka-bridge/identity" "secret" (include "bridge.identitySecretName" .) "key" .Values.identity.key "file" "identity.keys") -}}
{{- if .Values.webhooks.existingSecret -}}
{{- $files = append $files (dict "name" "webhook-keys" "env" "BRIDGE_WEBHOOKS__KEYS__FILE" "dir" "/etc/mcp-kafka-bridge/webhook-keys" "secret" .Values.webhooks.existingSecret "key" .Values.webhooks.key "file" "keys.json") -}}
{{- end -}}
{{- range $files -}}
{{- if not .key -}}
{{- fail (printf "%s: name the key of Secret %s that holds the file" (ternary "identity.key" "webhooks.key" (eq .name "identity-keys")) .secret) -}}
{{- end -}}
{{- end -}}
{{- toJson $files -}}
{{- end -}}

{{/*
The tools of each built-in pack (bridge/workers/packs.py); tests/test_helm.py checks this map
against the packs, so a tool added there fails the test until it is added here.
*/}}
{{- define "bridge.packTools" -}}
demo: [agent_run]
conformance:
  - test_simple_text
  - test_image_content
  - test_audio_content
  - test_embedded_resource
  - test_multiple_content_types
  - test_error_handling
  - test_tool_with_progress
  - json_schema_2020_12_tool
  - test_missing_capability
  - test_streaming_elicitation
  - test_logging_tool
  - test_header_param
  - greet
  - slow_compute
  - failing_job
  - protocol_error_job
  - confirm_delete
  - multi_input
  - test_tool_with_task
{{- end -}}

{{/* The tools of a list of packs, in pack order, as a JSON list; an unknown pack fails. */}}
{{- define "bridge.toolsOf" -}}
{{- $packs := include "bridge.packTools" .root | fromYaml -}}
{{- $tools := list -}}
{{- range .packs -}}
{{- if not (hasKey $packs .) -}}
{{- fail (printf "unknown tool pack %q (known: %s)" . (keys $packs | sortAlpha | join ", ")) -}}
{{- end -}}
{{- $tools = concat $tools (get $packs .) -}}
{{- end -}}
{{- toJson $tools -}}
{{- end -}}

{{/* Job topics (<prefix>.jobs.<tool>) the server sends to: its packs' tools and the extra tools. */}}
{{- define "bridge.serverJobTopics" -}}
{{- $tools := concat (include "bridge.toolsOf" (dict "root" . "packs" .Values.bridge.toolPacks) | fromJsonArray) .Values.topics.extraJobTools -}}
{{- $prefix := .Values.topics.prefix -}}
{{- $out := list -}}
{{- range $tools }}{{ $out = append $out (printf "%s.jobs.%s" $prefix .) }}{{ end -}}
{{- toJson (uniq $out) -}}
{{- end -}}

{{/* Job topics the workers consume: their packs' tools (none when workers are off). */}}
{{- define "bridge.workerJobTopics" -}}
{{- $prefix := .Values.topics.prefix -}}
{{- $out := list -}}
{{- if .Values.workers.enabled -}}
{{- range (include "bridge.toolsOf" (dict "root" . "packs" .Values.workers.packs) | fromJsonArray) }}{{ $out = append $out (printf "%s.jobs.%s" $prefix .) }}{{ end -}}
{{- end -}}
{{- toJson (uniq $out) -}}
{{- end -}}

{{/* The Kafka listener's port, from the first bootstrap server (for the NetworkPolicy). */}}
{{- define "bridge.kafkaPort" -}}
{{- $first := first (splitList "," .Values.kafka.bootstrapServers) | trim -}}
{{- $port := last (splitList ":" $first) -}}
{{- if not (regexMatch "^[0-9]+$" $port) -}}
{{- fail (printf "kafka.bootstrapServers: %q has no :port" $first) -}}
{{- end -}}
{{- $port -}}
{{- end -}}

{{/*
The security values every install must decide: caller authentication and Kafka credentials.
Every missing value is named in one message, with the explicit insecure choices; configmap.yaml
and statefulset.yaml include this, so `helm install` with the defaults refuses to render.
*/}}
{{- define "bridge.checkSecurity" -}}
{{- $auth := .Values.auth -}}
{{- if not (has $auth.mode (list "none" "bearer" "jwt")) -}}
{{- fail (printf "auth.mode must be none, bearer or jwt, not %q" $auth.mode) -}}
{{- end -}}
{{- $missing := list -}}
{{- if eq $auth.mode "none" -}}
{{- if not $auth.allowUnauthenticated -}}
{{- $missing = append $missing "auth.allowUnauthenticated=true, to confirm auth.mode=none (every caller is one principal: only behind an authenticating gateway); or auth.mode=jwt|bearer" -}}
{{- end -}}
{{- else if not $auth.existingSecret -}}
{{- $missing = append $missing (printf "auth.existingSecret: the Secret holding %s" (ternary "tokens.json" "jwks.json (or the HS256 key)" (eq $auth.mode "bearer"))) -}}
{{- end -}}
{{- if eq $auth.mode "jwt" -}}
{{- if not $auth.jwt.issuer -}}
{{- $missing = append $missing "auth.jwt.issuer: the iss of your tokens" -}}
{{- end -}}
{{- if not $auth.jwt.audience -}}
{{- $missing = append $missing "auth.jwt.audience: the aud your tokens carry for this API" -}}
{{- end -}}
{{- if and (has "HS256" $auth.jwt.algorithms) (not $auth.jwt.hs256SecretKey) -}}
{{- $missing = append $missing "auth.jwt.hs256SecretKey: the key of auth.existingSecret holding the HS256 key (auth.jwt.algorithms has HS256)" -}}
{{- end -}}
{{- end -}}
{{- $kafka := include "bridge.security" . -}}
{{- if and (ne $kafka "none") (not .Values.strimzi.kafkaUsers) -}}
{{- $roles := ternary (list "server" "worker") (list "server") .Values.workers.enabled -}}
{{- range $roles -}}
{{- $user := get $.Values.kafka.users . -}}
{{- if not $user.secret -}}
{{- $missing = append $missing (printf "kafka.users.%s.secret: the Secret with its Kafka credentials (or strimzi.kafkaUsers=true)" .) -}}
{{- end -}}
{{- if and (eq $kafka "scram") (not $user.username) -}}
{{- $missing = append $missing (printf "kafka.users.%s.username: its SCRAM user (or strimzi.kafkaUsers=true)" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $missing -}}
{{- fail (printf "set these values (docs/deployment.md, \"Helm\"):\n  - %s\nThe insecure choices are explicit: auth.mode=none with auth.allowUnauthenticated=true, and kafka.security=none (examples/minimal.yaml)." (join "\n  - " $missing)) -}}
{{- end -}}
{{- end -}}

{{/* The Events client profile when it is not the default (empty then). */}}
{{- define "bridge.eventsProfile" -}}
{{- $profile := .Values.webhooks.profile | default "sep-3415" -}}
{{- if not (has $profile (list "sep-3415" "chatgpt")) -}}
{{- fail (printf "webhooks.profile must be sep-3415 or chatgpt, not %q" $profile) -}}
{{- end -}}
{{- if and (eq $profile "chatgpt") (not .Values.webhooks.existingSecret) -}}
{{- fail "webhooks.profile=chatgpt needs webhooks.existingSecret: ChatGPT subscribes by webhook only, and webhooks are off without the key that seals their secrets" -}}
{{- end -}}
{{- if and (eq $profile "chatgpt") (eq (.Values.auth.mode | default "none") "none") -}}
{{- fail "webhooks.profile=chatgpt needs auth.mode bearer or jwt: ChatGPT subscribes by webhook only, and webhooks need a principal" -}}
{{- end -}}
{{- if ne $profile "sep-3415" -}}{{ $profile }}{{- end -}}
{{- end -}}

{{- define "bridge.security" -}}
{{- $mode := .Values.kafka.security -}}
{{- if not (has $mode (list "none" "scram" "mtls")) -}}
{{- fail (printf "kafka.security must be none, scram or mtls, not %q" $mode) -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{/* A role's Kafka user Secret (and SCRAM name): the value given, else its KafkaUser's name. */}}
{{- define "bridge.kafkaUserSecret" -}}
{{- $user := get .root.Values.kafka.users .role -}}
{{- if $user.secret -}}
{{- $user.secret -}}
{{- else if .root.Values.strimzi.kafkaUsers -}}
{{- printf "%s-%s" (include "bridge.fullname" .root) .role -}}
{{- else -}}
{{- fail (printf "kafka.security=%s: set kafka.users.%s.secret (the Secret with its credentials) or strimzi.kafkaUsers=true" .root.Values.kafka.security .role) -}}
{{- end -}}
{{- end -}}

{{- define "bridge.kafkaUsername" -}}
{{- $user := get .root.Values.kafka.users .role -}}
{{- if $user.username -}}
{{- $user.username -}}
{{- else if .root.Values.strimzi.kafkaUsers -}}
{{- printf "%s-%s" (include "bridge.fullname" .root) .role -}}
{{- else -}}
{{- fail (printf "kafka.security=scram: set kafka.users.%s.username or strimzi.kafkaUsers=true" .role) -}}
{{- end -}}
{{- end -}}

{{/*
What every pod of a role shares: the hardened pod security context, service account, /tmp and
the Kafka credential mounts. Called with (dict "root" $ "role" "server"|"worker").
*/}}
{{- define "bridge.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "bridge.containerSecurityContext" -}}
runAsNonRoot: true
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Kafka credential env of a role (only what differs per role: the SCRAM user name). */}}
{{- define "bridge.kafkaEnv" -}}
{{- if eq (include "bridge.security" .root) "scram" }}
- name: BRIDGE_KAFKA__SASL__USERNAME
  value: {{ include "bridge.kafkaUsername" . | quote }}
{{- end }}
{{- end -}}

{{- define "bridge.kafkaMounts" -}}
{{- $mode := include "bridge.security" .root -}}
{{- if and (ne $mode "none") .root.Values.kafka.tls.caSecret }}
- name: kafka-ca
  mountPath: /etc/mcp-kafka-bridge/kafka-ca
  readOnly: true
{{- end }}
{{- if ne $mode "none" }}
- name: kafka-user
  mountPath: /etc/mcp-kafka-bridge/kafka-user
  readOnly: true
{{- end }}
{{- end -}}

{{- define "bridge.kafkaVolumes" -}}
{{- $mode := include "bridge.security" .root -}}
{{- if and (ne $mode "none") .root.Values.kafka.tls.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ .root.Values.kafka.tls.caSecret }}
    defaultMode: 0440
    items:
      - key: {{ .root.Values.kafka.tls.caKey }}
        path: ca.crt
{{- end }}
{{- if ne $mode "none" }}
- name: kafka-user
  secret:
    secretName: {{ include "bridge.kafkaUserSecret" . }}
    defaultMode: 0440
    items:
      {{- if eq $mode "scram" }}
      - key: password
        path: password
      {{- else }}
      - key: user.crt
        path: user.crt
      - key: user.key
        path: user.key
      {{- end }}
{{- end }}
{{- end -}}

{{/*
The group session timeout: at least what brokers accept by default (group.min.session.timeout.ms,
6 s), at most the bridge setting's maximum (BRIDGE_REPLICAS__SESSION_TIMEOUT_MS, 300 s).
*/}}
{{- define "bridge.sessionTimeoutMs" -}}
{{- $ms := int .Values.server.groupSessionTimeoutMs -}}
{{- if or (lt $ms 6000) (gt $ms 300000) -}}
{{- fail (printf "server.groupSessionTimeoutMs must be 6000..300000 (the brokers' default minimum, the bridge's maximum), not %d" $ms) -}}
{{- end -}}
{{- $ms -}}
{{- end -}}

{{- /* The hand-over bound (s) and the pods' grace period it needs: preStop (5 s) + the
hand-over + the streams' drain (10 s, the server's graceful shutdown) + 10 s to close the Kafka
clients (tests/test_k8s.py checks the base's sum). */ -}}
{{- define "bridge.handoverTimeoutS" -}}
{{- $s := int .Values.server.handoverTimeoutS -}}
{{- if or (lt $s 0) (gt $s 600) -}}
{{- fail (printf "server.handoverTimeoutS must be 0..600, not %d" $s) -}}
{{- end -}}
{{- $s -}}
{{- end -}}

{{- define "bridge.terminationGraceS" -}}
{{- add 25 (include "bridge.handoverTimeoutS" . | int) -}}
{{- end -}}

{{/*
A BRIDGE_* name under its current spelling: a flat name of 0.1.0 becomes its grouped one from
files/renamed-settings.json, which tests/test_settings_renames.py keeps equal to the table of
bridge/settings_renames.py; under a group that moved too (the flat BRIDGE_KAFKA_TLS__CA_FILE).
*/}}
{{- define "bridge.currentName" -}}
{{- $renamed := .root.Files.Get "files/renamed-settings.json" | fromJson -}}
{{- $parts := splitn "__" 2 .name -}}
{{- $head := index $renamed $parts._0 | default $parts._0 -}}
{{- if $parts._1 -}}{{ printf "%s__%s" $head $parts._1 }}{{- else -}}{{ $head }}{{- end -}}
{{- end -}}

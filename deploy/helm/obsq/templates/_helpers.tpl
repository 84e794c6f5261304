{{/* Chart name. */}}
{{- define "obsq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified name: RELEASE-obsq, or RELEASE when it already contains the name. */}}
{{- define "obsq.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of one component's resources: FULLNAME-COMPONENT. Call with (list $ "worker"). */}}
{{- define "obsq.componentName" -}}
{{- $root := index . 0 }}
{{- printf "%s-%s" (include "obsq.fullname" $root | trunc 52 | trimSuffix "-") (index . 1) }}
{{- end }}

{{- define "obsq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "obsq.labels" -}}
helm.sh/chart: {{ include "obsq.chart" . }}
{{ include "obsq.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: obsq
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "obsq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "obsq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one component. Call with (list $ "worker"). */}}
{{- define "obsq.componentLabels" -}}
{{ include "obsq.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "obsq.componentSelectorLabels" -}}
{{ include "obsq.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/*
  The pod labels that the ServiceMonitor and the PodMonitor copy onto every target, as
  app_kubernetes_io_part_of, app_kubernetes_io_instance and app_kubernetes_io_component
  (the names a Prometheus that maps pod labels, as annotation-based scraping commonly
  does, gives them too). Dashboards and alerts tell installations apart by namespace and
  app_kubernetes_io_instance.
*/}}
{{- define "obsq.targetLabels" -}}
- app.kubernetes.io/part-of
- app.kubernetes.io/instance
- app.kubernetes.io/component
{{- end }}

{{- define "obsq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "obsq.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* REGISTRY/REPOSITORY@DIGEST, or REGISTRY/REPOSITORY:TAG; no registry: the runtime's default. */}}
{{- define "obsq.image" -}}
{{- $repository := .Values.image.repository }}
{{- with .Values.image.registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* OBSQ_QUEUES: "critical=6,default=3", in the order of worker.queues. */}}
{{- define "obsq.queues" -}}
{{- $parts := list }}
{{- range .Values.worker.queues }}
{{- $parts = append $parts (printf "%s=%d" .name (int .weight)) }}
{{- end }}
{{- join "," $parts }}
{{- end }}

{{/* A PromQL regex matching exactly the worker's queues: critical|default. */}}
{{- define "obsq.queueRegex" -}}
{{- $parts := list }}
{{- range .Values.worker.queues }}
{{- $parts = append $parts (regexQuoteMeta .name | replace "\\" "\\\\") }}
{{- end }}
{{- join "|" $parts }}
{{- end }}

{{/*
  The one decision about long tasks, worker.shutdownTimeout: how long a stopping worker
  lets its running tasks finish before handing them back (OBSQ_SHUTDOWN_TIMEOUT). The
  pod's grace follows it with worker.terminationGracePeriodMargin on top (for the time a
  preStop hook takes, and the hand-back itself); set the grace alone and the worker's
  timeout follows it instead. Both set: the grace must leave the margin.
*/}}
{{- define "obsq.shutdownTimeout" -}}
{{- $w := .Values.worker }}
{{- if not (kindIs "invalid" $w.shutdownTimeout) }}
{{- int $w.shutdownTimeout }}
{{- else if not (kindIs "invalid" $w.terminationGracePeriodSeconds) }}
{{- $derived := sub (int $w.terminationGracePeriodSeconds) (int $w.terminationGracePeriodMargin) }}
{{- if lt $derived 1 }}
{{- fail (printf "worker.terminationGracePeriodSeconds (%d) must exceed worker.terminationGracePeriodMargin (%d): the worker needs time to drain" (int $w.terminationGracePeriodSeconds) (int $w.terminationGracePeriodMargin)) }}
{{- end }}
{{- $derived }}
{{- else }}
{{- 25 }}{{/* the worker's own default shutdown_timeout */}}
{{- end }}
{{- end }}

{{- define "obsq.terminationGracePeriodSeconds" -}}
{{- $w := .Values.worker }}
{{- $timeout := include "obsq.shutdownTimeout" . | int }}
{{- if kindIs "invalid" $w.terminationGracePeriodSeconds }}
{{- add $timeout (int $w.terminationGracePeriodMargin) }}
{{- else }}
{{- if lt (int $w.terminationGracePeriodSeconds) (add $timeout (int $w.terminationGracePeriodMargin)) }}
{{- fail (printf "worker.terminationGracePeriodSeconds (%d) must be at least worker.shutdownTimeout (%d) plus worker.terminationGracePeriodMargin (%d): otherwise the kubelet kills draining workers before they hand their tasks back" (int $w.terminationGracePeriodSeconds) $timeout (int $w.terminationGracePeriodMargin)) }}
{{- end }}
{{- int $w.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/* A component's PodDisruptionBudget. Call with (list $ "worker" PDB_VALUES). */}}
{{- define "obsq.pdb" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
{{- $pdb := index . 2 }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "obsq.componentName" (list $root $component) }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "obsq.componentLabels" (list $root $component) | nindent 4 }}
spec:
  {{- if and (not (kindIs "invalid" $pdb.minAvailable)) (not (kindIs "invalid" $pdb.maxUnavailable)) }}
  {{- fail (printf "%s.pdb: set only one of minAvailable and maxUnavailable (set the other to null)" $component) }}
  {{- else if not (kindIs "invalid" $pdb.minAvailable) }}
  minAvailable: {{ $pdb.minAvailable }}
  {{- else if not (kindIs "invalid" $pdb.maxUnavailable) }}
  maxUnavailable: {{ $pdb.maxUnavailable }}
  {{- else }}
  {{- fail (printf "%s.pdb.enabled needs minAvailable or maxUnavailable" $component) }}
  {{- end }}
  {{- with $pdb.unhealthyPodEvictionPolicy }}
  unhealthyPodEvictionPolicy: {{ . }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "obsq.componentSelectorLabels" (list $root $component) | nindent 6 }}
{{- end }}

{{/* Checks of value combinations that the schema cannot express. */}}
{{- define "obsq.validate" -}}
{{- if and .Values.autoscaling.enabled .Values.keda.enabled }}
{{- fail "autoscaling.enabled and keda.enabled are mutually exclusive: both would scale the worker Deployment; enable only one" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (not (dig "requests" "cpu" "" .Values.worker.resources)) }}
{{- fail "autoscaling.enabled scales on CPU utilization and needs worker.resources.requests.cpu" }}
{{- end }}
{{- if and (not .Values.redis.existingSecret) (not .Values.redis.url) }}
{{- fail "set redis.existingSecret (and redis.existingSecretKey) or redis.url" }}
{{- end }}
{{- if and .Values.redis.auth.username (not .Values.redis.auth.existingSecret) }}
{{- fail "redis.auth.username is the user of the password in redis.auth.existingSecret: set that too" }}
{{- end }}
{{- if .Values.production }}
{{- if regexMatch "://[^/@]*:[^/@]*@" (default "" .Values.redis.url) }}
{{- fail "production: redis.url holds a password in plain values, where anyone who can read the release sees it: put the password in a Secret and name it in redis.auth.existingSecret (key redis.auth.existingSecretPasswordKey, redis-password by default), or put the whole URL in a Secret named in redis.existingSecret" }}
{{- end }}
{{- if not (or .Values.redis.existingSecret .Values.redis.auth.existingSecret) }}
{{- fail "production: Redis's password must come from a Secret: set redis.auth.existingSecret to a Secret holding the password (key redis.auth.existingSecretPasswordKey, redis-password by default, as Redis charts keep it), or redis.existingSecret to one holding the whole URL" }}
{{- end }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled }}
{{- fail "metrics.serviceMonitor.enabled and metrics.podMonitor.enabled would scrape every pod twice: enable only one" }}
{{- end }}
{{- if and .Values.tracing.enabled (not .Values.tracing.endpoint) }}
{{- fail "tracing.enabled needs tracing.endpoint (the OTLP endpoint, e.g. http://otel-collector:4317)" }}
{{- end }}
{{- end }}

{{/* Environment shared by every container: worker, scheduler, exporter and console. */}}
{{- define "obsq.commonEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: OBSQ_NAMESPACE
  value: {{ .Values.obsq.namespace | quote }}
- name: OBSQ_LOG_FORMAT
  value: {{ .Values.obsq.logFormat | quote }}
- name: OBSQ_LOG_LEVEL
  value: {{ .Values.obsq.logLevel | quote }}
{{- if .Values.redis.existingSecret }}
- name: OBSQ_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.existingSecret }}
      key: {{ .Values.redis.existingSecretKey }}
{{- else }}
- name: OBSQ_REDIS_URL
  value: {{ .Values.redis.url | quote }}
{{- end }}
{{- with .Values.redis.auth }}
{{- if .existingSecret }}
- name: OBSQ_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .existingSecretPasswordKey }}
{{- if .username }}
- name: OBSQ_REDIS_USERNAME
  value: {{ .username | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.redis.tls }}
{{- if .existingSecret }}
- name: OBSQ_REDIS_TLS_CA
  value: {{ printf "%s/%s" .mountPath .caKey | quote }}
{{- if .certKey }}
- name: OBSQ_REDIS_TLS_CERT
  value: {{ printf "%s/%s" .mountPath .certKey | quote }}
{{- end }}
{{- if .keyKey }}
- name: OBSQ_REDIS_TLS_KEY
  value: {{ printf "%s/%s" .mountPath .keyKey | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.tracing.enabled }}
- name: OTEL_TRACES_EXPORTER
  value: otlp
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.tracing.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .Values.tracing.protocol | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ default (include "obsq.fullname" .) .Values.tracing.serviceName | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ .Values.tracing.sampler | quote }}
{{- if .Values.tracing.samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .Values.tracing.samplerArg | quote }}
{{- end }}
{{- $attrs := list "k8s.namespace.name=$(POD_NAMESPACE)" "k8s.pod.name=$(POD_NAME)" }}
{{- range $k, $v := .Values.tracing.resourceAttributes }}
{{- $attrs = append $attrs (printf "%s=%s" $k (toString $v)) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attrs | quote }}
{{- else }}
- name: OTEL_TRACES_EXPORTER
  value: none
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The mount of the Secret with Redis's TLS files, in every container that speaks to Redis. */}}
{{- define "obsq.redisTlsMount" -}}
{{- if .Values.redis.tls.existingSecret }}
- name: redis-tls
  mountPath: {{ .Values.redis.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "obsq.redisTlsVolume" -}}
{{- if .Values.redis.tls.existingSecret }}
- name: redis-tls
  secret:
    secretName: {{ .Values.redis.tls.existingSecret }}
    defaultMode: 0444
{{- end }}
{{- end }}

{{/* Topology spread constraints whose labelSelector defaults to the component's pods. */}}
{{- define "obsq.topologySpreadConstraints" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
{{- $constraints := index . 2 }}
{{- range $constraints }}
{{- $c := deepCopy . }}
{{- if not $c.labelSelector }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" (include "obsq.componentSelectorLabels" (list $root $component) | fromYaml)) }}
{{- end }}
- {{ toYaml $c | nindent 2 | trim }}
{{- end }}
{{- end }}

{{/*
  Put a number of prometheusRule.alerts into a rule's expression: the one match of
  `pattern` (a comparison that ends a line) gets the new number. Call with
  (list RULE PARAMETER PATTERN NUMBER).
*/}}
{{- define "obsq.ruleNumber" -}}
{{- $rule := index . 0 }}
{{- $param := index . 1 }}
{{- $pattern := index . 2 }}
{{- $number := index . 3 }}
{{- if ne (len (regexFindAll $pattern $rule.expr -1)) 1 }}
{{- fail (printf "prometheusRule.alerts.%s.%s: its expression has no single comparison to set" $rule.alert $param) }}
{{- end }}
{{- $_ := set $rule "expr" (regexReplaceAll $pattern $rule.expr (printf "${1} %v${2}" $number)) }}
{{- end }}

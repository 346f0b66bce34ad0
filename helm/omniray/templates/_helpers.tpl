{{/* Names and labels */}}
{{- define "omniray.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "omniray.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "omniray.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "omniray.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "omniray.selectorLabels" -}}
app.kubernetes.io/name: {{ include "omniray.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "omniray.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "omniray.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "omniray.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Serve config generated from the profile (`make chart`); a profile without one fails. */}}
{{- define "omniray.serveConfig" -}}
{{- $path := printf "files/serve/%s.yaml" .Values.profile }}
{{- $config := .Files.Get $path }}
{{- if not $config }}
{{- fail (printf "profile %q has no generated Serve config %s: run `make chart`" .Values.profile $path) }}
{{- end }}
{{- $serve := fromYaml $config }}
{{- $grace := 0.0 }}
{{- range $app := $serve.applications }}
{{- range $d := $app.deployments }}
{{- with (get ($.Values.replicaBounds | default dict) $d.name) }}
{{- if $d.autoscaling_config }}
{{- $_ := set $d.autoscaling_config "min_replicas" .min }}
{{- $_ := set $d.autoscaling_config "max_replicas" .max }}
{{- else }}
{{- /* a deployment the profile runs at a fixed count: bounds that meet are that count, others
  autoscale it by Serve's default policy */}}
{{- if eq (.min | int) (.max | int) }}
{{- $_ := set $d "num_replicas" .min }}
{{- else }}
{{- $_ := unset $d "num_replicas" }}
{{- $_ := set $d "autoscaling_config" (dict "min_replicas" .min "max_replicas" .max) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $.Values.gracefulShutdownSeconds }}
{{- $_ := set $d "graceful_shutdown_timeout_s" ($.Values.gracefulShutdownSeconds | float64) }}
{{- end }}
{{- $grace = maxf $grace ($d.graceful_shutdown_timeout_s | float64) }}
{{- end }}
{{- end }}
{{- if le (.Values.terminationGracePeriodSeconds | float64) $grace }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be longer than the replicas' graceful shutdown (%v s)" .Values.terminationGracePeriodSeconds $grace) }}
{{- end }}
{{- if or .Values.gracefulShutdownSeconds .Values.replicaBounds }}
{{- toYaml $serve }}
{{- else }}
{{- $config }}
{{- end }}
{{- end }}

{{/* Ray's custom resource for one pool, as a rayStartParams `resources` value (a quoted JSON map). */}}
{{- define "omniray.poolResources" -}}
{{- toJson (toJson (dict (printf "omniray_pool_%s" .) 1000)) | quote }}
{{- end }}

{{- define "omniray.redisHost" -}}
{{- printf "%s-redis" (include "omniray.fullname" .) }}
{{- end }}

{{- define "omniray.redisSecretName" -}}
{{- default (printf "%s-redis" (include "omniray.fullname" .)) .Values.redis.auth.existingSecret }}
{{- end }}

{{/* OMNIRAY_REDIS_URL (services/common/redis_config.py) and the password it is built from. */}}
{{- define "omniray.redisEnv" -}}
{{- if .Values.redis.enabled }}
{{- if .Values.redis.auth.enabled }}
- name: OMNIRAY_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "omniray.redisSecretName" . }}
      key: {{ .Values.redis.auth.existingSecretKey }}
- name: OMNIRAY_REDIS_URL
  value: {{ printf "redis://:$(OMNIRAY_REDIS_PASSWORD)@%s:6379/0" (include "omniray.redisHost" .) | quote }}
{{- else }}
- name: OMNIRAY_REDIS_URL
  value: {{ printf "redis://%s:6379/0" (include "omniray.redisHost" .) | quote }}
{{- end }}
{{- else if or .Values.redis.external.url .Values.redis.external.existingSecret }}
- name: OMNIRAY_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ default (printf "%s-redis-url" (include "omniray.fullname" .)) .Values.redis.external.existingSecret }}
      key: {{ .Values.redis.external.existingSecretKey }}
{{- else }}
{{- fail "redis.enabled is false: set redis.external.url or redis.external.existingSecret" }}
{{- end }}
{{- end }}

{{/* The ServiceAccount of the Ray pods ("" for the namespace's default, whose token no pod mounts). */}}
{{- define "omniray.serviceAccountName" -}}
{{- if .Values.serviceAccountName }}
{{- .Values.serviceAccountName }}
{{- else if .Values.ray.enableInTreeAutoscaling }}
{{- printf "%s-autoscaler" (include "omniray.fullname" .) }}
{{- end }}
{{- end }}

{{/* Where a container with a read-only root writes: HOME and the caches under /tmp (an emptyDir). */}}
{{- define "omniray.scratchEnv" -}}
- {name: HOME, value: /tmp/home}
- {name: XDG_CACHE_HOME, value: /tmp/cache}
{{- end }}

{{- define "omniray.tenantsConfigMap" -}}
{{- default (printf "%s-tenants" (include "omniray.fullname" .)) .Values.tenants.existingConfigMap }}
{{- end }}

{{/*
A Ray pod template. Args: root (the chart context), pool (head | encoder | thinker | speech),
group (its values), head (bool).
*/}}
{{- define "omniray.rayPod" -}}
{{- $root := .root }}
{{- $group := .group }}
metadata:
  labels:
    {{- include "omniray.selectorLabels" $root | nindent 4 }}
    app.kubernetes.io/component: ray
    omniray.io/pool: {{ .pool }}
    {{- with $root.Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- /* No tenants checksum here: the gateway hot-reloads the mounted file, while a changed pod
  template makes KubeRay replace the whole Ray cluster. */}}
  {{- with $root.Values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  # Longer than the stages' graceful_shutdown_timeout_s (120 s): a pod being terminated lets its
  # replicas finish the responses they are serving.
  terminationGracePeriodSeconds: {{ $root.Values.terminationGracePeriodSeconds }}
  {{- with include "omniray.serviceAccountName" $root }}
  serviceAccountName: {{ . }}
  {{- end }}
  # Only the in-tree autoscaler (a sidecar of the head) talks to the Kubernetes API.
  automountServiceAccountToken: {{ and .head $root.Values.ray.enableInTreeAutoscaling }}
  securityContext:
    {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if $root.Values.models.prepare }}
  initContainers:
    - name: models
      image: {{ include "omniray.image" $root }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      command: [python, -m, services.models.build, --profile, {{ $root.Values.profile | quote }}]
      securityContext:
        {{- toYaml $root.Values.securityContext | nindent 8 }}
      env:
        - name: OMNIRAY_DATA
          value: /data
        {{- include "omniray.scratchEnv" $root | nindent 8 }}
      volumeMounts:
        - {name: data, mountPath: /data}
        - {name: tmp, mountPath: /tmp}
        {{- with $root.Values.models.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  {{- end }}
  containers:
    - name: {{ ternary "ray-head" "ray-worker" .head }}
      image: {{ include "omniray.image" $root }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      securityContext:
        {{- toYaml $root.Values.securityContext | nindent 8 }}
      env:
        - name: OMNIRAY_DATA
          value: /data
        {{- include "omniray.scratchEnv" $root | nindent 8 }}
        - name: OMNIRAY_TENANTS_FILE
          value: /etc/omniray/tenants/tenants.yaml
        - name: RAY_SERVE_GRPC_MAX_MESSAGE_SIZE  # the gRPC proxy's receive limit (Serve's default: 2 GiB)
          value: {{ $root.Values.grpcMaxMessageBytes | int64 | quote }}
        # Ray Serve's high-throughput mode: HAProxy in front of the gateway replicas' own servers
        # (services/app.py SERVE_ENV; a chart test checks they agree)
        - name: RAY_SERVE_ENABLE_HA_PROXY
          value: "1"
        - name: RAY_SERVE_THROUGHPUT_OPTIMIZED
          value: "1"
        # HAProxy through omniray's launcher: requests' headers within this long (slowloris), else 408
        - name: RAY_SERVE_HAPROXY_BINARY_PATH
          value: /opt/venv/bin/omniray-haproxy
        - name: OMNIRAY_HEADER_READ_TIMEOUT_S
          value: {{ $root.Values.headerReadTimeoutSeconds | int | quote }}
        {{- include "omniray.redisEnv" $root | nindent 8 }}
        {{- with $root.Values.otel.endpoint }}
        - name: OTEL_EXPORTER_OTLP_ENDPOINT
          value: {{ . | quote }}
        {{- end }}
        {{- with $root.Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        {{- if .head }}
        - {name: gcs-server, containerPort: 6379}
        - {name: dashboard, containerPort: 8265}
        - {name: client, containerPort: 10001}
        - {name: serve, containerPort: 8000}
        - {name: grpc, containerPort: 9000}
        {{- end }}
        - {name: metrics, containerPort: 8080}
      resources:
        {{- $res := deepCopy $group.resources }}
        {{- if $group.gpus }}
        {{- $_ := set $res "requests" (merge (dict "nvidia.com/gpu" $group.gpus) (default (dict) $res.requests)) }}
        {{- $_ := set $res "limits" (merge (dict "nvidia.com/gpu" $group.gpus) (default (dict) $res.limits)) }}
        {{- end }}
        {{- toYaml $res | nindent 8 }}
      volumeMounts:
        - {name: data, mountPath: /data}
        - {name: tenants, mountPath: /etc/omniray/tenants, readOnly: true}
        - {name: tmp, mountPath: /tmp}
        {{- if $group.shmSize }}
        - {name: dshm, mountPath: /dev/shm}
        {{- end }}
        {{- with $root.Values.models.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: data
      {{- toYaml $root.Values.models.volume | nindent 6 }}
    - name: tenants
      configMap:
        name: {{ include "omniray.tenantsConfigMap" $root }}
    - name: tmp
      emptyDir: {sizeLimit: {{ $root.Values.tmpSize }}}
    {{- if $group.shmSize }}
    - name: dshm
      emptyDir: {medium: Memory, sizeLimit: {{ $group.shmSize }}}
    {{- end }}
    {{- with $root.Values.models.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $group.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $group.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $group.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* Scrape labels the dashboards and alerts group by: the Ray cluster and the pool of each pod. */}}
{{- define "omniray.relabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_label_ray_io_cluster]
  targetLabel: ray_io_cluster
- sourceLabels: [__meta_kubernetes_pod_label_omniray_io_pool]
  targetLabel: pool
{{- end }}

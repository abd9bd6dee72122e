{{/*
Names and labels.
*/}}
{{- define "splitserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "splitserve.fullname" -}}
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

{{- define "splitserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "splitserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "splitserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "splitserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "splitserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (toString .Values.image.tag) }}
{{- end }}

{{- define "splitserve.apiKeysSecret" -}}
{{- default (printf "%s-api-keys" (include "splitserve.fullname" .)) .Values.apiKeys.existingSecret }}
{{- end }}

{{/*
The engine device on Kubernetes: config.device, where auto means cuda.
Mirrors splitserve.k8s.layout.k8s_device.
*/}}
{{- define "splitserve.device" -}}
{{- $d := default "auto" .Values.config.device }}
{{- if eq $d "auto" }}cuda{{ else }}{{ $d }}{{ end }}
{{- end }}

{{/*
Deployed pools, as a JSON list: colocated mode deploys only decode.
*/}}
{{- define "splitserve.roles" -}}
{{- if eq (default "disaggregated" .Values.config.mode) "colocated" }}["decode"]{{ else }}["prefill","decode"]{{ end }}
{{- end }}

{{/*
Worker pods one replica of a pool needs: 1 (a replica's TP x PP ranks run in one Ray actor on one
pod). Mirrors splitserve.k8s.layout.pods_per_replica.
*/}}
{{- define "splitserve.podsPerReplica" -}}
1
{{- end }}

{{/*
"true" when the config has an autoscaling section (also an empty one: splitserve's defaults),
else "": the controller then sets the pools' replicas and KubeRay's autoscaler follows them.
*/}}
{{- define "splitserve.autoscaling" -}}
{{- if not (kindIs "invalid" .Values.config.autoscaling) }}true{{ end }}
{{- end }}

{{/*
A pool's worker group size, as JSON {replicas, min, max}; call with (list $ role). With
config.autoscaling, KubeRay's autoscaler sizes the group between the config's min_replicas and
max_replicas times the pods a replica needs, starting from the pool's replicas (clamped);
without it the group is fixed. Mirrors splitserve.k8s.layout.worker_group_size.
*/}}
{{- define "splitserve.groupSize" -}}
{{- $root := index . 0 }}
{{- $role := index . 1 }}
{{- $pool := index $root.Values.config.pools $role }}
{{- $per := int (include "splitserve.podsPerReplica" $root) }}
{{- $n := mul (int (default 1 $pool.replicas)) $per }}
{{- $auto := $root.Values.config.autoscaling }}
{{- if include "splitserve.autoscaling" $root }}
{{- $low := mul (int (ternary 1 $auto.min_replicas (kindIs "invalid" $auto.min_replicas))) $per }}
{{- $high := mul (int (default 64 $auto.max_replicas)) $per }}
{{- dict "replicas" (min (max $n $low) $high) "min" $low "max" $high | toJson }}
{{- else }}
{{- dict "replicas" $n "min" $n "max" $n | toJson }}
{{- end }}
{{- end }}

{{/*
The effective config (YAML): values.config, plus tenancy.tenants_file when the API-key Secret is
mounted. Mirrors splitserve.k8s.chart.effective_config.
*/}}
{{- define "splitserve.config" -}}
{{- $cfg := deepCopy .Values.config }}
{{- if .Values.apiKeys.enabled }}
{{- $tenancy := deepCopy (default (dict) $cfg.tenancy) }}
{{- $_ := set $tenancy "tenants_file" "/etc/splitserve/api-keys/tenants.yaml" }}
{{- $_ := set $cfg "tenancy" $tenancy }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/*
The Ray Serve config (RayService serveConfigV2). Mirrors splitserve.app.serve_config with
pool_resources: the application builder gets the config, and each deployment spells out only
num_replicas and ray_actor_options (as pool_deployment_options sets them), each pool pinned to its
worker group by the custom resource "splitserve-<pool>". Every other option comes from build_app.
*/}}
{{- define "splitserve.serveConfig" -}}
{{- $cfg := include "splitserve.config" . | fromYaml }}
{{- $device := include "splitserve.device" . }}
{{- $shareCores := dig "placement" "share_cores" false $cfg }}
{{- $deployments := list }}
{{- range $role := include "splitserve.roles" . | fromJsonArray }}
{{- $pool := index $cfg.pools $role }}
{{- $ranks := mul (int $pool.tensor_parallel_size) (int $pool.pipeline_parallel_size) }}
{{- $actor := dict "num_cpus" $ranks }}
{{- if eq $device "cuda" }}
{{- $actor = dict "num_cpus" 1 "num_gpus" $ranks }}
{{- else if $shareCores }}
{{- $actor = dict "num_cpus" (mulf 0.01 $ranks) }}
{{- end }}
{{- $_ := set $actor "resources" (dict (printf "splitserve-%s" $role) 1) }}
{{- $deployments = append $deployments (dict
      "name" $role
      "num_replicas" (int $pool.replicas)
      "ray_actor_options" $actor) }}
{{- end }}
{{- $deployments = append $deployments (dict
      "name" "router"
      "num_replicas" (int $cfg.router.replicas)
      "ray_actor_options" (dict "num_cpus" 0)) }}
{{- $args := dict "config" $cfg "device" $device "kv_host" nil }}
{{- $app := dict
      "name" "splitserve"
      "route_prefix" "/"
      "import_path" "splitserve.app:app_builder"
      "args" $args
      "deployments" $deployments
      "external_scaler_enabled" (not (kindIs "invalid" $cfg.autoscaling)) }}
{{- $http := dict "host" $cfg.router.host "port" (int $cfg.router.port) }}
{{- toYaml (dict "http_options" $http "applications" (list $app)) }}
{{- end }}

{{/*
Guard rails that values.schema.json cannot express.
*/}}
{{- define "splitserve.validate" -}}
{{- if has (toString .Values.config.router.host) (list "127.0.0.1" "localhost" "::1") }}
{{- fail "config.router.host is a loopback address: in a pod the Serve proxy must listen on 0.0.0.0 (the Service cannot reach it otherwise)" }}
{{- end }}
{{- if not (has .Values.kserve.mode (list "none" "inferenceservice" "llmisvc")) }}
{{- fail (printf "kserve.mode must be none, inferenceservice or llmisvc (got %v)" .Values.kserve.mode) }}
{{- end }}
{{- end }}

{{/*
Pod-level pieces shared by the head and worker pods.
*/}}
{{- define "splitserve.podVolumes" -}}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.workers.shmSize }}
{{- if .Values.apiKeys.enabled }}
- name: api-keys
  secret:
    secretName: {{ include "splitserve.apiKeysSecret" . }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- include "splitserve.modelVolumes" . }}
{{- end }}

{{- define "splitserve.volumeMounts" -}}
- name: dshm
  mountPath: /dev/shm
{{- if .Values.apiKeys.enabled }}
- name: api-keys
  mountPath: /etc/splitserve/api-keys
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- include "splitserve.modelVolumeMounts" . }}
{{- end }}

{{/*
Engine container env (JSON list): values.env, then HF_TOKEN from hfTokenSecret when it names a
Secret, then the model cache's paths (RayService with modelCache on, _models.tpl). Both the
RayService and the KServe modes use it, and so does the model download Job.
*/}}
{{- define "splitserve.env" -}}
{{- $env := list }}
{{- range .Values.env }}{{ $env = append $env . }}{{ end }}
{{- with .Values.hfTokenSecret }}{{ if .name }}
{{- $env = append $env (dict "name" "HF_TOKEN" "valueFrom" (dict "secretKeyRef" (dict "name" .name "key" (default "token" .key)))) }}
{{- end }}{{ end }}
{{- $env = concat $env (include "splitserve.modelCacheEnv" (list . true) | fromJsonArray) }}
{{- toJson $env }}
{{- end }}

{{/*
The Ray pods' env (JSON list): splitserve.env, then Ray Serve's one-event-loop switches when
config.ray.one_event_loop is on (the default; splitserve/ingress.py, loop_env): each replica
runs its code and its handles' request router on its main event loop; the niceness of Ray's
worker processes, config.ray.worker_niceness (0 unless set; Ray's own default is 15); with
config.router.direct_ingress, Serve's HAProxy (RAY_SERVE_ENABLE_HA_PROXY; its statistics and
metrics ports stay Serve's defaults, on the pod's network); with direct_streaming too, the
ingress request router's settings (splitserve/ingress.py, route_env: the same values; its
timeout covers the decode gate's queue and, disaggregated, decode room, the prefill gate and the
remote prefill's deadline).
*/}}
{{- define "splitserve.rayEnv" -}}
{{- $env := include "splitserve.env" . | fromJsonArray }}
{{- if dig "ray" "one_event_loop" true (.Values.config | default dict) }}
{{- $env = concat $env (list (dict "name" "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD" "value" "0") (dict "name" "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP" "value" "0")) }}
{{- end }}
{{- $env = append $env (dict "name" "RAY_worker_niceness" "value" (toString (dig "ray" "worker_niceness" 0 (.Values.config | default dict)))) }}
{{- $router := dig "router" (dict) (.Values.config | default dict) }}
{{- if $router.direct_ingress }}
{{- $env = append $env (dict "name" "RAY_SERVE_ENABLE_HA_PROXY" "value" "1") }}
{{- end }}
{{- if and $router.direct_ingress $router.direct_streaming }}
{{- $queue := float64 (dig "tenancy" "queue_timeout_s" 30.0 (.Values.config | default dict)) }}
{{- $wait := $queue }}
{{- if eq (dig "mode" "disaggregated" (.Values.config | default dict)) "disaggregated" }}
{{- $wait = addf $queue (mulf 2 $queue) (float64 (dig "disaggregation" "prefill_timeout_s" 30.0 (.Values.config | default dict))) }}
{{- end }}
{{- $body := int (default 1048576 $router.max_body_bytes) }}
{{- $env = concat $env (list (dict "name" "RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY" "value" "1") (dict "name" "RAY_SERVE_SESSION_ID_HEADER_KEY" "value" "authorization") (dict "name" "RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_TIMEOUT_S" "value" (toString (add (int (ceil $wait)) 5))) (dict "name" "RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_BUFSIZE" "value" (toString (max 8388608 (add $body 65536))))) }}
{{- end }}
{{- toJson $env }}
{{- end }}

{{/*
Security contexts (values podSecurityContext, securityContext). The container one takes a list of
capabilities to add, e.g. (list $ (list "IPC_LOCK")) for the engine containers of an RDMA fabric:
they join securityContext.capabilities.add, and `drop` stays as the values say (default ALL).
*/}}
{{- define "splitserve.podSecurityContext" -}}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "splitserve.containerSecurityContext" -}}
{{- $root := index . 0 }}
{{- $add := index . 1 }}
{{- $ctx := deepCopy (default (dict) $root.Values.securityContext) }}
{{- if $add }}
{{- $caps := deepCopy (default (dict) $ctx.capabilities) }}
{{- $_ := set $caps "add" (concat (default (list) $caps.add) $add | uniq) }}
{{- $_ := set $ctx "capabilities" $caps }}
{{- end }}
{{- with $ctx }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The serve Service KubeRay creates for the RayService (spec.serveService): its name, and the
object. KubeRay sets its selector to the pods of the cluster whose Serve app is ready (label
ray.io/serve) and keeps only ports named "serve"; during an upgrade it switches the selector to
the new cluster once that cluster's app is ready.
*/}}
{{- define "splitserve.serveServiceName" -}}
{{- printf "%s-serve-svc" (include "splitserve.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "splitserve.serveService" -}}
metadata:
  name: {{ include "splitserve.serveServiceName" . }}
  labels:
    {{- include "splitserve.labels" . | nindent 4 }}
    splitserve.io/service: api
  {{- with .Values.service.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: {{ .Values.service.type }}
  ports:
    - name: serve
      port: {{ int .Values.service.port }}
      targetPort: serve
      protocol: TCP
{{- end }}

{{/*
The RayService upgrade strategy (values upgradeStrategy), with the checks KubeRay makes at
admission time for NewClusterWithIncrementalUpgrade made at render time instead.
*/}}
{{- define "splitserve.upgradeStrategy" -}}
{{- $u := .Values.upgradeStrategy }}
{{- if not (has $u.type (list "NewCluster" "None" "NewClusterWithIncrementalUpgrade")) }}
{{- fail (printf "upgradeStrategy.type must be NewCluster, None or NewClusterWithIncrementalUpgrade (got %v)" $u.type) }}
{{- end }}
type: {{ $u.type }}
{{- if eq $u.type "NewClusterWithIncrementalUpgrade" }}
{{- if not (include "splitserve.autoscaling" .) }}
{{- fail "upgradeStrategy NewClusterWithIncrementalUpgrade needs KubeRay's autoscaler: set config.autoscaling" }}
{{- end }}
{{- $o := default (dict) $u.clusterUpgradeOptions }}
{{- if not (and $o.gatewayClassName $o.stepSizePercent $o.intervalSeconds) }}
{{- fail "upgradeStrategy NewClusterWithIncrementalUpgrade needs clusterUpgradeOptions.gatewayClassName, stepSizePercent and intervalSeconds" }}
{{- end }}
{{- if .Values.ingress.enabled }}
{{- fail "upgradeStrategy NewClusterWithIncrementalUpgrade routes through KubeRay's Gateway (clusterUpgradeOptions.gatewayClassName), not an Ingress: set ingress.enabled=false" }}
{{- end }}
clusterUpgradeOptions:
  {{- toYaml $o | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The pods' terminationGracePeriodSeconds: config.router.shutdown_grace_s (how long `splitserve
serve` gives requests in flight after SIGTERM; 20 when unset, as in splitserve.config) rounded up,
plus 30 s to stop Serve, the engines and Ray after the drain. Mirrors
splitserve.k8s.kserve.termination_grace_period_s.
*/}}
{{- define "splitserve.terminationGracePeriodSeconds" -}}
{{- $cfg := include "splitserve.config" . | fromYaml }}
{{- add (int (ceil (dig "router" "shutdown_grace_s" 20.0 $cfg))) 30 }}
{{- end }}

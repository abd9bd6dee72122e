{{/*
Models: config.model.path as a model URI, the pvc:// claim's mount, and the shared model cache
(values modelCache). Mirrors splitserve.models.uri / splitserve.models.cache and
splitserve.k8s.layout (tests/k8s/test_model_cache.py renders and compares).
*/}}

{{/*
config.model.path parsed as splitserve.models.uri.parse_model_uri does (the config refuses a
malformed one before it gets here): JSON {scheme, location, revision, root}; scheme "" for the
built-in tiny model (path null), "local" for a directory, "hf" also for a plain hub id.
*/}}
{{- define "splitserve.modelUri" -}}
{{- $path := toString (default "" .Values.config.model.path) }}
{{- $u := dict "scheme" "" "location" "" "revision" "" }}
{{- if eq $path "" }}
{{- else if contains "://" $path }}
{{- $parts := splitn "://" 2 $path }}
{{- $_ := set $u "scheme" $parts._0 }}
{{- $_ := set $u "location" (trimSuffix "/" $parts._1) }}
{{- else if or (hasPrefix "/" $path) (hasPrefix "." $path) (hasPrefix "~" $path) }}
{{- $u = dict "scheme" "local" "location" $path "revision" "" }}
{{- else }}
{{- $_ := set $u "scheme" "hf" }}
{{- $_ := set $u "location" $path }}
{{- end }}
{{- if eq $u.scheme "hf" }}
{{- $r := splitn "@" 2 $u.location }}
{{- $_ := set $u "location" $r._0 }}
{{- $_ := set $u "revision" (default "" $r._1) }}
{{- end }}
{{- $_ := set $u "root" (first (splitList "/" $u.location)) }}
{{- toJson $u }}
{{- end }}

{{/*
The URI KServe fetches (storageUri, model.uri): hf as hf://ORG/NAME[:REVISION], s3/gs/pvc as
written, "" for a local directory or the tiny model. Mirrors splitserve.models.uri.kserve_uri.
*/}}
{{- define "splitserve.kserveModelUri" -}}
{{- $u := include "splitserve.modelUri" . | fromJson }}
{{- if eq $u.scheme "hf" }}
{{- printf "hf://%s" $u.location }}{{ with $u.revision }}:{{ . }}{{ end }}
{{- else if has $u.scheme (list "s3" "gs" "pvc") }}
{{- printf "%s://%s" $u.scheme $u.location }}
{{- end }}
{{- end }}

{{/*
"true" when the RayService pods use the shared model cache (modelCache.enabled, kserve.mode none).
*/}}
{{- define "splitserve.modelCacheOn" -}}
{{- if and .Values.modelCache.enabled (eq .Values.kserve.mode "none") }}true{{ end }}
{{- end }}

{{- define "splitserve.modelCacheClaim" -}}
{{- default (printf "%s-model-cache" (include "splitserve.fullname" .)) .Values.modelCache.existingClaim }}
{{- end }}

{{/*
Environment of a pod on the model cache (JSON list); call with (list $ offline). Engines are
offline (HF_HUB_OFFLINE=1: the hub repo is loaded from the cache, never looked up); the download
Job is not. Mirrors splitserve.models.cache.cache_env.
*/}}
{{- define "splitserve.modelCacheEnv" -}}
{{- $root := index . 0 }}
{{- $env := list }}
{{- if include "splitserve.modelCacheOn" $root }}
{{- $env = list (dict "name" "SPLITSERVE_MODEL_CACHE" "value" "/mnt/model-cache") (dict "name" "HF_HOME" "value" "/mnt/model-cache/huggingface") }}
{{- if index . 1 }}{{ $env = append $env (dict "name" "HF_HUB_OFFLINE" "value" "1") }}{{ end }}
{{- end }}
{{- toJson $env }}
{{- end }}

{{/*
RayService pod volumes (YAML list items, possibly none): the model cache's claim, and the claim
of a pvc:// model (read-only), each mounted by splitserve.modelVolumeMounts.
*/}}
{{- define "splitserve.modelVolumes" -}}
{{- $u := include "splitserve.modelUri" . | fromJson }}
{{- if include "splitserve.modelCacheOn" . }}
- name: model-cache
  persistentVolumeClaim:
    claimName: {{ include "splitserve.modelCacheClaim" . }}
{{- end }}
{{- if eq $u.scheme "pvc" }}
- name: model-pvc
  persistentVolumeClaim:
    claimName: {{ $u.root }}
    readOnly: true
{{- end }}
{{- end }}

{{- define "splitserve.modelVolumeMounts" -}}
{{- $u := include "splitserve.modelUri" . | fromJson }}
{{- if include "splitserve.modelCacheOn" . }}
- name: model-cache
  mountPath: /mnt/model-cache
{{- end }}
{{- if eq $u.scheme "pvc" }}
- name: model-pvc
  mountPath: /mnt/pvc/{{ $u.root }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
Model checks that the values schema cannot express (splitserve k8s check reports the same).
*/}}
{{- define "splitserve.validateModel" -}}
{{- $u := include "splitserve.modelUri" . | fromJson }}
{{- if and (has $u.scheme (list "s3" "gs")) (eq .Values.kserve.mode "none") (not .Values.modelCache.enabled) }}
{{- fail (printf "config.model.path %s is read from the model cache: set modelCache.enabled=true (its Job downloads the model once, before the engines start)" .Values.config.model.path) }}
{{- end }}
{{- if and .Values.modelCache.enabled (ne .Values.kserve.mode "none") }}
{{- fail "modelCache is for the RayService (kserve.mode none); KServe fetches storageUri/model.uri itself: set modelCache.enabled=false" }}
{{- end }}
{{- end }}

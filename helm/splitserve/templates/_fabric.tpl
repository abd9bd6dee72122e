{{/*
The KV fabric's additions to an engine pod, as JSON {env, resources, capabilities, hostNetwork,
annotations}: the preset of config.kv_transfer.fabric (files/kv-fabric-presets.json, generated
from splitserve.k8s.fabric.PRESETS) combined with the kvFabric values. Empty in colocated mode
(no KV crosses pods). Mirrors splitserve.k8s.fabric.fabric_pod; tests/k8s/test_fabric.py
compares the two for every preset.
*/}}
{{- define "splitserve.kvFabric" -}}
{{- $cfg := .Values.config }}
{{- $v := default (dict) .Values.kvFabric }}
{{- $out := dict "env" (list) "resources" (dict) "capabilities" (list) "hostNetwork" false "annotations" (dict) }}
{{- if ne (default "disaggregated" $cfg.mode) "colocated" }}
{{- $kind := dig "kv_transfer" "fabric" "tcp" $cfg }}
{{- $preset := index (.Files.Get "files/kv-fabric-presets.json" | fromJson) $kind }}
{{- $env := list }}
{{- range $name, $value := $preset.env }}
{{- $env = append $env (dict "name" $name "value" $value) }}
{{- end }}
{{- if and $preset.ucx $v.netDevices }}
{{- $env = append $env (dict "name" "UCX_NET_DEVICES" "value" (toString $v.netDevices)) }}
{{- end }}
{{- if and $preset.ucx (not (kindIs "invalid" $v.gidIndex)) }}
{{- $env = append $env (dict "name" "UCX_IB_GID_INDEX" "value" (toString (int $v.gidIndex))) }}
{{- end }}
{{- range $v.env }}{{ $env = append $env . }}{{ end }}
{{- $resources := dict }}
{{- range $name, $n := (default $preset.resources $v.resources) }}
{{- $_ := set $resources $name (toString $n) }}
{{- end }}
{{- $ipcLock := ternary $preset.ipcLock $v.ipcLock (kindIs "invalid" $v.ipcLock) }}
{{- $_ := set $out "env" $env }}
{{- $_ := set $out "resources" $resources }}
{{- $_ := set $out "capabilities" (ternary (list "IPC_LOCK") (list) $ipcLock) }}
{{- $_ := set $out "hostNetwork" (default false $v.hostNetwork) }}
{{- with $v.networks }}{{ $_ := set $out "annotations" (dict "k8s.v1.cni.cncf.io/networks" (toString .)) }}{{ end }}
{{- end }}
{{- toJson $out }}
{{- end }}

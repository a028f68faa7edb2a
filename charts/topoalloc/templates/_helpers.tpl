{{/*
The objects come from files/*.yaml, the kustomize bases rendered by `make chart`; these helpers
apply the chart's values to them, as topoalloc/commands/installer/manifests.py and settings.py do
for `topoalloc install` (tests/install/test_chart.py holds the two outputs equal).
*/}}

{{/* ["file", ...]: the rendered bases a release is made of. */}}
{{- define "topoalloc.pieces" -}}
{{- $pieces := list (ternary "placement" "kubeadm" (eq .Values.mode "placement")) -}}
{{- if eq .Values.mode "secondary" }}{{ $pieces = append $pieces "secondary" }}{{ end -}}
{{- if eq .Values.certs "cert-manager" }}{{ $pieces = append $pieces "cert-manager" }}{{ end -}}
{{- if .Values.monitoring }}{{ $pieces = append $pieces "monitoring" }}{{ end -}}
{{- if and .Values.deviceClasses (.Capabilities.APIVersions.Has "resource.k8s.io/v1") -}}
{{- $pieces = append $pieces "deviceclasses" -}}
{{- end -}}
{{- toJson (append $pieces "agent") -}}
{{- end -}}

{{/* list DST SRC: SRC laid on DST in place, mappings merged key by key, anything else replaced
(false and 0 included, which sprig's merge functions would skip). */}}
{{- define "topoalloc.merge" -}}
{{- $dst := index . 0 -}}
{{- range $key, $value := index . 1 -}}
{{- if and (kindIs "map" $value) (kindIs "map" (index $dst $key)) -}}
{{- include "topoalloc.merge" (list (index $dst $key) $value) -}}
{{- else -}}
{{- $_ := set $dst $key (deepCopy $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* list BASE-TEXT SETTINGS...: the base file as shipped when no settings are given, else the
settings laid on it, as indented JSON (the installer writes the same bytes, so that the checksum
annotations agree). */}}
{{- define "topoalloc.configText" -}}
{{- $base := index . 0 -}}
{{- $layers := list -}}
{{- range $layer := rest . }}{{ if $layer }}{{ $layers = append $layers $layer }}{{ end }}{{ end -}}
{{- if $layers -}}
{{- $merged := fromYaml $base -}}
{{- range $layer := $layers }}{{ include "topoalloc.merge" (list $merged $layer) }}{{ end -}}
{{- toPrettyJson $merged -}}
{{- else -}}
{{- $base -}}
{{- end -}}
{{- end -}}

{{/* The gang webhooks' failurePolicy. */}}
{{- define "topoalloc.gangPolicy" -}}
{{- .Values.gangWebhookFailurePolicy | default (ternary "Fail" "Ignore" (eq .Values.mode "placement")) -}}
{{- end -}}

{{/* kube-scheduler's tag: the value, else the API server's version without a vendor suffix. */}}
{{- define "topoalloc.schedulerVersion" -}}
{{- .Values.scheduler.version | default (regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version) -}}
{{- end -}}

{{/* The two TLS Secrets' data (generate): kept from the cluster when both are there with one CA,
else a new CA and certificates. A JSON {secret: {file: base64}}. */}}
{{- define "topoalloc.tls" -}}
{{- $ns := "topoalloc-system" -}}
{{- $server := (lookup "v1" "Secret" $ns "topoalloc-allocator-tls").data | default dict -}}
{{- $client := (lookup "v1" "Secret" $ns "topoalloc-scheduler-client").data | default dict -}}
{{- $complete := and (index $server "tls.crt") (index $server "tls.key") (index $client "tls.crt") (index $client "tls.key") -}}
{{- if and $complete (index $server "ca.crt") (eq (index $server "ca.crt") (index $client "ca.crt" | default "")) -}}
{{- toJson (dict "topoalloc-allocator-tls" $server "topoalloc-scheduler-client" $client) -}}
{{- else -}}
{{- $names := list -}}
{{- range $service := list "topoalloc-allocator" "topoalloc-webhook" -}}
{{- $names = concat $names (list $service (printf "%s.%s" $service $ns) (printf "%s.%s.svc" $service $ns) (printf "%s.%s.svc.cluster.local" $service $ns)) -}}
{{- end -}}
{{- $ca := genCA "topoalloc-extender-ca" 3650 -}}
{{- $srv := genSignedCert (printf "topoalloc-allocator.%s.svc" $ns) nil $names 365 $ca -}}
{{- $cli := genSignedCert "kube-scheduler-extender-client" nil nil 365 $ca -}}
{{- $caCrt := $ca.Cert | b64enc -}}
{{- toJson (dict
  "topoalloc-allocator-tls" (dict "tls.crt" ($srv.Cert | b64enc) "tls.key" ($srv.Key | b64enc) "ca.crt" $caCrt)
  "topoalloc-scheduler-client" (dict "tls.crt" ($cli.Cert | b64enc) "tls.key" ($cli.Key | b64enc) "ca.crt" $caCrt)) -}}
{{- end -}}
{{- end -}}

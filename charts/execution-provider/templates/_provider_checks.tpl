{{- /*
  Render-time checks of the provider's values that the schema cannot express: where the security
  files come from, and the limiter bounds against each other.
*/ -}}

{{/* Exactly one security source: the whole Secret securitySecretName, or securitySources, whose
     projected paths are unique, never manifest.json, at most 32 in all, and include every file the
     manifest names (the TLS files and each grant key's file) and the supervisor key file when
     one is set. */}}
{{- define "ep.checkSecuritySources" -}}
{{- $p := .Values.provider -}}
{{- if and $p.securitySecretName $p.securitySources -}}
{{- fail "provider.securitySecretName and provider.securitySources are mutually exclusive" -}}
{{- end -}}
{{- if not (or $p.securitySecretName $p.securitySources) -}}
{{- fail "provider.securitySecretName or provider.securitySources is required" -}}
{{- end -}}
{{- if eq $p.supervisorKeyFile "manifest.json" -}}
{{- fail "provider.supervisorKeyFile: manifest.json is reserved for the security manifest" -}}
{{- end -}}
{{- with $p.securitySources -}}
  {{- $names := list -}}
  {{- $paths := list -}}
  {{- range . -}}
    {{- if has .name $names -}}{{- fail (printf "provider.securitySources: Secret %s is listed twice" .name) -}}{{- end -}}
    {{- $names = append $names .name -}}
    {{- $keys := list -}}
    {{- $source := .name -}}
    {{- range .items -}}
      {{- if has .key $keys -}}{{- fail (printf "provider.securitySources: key %s of Secret %s is projected twice" .key $source) -}}{{- end -}}
      {{- $keys = append $keys .key -}}
      {{- if eq .path "manifest.json" -}}{{- fail "provider.securitySources: manifest.json is reserved for the security manifest" -}}{{- end -}}
      {{- if has .path $paths -}}{{- fail (printf "provider.securitySources: path %s is projected twice" .path) -}}{{- end -}}
      {{- $paths = append $paths .path -}}
    {{- end -}}
  {{- end -}}
  {{- if gt (len $paths) 32 -}}{{- fail "provider.securitySources: at most 32 key mappings in total" -}}{{- end -}}
  {{- $manifest := fromJson ($p.securityManifest | default "{}") -}}
  {{- $needed := list -}}
  {{- range $field, $file := ($manifest.tls | default dict) -}}{{- $needed = append $needed $file -}}{{- end -}}
  {{- range ($manifest.keys | default list) -}}{{- if .file -}}{{- $needed = append $needed .file -}}{{- end -}}{{- end -}}
  {{- range $needed -}}
    {{- if not (has . $paths) -}}
      {{- fail (printf "provider.securitySources: the security manifest names %s, which no source projects" .) -}}
    {{- end -}}
  {{- end -}}
  {{- with $p.supervisorKeyFile -}}
    {{- if not (has . $paths) -}}
      {{- fail (printf "provider.securitySources: provider.supervisorKeyFile is %s, which no source projects" .) -}}
    {{- end -}}
  {{- end -}}
{{- end -}}
{{- end -}}

{{/* The per-client RPC bound may not exceed the global one (the provider refuses to start). */}}
{{- define "ep.checkLimiterBounds" -}}
{{- $p := .Values.provider -}}
{{- if and (not (kindIs "invalid" $p.maxConcurrentRPCs)) (not (kindIs "invalid" $p.maxConcurrentRPCsPerClient)) -}}
  {{- if gt (int $p.maxConcurrentRPCsPerClient) (int $p.maxConcurrentRPCs) -}}
    {{- fail "provider.maxConcurrentRPCsPerClient must not exceed provider.maxConcurrentRPCs" -}}
  {{- end -}}
{{- end -}}
{{- end -}}

{{/* A revision with `network: outbound` needs the egress that gives it: its template's
     networkPolicy.workloadProfiles entry (the executors' NetworkPolicy denies everything else). */}}
{{- define "ep.checkOutboundTemplates" -}}
{{- range $id, $template := .Values.templates -}}
  {{- range $key, $revision := $template.revisions -}}
    {{- if eq ($revision.execution.network | default "none") "outbound" -}}
      {{- $profile := index $.Values.networkPolicy.workloadProfiles $id | default dict -}}
      {{- if not $profile.egress -}}
        {{- fail (printf "templates.%s: revision %s asks for network: outbound, but networkPolicy.workloadProfiles.%s has no egress" $id $key $id) -}}
      {{- end -}}
    {{- end -}}
  {{- end -}}
{{- end -}}
{{- end -}}

{{/* Traces go to a collector the provider's NetworkPolicy lets it reach, and only there. */}}
{{- define "ep.checkOtlp" -}}
{{- $p := .Values.provider -}}
{{- if and $p.otlpEndpoint (not $p.otlpCollectorCIDRs) -}}
{{- fail "provider.otlpCollectorCIDRs: list where the collector of provider.otlpEndpoint is (the provider's egress is closed to everything else)" -}}
{{- end -}}
{{- if and $p.otlpCollectorCIDRs (not $p.otlpEndpoint) -}}
{{- fail "provider.otlpCollectorCIDRs is set without provider.otlpEndpoint" -}}
{{- end -}}
{{- end -}}

{{/* The port of the collector URL provider.otlpEndpoint: its own, else that of its scheme. */}}
{{- define "ep.otlpPort" -}}
{{- $url := urlParse .Values.provider.otlpEndpoint -}}
{{- $port := regexFind ":[0-9]+$" $url.host | trimPrefix ":" -}}
{{- if $port -}}{{ $port }}{{- else if eq $url.scheme "https" -}}443{{- else -}}80{{- end -}}
{{- end -}}

{{/* The switches that are always on: rendering without them would drop a safety net. */}}
{{- define "ep.checkSwitches" -}}
{{- if ne (toString .Values.networkPolicy.enabled) "true" -}}
{{- fail "networkPolicy.enabled must be true: executors are isolated by the chart's NetworkPolicies" -}}
{{- end -}}
{{- if ne (toString .Values.resourceGovernance.enabled) "true" -}}
{{- fail "resourceGovernance.enabled must be true: the namespace is bounded by the chart's quota" -}}
{{- end -}}
{{- end -}}

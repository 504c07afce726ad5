{{/* The release's base name: fullnameOverride, or "<release>-execution-provider". */}}
{{- define "ep.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-execution-provider" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The dedicated executor ServiceAccount: "<fullname>-executor", shortened with a hash when
     the fullname is long; it never equals the provider's. */}}
{{- define "ep.executorServiceAccount" -}}
{{- $full := include "ep.fullname" . -}}
{{- $name := "" -}}
{{- if le (len $full) 54 -}}
{{- $name = printf "%s-executor" $full -}}
{{- else -}}
{{- $name = printf "%s-%s-executor" ($full | trunc 45 | trimSuffix "-") (sha256sum $full | trunc 8) -}}
{{- end -}}
{{- if eq $name $full -}}
{{- fail "the executor ServiceAccount name must differ from the provider's" -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* The fixed capacity-ledger ConfigMap (DECISIONS 16: created here, never by the provider). */}}
{{- define "ep.ledgerName" -}}mecatl-execution-profile-allocations{{- end -}}

{{/* The capacity ledger's shards beside the root (shard 0): `<ledger>-1` … `-15`, comma separated. */}}
{{- define "ep.ledgerShardNames" -}}
{{- $root := include "ep.ledgerName" . -}}
{{- $names := list -}}
{{- range $index := untilStep 1 16 1 -}}
{{- $names = append $names (printf "%s-%d" $root $index) -}}
{{- end -}}
{{- join ", " $names -}}
{{- end -}}

{{- define "ep.authorityName" -}}{{ include "ep.fullname" . }}-security-authority{{- end -}}

{{- define "ep.labels" -}}
app.kubernetes.io/name: {{ include "ep.fullname" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ep.selector" -}}
app.kubernetes.io/name: {{ include "ep.fullname" . }}
{{- end -}}

{{/* Metadata of objects that outlive the release (uninstall keeps them). Fails the render when
     a live object of that name belongs to someone else or is being deleted. Call with
     (dict "root" $ "kind" "ConfigMap" "apiVersion" "v1" "name" $name). */}}
{{- define "ep.retainedMetadata" -}}
{{- $root := .root -}}
{{- $live := lookup .apiVersion .kind $root.Release.Namespace .name -}}
{{- if $live -}}
{{- $annotations := $live.metadata.annotations | default dict -}}
{{- $labels := $live.metadata.labels | default dict -}}
{{- if or $live.metadata.deletionTimestamp (ne (index $labels "app.kubernetes.io/managed-by" | default "") "Helm") (ne (index $annotations "meta.helm.sh/release-name" | default "") $root.Release.Name) (ne (index $annotations "meta.helm.sh/release-namespace" | default "") $root.Release.Namespace) -}}
{{- fail (printf "%s %s: foreign or ambiguous Helm ownership" .kind .name) -}}
{{- end -}}
{{- end -}}
name: {{ .name }}
namespace: {{ $root.Release.Namespace }}
labels:
  {{- include "ep.labels" $root | nindent 2 }}
annotations:
  helm.sh/resource-policy: keep
  meta.helm.sh/release-name: {{ $root.Release.Name }}
  meta.helm.sh/release-namespace: {{ $root.Release.Namespace }}
{{- end -}}

{{/* The templates file the provider reads. */}}
{{- define "ep.templatesYaml" -}}
{{- dict "templates" .Values.templates | toYaml -}}
{{- end -}}

{{/* Every RuntimeClass and StorageClass any revision names (for the preflight ClusterRole). */}}
{{- define "ep.clusterClasses" -}}
{{- $runtime := list -}}
{{- $storage := list -}}
{{- range $id, $template := .Values.templates -}}
{{- range $key, $revision := $template.revisions -}}
{{- $runtime = append $runtime $revision.execution.runtimeClassName -}}
{{- $storage = append $storage $revision.execution.storageClass -}}
{{- end -}}
{{- end -}}
{{- dict "runtime" ($runtime | uniq | sortAlpha) "storage" ($storage | uniq | sortAlpha) | toJson -}}
{{- end -}}

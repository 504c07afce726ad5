{{- /*
  The upgrade and lifetime guard (k8s-executor §5.3) as a function of the live objects, so that
  templates/lifetime-check.yaml gathers them with `lookup` and a render test can hand it any
  state. Call with (dict "root" $ "live" $live); $live holds:
    deployment, templatesMap, legacyProfiles, manifestMap, authorityMap, ledger, executorAccount:
      the object of that name, or an empty dict;
    ledgerShards: the ledger's shards 1 … 15 (each an object or an empty dict);
    pods, pvcs, environments, networkPolicies: lists of the namespace's objects.
  It fails the render; it creates nothing.
*/ -}}
{{- define "ep.lifetimeGuard" -}}
{{- $root := .root -}}
{{- $live := .live -}}
{{- $full := include "ep.fullname" $root -}}
{{- $environmentLabel := "execution.mecatl.dev/environment" -}}
{{- $workloadPods := list -}}
{{- $providerPods := list -}}
{{- range $live.pods -}}
  {{- $labels := .metadata.labels | default dict -}}
  {{- if hasKey $labels $environmentLabel -}}{{- $workloadPods = append $workloadPods . -}}{{- end -}}
  {{- if eq (index $labels "app.kubernetes.io/name" | default "") $full -}}{{- $providerPods = append $providerPods . -}}{{- end -}}
{{- end -}}
{{- $workloadPVCs := list -}}
{{- range $live.pvcs -}}
  {{- if hasKey (.metadata.labels | default dict) $environmentLabel -}}{{- $workloadPVCs = append $workloadPVCs . -}}{{- end -}}
{{- end -}}
{{- /* A slot anywhere in the ledger (the root or any shard) is in use: a `.slots` entry with a slot
     or an overflow name, an entry that does not parse (refuse rather than guess), or an entry of
     the format before sharding (a JSON array of names) other than an empty one. */ -}}
{{- $ledgerInUse := false -}}
{{- range $map := prepend ($live.ledgerShards | default list) ($live.ledger | default dict) -}}
  {{- range $key, $value := (($map | default dict).data | default dict) -}}
    {{- if hasSuffix ".slots" $key -}}
      {{- $entry := fromJson $value -}}
      {{- if or (hasKey $entry "Error") ($entry.slots | default list) ($entry.overflow | default list) -}}
        {{- $ledgerInUse = true -}}
      {{- end -}}
    {{- else if ne $value "[]" -}}
      {{- $ledgerInUse = true -}}
    {{- end -}}
  {{- end -}}
{{- end -}}
{{- $prune := $root.Values.maintenance.pruneRevisions | default dict -}}
{{- $policies := dict -}}
{{- range $live.networkPolicies -}}{{- $_ := set $policies .metadata.name . -}}{{- end -}}
{{- $denyName := printf "%s-workload-default-deny" $full -}}
{{- if $live.legacyProfiles -}}
  {{- fail (printf "ConfigMap %s-profiles of an earlier layout exists: an in-place upgrade is not possible" $full) -}}
{{- end -}}
{{- $old := dict -}}
{{- if $live.templatesMap -}}
  {{- if and $live.deployment (gt (int ($live.deployment.spec.replicas | default 0)) 0) -}}
    {{- fail "quiesce the execution provider: scale the Deployment to 0 before upgrading" -}}
  {{- end -}}
  {{- if $providerPods -}}
    {{- fail (printf "quiesce the execution provider: provider Pod %s still exists" (index $providerPods 0).metadata.name) -}}
  {{- end -}}
  {{- $lifetime := index ($live.templatesMap.data | default dict) "lifetime.json" | default "" -}}
  {{- if not $lifetime -}}
    {{- fail (printf "ConfigMap %s-templates has no lifetime.json" $full) -}}
  {{- end -}}
  {{- $old = fromJson $lifetime -}}
  {{- include "ep.lifetimeNetworkGuard" (dict "root" $root "old" $old "workloadPods" $workloadPods) -}}
  {{- include "ep.lifetimeDefinitionGuard" (dict "root" $root "old" $old "live" $live "workloadPods" $workloadPods "workloadPVCs" $workloadPVCs "ledgerInUse" $ledgerInUse) -}}
  {{- if not $live.executorAccount -}}
    {{- fail "the executor ServiceAccount is missing: bootstrap is forbidden on upgrade" -}}
  {{- end -}}
  {{- if not $live.ledger -}}
    {{- fail "the capacity ledger ConfigMap is missing: bootstrap is forbidden on upgrade" -}}
  {{- end -}}
  {{- if not (hasKey $policies $denyName) -}}
    {{- fail "the executor default-deny NetworkPolicy is missing: bootstrap is forbidden on upgrade" -}}
  {{- end -}}
{{- else -}}
  {{- range $name, $policy := $policies -}}
    {{- if or (eq $name $denyName) (hasPrefix (printf "%s-profile-" $full) $name) -}}
      {{- fail (printf "orphan executor NetworkPolicy %s without the templates ConfigMap: foreign or broken install" $name) -}}
    {{- end -}}
  {{- end -}}
{{- end -}}
{{- if or $ledgerInUse $live.environments $workloadPods $workloadPVCs $prune -}}
  {{- include "ep.lifetimeRetainedGuard" (dict "root" $root "old" $old "live" $live "policies" $policies) -}}
{{- end -}}
{{- end -}}

{{/* Network configuration: byte-identical apart from workloadProfiles (and the constant
     switch); existing profiles immutable; a new profile only for a new template id that no
     existing Pod carries. */}}
{{- define "ep.lifetimeNetworkGuard" -}}
{{- $root := .root -}}
{{- $old := .old -}}
{{- $oldPolicy := omit ($old.networkPolicy | default dict) "workloadProfiles" "enabled" -}}
{{- $newPolicy := omit $root.Values.networkPolicy "workloadProfiles" "enabled" -}}
{{- if ne (toJson $oldPolicy) (toJson $newPolicy) -}}
  {{- fail "networkPolicy (apart from new workloadProfiles) is immutable" -}}
{{- end -}}
{{- $oldProfiles := $old.networkPolicy.workloadProfiles | default dict -}}
{{- range $id, $profile := $oldProfiles -}}
  {{- if ne (toJson $profile) (toJson (index $root.Values.networkPolicy.workloadProfiles $id | default dict)) -}}
    {{- fail (printf "networkPolicy.workloadProfiles.%s is immutable" $id) -}}
  {{- end -}}
{{- end -}}
{{- range $id, $profile := $root.Values.networkPolicy.workloadProfiles -}}
  {{- if not (hasKey $oldProfiles $id) -}}
    {{- if hasKey ($old.definitions | default dict) $id -}}
      {{- fail (printf "networkPolicy.workloadProfiles.%s: egress may be added only with a new template id, not to the existing template %s" $id $id) -}}
    {{- end -}}
    {{- $hash := sha256sum $id | trunc 16 -}}
    {{- range $.workloadPods -}}
      {{- if eq (index (.metadata.labels | default dict) "execution.mecatl.dev/template-id" | default "") $hash -}}
        {{- fail (printf "networkPolicy.workloadProfiles.%s: Pod %s already runs this template id" $id .metadata.name) -}}
      {{- end -}}
    {{- end -}}
  {{- end -}}
{{- end -}}
{{- end -}}

{{/* Every historical (id, revision) stays byte-identical, unless maintenance.pruneRevisions names
     it; pruning needs an observed scaled-to-zero provider, an empty ledger and an empty
     namespace. */}}
{{- define "ep.lifetimeDefinitionGuard" -}}
{{- $root := .root -}}
{{- $live := .live -}}
{{- $prune := $root.Values.maintenance.pruneRevisions | default dict -}}
{{- range $id, $template := (.old.definitions | default dict) -}}
  {{- range $key, $revision := $template.revisions -}}
    {{- $new := index $root.Values.templates $id | default dict -}}
    {{- $newRevision := index ($new.revisions | default dict) $key | default dict -}}
    {{- $pruned := has $key (index $prune $id | default list) -}}
    {{- if and (not $pruned) (ne (toJson $revision.execution) (toJson ($newRevision.execution | default dict))) -}}
      {{- fail (printf "template %s revision %s must stay present and unchanged (existing environments run on it); revoke it instead" $id $key) -}}
    {{- end -}}
  {{- end -}}
{{- end -}}
{{- range $id, $keys := $prune -}}
  {{- range $keys -}}
    {{- if not (hasKey ((index ($.old.definitions | default dict) $id | default dict).revisions | default dict) .) -}}
      {{- fail (printf "maintenance.pruneRevisions.%s: revision %s was never installed" $id .) -}}
    {{- end -}}
  {{- end -}}
{{- end -}}
{{- if $prune -}}
  {{- if not (and $live.deployment (eq (int ($live.deployment.spec.replicas | default 0)) 0)) -}}
    {{- fail "maintenance.pruneRevisions needs the provider Deployment observed scaled to 0" -}}
  {{- end -}}
  {{- if or (not $live.ledger) .ledgerInUse -}}
    {{- fail "maintenance.pruneRevisions needs the capacity ledger present with every entry empty" -}}
  {{- end -}}
  {{- if or $live.environments $live.pods $live.pvcs -}}
    {{- fail "maintenance.pruneRevisions needs a namespace without ExecutionEnvironments, Pods and PVCs" -}}
  {{- end -}}
{{- end -}}
{{- end -}}

{{/* With anything retained (ledger slots, environments, executor Pods or PVCs, a prune), what
     the retained objects depend on must already exist: bootstrap is forbidden. (The default-deny
     policy is checked on every upgrade; without the templates ConfigMap this fails earlier.) */}}
{{- define "ep.lifetimeRetainedGuard" -}}
{{- $root := .root -}}
{{- $live := .live -}}
{{- $full := include "ep.fullname" $root -}}
{{- $account := $live.executorAccount -}}
{{- if or (not $account) (ne (toString $account.automountServiceAccountToken) "false") $account.imagePullSecrets -}}
  {{- fail "the executor ServiceAccount must exist, tokenless and without pull secrets: bootstrap is forbidden" -}}
{{- end -}}
{{- range $what, $map := dict "templates" $live.templatesMap "security-manifest" $live.manifestMap "security-authority" $live.authorityMap "capacity ledger" $live.ledger -}}
  {{- if not (and $map $map.data) -}}
    {{- fail (printf "the %s ConfigMap is missing or empty: bootstrap is forbidden" $what) -}}
  {{- end -}}
{{- end -}}
{{- if not (hasKey $live.authorityMap.data "state.json") -}}
  {{- fail "the security-authority ConfigMap has no state.json: bootstrap is forbidden" -}}
{{- end -}}
{{- range $id, $profile := (.old.networkPolicy | default dict).workloadProfiles | default dict -}}
  {{- $name := printf "%s-profile-%s" $full (sha256sum $id | trunc 16) -}}
  {{- if not (hasKey $.policies $name) -}}
    {{- fail (printf "the NetworkPolicy %s of workload profile %s is missing: bootstrap is forbidden" $name $id) -}}
  {{- end -}}
{{- end -}}
{{- end -}}

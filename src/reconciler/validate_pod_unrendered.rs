//! The fields of an executor Pod the provider does not render: each security-relevant one is
//! refused when set (an admission webhook adding `envFrom: secretRef`, a host namespace or a
//! host path must not get its Pod adopted); what the API server, the scheduler and admission
//! plugins default is accepted.
//!
//! Refused on the Pod: `hostNetwork`, `hostPID`, `hostIPC`, `shareProcessNamespace`,
//! `hostUsers: true`, `securityContext.sysctls`, `supplementalGroups`, `seLinuxOptions`,
//! `windowsOptions`, an
//! `appArmorProfile` other than `RuntimeDefault`, a localhost seccomp profile, `dnsConfig`, a
//! `dnsPolicy` other than `ClusterFirst`, `hostAliases`, `resourceClaims`, a `schedulerName`
//! other than `default-scheduler`. Refused on the container: `args`, `env`, `envFrom`,
//! `workingDir`, `ports`, any probe, `lifecycle`, `stdin`/`stdinOnce`/`tty`, a container
//! `restartPolicy`, `volumeDevices`, a mount's `mountPropagation`, `subPathExpr` or
//! `recursiveReadOnly`, and in its security context a `seccompProfile` or `appArmorProfile`
//! other than `RuntimeDefault`, a `procMount` other than `Default`, a `runAsGroup` other than
//! the executor's, `seLinuxOptions` and `windowsOptions`. Extra containers and volumes, added
//! capabilities, `privileged`, escalation and host paths are refused by the rendered-field
//! checks.
//!
//! Accepted (defaulted or set by the control plane): `nodeName`, `priority`,
//! `priorityClassName`, `preemptionPolicy`, `overhead` (RuntimeClass admission),
//! `terminationMessagePath`/`Policy`, `schedulerName: default-scheduler`,
//! `dnsPolicy: ClusterFirst`, `procMount: Default`, `supplementalGroupsPolicy` and
//! `seLinuxChangePolicy` (they only choose how the kubelet applies groups and labels).

use k8s_openapi::api::core::v1::{Container, PodSpec, SecurityContext};

use super::render::EXECUTOR_UID;

/// The Pod-level fields the provider does not render.
pub fn validate_pod_fields(pod: &PodSpec) -> Result<(), &'static str> {
    if [pod.host_network, pod.host_pid, pod.host_ipc].contains(&Some(true)) {
        return Err("pod shares a host namespace");
    }
    if pod.share_process_namespace == Some(true) {
        return Err("pod shares its process namespace");
    }
    if pod.host_users == Some(true) {
        return Err("pod runs in the host user namespace");
    }
    if let Some(context) = pod.security_context.as_ref() {
        if context.sysctls.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err("pod sets sysctls");
        }
        if context
            .supplemental_groups
            .as_ref()
            .is_some_and(|g| !g.is_empty())
        {
            return Err("pod adds supplemental groups");
        }
        if context.se_linux_options.is_some() || context.windows_options.is_some() {
            return Err("pod sets SELinux or Windows options");
        }
        if !runtime_default_or_unset(context.app_armor_profile.as_ref().map(|p| &p.type_)) {
            return Err("pod AppArmor profile differs");
        }
        if context
            .seccomp_profile
            .as_ref()
            .is_some_and(|p| p.localhost_profile.is_some())
        {
            return Err("pod security context differs");
        }
    }
    if pod.dns_config.is_some()
        || pod
            .dns_policy
            .as_deref()
            .is_some_and(|p| p != "ClusterFirst")
        || pod.host_aliases.as_ref().is_some_and(|h| !h.is_empty())
    {
        return Err("pod DNS or host aliases differ");
    }
    if pod.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err("pod claims devices");
    }
    if pod
        .scheduler_name
        .as_deref()
        .is_some_and(|s| s != "default-scheduler")
    {
        return Err("pod scheduler differs");
    }
    Ok(())
}

/// The container fields the provider does not render.
pub fn validate_container_fields(container: &Container) -> Result<(), &'static str> {
    let listed = |v: Option<usize>| v.is_some_and(|n| n > 0);
    if listed(container.args.as_ref().map(Vec::len))
        || container
            .working_dir
            .as_deref()
            .is_some_and(|d| !d.is_empty())
    {
        return Err("executor container arguments or working directory differ");
    }
    if listed(container.env.as_ref().map(Vec::len))
        || listed(container.env_from.as_ref().map(Vec::len))
    {
        return Err("executor container environment differs");
    }
    if listed(container.ports.as_ref().map(Vec::len)) {
        return Err("executor container exposes ports");
    }
    if container.liveness_probe.is_some()
        || container.readiness_probe.is_some()
        || container.startup_probe.is_some()
        || container.lifecycle.is_some()
    {
        return Err("executor container has probes or lifecycle hooks");
    }
    if [container.stdin, container.stdin_once, container.tty].contains(&Some(true)) {
        return Err("executor container takes a terminal or stdin");
    }
    if container.restart_policy.is_some() {
        return Err("executor container restart policy differs");
    }
    if listed(container.volume_devices.as_ref().map(Vec::len)) {
        return Err("executor container has volume devices");
    }
    let odd_mount = container.volume_mounts.iter().flatten().any(|m| {
        m.mount_propagation.as_deref().is_some_and(|p| p != "None")
            || m.sub_path_expr.as_deref().is_some_and(|p| !p.is_empty())
            || m.recursive_read_only.is_some()
    });
    if odd_mount {
        return Err("executor volume mounts differ");
    }
    match container.security_context.as_ref() {
        Some(context) => validate_container_context(context),
        None => Ok(()),
    }
}

fn validate_container_context(context: &SecurityContext) -> Result<(), &'static str> {
    let seccomp = context.seccomp_profile.as_ref();
    if !runtime_default_or_unset(seccomp.map(|p| &p.type_))
        || seccomp.is_some_and(|p| p.localhost_profile.is_some())
        || !runtime_default_or_unset(context.app_armor_profile.as_ref().map(|p| &p.type_))
    {
        return Err("executor seccomp or AppArmor profile differs");
    }
    if context
        .proc_mount
        .as_deref()
        .is_some_and(|m| m != "Default")
    {
        return Err("executor proc mount differs");
    }
    if context.run_as_group.is_some_and(|g| g != EXECUTOR_UID) {
        return Err("executor group differs");
    }
    if context.se_linux_options.is_some() || context.windows_options.is_some() {
        return Err("executor sets SELinux or Windows options");
    }
    Ok(())
}

fn runtime_default_or_unset(profile: Option<&String>) -> bool {
    profile.is_none_or(|p| p == "RuntimeDefault")
}

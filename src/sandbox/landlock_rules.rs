//! Landlock, the second layer under the mount namespace: even if a bind were writable or a
//! path reached something the mounts should hide, the init and everything it starts may only
//! read and execute the system directories, read `/proc` and `/dev`, and write the workspace,
//! `/tmp`, `/dev/shm` and the terminal devices. Signals and abstract UNIX sockets are scoped
//! to the sandbox (ABI 6).
//!
//! TCP: with no network, connect and bind are refused outright (the empty network namespace
//! already has no route). With the host's network, TCP connect is allowed to every port but
//! the provider's and TCP bind to none; that needs ABI 4, and signal and abstract-socket
//! scoping (ABI 6) too, since the sandbox then shares the host's abstract socket namespace:
//! without them the sandbox refuses to start. UDP is not covered by Landlock (see
//! `docs/sandbox.md`).

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};

use super::rootfs::{HELPER_PATH, HOST_SYSTEM_DIRS};
use super::{Network, SetupError, Step as _, WORKSPACE_PATH};

/// The newest ABI whose rights the sandbox asks for.
const ABI_USED: ABI = ABI::V6;

/// Applies the ruleset to this process (and so to everything it starts).
pub fn restrict(network: &Network) -> Result<(), SetupError> {
    let step = "applying Landlock";
    let all = AccessFs::from_all(ABI_USED);
    let read = AccessFs::from_read(ABI_USED);
    let devices = AccessFs::ReadFile
        | AccessFs::WriteFile
        | AccessFs::ReadDir
        | AccessFs::Truncate
        | AccessFs::IoctlDev;
    let tcp = AccessNet::ConnectTcp | AccessNet::BindTcp;
    let scopes = Scope::AbstractUnixSocket | Scope::Signal;
    let host_network = matches!(network, Network::HostExceptPorts(_));
    let required = if host_network {
        CompatLevel::HardRequirement
    } else {
        CompatLevel::BestEffort
    };
    let ruleset = Ruleset::default()
        .handle_access(all)
        .step(step)?
        .set_compatibility(required)
        .handle_access(tcp)
        .step(step)?
        .scope(scopes)
        .step(step)?
        .create()
        .step(step)?
        .add_rules(path_beneath_rules(["/"], AccessFs::ReadDir))
        .step(step)?
        .add_rules(path_beneath_rules(HOST_SYSTEM_DIRS, read))
        .step(step)?
        .add_rules(path_beneath_rules([HELPER_PATH], read))
        .step(step)?
        .add_rules(path_beneath_rules(
            ["/proc"],
            AccessFs::ReadFile | AccessFs::ReadDir,
        ))
        .step(step)?
        .add_rules(path_beneath_rules(["/dev"], devices))
        .step(step)?
        .add_rules(path_beneath_rules(
            [WORKSPACE_PATH, "/tmp", "/dev/shm"],
            all,
        ))
        .step(step)?;
    let ruleset = match network {
        Network::None => ruleset,
        Network::HostExceptPorts(refused) => ruleset
            .add_rules(allowed_connect_ports(refused).map(|port| {
                Ok::<_, landlock::RulesetError>(NetPort::new(port, AccessNet::ConnectTcp))
            }))
            .step(step)?,
    };
    let status = ruleset.restrict_self().step(step)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(SetupError::new(
            step,
            "this kernel does not enforce Landlock (CONFIG_SECURITY_LANDLOCK and `landlock` in the lsm= list are needed)",
        ));
    }
    Ok(())
}

/// Every TCP port but `refused` (and 0, which no connect names).
pub fn allowed_connect_ports(refused: &[u16]) -> impl Iterator<Item = u16> + '_ {
    (1..=u16::MAX).filter(move |port| !refused.contains(port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_rules_cover_every_port_but_the_refused_ones() {
        let allowed: Vec<u16> = allowed_connect_ports(&[7443, 1]).collect();
        assert_eq!(allowed.len(), usize::from(u16::MAX) - 2);
        assert!(!allowed.contains(&7443) && !allowed.contains(&1) && !allowed.contains(&0));
        assert!(allowed.contains(&7444) && allowed.contains(&u16::MAX));
    }
}

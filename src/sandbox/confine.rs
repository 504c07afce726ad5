//! The init stage's own confinement, besides the file system: parent-death signal, host
//! name, rlimits, `no_new_privs` and an empty capability state that `execve` cannot refill.

use rustix::process::{Resource, Rlimit, Signal};
use rustix::thread::{CapabilitiesSecureBits, CapabilitySet, CapabilitySets};

use super::{Limits, SetupError, Step as _};

/// Highest capability number probed when emptying the bounding set.
const LAST_CAPABILITY: u32 = 63;

/// SIGKILL when stage 2 (the parent) dies, so that killing the host stage ends the sandbox.
pub fn die_with_parent() -> Result<(), SetupError> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .step("tying the init to its parent")
}

/// The host name of the sandbox's UTS namespace.
pub fn set_hostname(name: &str) -> Result<(), SetupError> {
    let name: String = name.chars().take(64).collect();
    rustix::system::sethostname(name.as_bytes()).step("setting the host name")
}

/// File size, open files and core dumps; the process count too when no pids cgroup bounds the
/// sandbox.
pub fn set_rlimits(limits: &Limits, pids_cgroup: bool) -> Result<(), SetupError> {
    let exact = |value: u64| Rlimit {
        current: Some(value),
        maximum: Some(value),
    };
    rustix::process::setrlimit(Resource::Fsize, exact(limits.file_size))
        .step("setting RLIMIT_FSIZE")?;
    rustix::process::setrlimit(Resource::Nofile, exact(limits.open_files))
        .step("setting RLIMIT_NOFILE")?;
    rustix::process::setrlimit(Resource::Core, exact(0)).step("setting RLIMIT_CORE")?;
    if !pids_cgroup {
        rustix::process::setrlimit(Resource::Nproc, exact(u64::from(limits.pids)))
            .step("setting RLIMIT_NPROC")?;
    }
    Ok(())
}

/// `PR_SET_NO_NEW_PRIVS`: no `execve` grants privileges again (set-uid bits, file
/// capabilities); Landlock and seccomp also require it.
pub fn set_no_new_privs() -> Result<(), SetupError> {
    rustix::thread::set_no_new_privs(true).step("setting no_new_privs")
}

/// Empties the bounding, ambient, effective, permitted and inheritable sets and locks the
/// secure bits so that uid 0 of the namespace never regains a capability through `execve`.
pub fn drop_capabilities() -> Result<(), SetupError> {
    for bit in 0..=LAST_CAPABILITY {
        let capability = CapabilitySet::from_bits_retain(1 << bit);
        match rustix::thread::remove_capability_from_bounding_set(capability) {
            Ok(()) => {}
            // Numbers past the kernel's last capability.
            Err(rustix::io::Errno::INVAL) => break,
            Err(e) => return Err(SetupError::new("emptying the bounding set", e)),
        }
    }
    rustix::thread::clear_ambient_capability_set().step("clearing the ambient set")?;
    rustix::thread::set_capabilities_secure_bits(
        CapabilitiesSecureBits::NO_ROOT
            | CapabilitiesSecureBits::NO_ROOT_LOCKED
            | CapabilitiesSecureBits::NO_SETUID_FIXUP
            | CapabilitiesSecureBits::NO_SETUID_FIXUP_LOCKED
            | CapabilitiesSecureBits::KEEP_CAPS_LOCKED
            | CapabilitiesSecureBits::NO_CAP_AMBIENT_RAISE
            | CapabilitiesSecureBits::NO_CAP_AMBIENT_RAISE_LOCKED,
    )
    .step("locking the secure bits")?;
    let empty = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    rustix::thread::set_capabilities(None, empty).step("dropping capabilities")?;
    let now = rustix::thread::capabilities(None).step("reading capabilities")?;
    if !(now.effective.is_empty() && now.permitted.is_empty() && now.inheritable.is_empty()) {
        return Err(SetupError::new(
            "dropping capabilities",
            "capabilities remain",
        ));
    }
    Ok(())
}

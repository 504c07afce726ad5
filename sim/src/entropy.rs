//! Fixed hash-map keys in every process that links the simulator, so that iteration over a
//! standard `HashMap`/`HashSet` visits its entries in the same order in every run.
//!
//! Why: `kube-runtime`'s controller keeps the objects waiting to be reconciled in a standard
//! `HashSet` (`scheduler.rs`, `pending`) and its running reconciles in a standard `HashMap`
//! (`controller/future_hash_map.rs`); it starts and polls them in the sets' iteration order. The
//! standard library seeds every hash map from the operating system (`getrandom(2)` with
//! `GRND_INSECURE`, once per thread, then a counter), so that order changed from one process to
//! the next. A replica that restarts with several environments in the store holds them until
//! its cache is filled and then reconciles them all at once, in that random order: its calls
//! reach the API server in a different order and the rest of the run diverges (this is what
//! made `crash-restart` 1 give different traces in fresh processes).
//!
//! How: the standard library looks `getrandom` up as a weak symbol precisely so that it can be
//! interposed, and a definition in the executable takes precedence over the C library's. This
//! module defines it: a request with `GRND_INSECURE`, which the standard library makes only for
//! hash-map keys, gets fixed bytes; every other request (TLS randoms, key shares) goes to the
//! kernel unchanged. The keys are then the same in every thread of every run; a run that starts
//! on a fresh thread (see `crate::run`) also starts the per-thread counter afresh, so two runs in
//! one process see the same keys too.
//!
//! Only Linux on x86-64 and AArch64 (the CI and development machines) is covered; elsewhere the
//! hash-map order, and so a restarted replica's first reconciles, may differ between runs.
#![allow(unsafe_code)]

/// The byte every hash-map key is made of (any fixed value will do).
const KEY_BYTE: u8 = 0x5e;

/// `getrandom(2)`'s flag for "random bytes that need not be cryptographically secure", used by
/// the standard library for hash-map keys and by nothing else in the simulator.
const GRND_INSECURE: u32 = 0x0004;

/// The `getrandom(2)` system call number.
#[cfg(target_arch = "x86_64")]
const SYS_GETRANDOM: i64 = 318;
#[cfg(target_arch = "aarch64")]
const SYS_GETRANDOM: i64 = 278;

unsafe extern "C" {
    /// The C library's generic system call entry (returns -1 and sets `errno` on failure).
    fn syscall(number: i64, ...) -> i64;
}

/// `getrandom(2)`: fixed bytes for `GRND_INSECURE` requests, the kernel's for any other.
///
/// # Safety
///
/// As for `getrandom(2)`: `buf` must be valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getrandom(buf: *mut u8, len: usize, flags: u32) -> isize {
    if flags & GRND_INSECURE != 0 {
        // SAFETY: the caller guarantees `buf` is valid for `len` bytes.
        unsafe { std::ptr::write_bytes(buf, KEY_BYTE, len) };
        return isize::try_from(len).unwrap_or(isize::MAX);
    }
    // SAFETY: forwards the caller's arguments, under the caller's guarantees, to the kernel.
    let written = unsafe { syscall(SYS_GETRANDOM, buf, len, i64::from(flags)) };
    written as isize
}

/// Whether two fresh threads of this process get the same hash-map keys (false if the
/// interposition above stopped taking effect, e.g. because the standard library changed).
pub fn fixed_hash_keys() -> bool {
    // A fresh thread initialises its keys afresh, through `getrandom` above.
    let probe = || {
        use std::hash::BuildHasher;
        std::collections::hash_map::RandomState::new().hash_one(0_u8)
    };
    let here = std::thread::spawn(probe).join().expect("probe thread");
    let again = std::thread::spawn(probe).join().expect("probe thread");
    here == again
}

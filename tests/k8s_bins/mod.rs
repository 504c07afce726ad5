//! The cached control-plane binaries of the cluster and chart tests (kube-apiserver, etcd,
//! kwok, helm, ... built from Go modules by `tests/e2e/bin/build-bins.sh` into
//! `~/.cache/execution-provider/k8s`): where they are, whether they can be built on this
//! machine, and building them on first use with the script's progress on standard error.
//!
//! A test that needs them and cannot have them is reported *ignored* with the reason, never
//! passed; under CI (`CI` set) that is a failure instead.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The directory of the suite's scripts.
pub fn scripts() -> PathBuf {
    repo_root().join("tests/e2e/bin")
}

/// Whether CI runs us: there a test that cannot run fails.
pub fn under_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// A directory of `versions.sh` (`KUBE_DIR`, `ETCD_DIR`, `KWOK_DIR`, `HELM_DIR`), read the way
/// the scripts read it, so the cache layout is defined once.
pub fn cache_dir(variable: &str) -> Result<PathBuf, String> {
    let versions = scripts().join("versions.sh");
    let output = Command::new("bash")
        .arg("-c")
        .arg(format!("source \"$1\" && printf %s \"${variable}\""))
        .arg("versions")
        .arg(&versions)
        .output()
        .map_err(|e| format!("cannot run bash to read {}: {e}", versions.display()))?;
    let dir = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() || dir.is_empty() {
        return Err(format!("{} does not define {variable}", versions.display()));
    }
    Ok(PathBuf::from(dir))
}

/// Whether `program` is on `PATH`.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            let candidate = dir.join(program);
            candidate.is_file()
                && std::fs::metadata(&candidate).is_ok_and(|m| {
                    std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
                })
        })
    })
}

/// Why the binaries of `component` (`kube`, `etcd`, `kwok`, `helm`), missing from the cache,
/// cannot be built here; `None` when they are cached or can be built.
pub fn why_unbuildable(component: &str, binaries: &[PathBuf]) -> Option<String> {
    if binaries.iter().all(|b| b.is_file()) {
        return None;
    }
    if !on_path("go") {
        return Some(format!(
            "the {component} binaries are not built ({} is missing) and no Go toolchain is on PATH \
             to build them (tests/e2e/bin/build-bins.sh; see docs/e2e.md)",
            binaries
                .iter()
                .find(|b| !b.is_file())
                .map(|b| b.display().to_string())
                .unwrap_or_default()
        ));
    }
    None
}

/// Runs `build-bins.sh components...` with its output on standard error (the progress of a
/// build that can take many minutes the first time); the script builds only what is missing
/// and waits for another build of the same cache to finish.
pub fn build(components: &[&str]) -> Result<(), String> {
    eprintln!(
        "building the cached control-plane binaries ({}) with tests/e2e/bin/build-bins.sh; \
         the first build takes many minutes, later runs find the cache",
        components.join(", ")
    );
    let mut child = Command::new("bash")
        .arg(scripts().join("build-bins.sh"))
        .args(components)
        .stdout(std::process::Stdio::from(std::io::stderr()))
        .spawn()
        .map_err(|e| format!("cannot run build-bins.sh: {e}"))?;
    // Go prints nothing while it compiles; say every minute that the build goes on.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait());
    });
    let mut minutes = 0;
    let status = loop {
        match finished.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(status) => break status.map_err(|e| format!("build-bins.sh: {e}"))?,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                minutes += 1;
                eprintln!(
                    "build-bins: still building {} ({minutes} min so far)",
                    components.join(", ")
                );
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err("build-bins.sh: lost its waiter".to_owned());
            }
        }
    };
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "tests/e2e/bin/build-bins.sh {components:?} failed ({status})"
        ))
    }
}

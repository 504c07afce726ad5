//! The control plane one run of the suite uses, decided once at run time: the one named by
//! `E2E_KUBECONFIG` (CI starts one with `tests/e2e/bin/start-control-plane.sh` and exports its
//! env file), else one this process starts itself in a fresh work directory on free ports
//! (building the cached binaries first when they are missing) and stops when the suite ends.
//! Where that is impossible on this machine (not root, no Go toolchain to build the binaries,
//! no `openssl` or `curl` for the start script) every cluster test is reported *ignored* with
//! the reason; under CI it fails instead.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use crate::cluster::Cluster;
use crate::k8s_bins;

/// What the suite has to run against.
#[derive(Clone, Debug)]
pub enum Availability {
    /// A control plane that is up.
    Ready(Cluster),
    /// None can be had on this machine, and why (the tests are ignored).
    Impossible(String),
    /// Starting one was possible but failed (the tests fail).
    Broken(String),
}

static AVAILABILITY: OnceLock<Availability> = OnceLock::new();
/// The work directory of a control plane this process started, to stop at the end.
static STARTED: Mutex<Option<PathBuf>> = Mutex::new(None);

/// The control plane of this run, provisioned by the first test that asks (the others wait).
pub fn availability() -> Availability {
    AVAILABILITY.get_or_init(provision).clone()
}

/// Stops the control plane this process started, if any.
pub fn stop_if_started() {
    let Some(work) = STARTED.lock().expect("started lock").take() else {
        return;
    };
    eprintln!(
        "stopping the control plane this run started ({})",
        work.display()
    );
    let stopped = Command::new("bash")
        .arg(k8s_bins::scripts().join("stop-control-plane.sh"))
        .arg(&work)
        .status();
    if !stopped.is_ok_and(|s| s.success()) {
        eprintln!("stop-control-plane.sh {} failed", work.display());
    }
    let _ = std::fs::remove_dir_all(&work);
}

fn provision() -> Availability {
    match from_environment() {
        Ok(Some(cluster)) => return Availability::Ready(cluster),
        Ok(None) => {}
        Err(inconsistent) => return Availability::Broken(inconsistent),
    }
    if let Some(reason) = why_impossible() {
        if k8s_bins::under_ci() {
            return Availability::Broken(format!(
                "CI is set but no control plane can run: {reason}"
            ));
        }
        return Availability::Impossible(reason);
    }
    match start_own() {
        Ok(cluster) => Availability::Ready(cluster),
        Err(failure) => Availability::Broken(failure),
    }
}

/// The control plane named by the environment (`E2E_KUBECONFIG` and its companions).
fn from_environment() -> Result<Option<Cluster>, String> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let Some(kubeconfig) = var("E2E_KUBECONFIG") else {
        return Ok(None);
    };
    let required = |name: &str| {
        var(name)
            .map(PathBuf::from)
            .ok_or_else(|| format!("E2E_KUBECONFIG is set but {name} is not"))
    };
    Ok(Some(Cluster {
        kubeconfig: PathBuf::from(kubeconfig),
        kubectl: required("E2E_KUBECTL")?,
        helm: required("E2E_HELM")?,
        work: required("E2E_WORK")?,
    }))
}

/// The binaries start-control-plane.sh needs, by build-bins.sh component.
fn binaries() -> Result<Vec<(&'static str, Vec<PathBuf>)>, String> {
    let kube = k8s_bins::cache_dir("KUBE_DIR")?;
    Ok(vec![
        (
            "kube",
            [
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kubectl",
            ]
            .iter()
            .map(|b| kube.join(b))
            .collect(),
        ),
        ("etcd", vec![k8s_bins::cache_dir("ETCD_DIR")?.join("etcd")]),
        ("kwok", vec![k8s_bins::cache_dir("KWOK_DIR")?.join("kwok")]),
        ("helm", vec![k8s_bins::cache_dir("HELM_DIR")?.join("helm")]),
    ])
}

/// Why this machine cannot start a control plane, if it cannot.
fn why_impossible() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some(
            "starting a control plane needs root: kwok execs the helper at its image path \
             /mecatl-executor, which the start script links (or set E2E_KUBECONFIG; see docs/e2e.md)"
                .to_owned(),
        );
    }
    for tool in ["openssl", "curl"] {
        if !k8s_bins::on_path(tool) {
            return Some(format!(
                "tests/e2e/bin/start-control-plane.sh needs {tool}, which is not on PATH"
            ));
        }
    }
    let binaries = match binaries() {
        Ok(binaries) => binaries,
        Err(e) => return Some(e),
    };
    binaries
        .iter()
        .find_map(|(component, paths)| k8s_bins::why_unbuildable(component, paths))
}

/// Builds what is missing, starts a control plane in a fresh work directory on free ports
/// and reads the env file it writes.
fn start_own() -> Result<Cluster, String> {
    let missing: Vec<&str> = binaries()?
        .into_iter()
        .filter(|(_, paths)| !paths.iter().all(|p| p.is_file()))
        .map(|(component, _)| component)
        .collect();
    if !missing.is_empty() {
        k8s_bins::build(&missing)?;
    }
    let work = tempfile::Builder::new()
        .prefix("execution-provider-e2e.")
        .tempdir()
        .map_err(|e| format!("cannot make a work directory: {e}"))?
        .keep();
    *STARTED.lock().expect("started lock") = Some(work.clone());
    eprintln!(
        "no E2E_KUBECONFIG: starting a control plane for this run in {}",
        work.display()
    );
    let mut start = Command::new("bash");
    start
        .arg(k8s_bins::scripts().join("start-control-plane.sh"))
        .env("E2E_WORK", &work)
        .stdout(std::process::Stdio::from(std::io::stderr()));
    for (variable, port) in free_ports()? {
        start.env(variable, port.to_string());
    }
    let status = start
        .status()
        .map_err(|e| format!("cannot run start-control-plane.sh: {e}"))?;
    if !status.success() {
        return Err(format!(
            "tests/e2e/bin/start-control-plane.sh failed ({status}); its logs are above"
        ));
    }
    let env = read_env_file(&work.join("env"))?;
    let get = |key: &str| {
        env.get(key)
            .map(PathBuf::from)
            .ok_or_else(|| format!("{} has no {key}", work.join("env").display()))
    };
    Ok(Cluster {
        kubeconfig: get("E2E_KUBECONFIG")?,
        kubectl: get("E2E_KUBECTL")?,
        helm: get("E2E_HELM")?,
        work: get("E2E_WORK")?,
    })
}

/// Ports nothing listens on now, one per component, so a control plane started here does not
/// collide with another on this machine (the script's defaults are fixed).
fn free_ports() -> Result<Vec<(&'static str, u16)>, String> {
    let variables = [
        "E2E_ETCD_PORT",
        "E2E_ETCD_PEER_PORT",
        "E2E_API_PORT",
        "E2E_KCM_PORT",
        "E2E_SCHED_PORT",
        "E2E_KWOK_PORT",
    ];
    // Every listener is held until all ports are drawn, so no two are the same.
    let listeners = variables
        .iter()
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot find a free port: {e}"))?;
    variables
        .iter()
        .zip(&listeners)
        .map(|(variable, listener)| {
            let port = listener
                .local_addr()
                .map_err(|e| format!("cannot find a free port: {e}"))?
                .port();
            Ok((*variable, port))
        })
        .collect()
}

/// The `export KEY='value'` lines start-control-plane.sh writes.
pub fn read_env_file(path: &Path) -> Result<BTreeMap<String, String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|line| line.strip_prefix("export ")?.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.trim_matches('\'').to_owned()))
        .collect())
}

//! The real control plane the suite runs against (provisioned by `control_plane`), with
//! `kubectl` and `helm` runners, kube clients for the admin and for service-account tokens,
//! one namespace per test, and the CRD installed once per run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::ObjectMeta;
use tokio::sync::OnceCell;

/// Where the chart lives, relative to the repository root.
pub const CHART_DIR: &str = "charts/execution-provider";

/// The started control plane.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// The admin kubeconfig (client certificate in `system:masters`).
    pub kubeconfig: PathBuf,
    /// The `kubectl` built with the control plane.
    pub kubectl: PathBuf,
    /// The `helm` built from its Go module.
    pub helm: PathBuf,
    /// The control plane's work directory (logs, PKI, workspaces).
    pub work: PathBuf,
}

/// The repository root.
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// What a finished command printed.
#[derive(Debug)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    pub success: bool,
}

/// Runs `program args`, with `stdin` when given, and returns what it printed.
pub async fn run(program: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    use tokio::io::AsyncWriteExt as _;
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .stdin(if stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).await.unwrap();
    }
    let out = child.wait_with_output().await.unwrap();
    Output {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        success: out.status.success(),
    }
}

impl Cluster {
    /// `kubectl --kubeconfig <admin> args`; panics with its output when it fails.
    pub async fn kubectl(&self, args: &[&str]) -> String {
        self.kubectl_with(&self.kubeconfig, args, None).await
    }

    /// `kubectl` as the identity of `kubeconfig`, with optional stdin; panics when it fails.
    pub async fn kubectl_with(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        stdin: Option<&str>,
    ) -> String {
        let config = format!("--kubeconfig={}", kubeconfig.display());
        let full: Vec<&str> = std::iter::once(config.as_str())
            .chain(args.iter().copied())
            .collect();
        let out = run(&self.kubectl, &full, stdin).await;
        assert!(
            out.success,
            "kubectl {args:?} failed: {}{}",
            out.stdout, out.stderr
        );
        out.stdout
    }

    /// `helm --kubeconfig <admin> args`; panics with its output when it fails.
    pub async fn helm(&self, args: &[&str]) -> String {
        let config = format!("--kubeconfig={}", self.kubeconfig.display());
        let full: Vec<&str> = std::iter::once(config.as_str())
            .chain(args.iter().copied())
            .collect();
        let out = run(&self.helm, &full, None).await;
        assert!(
            out.success,
            "helm {args:?} failed: {}{}",
            out.stdout, out.stderr
        );
        out.stdout
    }

    /// A kube client with the admin's credentials.
    pub async fn admin_client(&self) -> kube::Client {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// Installs the chart's CRD once per test run and waits until it is established.
    pub async fn install_crd(&self) {
        static INSTALLED: OnceCell<()> = OnceCell::const_new();
        INSTALLED
            .get_or_init(|| async {
                let crd = repo_root()
                    .join(CHART_DIR)
                    .join("crds/executionenvironment.yaml");
                self.kubectl(&["apply", "--server-side", "-f", &crd.to_string_lossy()])
                    .await;
                self.kubectl(&[
                    "wait",
                    "--for=condition=Established",
                    "--timeout=60s",
                    "crd/executionenvironments.execution.mecatl.dev",
                ])
                .await;
            })
            .await;
    }

    /// Creates a fresh namespace for one test (Pod Security `restricted` enforced, as the chart
    /// expects) and waits for its default ServiceAccount.
    pub async fn namespace(&self, test: &str) -> TestNamespace {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let mut name = format!(
            "e2e-{}-{:x}{}",
            test.replace('_', "-"),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        name.truncate(63);
        let name = name.trim_end_matches('-').to_owned();
        let client = self.admin_client().await;
        let labels = ["enforce", "audit", "warn"]
            .into_iter()
            .map(|mode| {
                (
                    format!("pod-security.kubernetes.io/{mode}"),
                    "restricted".to_owned(),
                )
            })
            .collect();
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("cannot create namespace {name}: {e}"));
        let accounts = Api::<ServiceAccount>::namespaced(client.clone(), &name);
        eventually(
            Duration::from_secs(60),
            "the namespace's default ServiceAccount",
            || {
                let accounts = accounts.clone();
                async move { accounts.get_opt("default").await.ok().flatten() }
            },
        )
        .await;
        TestNamespace { name, client }
    }
}

/// One test's namespace; [`TestNamespace::delete`] removes it with everything in it.
pub struct TestNamespace {
    pub name: String,
    pub client: kube::Client,
}

impl TestNamespace {
    /// Asks for the namespace's deletion without waiting: environments keep their finalizers
    /// once no provider runs (the workspace is retained by design), and stopping the control
    /// plane discards everything anyway.
    pub async fn delete(self) {
        let api = Api::<Namespace>::all(self.client.clone());
        let _ = api.delete(&self.name, &DeleteParams::default()).await;
    }
}

/// A kube client for the identity in `kubeconfig`.
pub async fn client_from_kubeconfig(kubeconfig: &Path) -> kube::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let raw = Kubeconfig::read_from(kubeconfig)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", kubeconfig.display()));
    let config = kube::Config::from_custom_kubeconfig(raw, &KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// Polls `check` every 100 ms until it returns `Some` or `limit` passes (then panics).
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

//! The provider under test: the Helm chart installed into the test namespace (its real RBAC,
//! service accounts, ConfigMaps, quota and policies), and `execution-provider serve` run as a
//! process with a kubeconfig holding a token of the chart's provider ServiceAccount, so any
//! permission the chart forgot fails the test. Clients reach it over mTLS on loopback.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use execution_provider::api::pb::execution_provider_service_client::ExecutionProviderServiceClient;
use execution_provider::runtime::SystemClock;
use execution_provider::runtime::net::TokioNet;
use execution_provider::runtime::tls::{self, Identity, MtlsConnector};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::transport::{Channel, Endpoint};

use crate::cluster::{CHART_DIR, Cluster, TestNamespace, eventually, repo_root};
use crate::fixtures::{ProviderFiles, RUNTIME_CLASS, templates_yaml};

/// The chart's names with `fullnameOverride: execution-provider`.
pub const FULLNAME: &str = "execution-provider";
/// The executor ServiceAccount the chart creates.
pub const EXECUTOR_ACCOUNT: &str = "execution-provider-executor";

pub type Client = ExecutionProviderServiceClient<Channel>;

/// The chart installed in one test namespace, and the files a provider process runs with.
pub struct Installation {
    pub namespace: String,
    pub files: ProviderFiles,
    /// A kubeconfig holding a token of the chart's provider ServiceAccount.
    pub provider_kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

/// Creates the cluster-scoped objects the suite's template needs (once per run).
async fn ensure_runtime_class(cluster: &Cluster) {
    static DONE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    DONE.get_or_init(|| async {
        let class = format!(
            "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {{name: {RUNTIME_CLASS}}}\nhandler: runc\n"
        );
        cluster
            .kubectl_with(&cluster.kubeconfig, &["apply", "-f", "-"], Some(&class))
            .await;
    })
    .await;
}

/// The chart's values for the suite: the test's manifest and templates, loopback API server.
fn values(files: &ProviderFiles) -> serde_json::Value {
    let manifest = std::fs::read_to_string(files.manifest()).unwrap();
    let catalogue = std::fs::read_to_string(files.templates()).unwrap();
    let templates: serde_json::Value = serde_saphyr::from_str(&catalogue).unwrap();
    let image = std::env::var("E2E_PROVIDER_IMAGE").unwrap_or_else(|_| {
        format!(
            "registry.invalid/execution/provider@sha256:{}",
            "fedcba9876543210".repeat(4)
        )
    });
    serde_json::json!({
        "fullnameOverride": FULLNAME,
        "provider": {
            "image": image,
            "securitySecretName": "execution-provider-tls",
            "securityManifest": manifest,
            "apiServerCIDRs": ["127.0.0.1/32"],
            "dnsCIDRs": ["10.96.0.10/32"],
        },
        "templates": templates["templates"],
    })
}

impl Installation {
    /// Installs the CRD (once) and the chart into `ns` with the suite's template catalogue,
    /// and mints the provider's token.
    pub async fn install(cluster: &Cluster, ns: &TestNamespace) -> Self {
        ensure_runtime_class(cluster).await;
        Self::install_with(cluster, ns, &templates_yaml()).await
    }

    /// [`Installation::install`] with the template catalogue `templates`.
    pub async fn install_with(cluster: &Cluster, ns: &TestNamespace, templates: &str) -> Self {
        cluster.install_crd().await;
        let dir = tempfile::tempdir().unwrap();
        let files = ProviderFiles::create(&dir.path().join("state"), templates);
        let values_path = dir.path().join("values.json");
        std::fs::write(&values_path, values(&files).to_string()).unwrap();
        let chart = repo_root().join(CHART_DIR);
        cluster
            .helm(&[
                "install",
                "e2e",
                &chart.to_string_lossy(),
                "--namespace",
                &ns.name,
                "--values",
                &values_path.to_string_lossy(),
            ])
            .await;
        wait_for_quota(ns).await;
        let token = cluster
            .kubectl(&["create", "token", FULLNAME, "-n", &ns.name, "--duration=2h"])
            .await;
        let provider_kubeconfig = dir.path().join("provider.kubeconfig");
        write_token_kubeconfig(&cluster.kubeconfig, token.trim(), &provider_kubeconfig);
        Self {
            namespace: ns.name.clone(),
            files,
            provider_kubeconfig,
            dir,
        }
    }

    /// Starts one `serve` process and waits until it reports ready.
    pub async fn start_provider(&self, name: &str) -> Provider {
        Provider::start(self, self.dir.path(), name).await
    }

    /// An mTLS client presenting the manifest's (administrator) client certificate.
    pub fn client(&self, provider: &Provider) -> Client {
        let root = self.files.state.root();
        let read = |path: PathBuf| std::fs::read(&path).unwrap();
        let identity = Identity::from_pem(
            &read(root.join("client/client.pem")),
            &read(root.join("client/client.key")),
            "e2e client",
        )
        .unwrap();
        let cas = tls::certificates_from_pem(&read(root.join("client/ca.pem")), "ca").unwrap();
        let config = tls::client_config(Some(&identity), &cas, Arc::new(SystemClock)).unwrap();
        let connector = MtlsConnector::new(
            TokioNet,
            config,
            Some(ServerName::try_from("localhost").unwrap()),
        );
        let channel = Endpoint::from_shared(format!("http://{}", provider.addr))
            .unwrap()
            .connect_with_connector_lazy(connector);
        ExecutionProviderServiceClient::new(channel)
    }
}

/// Waits until the controller-manager has computed every resource the chart's ResourceQuota
/// limits. Until then quota admission refuses creating what it cannot count yet (on a new
/// control plane, `count/executionenvironments` is known only after the quota controller's
/// next discovery of the freshly installed CRD).
async fn wait_for_quota(ns: &TestNamespace) {
    let quotas = kube::Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(
        ns.client.clone(),
        &ns.name,
    );
    eventually(
        Duration::from_secs(120),
        "the chart's ResourceQuota to be computed",
        || {
            let quotas = quotas.clone();
            async move {
                let status = quotas.get(FULLNAME).await.ok()?.status?;
                let (hard, used) = (status.hard?, status.used?);
                hard.keys().all(|k| used.contains_key(k)).then_some(())
            }
        },
    )
    .await;
}

/// Writes a kubeconfig for the admin kubeconfig's cluster that authenticates with `token`.
fn write_token_kubeconfig(admin: &Path, token: &str, out: &Path) {
    let admin = kube::config::Kubeconfig::read_from(admin).unwrap();
    let cluster = admin.clusters[0].cluster.clone().unwrap();
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": cluster.certificate_authority_data,
        }}],
        "users": [{"name": "provider", "user": {"token": token}}],
        "contexts": [{"name": "provider", "context": {"cluster": "e2e", "user": "provider"}}],
        "current-context": "provider",
    });
    std::fs::write(out, config.to_string()).unwrap();
}

/// A free loopback port (the listener is closed before the provider binds it).
fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// One running `execution-provider serve` process.
pub struct Provider {
    pub addr: SocketAddr,
    pub health: SocketAddr,
    pub log: PathBuf,
    child: tokio::process::Child,
}

impl Provider {
    async fn start(installation: &Installation, dir: &Path, name: &str) -> Self {
        let (addr, health) = (free_port(), free_port());
        let log = dir.join(format!("{name}.log"));
        let files = &installation.files;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_execution-provider"))
            .arg("serve")
            .arg("--kubeconfig")
            .arg(&installation.provider_kubeconfig)
            .args(["--namespace", &installation.namespace])
            .args(["--executor-service-account", EXECUTOR_ACCOUNT])
            .arg("--templates")
            .arg(files.templates())
            .arg("--security-policy-manifest")
            .arg(files.manifest())
            .arg("--tls-directory")
            .arg(files.security_dir())
            .arg("--supervisor-key-file")
            .arg(files.supervisor_key())
            .args(["--listen", &addr.to_string()])
            .args(["--health-listen", &health.to_string()])
            .env("EXECUTION_PROVIDER_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .expect("execution-provider serve starts");
        let mut provider = Provider {
            addr,
            health,
            log,
            child,
        };
        provider.wait_ready().await;
        provider
    }

    async fn wait_ready(&mut self) {
        let health = self.health;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("serve exited with {status}:\n{}", self.log_text());
            }
            if http_status(health, "/ready").await == Some(204) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "serve did not become ready:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What the process has logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the process at once (a crash: no graceful shutdown) and waits for it.
    pub async fn crash(mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM, then waits (with a deadline) for a graceful exit with status 0.
    pub async fn stop(mut self) {
        let pid = self.child.id().expect("running") as i32;
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("serve exits within 30s of SIGTERM")
            .unwrap();
        assert!(
            status.success(),
            "serve exited with {status}:\n{}",
            self.log_text()
        );
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- log of {}:\n{}", self.log.display(), self.log_text());
        }
    }
}

/// The HTTP status of `GET path` on a plain-HTTP address, or `None` if it does not answer.
pub async fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&response);
    text.split_whitespace().nth(1)?.parse().ok()
}

/// Polls until the environment's Pod is Ready (kwok marks it) and returns it.
pub async fn wait_pod_ready(ns: &TestNamespace, pod: &str) -> k8s_openapi::api::core::v1::Pod {
    let pods =
        kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(ns.client.clone(), &ns.name);
    eventually(
        Duration::from_secs(60),
        "the executor Pod to be ready",
        || {
            let pods = pods.clone();
            async move {
                let pod = pods.get_opt(pod).await.ok()??;
                let ready = pod
                    .status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                ready.then_some(pod)
            }
        },
    )
    .await
}

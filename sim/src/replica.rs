//! One replica host: the production `provider::run` through the simulator's seams (skewed
//! clock, seeded ids per incarnation, `kube::Client` over turmoil TCP, the executor transport,
//! the security directory and, when the seed rotates it, the production security manager).
//!
//! A replica whose start-up checks fail (`ProviderError::Init`: the profile preflight or the
//! controller cache, e.g. because it started while cut from the API server) exits, as the
//! specification says it must, and is restarted after [`RESTART_BACKOFF`] as the kubelet
//! restarts a failed container; the trace records it. Any other error fails the run.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use execution_provider::executor::ExecutorTransport;
use execution_provider::metrics::Metrics;
use execution_provider::provider::{self, Dependencies, ProviderError, Settings, Shutdown};
use execution_provider::runtime::net::Net;
use execution_provider::runtime::{Runtime, SeededIds};
use execution_provider::security::{self, Security};

use crate::authority::SecurityFiles;
use crate::clock::SkewedClock;
use crate::net::{SimNet, kube_client};
use crate::operator::RunTemplates;
use crate::trace::Trace;
use crate::world::{API_HOST, API_PORT, GRPC_PORT, Material, NAMESPACE, replica_host};

/// How long a replica that failed its start-up checks stays down before it starts again.
pub const RESTART_BACKOFF: Duration = Duration::from_secs(1);

/// What one replica host is made of.
pub(crate) struct Replica {
    pub(crate) index: u32,
    pub(crate) clock: SkewedClock,
    pub(crate) material: Arc<Material>,
    /// The run's templates file: each incarnation loads the registry from it when it starts,
    /// as `serve` does, so a revocation written meanwhile is in force after a restart.
    pub(crate) templates: RunTemplates,
    /// The shared in-memory executor, or the transport to the node hosts.
    pub(crate) executor: Arc<dyn ExecutorTransport>,
    pub(crate) seed: u64,
    /// The run's own security directory, when the security manager runs (and its manifest
    /// is rotated and rolled back as a fault).
    pub(crate) security: Option<Arc<Mutex<SecurityFiles>>>,
    pub(crate) trace: Trace,
}

/// The parts of one incarnation, cloned out of the host's [`Replica`].
#[derive(Clone)]
struct Parts {
    index: u32,
    clock: SkewedClock,
    material: Arc<Material>,
    templates: RunTemplates,
    executor: Arc<dyn ExecutorTransport>,
    seed: u64,
    files: Option<Arc<Mutex<SecurityFiles>>>,
}

/// Adds replica host `replica.index`.
pub(crate) fn add_replica(sim: &mut turmoil::Sim<'_>, replica: Replica) {
    let incarnation = Arc::new(AtomicU64::new(0));
    sim.host(replica_host(replica.index), move || {
        let parts = Parts {
            index: replica.index,
            clock: replica.clock.clone(),
            material: replica.material.clone(),
            templates: replica.templates.clone(),
            executor: replica.executor.clone(),
            seed: replica.seed,
            files: replica.security.clone(),
        };
        let (trace, incarnation) = (replica.trace.clone(), incarnation.clone());
        async move {
            loop {
                let life = incarnation.fetch_add(1, Ordering::Relaxed);
                match run_incarnation(parts.clone(), life).await {
                    Err(Exit::Init(error)) => {
                        trace.record(
                            &replica_host(parts.index),
                            format!("exited at start-up ({error}); restarting"),
                        );
                        tokio::time::sleep(RESTART_BACKOFF).await;
                    }
                    Err(Exit::Other(error)) => return Err(error),
                    Ok(()) => return Ok(()),
                }
            }
        }
    });
}

/// Why an incarnation ended.
enum Exit {
    /// The start-up checks failed: restart.
    Init(ProviderError),
    /// Anything else: the run fails.
    Other(Box<dyn std::error::Error>),
}

impl<E: std::error::Error + 'static> From<E> for Exit {
    fn from(error: E) -> Self {
        Exit::Other(Box::new(error))
    }
}

async fn run_incarnation(parts: Parts, life: u64) -> Result<(), Exit> {
    let Parts {
        index,
        clock,
        material,
        templates,
        executor,
        seed,
        files,
    } = parts;
    let ids_seed = seed ^ (u64::from(index) << 32) ^ (life << 48) ^ 0x1d5;
    let runtime = Runtime {
        clock: Arc::new(clock),
        ids: Arc::new(SeededIds::new(ids_seed)),
    };
    let (manifest, tls_dir) = match &files {
        Some(files) => {
            let files = files.lock().expect("security files lock");
            (files.manifest_path().to_owned(), files.tls_dir().to_owned())
        }
        None => (
            material.state.manifest_path(),
            material.state.security_dir(),
        ),
    };
    let loaded = security::load_directory(&manifest, &tls_dir)?;
    let security = Security::new(&loaded, runtime.clock.clone())?;
    let kube = kube_client(API_HOST, API_PORT, NAMESPACE);
    let manager = files.as_ref().map(|files| {
        let manager = files
            .lock()
            .expect("security files lock")
            .manager(security.clone(), kube.clone());
        tokio::spawn(manager.run(std::future::pending::<()>()))
    });
    let metrics = Metrics::new(security.limiter_rejections(), runtime.clock.clone());
    let deps = Dependencies {
        runtime,
        kube,
        executor,
        templates: templates.current(),
        security,
        metrics,
    };
    let settings = Settings {
        namespace: NAMESPACE.to_owned(),
        executor_service_account: "execution-executor".to_owned(),
        connections: Default::default(),
    };
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), GRPC_PORT);
    let listener = SimNet.bind(addr).await?;
    let (_trigger, shutdown) = Shutdown::new();
    let result = provider::run::<SimNet>(deps, settings, listener, shutdown).await;
    if let Some(manager) = manager {
        manager.abort();
    }
    match result {
        Err(error @ ProviderError::Init(_)) => Err(Exit::Init(error)),
        Err(error) => Err(error.into()),
        Ok(()) => Ok(()),
    }
}

//! The in-process Kubernetes API server: a tower `Service` speaking the real REST API with real
//! semantics (resourceVersion preconditions, status subresources, generation, label and field
//! selectors, finalizers, watches with bookmarks and 410 expiry), so the production kube-rs
//! code (`Api`, `watcher`, status patches, conflict handling) runs unchanged against it in `dev`
//! mode, in tests and in the simulator. `kube::Client::new(server, namespace)` uses it directly,
//! without sockets; a hyper server can serve it too, as the service accepts any request body.
//!
//! State is in memory ([`ApiServer::in_memory`]) or also persisted to a state directory
//! ([`ApiServer::open`]): an embedded SQLite database where every acknowledged mutation is one
//! transaction committed before the answer (module `persist`). Reads and watches are served from
//! memory either way, so both backends behave alike. The served kinds are listed in [`registry::KINDS`].

mod delete;
mod discovery;
mod dispatch;
pub mod exec;
mod meta;
mod patch;
mod persist;
mod read;
pub mod read_only;
pub mod registry;
mod response;
mod route;
mod selector;
mod status;
mod store;
mod table;
mod watch;
mod write;

use std::{
    convert::Infallible,
    fmt,
    future::Future,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;

pub use persist::{ApiServerError, LEGACY_STATE_FILE, MIGRATED_LEGACY_STATE_FILE, STATE_FILE};
pub use response::ResponseBody;
pub use store::DEFAULT_HISTORY_LIMIT;
pub use watch::BOOKMARK_INTERVAL;

use self::{persist::Persister, status::ApiError, store::Store, write::Ctx};
use crate::runtime::{Clock, IdSource};

/// State shared by every clone of the server and by its watch streams.
pub(crate) struct Shared {
    store: Mutex<Store>,
    clock: Arc<dyn Clock>,
    ids: Arc<dyn IdSource>,
    state_file: Option<PathBuf>,
    exec: Mutex<Option<Arc<dyn exec::ExecBackend>>>,
}

impl Shared {
    fn exec_backend(&self) -> Option<Arc<dyn exec::ExecBackend>> {
        self.exec
            .lock()
            .expect("exec backend lock poisoned")
            .clone()
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().expect("API server store lock poisoned")
    }

    fn ctx(&self, dry_run: bool) -> Ctx<'_> {
        Ctx {
            clock: self.clock.as_ref(),
            ids: self.ids.as_ref(),
            dry_run,
        }
    }
}

/// The in-process API server. Cloning is cheap; clones share the same state.
#[derive(Clone)]
pub struct ApiServer {
    shared: Arc<Shared>,
}

impl fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiServer")
            .field("state_file", &self.shared.state_file)
            .field("resource_version", &self.resource_version())
            .finish()
    }
}

impl ApiServer {
    fn with_store(
        store: Store,
        clock: Arc<dyn Clock>,
        ids: Arc<dyn IdSource>,
        state_file: Option<PathBuf>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                store: Mutex::new(store),
                clock,
                ids,
                state_file,
                exec: Mutex::new(None),
            }),
        }
    }

    /// An empty server whose state lives only in memory (it touches no file system).
    pub fn in_memory(clock: Arc<dyn Clock>, ids: Arc<dyn IdSource>) -> Self {
        let store = Store::new(0, Default::default(), None);
        Self::with_store(store, clock, ids, None)
    }

    /// A server persisted in `dir`: loads the database `<dir>/apiserver.sqlite3` (creating it,
    /// or migrating a legacy `<dir>/apiserver.json` into it on the first start; a corrupt or
    /// foreign file is an error naming it, and is never modified), and commits every
    /// acknowledged mutation in one transaction before answering.
    pub fn open(
        dir: &Path,
        clock: Arc<dyn Clock>,
        ids: Arc<dyn IdSource>,
    ) -> Result<Self, ApiServerError> {
        let (persister, loaded) = Persister::open(dir)?;
        let state_file = Some(persister.path().to_path_buf());
        let store = Store::new(loaded.resource_version, loaded.objects, Some(persister));
        Ok(Self::with_store(store, clock, ids, state_file))
    }

    /// A `kube::Client` talking to this server, with `default_namespace` for `Api::default_namespaced`.
    /// Must be called inside a tokio runtime (the client spawns its buffer task).
    pub fn client(&self, default_namespace: &str) -> ::kube::Client {
        ::kube::Client::new(self.clone(), default_namespace)
    }

    /// Sets what runs `pods/exec` requests ([`exec`]); without one they are refused.
    pub fn set_exec_backend(&self, backend: Arc<dyn exec::ExecBackend>) {
        *self.shared.exec.lock().expect("exec backend lock poisoned") = Some(backend);
    }

    /// Serves one HTTP/1 connection with upgrades, which `pods/exec` needs (the in-process
    /// [`ApiServer::client`] cannot upgrade). Returns when the connection closes.
    pub async fn serve_connection<I>(&self, io: I) -> Result<(), hyper::Error>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper_util::service::TowerToHyperService::new(self.clone());
        hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(io), service)
            .with_upgrades()
            .await
    }

    /// The database file, for a persisted server.
    pub fn state_file(&self) -> Option<&Path> {
        self.shared.state_file.as_deref()
    }

    /// The current (global) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().resource_version()
    }

    /// Every stored object of `kind` in all namespaces, in key order (for the simulator's
    /// invariant checker, which reads the state without going through the API).
    pub fn objects_of_kind(&self, kind: &'static str) -> Vec<serde_json::Value> {
        let store = self.shared.lock();
        store.objects(kind, None).map(|(_, v)| v.clone()).collect()
    }

    /// Forgets the watch event history, as an etcd compaction does: watches and continue
    /// tokens from before now get 410 and clients relist. Live watches continue.
    pub fn compact(&self) {
        self.shared.lock().compact();
    }

    /// Keeps at most `limit` events for resuming watches (default
    /// [`DEFAULT_HISTORY_LIMIT`]); watches that fall further behind get 410.
    pub fn set_watch_history_limit(&self, limit: usize) {
        self.shared.lock().set_history_limit(limit);
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<B> tower::Service<Request<B>> for ApiServer
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        if let Some((namespace, pod)) = exec::exec_target(request.uri().path()) {
            let answer = exec::handle(&shared, request, namespace, pod);
            return Box::pin(async move { Ok(answer) });
        }
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes = match body.collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    let message = format!("cannot read the request body: {}", e.into());
                    return Ok(response::error(&ApiError::bad_request(message)));
                }
            };
            Ok(dispatch::handle(&shared, &parts, &bytes))
        })
    }
}

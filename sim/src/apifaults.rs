//! A tower layer around the in-process API server that injects the API server's failures
//! drawn from the seed: writes refused before they commit (409, 429, 500) and writes that
//! commit but whose answer is lost (504). Reads and watches pass through; watch restarts
//! come from compaction, applied by the world. Hand-driven races add an outage: every write
//! whose path contains a given text is refused (503) until the outage ends, without touching
//! the seed's draws. A create refused because its name exists is traced (`exists 409 POST
//! PATH`: the creator had read the object as absent).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use execution_provider::kube::apiserver::{ApiServer, ResponseBody};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::peer::Peer;
use crate::trace::Trace;
use crate::writes::{WriteLog, Written};

/// The current error rates (refused before commit, lost after commit).
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiRates {
    /// Chance a write is refused before it commits.
    pub refuse: f64,
    /// Chance a committed write's answer is lost.
    pub lose_answer: f64,
}

/// A scripted outage: while it names a text, every write whose path contains it is refused.
#[derive(Debug, Clone, Default)]
pub struct ApiOutage(Arc<Mutex<Option<String>>>);

impl ApiOutage {
    /// Refuses (503) every write whose path contains `path_part`, until [`ApiOutage::end`].
    pub fn begin(&self, path_part: &str) {
        *self.0.lock().expect("outage lock poisoned") = Some(path_part.to_owned());
    }

    /// Ends the outage.
    pub fn end(&self) {
        *self.0.lock().expect("outage lock poisoned") = None;
    }

    fn refuses(&self, path: &str) -> bool {
        self.0
            .lock()
            .expect("outage lock poisoned")
            .as_deref()
            .is_some_and(|part| path.contains(part))
    }
}

/// The API server with injected failures.
#[derive(Clone)]
pub struct FaultyApi {
    inner: ApiServer,
    rng: Arc<Mutex<StdRng>>,
    rates: Arc<Mutex<ApiRates>>,
    trace: Trace,
    writes: WriteLog,
    outage: ApiOutage,
    peer: Peer,
}

impl FaultyApi {
    /// Wraps `inner`, drawing failures from `seed` at `rates`, recording every committed
    /// write in `writes`.
    pub fn new(
        inner: ApiServer,
        seed: u64,
        rates: Arc<Mutex<ApiRates>>,
        trace: Trace,
        writes: WriteLog,
    ) -> Self {
        Self {
            inner,
            rng: Arc::new(Mutex::new(StdRng::seed_from_u64(seed))),
            rates,
            trace,
            writes,
            outage: ApiOutage::default(),
            peer: Peer::default(),
        }
    }

    /// The handle that arms this server's foreign writer (hand-driven creator changes).
    pub fn peer(&self) -> Peer {
        self.peer.clone()
    }

    /// The handle that starts and ends this server's scripted outage.
    pub fn outage(&self) -> ApiOutage {
        self.outage.clone()
    }

    fn draw(&self, is_write: bool) -> (bool, bool, u16) {
        if !is_write {
            return (false, false, 0);
        }
        let rates = *self.rates.lock().expect("rates lock poisoned");
        let mut rng = self.rng.lock().expect("rng lock poisoned");
        let refuse = rates.refuse > 0.0 && rng.random_bool(rates.refuse.min(1.0));
        let lose = rates.lose_answer > 0.0 && rng.random_bool(rates.lose_answer.min(1.0));
        let code = [409, 429, 500][rng.random_range(0..3)];
        (refuse, lose, code)
    }
}

fn status(code: u16, reason: &str) -> Response<ResponseBody> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("injected by the simulator: {reason}"), "reason": reason, "code": code,
    });
    let bytes = serde_json::to_vec(&body).expect("JSON serializes");
    let mut response = Response::new(Full::new(Bytes::from(bytes)).boxed_unsync());
    *response.status_mut() =
        http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn reason(code: u16) -> &'static str {
    match code {
        409 => "Conflict",
        429 => "TooManyRequests",
        504 => "Timeout",
        _ => "InternalError",
    }
}

impl tower::Service<Request<hyper::body::Incoming>> for FaultyApi {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<hyper::body::Incoming>) -> Self::Future {
        let is_write = request.method() != http::Method::GET;
        let (refuse, lose, code) = self.draw(is_write);
        let method = request.method().to_string();
        let path = request.uri().path().to_owned();
        let what = format!("{method} {path}");
        let outage = is_write && self.outage.refuses(&path);
        let mut inner = self.inner.clone();
        let trace = self.trace.clone();
        let writes = self.writes.clone();
        let peer = (is_write && self.peer.armed()).then(|| self.peer.clone());
        Box::pin(async move {
            if outage {
                trace.record("apiserver", format!("outage 503 {what}"));
                return Ok(status(503, "ServiceUnavailable"));
            }
            if refuse {
                trace.record("apiserver", format!("refuse {code} {what}"));
                return Ok(status(code, reason(code)));
            }
            let mut response = match peer {
                // A foreign writer waits for this write: read its body first.
                Some(peer) => {
                    let (parts, body) = request.into_parts();
                    let Ok(body) = body.collect().await else {
                        return Ok(status(400, "BadRequest"));
                    };
                    let bytes = body.to_bytes();
                    let raced = peer.before_write(&inner, &path, &bytes, &trace).await;
                    let request = Request::from_parts(parts, Full::new(bytes));
                    let response = tower::Service::call(&mut inner, request).await?;
                    if raced {
                        let code = response.status().as_u16();
                        trace.record("apiserver", format!("after the peer {code} {what}"));
                    }
                    response
                }
                None => tower::Service::call(&mut inner, request).await?,
            };
            if method == "POST" && response.status() == http::StatusCode::CONFLICT {
                // A create that lost to an object of the same name (a stale absence).
                trace.record("apiserver", format!("exists 409 {what}"));
            }
            if is_write && response.status().is_success() {
                let (parts, body) = response.into_parts();
                let bytes = body.collect().await?.to_bytes();
                if let Ok(object) = serde_json::from_slice(&bytes) {
                    writes.push(Written {
                        method,
                        path,
                        object,
                    });
                }
                response = Response::from_parts(parts, Full::new(bytes).boxed_unsync());
            }
            if lose && response.status().is_success() {
                trace.record("apiserver", format!("lose answer {what}"));
                return Ok(status(504, reason(504)));
            }
            Ok(response)
        })
    }
}

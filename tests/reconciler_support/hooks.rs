//! A tower layer in front of the in-process API server for the reconciler tests: it records
//! every request (method, path, query, body), and plays what a real cluster may do to a
//! request: refuse it (quota, server errors), change it on the way in (mutating admission),
//! or let a peer act just before it is served (races between replicas).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use execution_provider::kube::apiserver::{ApiServer, ResponseBody};
use http::{Request, Response};
use http_body_util::BodyExt;
use serde_json::{Value, json};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Something to run just before a matching request is served.
pub type Before = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// What a rule does to a matching request.
#[derive(Clone)]
pub enum Action {
    /// Answer with this HTTP status, Kubernetes reason and message; nothing is applied.
    Refuse(u16, &'static str, &'static str),
    /// Change the JSON body before it is served (a mutating admission plugin).
    Mutate(fn(&mut Value)),
    /// Run this first, then serve the request.
    Before(Before),
}

/// A rule: requests with `method` whose path contains `path` and ends with `suffix`; applies
/// to the next `times` of them.
#[derive(Clone)]
pub struct Rule {
    pub method: &'static str,
    pub path: &'static str,
    pub suffix: &'static str,
    pub times: usize,
    pub action: Action,
}

/// One request as the layer saw it (after any mutation).
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub body: Value,
    /// The HTTP status it was answered with.
    pub code: u16,
    /// When it was answered (tokio time).
    pub at: tokio::time::Instant,
}

/// The recorded requests and the pending rules.
#[derive(Default)]
pub struct Log {
    pub seen: Vec<Seen>,
    rules: Vec<Rule>,
}

impl Log {
    /// Requests with `method` whose path contains `path`.
    pub fn matching(&self, method: &str, path: &str) -> Vec<Seen> {
        self.seen
            .iter()
            .filter(|s| s.method == method && s.path.contains(path))
            .cloned()
            .collect()
    }
}

/// The API server behind the recording, rule-applying layer.
#[derive(Clone)]
pub struct Hooked {
    inner: ApiServer,
    log: Arc<Mutex<Log>>,
}

impl Hooked {
    pub fn new(inner: ApiServer) -> Self {
        Self {
            inner,
            log: Arc::default(),
        }
    }

    /// Adds a rule.
    pub fn rule(&self, rule: Rule) {
        self.log.lock().unwrap().rules.push(rule);
    }

    /// Drops every pending rule.
    pub fn clear_rules(&self) {
        self.log.lock().unwrap().rules.clear();
    }

    /// Requests with `method` whose path contains `path`, in order.
    pub fn seen(&self, method: &str, path: &str) -> Vec<Seen> {
        self.log.lock().unwrap().matching(method, path)
    }

    /// A client through this layer.
    pub fn client(&self, namespace: &str) -> kube::Client {
        kube::Client::new(self.clone(), namespace)
    }

    fn take_action(&self, method: &str, path: &str) -> Option<Action> {
        let mut log = self.log.lock().unwrap();
        let rule = log.rules.iter_mut().find(|r| {
            r.times > 0 && r.method == method && path.contains(r.path) && path.ends_with(r.suffix)
        })?;
        rule.times -= 1;
        Some(rule.action.clone())
    }
}

fn refusal(code: u16, reason: &str, message: &str) -> Response<ResponseBody> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(
            http_body_util::Full::new(Bytes::from(body.to_string()))
                .map_err(|e| match e {})
                .boxed_unsync(),
        )
        .expect("response")
}

impl<B> tower::Service<Request<B>> for Hooked
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
            let method = parts.method.as_str().to_owned();
            let path = parts.uri.path().to_owned();
            let query = parts.uri.query().unwrap_or_default().to_owned();
            let mut value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let mut bytes = bytes;
            let answer = match this.take_action(&method, &path) {
                Some(Action::Refuse(code, reason, message)) => Some(refusal(code, reason, message)),
                Some(Action::Mutate(edit)) => {
                    edit(&mut value);
                    bytes = Bytes::from(value.to_string());
                    None
                }
                Some(Action::Before(before)) => {
                    before().await;
                    None
                }
                None => None,
            };
            let response = match answer {
                Some(response) => response,
                None => {
                    let mut inner = this.inner.clone();
                    let mut parts = parts;
                    parts.headers.remove(http::header::CONTENT_LENGTH);
                    let request = Request::from_parts(parts, http_body_util::Full::new(bytes));
                    tower::Service::call(&mut inner, request)
                        .await
                        .map_err(|e: Infallible| -> BoxError { match e {} })?
                }
            };
            this.log.lock().unwrap().seen.push(Seen {
                method,
                path,
                query,
                body: value,
                code: response.status().as_u16(),
                at: tokio::time::Instant::now(),
            });
            Ok(response)
        })
    }
}

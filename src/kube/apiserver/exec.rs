//! `pods/<name>/exec` over WebSocket, as the real API server offers it to kube-rs
//! (`Api::<Pod>::exec`, subprotocols `v5.channel.k8s.io` and `v4.channel.k8s.io`).
//!
//! The server checks the Pod and its container, answers `101 Switching Protocols`, and bridges
//! the channelled WebSocket to a process started by a caller-supplied [`ExecBackend`] (the dev
//! node agent or a test: for example `execution-helper` on the Pod's workspace). Frames are
//! binary, the first byte is the channel: 0 stdin, 1 stdout, 2 stderr, 3 the final `Status`,
//! and with v5, `[255, 0]` from the client closes stdin. Closing the WebSocket also closes
//! stdin. The upgrade needs a real HTTP/1 connection: serve the [`super::ApiServer`] with
//! [`super::ApiServer::serve_connection`], not the in-process tower client.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::{SinkExt as _, StreamExt as _};
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Empty};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::{Shared, registry, response, status::ApiError, store::ObjectKey};

/// The newer channel protocol (stdin can be closed on its own).
pub const PROTOCOL_V5: &str = "v5.channel.k8s.io";
/// The older channel protocol (only closing the WebSocket closes stdin).
pub const PROTOCOL_V4: &str = "v4.channel.k8s.io";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
const CLOSE: u8 = 255;
const CHUNK: usize = 32 * 1024;
/// How long a process whose client went away may take to end before it is killed.
pub const ABANDONED_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What the client asked to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecRequest {
    /// The Pod's namespace.
    pub namespace: String,
    /// The Pod.
    pub pod: String,
    /// The Pod as stored (the backend may read labels or annotations).
    pub pod_object: Value,
    /// The container (defaulted to the only one when the Pod has one).
    pub container: String,
    /// argv.
    pub command: Vec<String>,
    /// Whether stdin is attached.
    pub stdin: bool,
    /// Whether a TTY was asked for (refused: never used by the provider).
    pub tty: bool,
}

/// A started process: its streams and its exit code.
pub struct ExecProcess {
    /// The process's stdin, when attached.
    pub stdin: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    /// Its stdout.
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    /// Its stderr.
    pub stderr: Box<dyn AsyncRead + Send + Unpin>,
    /// Completes with the exit code once the process ended (an error for a signal death or a
    /// lost process). Dropping it must stop the process.
    pub exit: BoxFuture<Result<i32, String>>,
}

/// Runs exec requests for the server (the "container runtime" behind `pods/exec`).
pub trait ExecBackend: Send + Sync + 'static {
    /// Starts `request`, or says why not (answered as 400 Bad Request).
    fn start(&self, request: &ExecRequest) -> Result<ExecProcess, String>;
}

/// True for `/api/v1/namespaces/<ns>/pods/<name>/exec`; returns the namespace and name.
pub(super) fn exec_target(path: &str) -> Option<(String, String)> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", name, "exec"]
            if !ns.is_empty() && !name.is_empty() =>
        {
            Some(((*ns).to_owned(), (*name).to_owned()))
        }
        _ => None,
    }
}

/// Answers an exec request: the upgrade, or a `Status` failure.
pub(super) fn handle<B: Send + 'static>(
    shared: &Arc<Shared>,
    mut request: Request<B>,
    namespace: String,
    pod: String,
) -> Response<response::ResponseBody> {
    let prepared = prepare(shared, &request, namespace, pod);
    let (exec, protocol, accept) = match prepared {
        Ok(prepared) => prepared,
        Err(err) => return response::error(&err),
    };
    let backend = shared.exec_backend();
    let Some(backend) = backend else {
        return response::error(&ApiError::bad_request(
            "this server has no container runtime for exec".to_owned(),
        ));
    };
    let process = match backend.start(&exec) {
        Ok(process) => process,
        Err(why) => return response::error(&ApiError::bad_request(why)),
    };
    let upgrade = hyper::upgrade::on(&mut request);
    let v5 = protocol == PROTOCOL_V5;
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let io = TokioIo::new(upgraded);
                let ws = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
                bridge(ws, process, v5).await;
            }
            Err(e) => tracing::debug!(error = %e, "exec upgrade failed"),
        }
    });
    switching_protocols(protocol, &accept)
}

/// Validates the request and the Pod; returns what to run, the chosen subprotocol and the
/// `Sec-WebSocket-Accept` value.
fn prepare<B>(
    shared: &Arc<Shared>,
    request: &Request<B>,
    namespace: String,
    pod: String,
) -> Result<(ExecRequest, &'static str, String), ApiError> {
    if request.method() != Method::GET && request.method() != Method::POST {
        return Err(ApiError::method_not_allowed(request.method().as_str()));
    }
    let headers = request.headers();
    let header_has = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    if !header_has(header::UPGRADE, "websocket") || !header_has(header::CONNECTION, "upgrade") {
        return Err(ApiError::bad_request(
            "exec needs a WebSocket upgrade (SPDY is not served)".to_owned(),
        ));
    }
    let protocol = [PROTOCOL_V5, PROTOCOL_V4]
        .into_iter()
        .find(|p| header_has(header::SEC_WEBSOCKET_PROTOCOL, p))
        .ok_or_else(|| ApiError::bad_request("no supported channel subprotocol".to_owned()))?;
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| ApiError::bad_request("missing Sec-WebSocket-Key".to_owned()))?;
    let accept = derive_accept_key(key.as_bytes());

    let mut command = Vec::new();
    let mut container = None;
    let (mut stdin, mut tty) = (false, false);
    for (name, value) in url::form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
    {
        match name.as_ref() {
            "command" => command.push(value.into_owned()),
            "container" => container = Some(value.into_owned()),
            "stdin" => stdin = value == "true" || value == "1",
            "tty" => tty = value == "true" || value == "1",
            _ => {}
        }
    }
    if command.is_empty() {
        return Err(ApiError::bad_request(
            "you must specify at least 1 command".to_owned(),
        ));
    }
    if tty {
        return Err(ApiError::bad_request("tty is not supported".to_owned()));
    }
    let pods = registry::by_kind("Pod").expect("Pods are served");
    let key = ObjectKey {
        kind: pods.kind,
        namespace: namespace.clone(),
        name: pod.clone(),
    };
    let pod_object = shared
        .lock()
        .get(&key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(pods, &pod))?;
    let container = choose_container(&pod_object, container, &pod)?;
    let exec = ExecRequest {
        namespace,
        pod,
        pod_object,
        container,
        command,
        stdin,
        tty,
    };
    Ok((exec, protocol, accept))
}

/// The named container, which must be in the Pod's spec; without a name, the only container.
fn choose_container(pod: &Value, asked: Option<String>, name: &str) -> Result<String, ApiError> {
    let containers: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .map(|list| list.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    match asked {
        Some(asked) if containers.contains(&asked.as_str()) => Ok(asked),
        Some(asked) => Err(ApiError::bad_request(format!(
            "container {asked} is not valid for pod {name}"
        ))),
        None if containers.len() == 1 => Ok(containers[0].to_owned()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}"
        ))),
    }
}

fn switching_protocols(protocol: &'static str, accept: &str) -> Response<response::ResponseBody> {
    let mut answer = Response::new(Empty::new().map_err(|never| match never {}).boxed_unsync());
    *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = answer.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(protocol),
    );
    if let Ok(accept) = HeaderValue::from_str(accept) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    answer
}

/// Bridges the WebSocket and the process until the process ended and its output was sent,
/// then sends the final `Status` and closes.
async fn bridge<S>(ws: WebSocketStream<S>, process: ExecProcess, v5: bool)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut source) = ws.split();
    let (frames, mut outgoing) = mpsc::channel::<Vec<u8>>(4);
    let stdout = tokio::spawn(forward(process.stdout, STDOUT, frames.clone()));
    let stderr = tokio::spawn(forward(process.stderr, STDERR, frames));
    let mut stdin = process.stdin;
    let reader = tokio::spawn(async move {
        while let Some(message) = source.next().await {
            let Ok(Message::Binary(frame)) = message else {
                if matches!(message, Ok(Message::Close(_)) | Err(_)) {
                    break;
                }
                continue;
            };
            match (frame.first(), frame.get(1)) {
                (Some(&STDIN), _) => {
                    if let Some(writer) = stdin.as_mut()
                        && writer.write_all(&frame[1..]).await.is_err()
                    {
                        stdin = None;
                    }
                }
                (Some(&CLOSE), Some(&STDIN)) if v5 => {
                    if let Some(mut writer) = stdin.take() {
                        let _ = writer.shutdown().await;
                    }
                }
                _ => {}
            }
        }
        // The client went away or closed the socket: stdin closes with it.
        drop(stdin);
    });
    let mut delivered = true;
    while let Some(frame) = outgoing.recv().await {
        if sink.send(Message::binary(frame)).await.is_err() {
            delivered = false;
            break;
        }
    }
    stdout.abort();
    stderr.abort();
    if !delivered {
        // The client went away and closed stdin with it: the process gets a grace period to end
        // on its own (the helper cancels its command and proves the cleanup) before it is
        // dropped, which kills it.
        let _ = tokio::time::timeout(ABANDONED_GRACE, process.exit).await;
    } else {
        let status = final_status(process.exit.await);
        let mut frame = vec![STATUS];
        frame.extend_from_slice(&serde_json::to_vec(&status).unwrap_or_default());
        let _ = sink.send(Message::binary(frame)).await;
        let _ = sink.close().await;
    }
    reader.abort();
}

/// Copies one output stream into channel frames until EOF.
async fn forward(
    mut reader: Box<dyn AsyncRead + Send + Unpin>,
    channel: u8,
    frames: mpsc::Sender<Vec<u8>>,
) {
    let mut buffer = vec![0u8; CHUNK];
    loop {
        match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let mut frame = Vec::with_capacity(n + 1);
                frame.push(channel);
                frame.extend_from_slice(&buffer[..n]);
                if frames.send(frame).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The `Status` sent on channel 3, as the kubelet writes it.
fn final_status(exit: Result<i32, String>) -> Value {
    match exit {
        Ok(0) => json!({"metadata": {}, "status": "Success"}),
        Ok(code) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        Err(why) => json!({
            "metadata": {},
            "status": "Failure",
            "message": why,
            "reason": "InternalError",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pod_exec_paths_are_exec_targets() {
        assert_eq!(
            exec_target("/api/v1/namespaces/ns/pods/p/exec"),
            Some(("ns".to_owned(), "p".to_owned()))
        );
        assert_eq!(exec_target("/api/v1/namespaces/ns/pods/p"), None);
        assert_eq!(exec_target("/api/v1/namespaces/ns/pods/p/attach"), None);
        assert_eq!(exec_target("/api/v1/namespaces//pods/p/exec"), None);
    }

    #[test]
    fn a_non_zero_exit_is_reported_as_the_kubelet_does() {
        let status = final_status(Ok(3));
        assert_eq!(status["reason"], "NonZeroExitCode");
        assert_eq!(status["details"]["causes"][0]["message"], "3");
        assert_eq!(final_status(Ok(0))["status"], "Success");
        assert_eq!(final_status(Err("lost".into()))["status"], "Failure");
    }

    #[test]
    fn the_container_must_be_in_the_pod() {
        let pod = json!({"spec": {"containers": [{"name": "executor"}]}});
        assert_eq!(choose_container(&pod, None, "p").unwrap(), "executor");
        assert_eq!(
            choose_container(&pod, Some("executor".into()), "p").unwrap(),
            "executor"
        );
        assert_eq!(
            choose_container(&pod, Some("other".into()), "p")
                .unwrap_err()
                .code,
            400
        );
    }
}

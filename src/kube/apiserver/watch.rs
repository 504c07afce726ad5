//! Watches: a newline-delimited JSON stream of `{"type", "object"}` events in resourceVersion
//! order, starting strictly after the asked resourceVersion (replayed from the store's bounded
//! history), or with synthetic ADDED events for the current objects when none is given. A
//! position older than the history yields an ERROR event carrying a 410 `Expired` Status, as
//! real servers send, so clients relist. Objects entering or leaving a selector are sent as
//! ADDED or DELETED. Bookmarks (when allowed) come every [`BOOKMARK_INTERVAL`] of tokio time,
//! and the stream ends after `timeoutSeconds`. Clients that ask for Tables get each object as
//! a one-row `Table` (see the `table` module).

use std::{collections::VecDeque, convert::Infallible, pin::Pin, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::{sync::watch, time::Sleep};

use super::{
    Shared,
    registry::KindInfo,
    response::ResponseBody,
    selector::Filter,
    status::ApiError,
    store::{Event, EventType, Store},
    table::{self, TableRequest},
};

/// How often a watch that allows bookmarks gets one.
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);
/// How long a watch lasts without `timeoutSeconds` (real servers pick 30 to 60 minutes).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// A watch request.
#[derive(Debug)]
pub struct WatchRequest {
    /// Which objects.
    pub filter: Filter,
    /// Start strictly after this resourceVersion; `None` sends the current objects first.
    pub resource_version: Option<u64>,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: current objects first, then an initial-events-end bookmark.
    pub send_initial_events: bool,
    /// When the stream ends.
    pub timeout: Duration,
    /// Objects as `Table`s (`kubectl get --watch`) instead of themselves.
    pub table: Option<TableRequest>,
}

/// Renders the event lines of one watch: objects as they are, or as one-row Tables of which
/// the first carries the column definitions, as the real server sends them.
struct Encoder {
    kind: &'static KindInfo,
    table: Option<TableRequest>,
    headers_sent: bool,
}

impl Encoder {
    fn event(&mut self, shared: &Shared, event_type: EventType, object: &Value) -> Bytes {
        let Some(request) = self.table else {
            return line(event_type.as_str(), object);
        };
        let metadata = json!({"resourceVersion": object["metadata"]["resourceVersion"]});
        let now = shared.clock.wall();
        let headers = !std::mem::replace(&mut self.headers_sent, true);
        let table = table::table(
            self.kind,
            std::slice::from_ref(object),
            metadata,
            request,
            now,
            headers,
        );
        line(event_type.as_str(), &table)
    }
}

struct WatchState {
    shared: Arc<Shared>,
    kind: &'static KindInfo,
    filter: Filter,
    encoder: Encoder,
    position: u64,
    pending: VecDeque<Bytes>,
    changes: watch::Receiver<u64>,
    timeout: Pin<Box<Sleep>>,
    bookmark: Option<Pin<Box<Sleep>>>,
    finished: bool,
}

fn line(event_type: &str, object: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(&json!({"type": event_type, "object": object}))
        .expect("JSON values always serialize");
    bytes.push(b'\n');
    Bytes::from(bytes)
}

fn bookmark_line(kind: &KindInfo, position: u64, initial_end: bool) -> Bytes {
    let mut object = json!({
        "kind": kind.kind,
        "apiVersion": kind.api_version(),
        "metadata": {"resourceVersion": position.to_string()},
    });
    if initial_end {
        object["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line("BOOKMARK", &object)
}

/// The event type a watcher with `filter` sees for `event`, if any.
fn visible_type(filter: &Filter, event: &Event) -> Option<EventType> {
    let now = filter.matches(&event.object);
    let before = event.previous.as_ref().is_some_and(|p| filter.matches(p));
    match (event.event_type, before, now) {
        (EventType::Added, _, true) => Some(EventType::Added),
        (EventType::Modified, true, true) => Some(EventType::Modified),
        (EventType::Modified, false, true) => Some(EventType::Added),
        (EventType::Modified, true, false) => Some(EventType::Deleted),
        (EventType::Deleted, before, now) if before || now => Some(EventType::Deleted),
        _ => None,
    }
}

impl WatchState {
    /// Queues every event after the position (or an expiry error), advancing the position.
    fn pull(&mut self) {
        let shared = Arc::clone(&self.shared);
        let store = shared.lock();
        self.changes.borrow_and_update();
        let Some(events) = store.events_after(self.position) else {
            let message = format!(
                "too old resource version: {} ({})",
                self.position,
                store.floor()
            );
            self.pending
                .push_back(line("ERROR", &ApiError::expired(message).to_status()));
            self.finished = true;
            return;
        };
        for event in events.filter(|e| e.kind == self.kind.kind) {
            if let Some(event_type) = visible_type(&self.filter, event) {
                let line = self.encoder.event(&shared, event_type, &event.object);
                self.pending.push_back(line);
            }
        }
        self.position = store.resource_version();
    }

    /// Waits for a commit, the bookmark timer or the timeout.
    async fn wait(&mut self) {
        enum Woke {
            Changed(bool),
            Timeout,
            Bookmark,
        }
        let Self {
            changes,
            timeout,
            bookmark,
            ..
        } = self;
        let bookmark_due = async {
            match bookmark {
                Some(sleep) => sleep.as_mut().await,
                None => std::future::pending().await,
            }
        };
        // `biased`: a fixed polling order keeps simulated runs deterministic.
        let woke = tokio::select! {
            biased;
            changed = changes.changed() => Woke::Changed(changed.is_ok()),
            () = timeout.as_mut() => Woke::Timeout,
            () = bookmark_due => Woke::Bookmark,
        };
        match woke {
            Woke::Changed(open) => self.finished = !open,
            Woke::Timeout => self.finished = true,
            Woke::Bookmark => {
                self.pull();
                if !self.finished {
                    self.pending
                        .push_back(bookmark_line(self.kind, self.position, false));
                }
                self.bookmark = Some(Box::pin(tokio::time::sleep(BOOKMARK_INTERVAL)));
            }
        }
    }

    /// The next chunk of the stream, or `None` at its end.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if let Some(chunk) = self.pending.pop_front() {
                return Some(chunk);
            }
            if self.finished {
                return None;
            }
            self.pull();
            if self.pending.is_empty() && !self.finished {
                self.wait().await;
            }
        }
    }
}

/// The initial lines and position of a watch, and whether it already ended, decided under the
/// store lock. A resourceVersion from the future fails with an ERROR event (504), as real
/// servers do once their wait for it times out.
fn initial(
    shared: &Shared,
    store: &Store,
    encoder: &mut Encoder,
    request: &WatchRequest,
) -> (VecDeque<Bytes>, u64, bool) {
    let kind = encoder.kind;
    let current = store.resource_version();
    let mut pending = VecDeque::new();
    match request.resource_version {
        Some(asked) if asked > current => {
            let status = ApiError::too_large_resource_version(asked, current).to_status();
            pending.push_back(line("ERROR", &status));
            (pending, current, true)
        }
        Some(asked) if !request.send_initial_events => (pending, asked, false),
        _ => {
            let namespace = request.filter.namespace.as_deref();
            for (_, object) in store.objects(kind.kind, namespace) {
                if request.filter.matches(object) {
                    pending.push_back(encoder.event(shared, EventType::Added, object));
                }
            }
            if request.send_initial_events && request.bookmarks {
                pending.push_back(bookmark_line(kind, current, true));
            }
            (pending, current, false)
        }
    }
}

/// Starts a watch; the body streams until the timeout, an expiry or the client's drop.
pub fn start(shared: Arc<Shared>, kind: &'static KindInfo, request: WatchRequest) -> ResponseBody {
    let mut encoder = Encoder {
        kind,
        table: request.table,
        headers_sent: false,
    };
    let (pending, position, finished, changes) = {
        let store = shared.lock();
        let (pending, position, finished) = initial(&shared, &store, &mut encoder, &request);
        (pending, position, finished, store.subscribe())
    };
    let state = WatchState {
        shared,
        kind,
        filter: request.filter,
        encoder,
        position,
        pending,
        changes,
        timeout: Box::pin(tokio::time::sleep(request.timeout)),
        bookmark: request
            .bookmarks
            .then(|| Box::pin(tokio::time::sleep(BOOKMARK_INTERVAL))),
        finished,
    };
    let stream = futures::stream::unfold(state, |mut state| async move {
        let chunk = state.next_chunk().await?;
        Some((Ok::<_, Infallible>(Frame::data(chunk)), state))
    });
    StreamBody::new(stream).boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::apiserver::selector::LabelSelector;

    fn event(event_type: EventType, before: Option<&str>, after: &str) -> Event {
        let obj = |app: &str| json!({"metadata": {"name": "a", "labels": {"app": app}}});
        Event {
            resource_version: 1,
            kind: "ConfigMap",
            event_type,
            object: obj(after),
            previous: before.map(obj),
        }
    }

    #[test]
    fn objects_entering_or_leaving_a_selector_are_added_or_deleted() {
        let filter = Filter {
            labels: LabelSelector::parse("app=web").expect("parses"),
            ..Filter::default()
        };
        let seen = |e: Event| visible_type(&filter, &e);
        assert_eq!(
            seen(event(EventType::Added, None, "web")),
            Some(EventType::Added)
        );
        assert_eq!(seen(event(EventType::Added, None, "db")), None);
        assert_eq!(
            seen(event(EventType::Modified, Some("db"), "web")),
            Some(EventType::Added)
        );
        assert_eq!(
            seen(event(EventType::Modified, Some("web"), "db")),
            Some(EventType::Deleted)
        );
        assert_eq!(
            seen(event(EventType::Modified, Some("web"), "web")),
            Some(EventType::Modified)
        );
        assert_eq!(seen(event(EventType::Modified, Some("db"), "db")), None);
        assert_eq!(
            seen(event(EventType::Deleted, Some("web"), "web")),
            Some(EventType::Deleted)
        );
    }

    #[test]
    fn bookmarks_carry_the_position_and_the_initial_events_marker() {
        let kind = crate::kube::apiserver::registry::by_kind("Pod").expect("served");
        let text = bookmark_line(kind, 42, true);
        let value: Value = serde_json::from_slice(&text).expect("json line");
        assert_eq!(value["type"], "BOOKMARK");
        assert_eq!(value["object"]["metadata"]["resourceVersion"], "42");
        assert_eq!(
            value["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
        assert!(text.ends_with(b"\n"));
    }
}

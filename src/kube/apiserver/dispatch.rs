//! Request dispatch: maps a method on a routed path to a read, write, delete or watch and
//! renders the answer (201 for creates, `Status` objects for every failure).

use std::{sync::Arc, time::Duration};

use http::{
    Method, Response,
    header::{ACCEPT, CONTENT_TYPE},
    request::Parts,
};
use serde_json::{Value, json};

use super::{
    Shared,
    delete::{self, DeleteOptions},
    discovery,
    read::{self, ListRequest},
    registry::KindInfo,
    response::{self, ResponseBody},
    route::{Query, Target, parse_path},
    selector::{FieldSelector, Filter, LabelSelector},
    status::ApiError,
    store::ObjectKey,
    table::{self, TableRequest},
    watch::{self, DEFAULT_TIMEOUT, WatchRequest},
    write,
};

type Answer = Result<Response<ResponseBody>, ApiError>;

/// Answers one request whose body has been read.
pub fn handle(shared: &Arc<Shared>, parts: &Parts, body: &[u8]) -> Response<ResponseBody> {
    let answer = route(shared, parts, body);
    answer.unwrap_or_else(|err| {
        tracing::debug!(method = %parts.method, uri = %parts.uri, code = err.code, reason = err.reason, "apiserver request failed");
        response::error(&err)
    })
}

fn route(shared: &Arc<Shared>, parts: &Parts, body: &[u8]) -> Answer {
    let target = parse_path(parts.uri.path())?;
    let query = Query::parse(parts.uri.query());
    let method = &parts.method;
    let header = |name| {
        parts
            .headers
            .get(name)
            .and_then(|v: &http::HeaderValue| v.to_str().ok())
            .unwrap_or("")
    };
    let table = match *method {
        Method::GET => TableRequest::from_request(header(ACCEPT), query.get("includeObject"))?,
        _ => None,
    };
    match target {
        Target::Version if method == Method::GET => Ok(response::json(200, &version())),
        Target::Discovery(document) if method == Method::GET => {
            Ok(response::json(200, &discovery::render(&document)))
        }
        Target::Version | Target::Discovery(_) => {
            Err(ApiError::method_not_allowed(method.as_str()))
        }
        Target::Collection { kind, namespace } => {
            let wants = Wants {
                query: &query,
                table,
            };
            collection(shared, kind, namespace, method, wants, body)
        }
        Target::Object {
            kind,
            namespace,
            name,
            status,
        } => {
            let key = ObjectKey {
                kind: kind.kind,
                namespace,
                name,
            };
            let wants = Wants {
                query: &query,
                table,
            };
            object(
                shared,
                kind,
                key,
                status,
                method,
                wants,
                header(CONTENT_TYPE),
                body,
            )
        }
    }
}

fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-execution-provider-inprocess",
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "",
        "compiler": "rust",
        "platform": "any",
    })
}

fn json_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

fn filter(kind: &KindInfo, namespace: Option<String>, query: &Query) -> Result<Filter, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or(""), kind)
        .map_err(ApiError::bad_request)?;
    Ok(Filter {
        namespace,
        labels,
        fields,
    })
}

/// How a request wants its answer: its query, and whether as a Table.
#[derive(Clone, Copy)]
struct Wants<'a> {
    query: &'a Query,
    table: Option<TableRequest>,
}

impl Wants<'_> {
    /// The answer to a GET, as a Table when one was asked for.
    fn render(&self, shared: &Shared, kind: &KindInfo, answer: Value) -> Value {
        match self.table {
            Some(request) => table::from_answer(kind, &answer, request, shared.clock.wall()),
            None => answer,
        }
    }
}

fn collection(
    shared: &Arc<Shared>,
    kind: &'static KindInfo,
    namespace: Option<String>,
    method: &Method,
    wants: Wants<'_>,
    body: &[u8],
) -> Answer {
    let query = wants.query;
    match *method {
        Method::GET if query.flag("watch") => {
            let timeout = match query.number("timeoutSeconds")? {
                Some(secs) if secs > 0 => Duration::from_secs(secs),
                _ => DEFAULT_TIMEOUT,
            };
            let request = WatchRequest {
                filter: filter(kind, namespace, query)?,
                resource_version: query.resource_version()?,
                bookmarks: query.flag("allowWatchBookmarks"),
                send_initial_events: query.flag("sendInitialEvents"),
                timeout,
                table: wants.table,
            };
            let body = watch::start(Arc::clone(shared), kind, request);
            Ok(response::with_body(200, body))
        }
        Method::GET => {
            let request = ListRequest {
                filter: filter(kind, namespace, query)?,
                limit: query.number("limit")?,
                continue_token: query.get("continue"),
                resource_version: query.resource_version()?,
            };
            let list = read::list(&shared.lock(), kind, &request)?;
            Ok(response::json(200, &wants.render(shared, kind, list)))
        }
        Method::POST => {
            let namespace = match (kind.namespaced, namespace) {
                (true, Some(ns)) => ns,
                (false, None) => String::new(),
                _ => return Err(ApiError::method_not_allowed(method.as_str())),
            };
            let object = json_body(body)?;
            let ctx = shared.ctx(query.dry_run());
            let created = write::create(&mut shared.lock(), &ctx, kind, &namespace, object)?;
            Ok(response::json(201, &created))
        }
        Method::DELETE => {
            let options = DeleteOptions::parse(body)?;
            let ctx = shared.ctx(query.dry_run() || options.dry_run);
            let filter = filter(kind, namespace, query)?;
            let list =
                delete::delete_collection(&mut shared.lock(), &ctx, kind, &filter, &options)?;
            Ok(response::json(200, &list))
        }
        _ => Err(ApiError::method_not_allowed(method.as_str())),
    }
}

#[allow(clippy::too_many_arguments)]
fn object(
    shared: &Arc<Shared>,
    kind: &'static KindInfo,
    key: ObjectKey,
    status: bool,
    method: &Method,
    wants: Wants<'_>,
    content_type: &str,
    body: &[u8],
) -> Answer {
    let query = wants.query;
    let answer = match *method {
        Method::GET => {
            let object = read::get(&shared.lock(), kind, &key)?;
            wants.render(shared, kind, object)
        }
        Method::PUT => {
            let object = json_body(body)?;
            let ctx = shared.ctx(query.dry_run());
            write::replace(&mut shared.lock(), &ctx, kind, key, status, object)?
        }
        Method::PATCH => {
            let ctx = shared.ctx(query.dry_run());
            write::patch(
                &mut shared.lock(),
                &ctx,
                kind,
                key,
                status,
                content_type,
                body,
            )?
        }
        Method::DELETE if !status => {
            let options = DeleteOptions::parse(body)?;
            let ctx = shared.ctx(query.dry_run() || options.dry_run);
            delete::delete(&mut shared.lock(), &ctx, kind, key, &options)?
        }
        _ => return Err(ApiError::method_not_allowed(method.as_str())),
    };
    Ok(response::json(200, &answer))
}

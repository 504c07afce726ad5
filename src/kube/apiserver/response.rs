//! HTTP responses: the body type (whole JSON documents, or a stream for watches) and the
//! builders for JSON and `Status` answers.

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use serde_json::Value;

use super::status::ApiError;

/// The body of every response: a complete document, or a never-failing stream of watch events.
pub type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// A response with `body` and a JSON content type.
pub fn with_body(code: u16, body: ResponseBody) -> Response<ResponseBody> {
    let mut response = Response::new(body);
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A JSON document response.
pub fn json(code: u16, value: &Value) -> Response<ResponseBody> {
    let bytes = serde_json::to_vec(value).expect("JSON values always serialize");
    with_body(code, Full::new(Bytes::from(bytes)).boxed_unsync())
}

/// A `Status` failure response.
pub fn error(err: &ApiError) -> Response<ResponseBody> {
    json(err.code, &err.to_status())
}

//! Request bodies, read once before a handler looks at them: the size limit (413, whether or not
//! the client announced a length), the strict JSON check (`strict_json`: no repeated member, no
//! number that would change), and for `/mcp` the JSON-RPC id, so that the edge's own refusals
//! answer as JSON-RPC errors of that request. `/mcp` bodies are read only once the credential
//! holds, or held moments ago on this edge: an unauthenticated client cannot make the edge
//! buffer anything.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::error::{Code, Error};
use crate::state::AppState;
use crate::strict_json::{self, Problem};

/// The JSON-RPC id of the `/mcp` request being served (None: a notification, or unreadable).
#[derive(Clone, Debug, Default)]
pub struct JsonRpcId(pub Option<Value>);

/// The `/mcp` request's message as the gate read it: the direct path takes it from here
/// instead of reading the body again (`mcp::direct`).
#[derive(Clone, Debug)]
pub struct Message(pub rmcp::model::ClientJsonRpcMessage);

/// JSON-RPC's own codes for what the edge refuses before rmcp sees it.
const PARSE_ERROR: i32 = -32700;
const INVALID_REQUEST: i32 = -32600;
const INVALID_PARAMS: i32 = -32602;

fn too_large() -> Error {
    Error::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        Code::PayloadTooLarge,
        "the request body is larger than this edge accepts",
    )
    .with_hint("an operator sets the limit with --max-body-bytes")
}

/// The SHA-256 of a console request (method, path, canonical JSON body), for its idempotency key.
#[derive(Clone, Copy)]
pub struct RequestDigest(pub [u8; 32]);

impl RequestDigest {
    pub fn of(method: &str, path: &str, body: &[u8]) -> Self {
        use sha2::{Digest, Sha256};
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let canonical = querylayer_envelope::canonical::canonical_json_value(
            &json!({ "method": method, "path": path, "body": body }),
        );
        RequestDigest(Sha256::digest(canonical.as_bytes()).into())
    }
}

/// Reads the whole body within the limit: Err(413) past it, Err(400) when the client breaks off.
async fn read(body: Body, limit: usize) -> Result<Bytes, Error> {
    match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => Ok(bytes),
        Err(e) => {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(err) = source {
                if err.is::<http_body_util::LengthLimitError>() {
                    return Err(too_large());
                }
                source = err.source();
            }
            Err(Error::invalid_argument("the request body could not be read"))
        }
    }
}

fn has_body(request: &Request) -> bool {
    !matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS | Method::DELETE)
}

/// A console or `/v1` body that is not strict JSON: refused once the member token or the envelope
/// holds (an invalid credential gets the same 401 whatever else is wrong).
#[derive(Clone, Debug)]
pub struct MalformedBody(pub String);

/// `/api/console` and `/v1`: a JSON body (when there is one) must be strict JSON within the
/// limit. The refusal waits for the credential (`MalformedBody`): the console's for its token,
/// `/v1`'s for its envelope, so an unauthenticated request is refused alike whatever its body.
/// Console bodies also get their digest, for idempotency keys.
pub async fn strict_body(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if !has_body(&request) {
        return next.run(request).await;
    }
    let console = request.uri().path().starts_with("/api/console/");
    let (mut parts, body) = request.into_parts();
    let bytes = match read(body, state.config.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(e) => return e.into_response(),
    };
    if !bytes.iter().all(u8::is_ascii_whitespace) {
        if let Err(problem) = strict_json::check(&bytes) {
            parts.extensions.insert(MalformedBody(problem.to_string()));
        }
    }
    if console {
        parts.extensions.insert(RequestDigest::of(parts.method.as_str(), parts.uri.path(), &bytes));
    }
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// The body of a `/mcp` POST: its bytes, its JSON-RPC id, whether it is a tool call or a
/// resource read, and the message read from it; or the refusal (with the id, when there is one).
pub async fn inspect(
    body: Body,
    limit: usize,
) -> Result<(Bytes, Option<Value>, bool, Message), (Response, Option<Value>)> {
    use rmcp::model::{ClientJsonRpcMessage, ClientRequest};
    let bytes = match read(body, limit).await {
        Ok(bytes) => bytes,
        Err(e) => {
            let status = e.status;
            return Err((e.into_jsonrpc_response(None, Some(INVALID_REQUEST), status), None));
        }
    };
    match strict_json::check(&bytes) {
        Ok(()) => {
            // JSON, but not a message rmcp can read (it would answer 415 in plain text).
            let message = match serde_json::from_slice::<ClientJsonRpcMessage>(&bytes) {
                Ok(message) => message,
                Err(e) => {
                    let id = jsonrpc_id(&bytes);
                    let refusal = Error::invalid_argument(format!("not a JSON-RPC 2.0 message: {e}"))
                        .into_jsonrpc_response(id.clone(), Some(INVALID_REQUEST), StatusCode::BAD_REQUEST);
                    return Err((refusal, id));
                }
            };
            let governed = matches!(
                &message,
                ClientJsonRpcMessage::Request(r)
                    if matches!(r.request, ClientRequest::CallToolRequest(_) | ClientRequest::ReadResourceRequest(_))
            );
            let id = jsonrpc_id(&bytes);
            Ok((bytes, id, governed, Message(message)))
        }
        Err(problem @ Problem::Syntax(_)) => {
            let refusal = Error::invalid_argument(problem.to_string()).into_jsonrpc_response(
                None,
                Some(PARSE_ERROR),
                StatusCode::BAD_REQUEST,
            );
            Err((refusal, None))
        }
        Err(problem) => {
            let code = if problem.in_params() { INVALID_PARAMS } else { INVALID_REQUEST };
            let id = jsonrpc_id(&bytes);
            let refusal = Error::invalid_argument(problem.to_string()).into_jsonrpc_response(
                id.clone(),
                Some(code),
                StatusCode::BAD_REQUEST,
            );
            Err((refusal, id))
        }
    }
}

/// The id of a JSON-RPC request (a string or an integer), if the body is one.
fn jsonrpc_id(bytes: &[u8]) -> Option<Value> {
    #[derive(serde::Deserialize)]
    struct Message {
        id: Option<Value>,
    }
    serde_json::from_slice::<Message>(bytes)
        .ok()
        .and_then(|m| m.id)
        .filter(|id| id.is_string() || id.is_i64() || id.is_u64())
}

/// The refusal of an authenticated `/mcp` request before the gate has read it (the database
/// unavailable during authentication, a rate limit): the body is read now, only on this path,
/// for the request's id, and the answer is that request's JSON-RPC error.
pub async fn mcp_refusal(request: Request, error: Error, max_body_bytes: usize) -> Response {
    let status = error.status;
    let id = match request.extensions().get::<JsonRpcId>() {
        Some(JsonRpcId(id)) => id.clone(),
        None => {
            let read =
                tokio::time::timeout(Duration::from_secs(2), read(request.into_body(), max_body_bytes));
            match read.await {
                Ok(Ok(bytes)) => jsonrpc_id(&bytes),
                _ => None,
            }
        }
    };
    error.into_jsonrpc_response(id, None, status)
}

/// How long the outer time limit waits beyond the gate's, so that the gate answers first.
pub const OUTER_TIMEOUT_MARGIN: Duration = Duration::from_secs(2);

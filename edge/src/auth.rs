//! Authentication before anything else: the bearer secret becomes a SHA-256 fingerprint
//! (`db::Fingerprint`), the database resolves it (`querylayer_api.authenticate`), and only then
//! does an MCP server exist for the request. A connection this edge authenticated moments ago
//! is admitted without a round trip: its tool calls authenticate in their own statement, and
//! anything else it sends is confirmed in the database first (`confirm`). Every failure is the
//! same 401. Also the protected-resource metadata (RFC 9728) that the 401 challenge points to,
//! which names the edge itself as the authorization server (the `oauth` module).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{header, Extensions, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::db::{ConnectionContext, Fingerprint, RoundTrips};
use crate::error::{Code, Error};
use crate::state::AppState;

/// The longest secret the edge hashes; anything longer cannot be a QueryLayer secret.
const MAX_SECRET_LEN: usize = 512;

/// The bearer token of `Authorization: Bearer <token>`, if the header is well formed.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    let well_formed = scheme.eq_ignore_ascii_case("bearer")
        && !token.is_empty()
        && token.len() <= MAX_SECRET_LEN
        && token.bytes().all(|b| b.is_ascii_graphic());
    well_formed.then_some(token)
}

/// An agent connection admitted to `/mcp`, in the request's extensions from here on.
#[derive(Clone, Debug)]
pub struct Principal {
    pub fingerprint: Fingerprint,
    /// Shared: a request clones its principal (a tool call's context is cloned per call).
    pub context: Arc<ConnectionContext>,
    /// The database authenticated the connection for this request. Otherwise this edge did so
    /// within the last seconds (`Db::recently_authenticated`): enough to admit a tool call, which
    /// authenticates in its own statement, and nothing else (`confirm`).
    pub confirmed: bool,
    /// Set when the database found an admitted credential dead: the answer becomes the 401.
    pub dead: Arc<AtomicBool>,
    /// Set when the database refused a call of an OAuth connection for a scope it lacks: the
    /// answer becomes the step-up challenge naming it (`step_up_challenge`).
    pub lacks: Arc<Mutex<Option<String>>>,
    /// Set when a tool call was refused with a time to retry after (`rate_limited`, `busy`, …):
    /// the answer carries it as `Retry-After` too, as every other retry-later answer does.
    pub retry_after: Arc<AtomicU64>,
    /// The request's token of the connection's rate was taken (by the authentication that
    /// confirmed it); a tool call then takes none.
    pub took_token: bool,
    /// The request's database round trips.
    pub trips: RoundTrips,
}

impl Principal {
    /// The database refused the credential after the middleware admitted it: answer 401.
    pub fn found_dead(&self) {
        if !self.confirmed {
            self.dead.store(true, Ordering::Relaxed);
        }
    }

    /// A tool call was refused with "retry after `secs`".
    pub fn retry_after(&self, secs: u64) {
        self.retry_after.store(secs.max(1), Ordering::Relaxed);
    }

    /// The database refused a call for want of `scope`. A connection issued through OAuth gets
    /// the step-up challenge (its client asks the member for the scope and retries); any other
    /// keeps the tool error, which names the scope too.
    pub fn lacks_scope(&self, scope: &str) {
        if self.context.via_oauth() {
            *self.lacks.lock().unwrap_or_else(|e| e.into_inner()) = Some(scope.to_string());
        }
    }
}

/// Middleware in front of `/mcp`: resolves the bearer secret or answers 401. A presented but
/// dead secret is recorded as a failed authentication (in a transaction of its own). A
/// connection authenticated moments ago is admitted unconfirmed: no round trip here.
pub async fn require_connection(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let Some(fingerprint) = bearer(request.headers()).map(Fingerprint::of) else {
        return challenge(&state, Error::unauthenticated());
    };
    let trips = RoundTrips::default();
    let peer = crate::rate::peer(request.extensions());
    let (context, confirmed) = match state.db.recently_authenticated(&fingerprint) {
        Some(context) => (context, false),
        None => match state.db.counting(&trips).authenticate_edge(&fingerprint, peer).await {
            Ok(context) => (Arc::new(context), true),
            Err(e) if e.code == Code::Unauthenticated => {
                state.db.record_failed_authentication(&fingerprint, "mcp").await;
                return challenge(&state, Error::unauthenticated());
            }
            Err(e) => return crate::body::mcp_refusal(request, e, state.config.max_body_bytes).await,
        },
    };
    let dead = Arc::new(AtomicBool::new(false));
    let lacks = Arc::new(Mutex::new(None));
    let retry_after = Arc::new(AtomicU64::new(0));
    request.extensions_mut().insert(Principal {
        fingerprint,
        context,
        confirmed,
        dead: dead.clone(),
        lacks: lacks.clone(),
        retry_after: retry_after.clone(),
        took_token: confirmed,
        trips,
    });
    let response = next.run(request).await;
    if dead.load(Ordering::Relaxed) {
        return challenge(&state, Error::unauthenticated());
    }
    if let Some(scope) = lacks.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return step_up_challenge(&state, &scope);
    }
    let mut response = response;
    match retry_after.load(Ordering::Relaxed) {
        0 => {}
        secs => {
            response.headers_mut().entry(header::RETRY_AFTER).or_insert(HeaderValue::from(secs));
        }
    }
    response
}

/// Authenticates an unconfirmed principal now, before the edge answers anything but a tool call:
/// discovery (initialize, tools/list, …) and every refusal the edge makes before the database (a
/// malformed body, an unknown tool, a rate limit), so that a dead credential learns nothing
/// but the 401. The fresh context replaces the remembered one. `id`: the JSON-RPC request's,
/// for an error that is not the 401.
pub async fn confirm(
    state: &AppState,
    extensions: &mut Extensions,
    id: Option<Value>,
) -> Result<(), Response> {
    let Some(principal) = extensions.get::<Principal>().filter(|p| !p.confirmed) else {
        return Ok(());
    };
    let db = state.db.counting(&principal.trips);
    match db.authenticate_edge(&principal.fingerprint, crate::rate::peer(extensions)).await {
        Ok(context) => {
            let confirmed = Principal {
                context: Arc::new(context),
                confirmed: true,
                took_token: true,
                ..principal.clone()
            };
            extensions.insert(confirmed);
            Ok(())
        }
        Err(e) if e.code == Code::Unauthenticated => {
            db.record_failed_authentication(&principal.fingerprint, "mcp").await;
            Err(challenge(state, Error::unauthenticated()))
        }
        Err(e) => {
            let status = e.status;
            Err(e.into_jsonrpc_response(id, None, status))
        }
    }
}

/// The one 401 of the edge: no site, agent or reason, and a pointer to the resource metadata.
pub fn challenge(state: &AppState, error: Error) -> Response {
    let mut response = error.into_response();
    let value = format!(r#"Bearer resource_metadata="{}""#, state.config.resource_metadata_url());
    if let Ok(value) = HeaderValue::from_str(&value) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// The step-up challenge of the MCP authorization specification: 403 with `WWW-Authenticate:
/// Bearer error="insufficient_scope"`, the scope the refused operation needs (the client adds it
/// to what it asked before and asks the member again) and the resource metadata. The body is the
/// edge's error object, as for the 401. Only for connections issued through OAuth.
pub fn step_up_challenge(state: &AppState, scope: &str) -> Response {
    let error = Error::new(
        StatusCode::FORBIDDEN,
        Code::Forbidden,
        format!("this connection does not hold the scope {scope}"),
    )
    .with_hint("ask the member to allow the scope: authorize again with it (the MCP step-up flow)")
    .with_required_scope(scope);
    let mut response = error.into_response();
    let value = format!(
        r#"Bearer error="insufficient_scope", scope="{scope}", resource_metadata="{}", error_description="this call needs the scope {scope}""#,
        state.config.resource_metadata_url()
    );
    if let Ok(value) = HeaderValue::from_str(&value) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// The scopes of the contract, advertised in the resource metadata.
pub const SCOPES: &[&str] = &[
    "site:read",
    "content:read",
    "content:write",
    "topical-map:read",
    "topical-map:write",
    "runs:read",
    "runs:write",
    "publish:request",
];

/// `/.well-known/oauth-protected-resource` (and the RFC 9728 path-suffixed form for `/mcp`).
/// The authorization server is the edge itself, at its public URL (the `oauth` module); operators
/// and owners may still issue connection secrets by hand.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/.well-known/oauth-protected-resource", get(resource_metadata))
        .route("/.well-known/oauth-protected-resource/mcp", get(resource_metadata))
}

async fn resource_metadata(State(state): State<AppState>) -> impl IntoResponse {
    Json(json!({
        "resource": state.config.resource_url(),
        "resource_name": "QueryLayer",
        "authorization_servers": [state.config.public_url],
        "bearer_methods_supported": ["header"],
        "scopes_supported": SCOPES,
    }))
}

/// `/mcp`, once admitted: reads the body, answers what is not JSON with JSON-RPC's parse
/// error and what is not a JSON-RPC message with its invalid-request error (HTTP 400, a JSON
/// body, instead of rmcp's 415 in plain text), refuses inexact numbers and repeated members,
/// keeps the request's id for later refusals, and bounds the time of the whole request so that a
/// request cut off still gets a JSON-RPC answer (retryable, with the same idempotency key).
/// Anything but a tool call or a resource read (which authenticate in their own statement), and
/// every refusal here, first confirms an unconfirmed principal (`confirm`).
pub async fn mcp_gate(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let (mut parts, body) = request.into_parts();
    if parts.method != http::Method::POST {
        if let Err(refusal) = confirm(&state, &mut parts.extensions, None).await {
            return refusal;
        }
        return next.run(Request::from_parts(parts, body)).await;
    }
    let (bytes, id, governed, message) = match crate::body::inspect(body, state.config.max_body_bytes).await {
        Ok(inspected) => inspected,
        Err((refusal, id)) => {
            return match confirm(&state, &mut parts.extensions, id).await {
                Ok(()) => refusal,
                Err(challenge) => challenge,
            };
        }
    };
    if !governed {
        if let Err(refusal) = confirm(&state, &mut parts.extensions, id.clone()).await {
            return refusal;
        }
    }
    parts.extensions.insert(crate::body::JsonRpcId(id.clone()));
    parts.extensions.insert(message);
    let request = Request::from_parts(parts, axum::body::Body::from(bytes));
    match tokio::time::timeout(state.config.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => Error::request_timeout().into_jsonrpc_response(id, None, http::StatusCode::REQUEST_TIMEOUT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn bearer_accepts_only_a_well_formed_bearer_header() {
        assert_eq!(bearer(&headers("Bearer qlc_abc")), Some("qlc_abc"));
        assert_eq!(bearer(&headers("bearer  qlc_abc ")), Some("qlc_abc"));
        assert_eq!(bearer(&headers("Basic qlc_abc")), None);
        assert_eq!(bearer(&headers("Bearer")), None);
        assert_eq!(bearer(&headers("Bearer a b")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
        assert_eq!(bearer(&headers(&format!("Bearer {}", "x".repeat(513)))), None);
    }
}

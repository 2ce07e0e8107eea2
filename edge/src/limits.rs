//! Request guards that hold no authority: the Host and Origin allow-lists (DNS rebinding and
//! cross-origin browsers), the per-credential rate limit, and the per-address budget of failed
//! authentications. Both limits are in-memory token buckets per edge instance: N instances admit
//! up to N times the configured rate.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::auth::Principal;
use crate::error::{Code, Error};
use crate::state::AppState;

/// Rejects requests whose Host is not ours (403) or that come from a foreign browser Origin
/// (403). Runs before authentication, so a rebinding page learns nothing else.
pub async fn check_host_and_origin(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let allow = &state.config.allow;
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    let Some(host) = host else {
        return Error::invalid_argument("the Host header is missing").into_response();
    };
    if !allow.host_allowed(&host) {
        tracing::warn!(host = %host, "refused a request for a host that is not allowed");
        return Error::new(StatusCode::FORBIDDEN, Code::ForbiddenHost, "this Host is not served here")
            .with_hint("an operator can allow it with --allowed-host")
            .into_response();
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let allowed = origin.to_str().map(|o| allow.origin_allowed(o)).unwrap_or(false);
        if !allowed {
            tracing::warn!(origin = ?origin, "refused a request from an origin that is not allowed");
            return Error::new(
                StatusCode::FORBIDDEN,
                Code::ForbiddenOrigin,
                "requests from this Origin are not accepted",
            )
            .with_hint("an operator can allow it with --allowed-origin")
            .into_response();
        }
    }
    next.run(request).await
}

/// Middleware after authentication on `/mcp`: one bucket per connection; over it, the request's
/// JSON-RPC error (retryable, with `retry_after`).
pub async fn limit_connection(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    if let Some(connection_id) = request.extensions().get::<Principal>().map(|p| p.context.connection_id) {
        if let Err(retry_after) = state.limiter.check(connection_id) {
            tracing::info!(connection_id = %connection_id, "rate limited");
            if let Err(challenge) = crate::auth::confirm(&state, request.extensions_mut(), None).await {
                return challenge;
            }
            return crate::body::mcp_refusal(
                request,
                Error::rate_limited(retry_after),
                state.config.max_body_bytes,
            )
            .await;
        }
    }
    next.run(request).await
}

/// Middleware in front of every credential check (`/mcp`, the console, `/v1`): a peer address
/// whose failed authentications (answers 401) have used up their budget is answered 429 before
/// any database work, so a stream of bad secrets cannot fill the audit log or the pool. Behind a
/// reverse proxy every client shares the proxy's address: raise the budget or set its rate to 0.
pub async fn limit_auth_failures(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    if let Some(peer) = peer {
        if let Err(retry_after) = state.auth_failures.admits(&peer) {
            tracing::warn!(peer = %peer, "refused a request from an address over its failed-authentication budget");
            return Error::rate_limited(retry_after)
                .with_hint(
                    "too many failed authentications from this address; wait, then use a valid credential",
                )
                .into_response();
        }
    }
    let response = next.run(request).await;
    if let Some(peer) = peer.filter(|_| response.status() == StatusCode::UNAUTHORIZED) {
        let _ = state.auth_failures.check(peer);
    }
    response
}

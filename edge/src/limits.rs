//! Request guards that hold no authority: the Host and Origin allow-lists (DNS rebinding and
//! cross-origin browsers), a connection's rate and an address's budget of failed
//! authentications. Both limits are decided in the database for every edge at once
//! (sql/157_rate.sql: the statements that authenticate and call take the tokens, the record of a
//! failure spends the budget); what is here repeats the database's refusals until they end, so
//! a client over a limit costs the database nothing more.

use axum::extract::{Request, State};
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

/// Middleware after authentication on `/mcp`: a connection the database refused for its rate
/// (a call or an authentication answered `rate_limited`) is refused here until `retry_after`
/// has passed: the request's JSON-RPC error (retryable, with `retry_after`).
pub async fn limit_connection(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    if let Some(connection_id) = request.extensions().get::<Principal>().map(|p| p.context.connection_id) {
        if let Some(retry_after) = state.db.connection_held(&connection_id) {
            tracing::info!(connection_id = %connection_id, "rate limited");
            // A dead credential gets the 401; any other refusal of the confirmation (the rate
            // again) is this one, answered below as the request's JSON-RPC error.
            if let Err(challenge) = crate::auth::confirm(&state, request.extensions_mut(), None).await {
                if challenge.status() == StatusCode::UNAUTHORIZED {
                    return challenge;
                }
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

/// Middleware in front of every credential check (`/mcp`, the console, `/v1`, the dashboard,
/// the delivery API): each failed authentication (an answer 401) spends the address's budget in
/// the database, the one every edge shares; once the database says it is spent, the address is
/// answered 429 here before any database work until its `retry_after` has passed. `/mcp`
/// also asks the database before it evaluates a new credential (`Db::authenticate_edge`), so
/// the budget holds exactly there; elsewhere an edge learns it is spent at the next failure.
/// Behind a reverse proxy every client shares the proxy's address: raise the budget or set its
/// rate to 0.
pub async fn limit_auth_failures(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let peer = crate::rate::peer(request.extensions());
    if let Some(peer) = peer {
        if let Some(retry_after) = state.peer_holds.held(&peer) {
            tracing::warn!(peer = %peer, "refused a request from an address over its failed-authentication budget");
            return over_budget(retry_after);
        }
    }
    let response = next.run(request).await;
    if let Some(peer) = peer.filter(|_| response.status() == StatusCode::UNAUTHORIZED) {
        if let Some(wait) = state.db.spend_peer_failure(peer).await {
            state.peer_holds.hold(peer, wait);
        }
    }
    response
}

/// The refusal of an address whose failed-authentication budget is spent.
pub fn over_budget(retry_after: u64) -> Response {
    Error::rate_limited(retry_after)
        .with_hint("too many failed authentications from this address; wait, then use a valid credential")
        .into_response()
}

//! The QueryLayer edge: a stateless service that authenticates bearer secrets and carries MCP
//! tool calls and console requests to `querylayer_api` functions, one transaction each. The
//! database decides; the edge only carries.
//!
//! One module per stage of a request:
//! `config` → `listener` (connection limits and timeouts) → `limits` (Host/Origin, rate) →
//! `body` (size, strict JSON) → `auth` → `bulkhead` (a site's share of the pool) → `mcp` /
//! `console` / `dashboard` / `delivery` → `db` (the one SQL call) → `error` (the one SQLSTATE
//! table, the response).
//! `admin` is the operator command line.

pub mod admin;
pub mod auth;
pub mod body;
pub mod bulkhead;
pub mod card;
pub mod commands;
pub mod compat;
pub mod config;
pub mod console;
pub mod dashboard;
pub mod db;
pub mod delivery;
pub mod error;
pub mod health;
pub mod ledger;
pub mod limits;
pub mod listener;
pub mod llm;
pub mod mcp;
pub mod metrics;
pub mod pgtls;
pub mod strict_json;
pub mod telemetry;
pub mod v1;
pub mod worker;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::bulkhead::SiteLimits;
use crate::config::HttpConfig;
use crate::db::Db;
use crate::error::Error;
use crate::health::Readiness;
use crate::limits::{FailureBudget, RateLimiter};

/// Everything a request may use. Cloned per request; holds no per-client state beyond the
/// rate limiter's buckets and the sites' permits.
#[derive(Clone)]
pub struct AppState {
    pub db: Db,
    pub config: Arc<HttpConfig>,
    pub limiter: Arc<RateLimiter>,
    pub auth_failures: Arc<FailureBudget>,
    pub sites: Arc<SiteLimits>,
    pub readiness: Arc<Readiness>,
}

impl AppState {
    pub fn new(db: Db, config: HttpConfig) -> Self {
        let limiter = Arc::new(RateLimiter::new(config.rate_limit_per_sec, config.rate_burst));
        let auth_failures = Arc::new(FailureBudget::new(config.auth_failure_rate, config.auth_failure_burst));
        let sites =
            Arc::new(SiteLimits::new(0, Some(config.site_reads), Some(config.site_writes), config.site_wait));
        let readiness = Readiness::new(config.readiness.clone(), config.readiness_tls.clone());
        AppState { db, config: Arc::new(config), limiter, auth_failures, sites, readiness }
    }
}

/// The whole HTTP surface, testable with `oneshot` without a socket.
pub fn app(state: AppState) -> Router {
    let mut plain = console::router();
    if state.config.require_auth {
        plain = plain.merge(v1::router());
    }
    let plain = plain.route_layer(middleware::from_fn_with_state(state.clone(), body::strict_body));
    // The dashboard takes HTML forms and the delivery API only reads: neither takes JSON bodies.
    let governed = mcp::router(&state).merge(plain).merge(dashboard::router()).merge(delivery::router());
    let guarded = governed
        .route_layer(middleware::from_fn_with_state(state.clone(), limits::limit_auth_failures))
        .route_layer(middleware::from_fn_with_state(state.clone(), limits::check_host_and_origin));
    Router::new()
        .merge(guarded)
        .merge(auth::router())
        .merge(health::router())
        .route("/.well-known/agent-card.json", axum::routing::get(v1::agent_card))
        .route(card::DOCUMENTATION_PATH, axum::routing::get(card::documentation))
        .fallback(|| async { Error::not_found("no such endpoint").into_response() })
        .layer(middleware::from_fn(log_request))
        // One body limit, the operator's: axum's own 2 MiB default for extractors is lifted.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(state.config.max_body_bytes))
        // The backstop: /mcp answers its own time limit as a JSON-RPC error a little earlier.
        .layer(TimeoutLayer::with_status_code(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            state.config.request_timeout + body::OUTER_TIMEOUT_MARGIN,
        ))
        .layer(middleware::from_fn(explain_limits))
        .layer(middleware::from_fn(telemetry::observe))
        .with_state(state)
}

/// The body and time limits answer from tower layers, with an empty or plain-text body; give
/// them the JSON error body every other refusal has (on `/mcp`, the JSON-RPC error shape).
async fn explain_limits(request: Request, next: Next) -> Response {
    let mcp = request.uri().path() == "/mcp";
    explain(next.run(request).await, mcp)
}

fn explain(response: Response, mcp: bool) -> Response {
    use axum::http::{header, StatusCode};
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return response;
    }
    let status = response.status();
    let error = match status {
        StatusCode::PAYLOAD_TOO_LARGE => Error::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "the request body is larger than this edge accepts",
        )
        .with_hint("an operator sets the limit with --max-body-bytes"),
        StatusCode::REQUEST_TIMEOUT => Error::request_timeout(),
        _ => return response,
    };
    if mcp {
        let code = (status == StatusCode::PAYLOAD_TOO_LARGE).then_some(-32600);
        error.into_jsonrpc_response(None, code, status)
    } else {
        error.into_response()
    }
}

/// One log line per request: method, path, status, duration, and the MCP method when the
/// client names it. Never a header value that could carry a credential, never a query string.
async fn log_request(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let mcp_method = request.headers().get("mcp-method").and_then(|v| v.to_str().ok()).map(str::to_string);
    let response = next.run(request).await;
    tracing::info!(
        method = %method,
        path = %path,
        status = response.status().as_u16(),
        duration_ms = started.elapsed().as_millis() as u64,
        mcp_method,
        "request"
    );
    response
}

/// Resolves on Ctrl-C or SIGTERM: what `serve` and `worker` stop on.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{to_bytes, Body};
    use axum::http::StatusCode;

    async fn code_of(response: Response) -> (StatusCode, serde_json::Value) {
        let status = response.status();
        let body = to_bytes(response.into_body(), 1 << 16).await.unwrap();
        (status, serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null))
    }

    #[tokio::test]
    async fn the_limits_answer_with_the_json_error_body() {
        for (status, code) in [
            (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
        ] {
            let bare = Response::builder().status(status).body(Body::from("length limit exceeded")).unwrap();
            let (answered, body) = code_of(explain(bare, false)).await;
            assert_eq!((answered, body["error"]["code"].as_str()), (status, Some(code)));
            // On /mcp the same refusal is a JSON-RPC error (no id: the request was not read).
            let bare = Response::builder().status(status).body(Body::from("length limit exceeded")).unwrap();
            let (answered, body) = code_of(explain(bare, true)).await;
            assert_eq!((answered, body["error"]["data"]["code"].as_str()), (status, Some(code)));
            assert_eq!(body["id"], serde_json::Value::Null);
        }
        // A JSON error from a handler, and any other status, pass through untouched.
        let ours = Error::new(StatusCode::PAYLOAD_TOO_LARGE, "too_many_records", "x").into_response();
        assert_eq!(code_of(explain(ours, false)).await.1["error"]["code"], "too_many_records");
        let teapot = Response::builder().status(StatusCode::IM_A_TEAPOT).body(Body::empty()).unwrap();
        assert_eq!(explain(teapot, true).status(), StatusCode::IM_A_TEAPOT);
    }
}

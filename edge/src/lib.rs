//! The QueryLayer edge: a stateless service that authenticates bearer secrets and carries MCP
//! tool calls and console requests to `querylayer_api` functions, one transaction each. The
//! database decides; the edge only carries.
//!
//! One module per stage of a request:
//! `config` → `limits` (Host/Origin, rate) → `auth` → `mcp` / `console` → `db` (the one SQL
//! call) → `error` (the one SQLSTATE table, the response). `admin` is the operator command line.

pub mod admin;
pub mod auth;
pub mod card;
pub mod commands;
pub mod config;
pub mod console;
pub mod db;
pub mod error;
pub mod health;
pub mod limits;
pub mod llm;
pub mod mcp;
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

use crate::config::HttpConfig;
use crate::db::Db;
use crate::error::Error;
use crate::limits::RateLimiter;

/// Everything a request may use. Cloned per request; holds no per-client state beyond the
/// rate limiter's buckets.
#[derive(Clone)]
pub struct AppState {
    pub db: Db,
    pub config: Arc<HttpConfig>,
    pub limiter: Arc<RateLimiter>,
}

impl AppState {
    pub fn new(db: Db, config: HttpConfig) -> Self {
        let limiter = Arc::new(RateLimiter::new(config.rate_limit_per_sec, config.rate_burst));
        AppState { db, config: Arc::new(config), limiter }
    }
}

/// The whole HTTP surface, testable with `oneshot` without a socket.
pub fn app(state: AppState) -> Router {
    let mut governed = mcp::router(&state).merge(console::router());
    if state.config.require_auth {
        governed = governed.merge(v1::router());
    }
    let guarded =
        governed.route_layer(middleware::from_fn_with_state(state.clone(), limits::check_host_and_origin));
    Router::new()
        .merge(guarded)
        .merge(auth::router())
        .merge(health::router())
        .route("/.well-known/agent-card.json", axum::routing::get(v1::agent_card))
        .fallback(|| async { Error::not_found("no such endpoint").into_response() })
        .layer(middleware::from_fn(log_request))
        .layer(RequestBodyLimitLayer::new(state.config.max_body_bytes))
        .layer(TimeoutLayer::with_status_code(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            state.config.request_timeout,
        ))
        .with_state(state)
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

//! The QueryLayer edge: a stateless service that authenticates bearer secrets and carries MCP
//! tool calls and console requests to `querylayer_api` functions, one transaction each. The
//! database decides; the edge only carries.
//!
//! One module per stage of a request:
//! `config` → `listener` (connection limits and timeouts) → `limits` (Host/Origin, rate) →
//! `body` (size, strict JSON) → `auth` → `bulkhead` (a site's share of the pool) → `mcp` /
//! `console` / `dashboard` / `delivery` → `db` (the one SQL call) → `error` (the one SQLSTATE
//! table, the response).
//! `admin` is the operator command line. `state` is the ground floor (`AppState`, shutdown); this
//! file only builds the app.

pub mod admin;
pub mod answer;
pub mod auth;
pub mod body;
pub mod bulkhead;
pub mod card;
pub mod client_documents;
pub mod commands;
pub mod compat;
pub mod config;
pub mod console;
pub mod dashboard;
pub mod db;
pub mod delivery;
pub mod error;
pub mod fetch;
pub mod health;
pub mod ledger;
pub mod limits;
pub mod listener;
pub mod llm;
pub mod mcp;
pub mod metrics;
pub mod oauth;
pub mod pgtls;
pub mod rate;
pub mod replica;
pub mod state;
pub mod strict_json;
pub mod telemetry;
pub mod v1;
pub mod worker;

use std::time::Instant;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::error::{Code, Error};
pub use crate::state::{shutdown_signal, AppState};

/// The whole HTTP surface, testable with `oneshot` without a socket.
pub fn app(state: AppState) -> Router {
    let mut plain = console::router();
    if state.config.require_auth {
        plain = plain.merge(v1::router());
    }
    let plain = plain.route_layer(middleware::from_fn_with_state(state.clone(), body::strict_body));
    // The dashboard takes HTML forms and the delivery API only reads: neither takes JSON bodies.
    let governed = mcp::router(&state)
        .merge(plain)
        .merge(dashboard::router())
        .merge(oauth::pages())
        .merge(delivery::router());
    let guarded = governed
        .route_layer(middleware::from_fn_with_state(state.clone(), limits::limit_auth_failures))
        .route_layer(middleware::from_fn_with_state(state.clone(), limits::check_host_and_origin));
    Router::new()
        .merge(guarded)
        .merge(auth::router())
        .merge(oauth::router())
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
            Code::PayloadTooLarge,
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
    // A handler that counted its database round trips (the delivery API) left them here.
    let db_round_trips = response.extensions().get::<db::RoundTrips>().map(db::RoundTrips::count);
    tracing::info!(
        method = %method,
        path = %path,
        status = response.status().as_u16(),
        duration_ms = started.elapsed().as_millis() as u64,
        mcp_method,
        db_round_trips,
        "request"
    );
    response
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
        let ours = Error::new(StatusCode::PAYLOAD_TOO_LARGE, Code::TooLarge, "x").into_response();
        assert_eq!(code_of(explain(ours, false)).await.1["error"]["code"], "too_large");
        let teapot = Response::builder().status(StatusCode::IM_A_TEAPOT).body(Body::empty()).unwrap();
        assert_eq!(explain(teapot, true).status(), StatusCode::IM_A_TEAPOT);
    }

    /// The top-level modules each `edge/src` module names (`crate::x`), tests left out.
    fn imports() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).expect("edge/src") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    walk(&path, out);
                } else if path.extension().is_some_and(|x| x == "rs") {
                    out.push(path);
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        walk(&root, &mut files);
        let mut graph: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
            Default::default();
        for file in files {
            let relative = file.strip_prefix(&root).expect("under src").to_string_lossy().to_string();
            let module = relative.split('/').next().unwrap_or_default().trim_end_matches(".rs").to_string();
            if module == "lib" || module == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&file).expect("source");
            let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
            let names = graph.entry(module.clone()).or_default();
            for (at, needle) in text.match_indices("crate::") {
                let rest = &text[at + needle.len()..];
                let groups: Vec<&str> = match rest.strip_prefix('{') {
                    Some(group) => group.split('}').next().unwrap_or_default().split(',').collect(),
                    None => vec![rest],
                };
                for group in groups {
                    let name: String =
                        group.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                    if !name.is_empty() && name != module {
                        names.insert(name);
                    }
                }
            }
        }
        graph
    }

    /// Imports that close a cycle today and are removed by a change under way (none now).
    const PENDING: &[(&str, &str)] = &[];

    #[test]
    fn no_module_imports_one_that_imports_it_back() {
        let mut graph = imports();
        for (from, to) in PENDING {
            if let Some(names) = graph.get_mut(*from) {
                names.remove(*to);
            }
        }
        assert!(graph.len() > 20, "the scan found the modules: {:?}", graph.keys());
        // Depth-first search for a path back to each module.
        for start in graph.keys() {
            let mut stack: Vec<Vec<&str>> = vec![vec![start.as_str()]];
            let mut seen = std::collections::BTreeSet::new();
            while let Some(path) = stack.pop() {
                let last = *path.last().expect("a path");
                for next in graph.get(last).into_iter().flatten() {
                    if next == start {
                        panic!("an import cycle: {} -> {start}", path.join(" -> "));
                    }
                    if graph.contains_key(next) && seen.insert(next.as_str()) {
                        let mut longer = path.clone();
                        longer.push(next.as_str());
                        stack.push(longer);
                    }
                }
            }
        }
        // Nothing below the router imports it for the state.
        for (module, names) in &imports() {
            assert!(
                !names.contains("AppState") && !names.contains("shutdown_signal"),
                "{module} imports lib.rs"
            );
        }
    }
}

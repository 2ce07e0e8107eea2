//! Prometheus metrics, served on a listen address of their own (`--metrics-listen`, off unless
//! configured) at `/metrics` in the text exposition format. One process-wide registry of
//! counters and histograms, written from a few hooks (the HTTP layer in `telemetry`, the end of a
//! tool call, the pool, `Error::from_db`) and read by the scrape; the pool's gauges are read
//! from the pool at scrape time. Labels come from closed sets (tool names, status codes,
//! SQLSTATEs, route prefixes), never from a caller's input.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::IntoResponse;

/// Upper bounds of the latency histograms, in seconds.
const BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

type Labels = Vec<(&'static str, String)>;

#[derive(Clone, Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS.len()];
        }
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                self.counts[i] += 1;
            }
        }
        self.sum += seconds;
        self.count += 1;
    }
}

struct Family {
    help: &'static str,
    histogram: bool,
    counters: BTreeMap<Labels, u64>,
    histograms: BTreeMap<Labels, Histogram>,
}

#[derive(Default)]
struct Registry {
    families: BTreeMap<&'static str, Family>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Default::default);

fn family<'a>(
    registry: &'a mut Registry,
    name: &'static str,
    help: &'static str,
    histogram: bool,
) -> &'a mut Family {
    registry.families.entry(name).or_insert_with(|| Family {
        help,
        histogram,
        counters: BTreeMap::new(),
        histograms: BTreeMap::new(),
    })
}

fn count(name: &'static str, help: &'static str, labels: Labels) {
    let mut registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    *family(&mut registry, name, help, false).counters.entry(labels).or_default() += 1;
}

fn observe(name: &'static str, help: &'static str, labels: Labels, elapsed: Duration) {
    let mut registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    family(&mut registry, name, help, true)
        .histograms
        .entry(labels)
        .or_default()
        .observe(elapsed.as_secs_f64());
}

/// The end of one MCP tool call: its outcome (`ok`, `error` with the edge's error code,
/// `retry_later`, `protocol_error`; `error::tool_outcome` classifies a response) and its latency.
pub fn tool_call(tool: &'static str, started: Instant, outcome: &str, code: &str) {
    count(
        "querylayer_tool_calls_total",
        "MCP tool calls by tool, outcome (ok, error, retry_later, protocol_error) and error code",
        vec![("tool", tool.to_string()), ("outcome", outcome.to_string()), ("code", code.to_string())],
    );
    observe(
        "querylayer_tool_call_duration_seconds",
        "Latency of MCP tool calls, by tool",
        vec![("tool", tool.to_string())],
        started.elapsed(),
    );
}

/// The route family of a path, a closed set (paths carry identifiers).
pub fn route_of(path: &str) -> &'static str {
    const PREFIXES: &[(&str, &str)] = &[
        ("/mcp", "/mcp"),
        ("/api/console", "/api/console"),
        ("/v1/", "/v1"),
        ("/delivery/v1", "/delivery/v1"),
        ("/healthz", "/healthz"),
        ("/readyz", "/readyz"),
        ("/.well-known/", "/.well-known"),
        ("/docs/", "/docs"),
    ];
    PREFIXES
        .iter()
        .find(|(prefix, _)| path.starts_with(prefix))
        .map(|(_, route)| *route)
        .unwrap_or("dashboard")
}

/// One HTTP request: by route family and status; refusals of a credential (401) and of the
/// rate limits (429: a credential's bucket or an address's failed-authentication budget).
pub fn http_request(path: &str, status: u16, elapsed: Duration) {
    let route = route_of(path);
    count(
        "querylayer_http_requests_total",
        "HTTP requests by route family and status",
        vec![("route", route.to_string()), ("status", status.to_string())],
    );
    observe(
        "querylayer_http_request_duration_seconds",
        "Latency of HTTP requests, by route family",
        vec![("route", route.to_string())],
        elapsed,
    );
    let reason = match status {
        401 => "authentication_failed",
        429 => "rate_limited",
        _ => return,
    };
    count(
        "querylayer_refusals_total",
        "Requests refused before any work: authentication_failed (401) and rate_limited (429, a \
         credential's rate limit or an address's failed-authentication budget)",
        vec![("reason", reason.to_string()), ("route", route.to_string())],
    );
}

/// A database error, by SQLSTATE (`connection` when no SQLSTATE: the connection failed).
pub fn database_error(sqlstate: Option<&str>) {
    count(
        "querylayer_database_errors_total",
        "Errors from the database by SQLSTATE (connection: no connection could be made or it was lost)",
        vec![("sqlstate", sqlstate.unwrap_or("connection").to_string())],
    );
}

/// How long a request waited for a pooled connection, and whether it got one.
pub fn pool_wait(elapsed: Duration, got: bool) {
    observe(
        "querylayer_pool_wait_seconds",
        "Time spent waiting for a pooled database connection",
        Vec::new(),
        elapsed,
    );
    if !got {
        count(
            "querylayer_pool_timeouts_total",
            "Requests that got no pooled database connection (timeout or connection failure)",
            Vec::new(),
        );
    }
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn label_text(labels: &Labels, extra: Option<(&str, String)>) -> String {
    let mut parts: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{v}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// What the scrape reads of the database pool (the pool's own status).
pub type PoolStatus = std::sync::Arc<dyn Fn() -> deadpool_postgres::Status + Send + Sync>;

/// The exposition text: every family, then the pool's gauges when a pool is given.
pub fn render(pool: Option<&PoolStatus>) -> String {
    let mut out = String::new();
    {
        let registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        for (name, family) in &registry.families {
            let kind = if family.histogram { "histogram" } else { "counter" };
            let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} {kind}", family.help);
            for (labels, value) in &family.counters {
                let _ = writeln!(out, "{name}{} {value}", label_text(labels, None));
            }
            for (labels, h) in &family.histograms {
                for (bound, n) in BUCKETS.iter().zip(&h.counts) {
                    let _ = writeln!(
                        out,
                        "{name}_bucket{} {n}",
                        label_text(labels, Some(("le", bound.to_string())))
                    );
                }
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {}",
                    label_text(labels, Some(("le", "+Inf".into()))),
                    h.count
                );
                let _ = writeln!(out, "{name}_sum{} {}", label_text(labels, None), h.sum);
                let _ = writeln!(out, "{name}_count{} {}", label_text(labels, None), h.count);
            }
        }
    }
    if let Some(pool) = pool {
        let status = pool();
        for (name, help, value) in [
            ("querylayer_pool_size", "Database connections the pool may open", status.max_size),
            ("querylayer_pool_connections", "Database connections the pool holds open", status.size),
            ("querylayer_pool_idle", "Open database connections not in use", status.available),
            ("querylayer_pool_waiting", "Requests waiting for a pooled database connection", status.waiting),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        }
    }
    out
}

async fn scrape(State(pool): State<PoolStatus>) -> impl IntoResponse {
    ([(http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], render(Some(&pool)))
}

/// Serves `/metrics` at `address` until `stop` turns true. Returns the bound address.
pub async fn serve(
    address: &str,
    pool: PoolStatus,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<SocketAddr, String> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| format!("--metrics-listen {address}: cannot listen: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let router = axum::Router::new().route("/metrics", axum::routing::get(scrape)).with_state(pool);
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        if let Err(e) = axum::serve(listener, router).with_graceful_shutdown(shutdown).await {
            tracing::error!("metrics listener: {e}");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_render_in_the_exposition_format() {
        http_request("/api/console/sites/x", 429, Duration::from_millis(3));
        database_error(Some("QL403"));
        pool_wait(Duration::from_millis(20), false);
        let text = render(None);
        assert!(text.contains("# TYPE querylayer_http_requests_total counter"), "{text}");
        assert!(
            text.contains("querylayer_http_requests_total{route=\"/api/console\",status=\"429\"} "),
            "{text}"
        );
        assert!(text.contains("querylayer_refusals_total{reason=\"rate_limited\",route=\"/api/console\"} "));
        assert!(text.contains("querylayer_database_errors_total{sqlstate=\"QL403\"} "));
        assert!(text.contains(
            "querylayer_http_request_duration_seconds_bucket{route=\"/api/console\",le=\"0.005\"} "
        ));
        assert!(text.contains("querylayer_pool_wait_seconds_bucket{le=\"+Inf\"} "));
        assert!(text.contains("querylayer_pool_timeouts_total "));
        assert_eq!(route_of("/sites/a/inbox"), "dashboard");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}

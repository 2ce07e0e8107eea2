//! Logs, request ids and traces.
//!
//! * Every HTTP request runs in a `request` span whose `request_id` is the client's
//!   `x-request-id` when it is sane (1 to 64 of `A-Z a-z 0-9 . _ : -`) or a new UUID; the
//!   response carries it back in `x-request-id`, and every log line written while the request
//!   is served carries it (the text format prints the span, the JSON format its `span` object).
//!   A tool call runs in a `tool` span (child of the request, with the same `request_id`), and
//!   each SQL call of a `querylayer_api` function in a `db` span inside it. The `db` span is at
//!   debug level: the logs have it only when `QUERYLAYER_LOG` asks for debug (under the default
//!   filter it is not even made, a sixteenth of a console request's instructions); the traces
//!   always have it.
//! * With `--otlp-endpoint`, those spans are sent as OpenTelemetry traces over OTLP/HTTP (JSON
//!   encoding) to `<endpoint>/v1/traces`, batched, from a background task; a full queue drops
//!   spans rather than slow a request. A W3C `traceparent` header continues the caller's trace.

use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use clap::ValueEnum;
use http::HeaderValue;
use serde_json::{json, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Instrument, Span, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines are written: text for a terminal, one JSON object per line for a collector.
#[derive(ValueEnum, Clone, Copy, Debug, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The span of the HTTP request being served, in the request's extensions (rmcp hands the
/// request's parts to the tool, which runs on a task of its own).
#[derive(Clone)]
pub struct RequestSpan {
    pub span: Span,
    pub request_id: String,
}

/// Logs go to stderr (stdout is the protocol channel of `mcp-serve`), a line at a time. Filter
/// with QUERYLAYER_LOG (tracing's env-filter syntax). Commands other than `serve` send no traces.
pub fn init_logging(format: LogFormat) {
    init_with(format, None, Stderr { batched: false })
}

/// The logs of `serve`: to stderr, filtered with QUERYLAYER_LOG (tracing's env-filter syntax),
/// batched when stderr is not a terminal (`Stderr`); with `otlp`, spans to that OTLP/HTTP
/// endpoint. Call `flush_logs` before the process ends.
pub fn init(format: LogFormat, otlp: Option<&str>) {
    let batched = !std::io::stderr().is_terminal();
    if batched {
        LOG_LINES.start();
    }
    init_with(format, otlp, Stderr { batched })
}

fn init_with(format: LogFormat, otlp: Option<&str>, writer: Stderr) {
    let filter = EnvFilter::try_from_env("QUERYLAYER_LOG").unwrap_or_else(|_| {
        EnvFilter::new("info,rmcp=warn,tower_http=warn,deadpool=warn,tokio_postgres=warn")
    });
    let traces = otlp.map(|endpoint| {
        OtlpLayer::new(endpoint).with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            meta.is_span() && meta.target().starts_with("querylayer_edge")
        }))
    });
    let registry = tracing_subscriber::registry().with(traces);
    let logs = tracing_subscriber::fmt::layer().with_writer(writer);
    let _ = match format {
        LogFormat::Json => registry
            .with(
                logs.json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_filter(filter),
            )
            .try_init(),
        LogFormat::Text => {
            registry.with(logs.with_ansi(std::io::stderr().is_terminal()).with_filter(filter)).try_init()
        }
    };
    if let Some(endpoint) = otlp {
        tracing::info!(endpoint, "sending traces over OTLP/HTTP");
    }
}

/// Where log lines go: stderr, a line at a time, or batched. A batched line is appended to
/// `LOG_LINES` and reaches stderr within `FLUSH_AFTER` (one write for all the lines of that time,
/// where a line at a time is one system call a line, two a tool call); a warning or an error
/// writes out the batch at once, with itself last, and so does a batch past `FLUSH_BYTES`.
#[derive(Clone, Copy)]
struct Stderr {
    batched: bool,
}

/// One line's writer (tracing-subscriber formats a line, writes it with one `write_all`, drops
/// the writer).
struct Line {
    batched: bool,
    urgent: bool,
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Stderr {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line { batched: self.batched, urgent: true }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Line {
        Line { batched: self.batched, urgent: *meta.level() <= tracing::Level::WARN }
    }
}

impl std::io::Write for Line {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.batched {
            LOG_LINES.append(bytes, self.urgent);
            Ok(bytes.len())
        } else {
            std::io::stderr().write(bytes)
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const FLUSH_AFTER: Duration = Duration::from_millis(50);
const FLUSH_BYTES: usize = 64 * 1024;

/// The lines not yet written, and the thread that writes them (parked while there are none).
struct Batch {
    lines: Mutex<Vec<u8>>,
    waiting: AtomicBool,
    writer: OnceLock<std::thread::Thread>,
}

static LOG_LINES: Batch =
    Batch { lines: Mutex::new(Vec::new()), waiting: AtomicBool::new(false), writer: OnceLock::new() };

impl Batch {
    fn start(&'static self) {
        self.writer.get_or_init(|| {
            std::thread::Builder::new()
                .name("log-writer".into())
                .spawn(move || loop {
                    std::thread::park();
                    if self.waiting.load(Ordering::SeqCst) {
                        std::thread::sleep(FLUSH_AFTER);
                        // Cleared before the write: a line appended from here on wakes this
                        // thread again, so none waits longer than one more round.
                        self.waiting.store(false, Ordering::SeqCst);
                        self.write_out();
                    }
                })
                .expect("the log writer thread")
                .thread()
                .clone()
        });
    }

    fn append(&self, bytes: &[u8], urgent: bool) {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        lines.extend_from_slice(bytes);
        if urgent || lines.len() >= FLUSH_BYTES {
            write_lines(&mut lines);
            return;
        }
        drop(lines);
        if !self.waiting.swap(true, Ordering::SeqCst) {
            if let Some(writer) = self.writer.get() {
                writer.unpark();
            }
        }
    }

    fn write_out(&self) {
        write_lines(&mut self.lines.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

fn write_lines(lines: &mut Vec<u8>) {
    if !lines.is_empty() {
        let _ = std::io::stderr().write_all(lines);
        lines.clear();
    }
}

/// Writes out the log lines still batched: before the process ends, and before a panic's report.
pub fn flush_logs() {
    LOG_LINES.write_out();
}

fn sane_request_id(value: &str) -> bool {
    (1..=64).contains(&value.len())
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// The outermost layer: the request id, the request's span (and trace), its metrics.
pub async fn observe(mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let request_id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| sane_request_id(v))
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let path = request.uri().path().to_string();
    let remote =
        request.headers().get("traceparent").and_then(|v| v.to_str().ok()).and_then(parse_traceparent);
    REMOTE_PARENT.set(remote);
    let span = tracing::info_span!(
        "request",
        request_id = %request_id,
        method = %request.method(),
        route = crate::metrics::route_of(&path),
        status = tracing::field::Empty,
    );
    REMOTE_PARENT.set(None);
    request.extensions_mut().insert(RequestSpan { span: span.clone(), request_id: request_id.clone() });
    let mut response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16();
    span.record("status", status);
    crate::metrics::http_request(&path, status, started.elapsed());
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}

/// The span of one tool call: a child of the HTTP request's span when there is one (rmcp
/// passes the request's parts along), carrying its request id.
pub fn tool_span(tool: &'static str, parts: Option<&http::request::Parts>) -> Span {
    match parts.and_then(|p| p.extensions.get::<RequestSpan>()) {
        Some(request) => {
            tracing::info_span!(parent: &request.span, "tool", tool, request_id = %request.request_id)
        }
        None => tracing::info_span!("tool", tool),
    }
}

/// The span of one SQL call of a `querylayer_api` function.
pub fn db_span(function: &'static str) -> Span {
    tracing::debug_span!("db", function)
}

thread_local! {
    /// The caller's trace context while the request span is created (read by `OtlpLayer`).
    static REMOTE_PARENT: Cell<Option<([u8; 16], [u8; 8])>> = const { Cell::new(None) };
}

/// `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`.
fn parse_traceparent(value: &str) -> Option<([u8; 16], [u8; 8])> {
    let parts: Vec<&str> = value.trim().split('-').collect();
    let [version, trace, span, flags] = parts.as_slice() else {
        return None;
    };
    if *version != "00" || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let trace: [u8; 16] = hex::decode(trace).ok()?.try_into().ok()?;
    let span: [u8; 8] = hex::decode(span).ok()?.try_into().ok()?;
    (trace != [0; 16] && span != [0; 8]).then_some((trace, span))
}

/// A span being recorded.
struct SpanData {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    name: &'static str,
    start: SystemTime,
    attributes: Vec<(&'static str, String)>,
}

struct Fields<'a>(&'a mut Vec<(&'static str, String)>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name(), value.to_string()));
    }
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    let mut filled = 0;
    while filled < N {
        let random = uuid::Uuid::new_v4();
        let bytes = random.as_bytes();
        let n = (N - filled).min(16);
        out[filled..filled + n].copy_from_slice(&bytes[..n]);
        filled += n;
    }
    out
}

/// Collects finished spans and hands them to the exporter task.
pub struct OtlpLayer {
    sender: tokio::sync::mpsc::Sender<Value>,
}

impl OtlpLayer {
    fn new(endpoint: &str) -> Self {
        let url = if endpoint.trim_end_matches('/').ends_with("/v1/traces") {
            endpoint.to_string()
        } else {
            format!("{}/v1/traces", endpoint.trim_end_matches('/'))
        };
        let (sender, receiver) = tokio::sync::mpsc::channel(QUEUE);
        tokio::spawn(export(url, receiver));
        OtlpLayer { sender }
    }
}

const QUEUE: usize = 4096;
const BATCH: usize = 512;

impl<S> Layer<S> for OtlpLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let parent =
            span.parent().and_then(|p| p.extensions().get::<SpanData>().map(|d| (d.trace_id, d.span_id)));
        let (trace_id, parent) = match parent.or_else(|| REMOTE_PARENT.get()) {
            Some((trace, span)) => (trace, Some(span)),
            None => (random_bytes(), None),
        };
        let mut attributes = Vec::new();
        attrs.record(&mut Fields(&mut attributes));
        span.extensions_mut().insert(SpanData {
            trace_id,
            span_id: random_bytes(),
            parent,
            name: attrs.metadata().name(),
            start: SystemTime::now(),
            attributes,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(data) = span.extensions_mut().get_mut::<SpanData>() {
                values.record(&mut Fields(&mut data.attributes));
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(data) = span.extensions_mut().remove::<SpanData>() else { return };
        let _ = self.sender.try_send(otlp_span(&data, SystemTime::now()));
    }
}

fn nanos(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos().to_string()
}

/// One span in OTLP's JSON encoding (ids in hex, times as decimal strings of nanoseconds).
fn otlp_span(data: &SpanData, end: SystemTime) -> Value {
    // SPAN_KIND_SERVER for the request, CLIENT for a database call, INTERNAL otherwise.
    let kind = match data.name {
        "request" => 2,
        "db" => 3,
        _ => 1,
    };
    let mut error = false;
    let attributes: Vec<Value> = data
        .attributes
        .iter()
        .map(|(key, value)| {
            let key = match (*key, data.name) {
                ("status", "request") => {
                    error = value.parse::<u16>().is_ok_and(|s| s >= 500);
                    "http.response.status_code"
                }
                ("method", "request") => "http.request.method",
                ("route", "request") => "http.route",
                ("function", "db") => "db.operation.name",
                (key, _) => key,
            };
            json!({"key": key, "value": {"stringValue": value}})
        })
        .collect();
    let mut span = json!({
        "traceId": hex::encode(data.trace_id),
        "spanId": hex::encode(data.span_id),
        "name": data.name,
        "kind": kind,
        "startTimeUnixNano": nanos(data.start),
        "endTimeUnixNano": nanos(end),
        "attributes": attributes,
        "status": {"code": if error { 2 } else { 0 }},
    });
    if let Some(parent) = data.parent {
        span["parentSpanId"] = json!(hex::encode(parent));
    }
    span
}

async fn export(url: String, mut receiver: tokio::sync::mpsc::Receiver<Value>) {
    let client = match reqwest::Client::builder().timeout(Duration::from_secs(5)).build() {
        Ok(client) => client,
        Err(e) => {
            tracing::error!("OTLP exporter: {e}");
            return;
        }
    };
    let mut last_complaint: Option<Instant> = None;
    while let Some(first) = receiver.recv().await {
        // Let the rest of a request's spans arrive, then send them together.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut spans = vec![first];
        while spans.len() < BATCH {
            match receiver.try_recv() {
                Ok(span) => spans.push(span),
                Err(_) => break,
            }
        }
        let body = json!({"resourceSpans": [{
            "resource": {"attributes": [
                {"key": "service.name", "value": {"stringValue": "querylayer-edge"}},
                {"key": "service.version", "value": {"stringValue": env!("CARGO_PKG_VERSION")}},
            ]},
            "scopeSpans": [{"scope": {"name": "querylayer-edge", "version": env!("CARGO_PKG_VERSION")}, "spans": spans}],
        }]});
        let sent = client.post(&url).json(&body).send().await.and_then(|r| r.error_for_status());
        if let Err(e) = sent {
            // At most one complaint a minute: a missing collector must not flood the log.
            if last_complaint.is_none_or(|at| at.elapsed() > Duration::from_secs(60)) {
                last_complaint = Some(Instant::now());
                tracing::warn!("OTLP exporter: could not send spans to {url}: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_and_traceparents_are_checked() {
        assert!(sane_request_id("3f2c-ab_12.x:y"));
        for bad in ["", "a b", "x\n", &"a".repeat(65), "é"] {
            assert!(!sane_request_id(bad), "{bad:?}");
        }
        let (trace, span) =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(hex::encode(trace), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex::encode(span), "00f067aa0ba902b7");
        assert!(parse_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
        assert!(parse_traceparent("garbage").is_none());
    }

    #[test]
    fn spans_are_encoded_as_otlp_json() {
        let data = SpanData {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent: Some([3; 8]),
            name: "request",
            start: UNIX_EPOCH + Duration::from_secs(1),
            attributes: vec![("route", "/mcp".into()), ("status", "503".into())],
        };
        let span = otlp_span(&data, UNIX_EPOCH + Duration::from_secs(2));
        assert_eq!(span["traceId"], "01010101010101010101010101010101");
        assert_eq!(span["parentSpanId"], "0303030303030303");
        assert_eq!(span["kind"], 2);
        assert_eq!(span["startTimeUnixNano"], "1000000000");
        assert_eq!(span["attributes"][0]["key"], "http.route");
        assert_eq!(span["status"]["code"], 2);
    }
}

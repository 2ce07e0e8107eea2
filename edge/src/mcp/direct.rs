//! `/mcp`'s service: a stateless 2026-07-28 `tools/call` is handed straight to the server's
//! request handler; every other request goes to rmcp's Streamable HTTP service.
//!
//! rmcp serves each stateless POST by starting a service on a one-shot transport: a task for
//! its loop, another for the request's handler, channels between them and the HTTP task, and
//! the message serialised back to a JSON value to compare it with the request's headers. The
//! tool call itself is the same either way: this path calls the same `Service::handle_request`
//! (rmcp's protocol checks of the request's `_meta`, the dispatch to `call_tool`, its result
//! hints) in one task of its own, which finishes even when the client goes away, as rmcp's
//! handler task does.
//!
//! It takes a request only when rmcp would have nothing to say of its headers: a `POST` of a
//! `tools/call`, no session, one `MCP-Protocol-Version` that rmcp knows, an `Accept` of both
//! JSON and event streams without parameters, a JSON `Content-Type`; for 2026-07-28,
//! `Mcp-Method: tools/call`, `Mcp-Name` equal to the body's tool and a body `_meta` that names
//! the same version and has every key it requires; for an earlier version, no version in the
//! `_meta`. Anything else, well formed or not, goes to rmcp, which answers it as before. The Host and Origin were checked before (`limits::check_host_and_origin`), with
//! the lists rmcp is given; no tool declares `Mcp-Param-*` headers (a unit test checks), so
//! rmcp's check of them has nothing to compare.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use futures_util::future::BoxFuture;
use http::{header, HeaderMap, Method, Request, StatusCode};
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, ErrorCode, GetExtensions, GetMeta, ProtocolVersion,
    ServerJsonRpcMessage,
};
use rmcp::service::{serve_directly, Peer, RequestContext, RunningService, Service as _};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::StreamableHttpService;
use rmcp::{ErrorData as McpError, RoleServer};

use super::QueryLayerMcp;

const JSON: &str = "application/json";

/// The service behind `/mcp`.
#[derive(Clone)]
pub struct McpService(Arc<Inner>);

struct Inner {
    server: QueryLayerMcp,
    rmcp: StreamableHttpService<QueryLayerMcp, NeverSessionManager>,
    idle: OnceLock<Idle>,
}

/// A peer for the handlers' request contexts. Only rmcp can make one, so it comes from a service
/// that rmcp serves on a transport that never carries a message; no tool talks to its peer.
struct Idle {
    peer: Peer<RoleServer>,
    _service: RunningService<RoleServer, QueryLayerMcp>,
}

impl McpService {
    pub fn new(
        server: QueryLayerMcp,
        rmcp: StreamableHttpService<QueryLayerMcp, NeverSessionManager>,
    ) -> Self {
        McpService(Arc::new(Inner { server, rmcp, idle: OnceLock::new() }))
    }

    async fn serve(self, request: Request<Body>) -> Response {
        let lifecycle = match direct_headers(request.headers()) {
            Some(lifecycle) if request.method() == Method::POST => lifecycle,
            _ => return self.by_rmcp(request).await,
        };
        let (mut parts, body) = request.into_parts();
        // The body gate (`auth::mcp_gate`) has read and bounded it already.
        let bytes = match axum::body::to_bytes(body, usize::MAX).await {
            Ok(bytes) => bytes,
            Err(_) => return self.by_rmcp(Request::from_parts(parts, Body::empty())).await,
        };
        // The gate has read the message already (`body::inspect`); read here only without it.
        let message = match parts.extensions.remove::<crate::body::Message>() {
            Some(crate::body::Message(message)) => Some(message),
            None => serde_json::from_slice(&bytes).ok(),
        };
        let Some((id, mut request)) = message.and_then(|m| direct_message(&parts.headers, lifecycle, m))
        else {
            return self.by_rmcp(Request::from_parts(parts, Body::from(bytes))).await;
        };
        let mut ctx = RequestContext::new(id.clone(), self.peer());
        ctx.meta = std::mem::take(request.get_meta_mut());
        ctx.extensions = std::mem::take(request.extensions_mut());
        ctx.extensions.insert(super::SharedParts(Arc::new(parts)));
        ctx.extensions.insert(super::output::Direct);
        let server = self.0.server.clone();
        let handled = tokio::spawn(async move { server.handle_request(request, ctx).await }).await;
        let message = match handled {
            Ok(Ok(result)) => match super::output::response_body(&result, &id) {
                Some(body) => return json_response(StatusCode::OK, Body::from(body)),
                None => ServerJsonRpcMessage::response(result, id),
            },
            Ok(Err(error)) => ServerJsonRpcMessage::error(error, Some(id)),
            Err(_) => {
                ServerJsonRpcMessage::error(McpError::internal_error("the tool call failed", None), Some(id))
            }
        };
        let status = match (&message, lifecycle) {
            (ServerJsonRpcMessage::Error(e), Lifecycle::Inline) => status_of(e.error.code),
            _ => StatusCode::OK,
        };
        match serde_json::to_vec(&message) {
            Ok(body) => json_response(status, Body::from(body)),
            Err(_) => json_response(StatusCode::INTERNAL_SERVER_ERROR, Body::empty()),
        }
    }

    async fn by_rmcp(&self, request: Request<Body>) -> Response {
        self.0.rmcp.handle(request).await.map(Body::new)
    }

    fn peer(&self) -> Peer<RoleServer> {
        let idle = self.0.idle.get_or_init(|| {
            let transport = (
                futures_util::sink::drain::<ServerJsonRpcMessage>(),
                futures_util::stream::pending::<ClientJsonRpcMessage>(),
            );
            let service = serve_directly(self.0.server.clone(), transport, None);
            Idle { peer: service.peer().clone(), _service: service }
        });
        idle.peer.clone()
    }
}

fn json_response(status: StatusCode, body: Body) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, JSON)
        .body(body)
        .expect("a valid response")
}

/// The HTTP status rmcp gives a 2026-07-28 request's JSON-RPC error (`jsonrpc_http_status`).
fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::UNSUPPORTED_PROTOCOL_VERSION
        | ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY
        | ErrorCode::HEADER_MISMATCH => StatusCode::BAD_REQUEST,
        ErrorCode::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
        _ => StatusCode::OK,
    }
}

/// The one value of a header, if it has exactly one and it is text.
fn single<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    value.to_str().ok()
}

/// How the request names its protocol version: in its `_meta` (2026-07-28, with the
/// `Mcp-Method` and `Mcp-Name` headers that version requires), or only in the
/// `MCP-Protocol-Version` header (the versions before it, which have no such headers; rmcp
/// answers their errors with HTTP 200).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Lifecycle {
    Inline,
    Legacy,
}

/// The lifecycle of a request this path may take, from its headers (`direct_call` checks the
/// body against them).
fn direct_headers(headers: &HeaderMap) -> Option<Lifecycle> {
    if headers.contains_key("mcp-session-id") {
        return None;
    }
    let version = single(headers, "mcp-protocol-version")?;
    let lifecycle = if version == ProtocolVersion::V_2026_07_28.as_str() {
        if single(headers, "mcp-method") != Some("tools/call") || single(headers, "mcp-name").is_none() {
            return None;
        }
        Lifecycle::Inline
    } else if version < ProtocolVersion::V_2026_07_28.as_str()
        && ProtocolVersion::KNOWN_VERSIONS.iter().any(|v| v.as_str() == version)
    {
        Lifecycle::Legacy
    } else {
        return None;
    };
    let content_type = single(headers, header::CONTENT_TYPE.as_str()).unwrap_or("");
    let essence = content_type.split_once(';').map_or(content_type, |(e, _)| e);
    if !essence.trim().eq_ignore_ascii_case(JSON) {
        return None;
    }
    let (mut json, mut events) = (false, false);
    for value in headers.get_all(header::ACCEPT) {
        let value = value.to_str().ok()?;
        if value.contains(';') || value.contains('"') {
            return None;
        }
        for entry in value.split(',') {
            let entry = entry.trim();
            json |= entry.eq_ignore_ascii_case(JSON);
            events |= entry.eq_ignore_ascii_case("text/event-stream");
        }
    }
    (json && events).then_some(lifecycle)
}

/// The request, when the body is a `tools/call` that fits its headers: for 2026-07-28, of the
/// tool `Mcp-Name` names, with a complete `_meta` naming that version; before it, with no
/// version in its `_meta`.
#[cfg(test)]
fn direct_call(
    headers: &HeaderMap,
    lifecycle: Lifecycle,
    body: &[u8],
) -> Option<(rmcp::model::RequestId, ClientRequest)> {
    direct_message(headers, lifecycle, serde_json::from_slice(body).ok()?)
}

/// As `direct_call`, of the message read from the body.
fn direct_message(
    headers: &HeaderMap,
    lifecycle: Lifecycle,
    message: ClientJsonRpcMessage,
) -> Option<(rmcp::model::RequestId, ClientRequest)> {
    let ClientJsonRpcMessage::Request(request) = message else {
        return None;
    };
    let ClientRequest::CallToolRequest(call) = &request.request else {
        return None;
    };
    let meta = request.request.get_meta();
    let fits = match lifecycle {
        Lifecycle::Inline => {
            single(headers, "mcp-name") == Some(call.params.name.as_ref())
                && meta.protocol_version() == Some(ProtocolVersion::V_2026_07_28)
                && meta.missing_required_keys(&ProtocolVersion::V_2026_07_28).is_empty()
        }
        Lifecycle::Legacy => meta.protocol_version().is_none(),
    };
    fits.then_some((request.id, request.request))
}

impl tower::Service<Request<Body>> for McpService {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.serve(request).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("mcp-protocol-version", "2026-07-28".parse().unwrap());
        h.insert("mcp-method", "tools/call".parse().unwrap());
        h.insert("mcp-name", "querylayer_list_content".parse().unwrap());
        h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        h.insert(header::ACCEPT, "application/json, text/event-stream".parse().unwrap());
        h
    }

    fn body(name: &str, version: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": name, "arguments": {}, "_meta": {
                "io.modelcontextprotocol/protocolVersion": version,
                "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {}
            }}
        }))
        .unwrap()
    }

    #[test]
    fn only_a_plain_stateless_tool_call_is_taken() {
        let h = call_headers();
        assert_eq!(direct_headers(&h), Some(Lifecycle::Inline));
        let mut legacy = h.clone();
        legacy.insert("mcp-protocol-version", "2025-11-25".parse().unwrap());
        legacy.remove("mcp-method");
        legacy.remove("mcp-name");
        assert_eq!(direct_headers(&legacy), Some(Lifecycle::Legacy));
        for (name, value) in [
            ("mcp-protocol-version", "2027-01-01"),
            ("mcp-protocol-version", "2025-01-01"),
            ("mcp-method", "tools/list"),
            ("accept", "application/json"),
            ("accept", "application/json;q=1, text/event-stream"),
            ("content-type", "text/plain"),
        ] {
            let mut other = h.clone();
            other.insert(name, value.parse().unwrap());
            assert_eq!(direct_headers(&other), None, "{name}: {value}");
        }
        let mut session = h.clone();
        session.insert("mcp-session-id", "abc".parse().unwrap());
        assert_eq!(direct_headers(&session), None);
        let mut twice = h.clone();
        twice.append("mcp-method", "tools/call".parse().unwrap());
        assert_eq!(direct_headers(&twice), None);
        let mut no_name = h.clone();
        no_name.remove("mcp-name");
        assert_eq!(direct_headers(&no_name), None);
    }

    #[test]
    fn the_body_must_name_the_headers_tool_and_version() {
        let h = call_headers();
        let inline = Lifecycle::Inline;
        let version = "2026-07-28";
        let Some((_, ClientRequest::CallToolRequest(_))) =
            direct_call(&h, inline, &body("querylayer_list_content", version))
        else {
            // The _meta keys this test writes must be the ones rmcp requires of 2026-07-28.
            panic!("a complete 2026-07-28 tools/call is taken");
        };
        assert!(direct_call(&h, inline, &body("querylayer_begin_run", version)).is_none());
        assert!(direct_call(&h, inline, &body("querylayer_list_content", "2025-11-25")).is_none());
        let bare =
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"querylayer_list_content"}}"#;
        assert!(direct_call(&h, inline, bare).is_none());
        assert!(direct_call(&h, inline, b"{").is_none());
        // Before 2026-07-28 the version is the header's alone: a _meta naming one goes to rmcp.
        let legacy = Lifecycle::Legacy;
        assert!(direct_call(&h, legacy, bare).is_some());
        assert!(direct_call(&h, legacy, &body("querylayer_list_content", version)).is_none());
        let list = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        assert!(direct_call(&h, legacy, list).is_none());
    }

    /// The same request answered by this path and by rmcp's service: the same status, type
    /// and JSON-RPC message. (No database: these answers come before one, or without a
    /// credential.)
    #[tokio::test]
    async fn the_direct_path_answers_as_rmcp_does() {
        use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
        let db = crate::db::Db::connect(
            "postgres://nobody@127.0.0.1:1/none",
            1,
            std::time::Duration::from_secs(1),
        )
        .unwrap();
        let server = QueryLayerMcp::for_http(db);
        let factory = server.clone();
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true)
            .with_sse_keep_alive(None)
            .with_allowed_hosts(["localhost"]);
        let rmcp = StreamableHttpService::new(
            move || Ok(factory.clone()),
            Arc::new(NeverSessionManager::default()),
            config,
        );
        let service = McpService::new(server, rmcp);
        let inline = |name: &str, arguments: serde_json::Value| {
            let mut headers = call_headers();
            headers.insert("mcp-name", name.parse().unwrap());
            let mut body: serde_json::Value = serde_json::from_slice(&body(name, "2026-07-28")).unwrap();
            body["params"]["arguments"] = arguments;
            (headers, serde_json::to_vec(&body).unwrap())
        };
        let legacy = |name: &str, arguments: serde_json::Value| {
            let mut headers = call_headers();
            headers.insert("mcp-protocol-version", "2025-11-25".parse().unwrap());
            headers.remove("mcp-method");
            headers.remove("mcp-name");
            let body = serde_json::json!({"jsonrpc": "2.0", "id": "r-1", "method": "tools/call",
                "params": {"name": name, "arguments": arguments}});
            (headers, serde_json::to_vec(&body).unwrap())
        };
        let cases = [
            inline("querylayer_unknown", serde_json::json!({})),
            inline("querylayer_list_content", serde_json::json!({"limit": 5})),
            inline("querylayer_list_content", serde_json::json!({"site": "other"})),
            inline("querylayer_list_content", serde_json::json!({"limit": "many"})),
            legacy("querylayer_unknown", serde_json::json!({})),
            legacy("querylayer_begin_run", serde_json::json!({"run_type": "t"})),
            legacy("querylayer_begin_run", serde_json::json!({})),
        ];
        for (headers, bytes) in cases {
            let lifecycle = direct_headers(&headers).expect("headers this path takes");
            assert!(direct_call(&headers, lifecycle, &bytes).is_some(), "a body this path takes");
            let request = || {
                let mut request = Request::post("/mcp").header(header::HOST, "localhost");
                for (name, value) in &headers {
                    request = request.header(name, value);
                }
                request.body(Body::from(bytes.clone())).unwrap()
            };
            let answer = |response: Response| async move {
                let status = response.status();
                let kind = response.headers().get(header::CONTENT_TYPE).cloned();
                let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
                (status, kind, serde_json::from_slice::<serde_json::Value>(&body).unwrap())
            };
            let direct = answer(service.clone().serve(request()).await).await;
            let by_rmcp = answer(service.by_rmcp(request()).await).await;
            assert_eq!(direct, by_rmcp, "{}", String::from_utf8_lossy(&bytes));
        }
    }

    #[test]
    fn no_tool_declares_parameter_headers() {
        for tool in QueryLayerMcp::all_tools() {
            let schema = serde_json::Value::Object((*tool.input_schema).clone()).to_string();
            assert!(!schema.contains("x-mcp-header"), "{} declares Mcp-Param headers", tool.name);
        }
    }
}

//! The MCP surface: one rmcp server whose tools each make one `querylayer_api` call as the
//! authenticated connection (the LLM variant of `answer_question` makes its calls in one
//! transaction). Tools live in one router per domain — site, content, runs, proposals, console
//! tasks, editorial planning, sources, evidence, forms, semantics — combined with `+`; the
//! semantics plane adds two resources. The same server answers Streamable HTTP at `/mcp`
//! (stateless: any instance answers any request) and stdio (`querylayer mcp-serve`).

mod console_tasks;
mod content;
mod direct;
mod editorial;
mod evidence;
mod forms;
mod output;
mod proposals;
mod reading;
pub mod registry;
mod runs;
mod semantics;
mod site;
mod sources;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::{middleware, Router};
use output::Json;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Resource, ResourceContents, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool_handler, ErrorData as McpError, RoleServer, ServerHandler};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::auth::{self, Principal};
use crate::bulkhead::{Access, SiteLimits};
use crate::config::HttpConfig;
use crate::db::{Answered, Call, Db, Fingerprint, FromStandby, JsonText, ToolCall};
use crate::error::{Code, Error, TOOL_ERROR_META_KEY};
use crate::limits;
use crate::state::AppState;
use registry::visible;

/// The schema of "any JSON value": `{}`. (schemars writes `true` for `serde_json::Value`,
/// which is valid JSON Schema, but some clients accept only object schemas.)
pub(crate) fn any_json(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({})
}

/// A JSON object with any members.
pub(crate) fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "object" })
}

/// A JSON array of any values.
pub(crate) fn any_array(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "array" })
}

/// The MCP resources (QueryGraph's): each is read through one `querylayer_api` function, as the
/// connection, under `content:read`.
pub const RESOURCES: &[(&str, &str, &str, &str)] = &[
    (
        "qg://models/current",
        "current_semantic_model",
        "get_semantic_model",
        "The site's current semantic model (OSI, normalized), with its version.",
    ),
    (
        "qg://story/resilience-desk",
        "resilience_desk_story",
        "story_overview",
        "The resilience-desk story: its roster and what its recorded runs decided (reading runs nothing).",
    ),
];

const INSTRUCTIONS: &str = "QueryLayer: governed access to one site's content. This connection is bound \
to one organization, site and agent; no argument names them. Work inside a governed run: \
querylayer_begin_run (declare required outputs), then drafts and proposals, recording each material \
result with querylayer_record_artifact, and finish with querylayer_finish_run. A run finished as \
completed while a required output is missing is stored as blocked. Drafts never publish: \
querylayer_request_publish_approval asks a human to approve. Errors carry a stable code in \
_meta[\"querylayer/error\"].";

/// The key under which a replayed answer is marked in a tool result's `_meta`.
pub const REPLAY_META_KEY: &str = "querylayer/idempotent-replay";

/// Every tool that is not read-only takes an optional `idempotency_key` (docs/edge.md).
pub(crate) fn idempotency_key(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "minLength": 1,
        "maxLength": 255,
        "pattern": "^[!-~]+$",
        "description": "Makes a retry safe. Send a new key (a UUID) with each call you mean to make once; \
            when you cannot tell whether the call took effect (a timeout, a lost connection, a retryable \
            error), repeat it with the same key and the same arguments: it takes effect at most once and \
            returns its first answer. The same key with other arguments is refused \
            (idempotency_key_reused). Keys are kept for 24 hours (idempotency_key_ttl_hours)."
    })
}

/// What `call_tool` learns of a write before dispatching it: the SHA-256 of its arguments (for
/// its idempotency key), and whether the answer turned out to be a stored one.
#[derive(Clone)]
struct WriteRequest {
    sha256: [u8; 32],
    replayed: Arc<AtomicBool>,
}

/// Set when a read was served by the standby (`replica`): the tool call's log line says so.
#[derive(Clone, Default)]
struct ServedByStandby(Arc<AtomicBool>);

/// The HTTP request's parts, as the direct path (`direct.rs`) hands them to a tool call. rmcp
/// clones a request's context, extensions and all, on its way to the tool; shared, the parts
/// (headers, the principal) cost a count to clone, not a copy.
#[derive(Clone)]
struct SharedParts(Arc<http::request::Parts>);

/// The tool `call_tool` dispatched to (its one name, which the audit row records) and when.
#[derive(Clone, Copy)]
struct Dispatched {
    tool: &'static str,
    started: Instant,
}

/// The SHA-256 of a tool call's canonical arguments, without the key itself.
fn request_sha256(tool: &str, arguments: Option<&rmcp::model::JsonObject>) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut arguments = arguments.cloned().unwrap_or_default();
    arguments.remove("idempotency_key");
    let canonical = querylayer_envelope::canonical::canonical_json_value(&serde_json::json!({
        "tool": tool,
        "arguments": serde_json::Value::Object(arguments),
    }));
    Sha256::digest(canonical.as_bytes()).into()
}

/// How a tool call finds its credential: the HTTP request's principal, or the stdio secret.
#[derive(Clone)]
pub struct QueryLayerMcp {
    db: Db,
    tools: Arc<ToolRouter<QueryLayerMcp>>,
    stdio_fingerprint: Option<Fingerprint>,
    /// The optional LLM that writes answer text (`--llm-url`); governance is unchanged by it.
    llm: Option<crate::llm::Llm>,
    /// Each site's share of the pool (HTTP only: stdio serves one connection).
    sites: Option<Arc<SiteLimits>>,
    /// The tools that are not read-only: they take idempotency keys and write permits.
    writes: Arc<HashSet<String>>,
    /// The hot standby read-only tools are served from when it is fresh enough.
    replica: Option<Arc<crate::replica::Replica>>,
}

impl QueryLayerMcp {
    fn new(db: Db, stdio_fingerprint: Option<Fingerprint>) -> Self {
        let mut tools = Self::site_router()
            + Self::content_router()
            + Self::reading_router()
            + Self::runs_router()
            + Self::proposals_router()
            + Self::console_tasks_router()
            + Self::editorial_router()
            + Self::sources_router()
            + Self::evidence_router()
            + Self::forms_router()
            + Self::semantics_router();
        for route in tools.map.values_mut() {
            if let Some(entry) = registry::entry(&route.attr.name) {
                route.attr.annotations = Some(entry.annotations());
            }
        }
        let writes = registry::TOOLS.iter().filter(|t| !t.read_only).map(|t| t.name.to_string()).collect();
        QueryLayerMcp {
            db,
            tools: Arc::new(tools),
            stdio_fingerprint,
            llm: None,
            sites: None,
            writes: Arc::new(writes),
            replica: None,
        }
    }

    /// Calls take a permit of their site first (`bulkhead`).
    pub fn with_site_limits(mut self, sites: Arc<SiteLimits>) -> Self {
        self.sites = Some(sites);
        self
    }

    /// A permit of the call's site (HTTP), or `overloaded`.
    async fn site_permit(
        &self,
        ctx: &RequestContext<RoleServer>,
        tool: &str,
    ) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, Error> {
        let (Some(sites), Some(principal)) = (&self.sites, Self::principal(ctx)) else {
            return Ok(None);
        };
        let access = if self.writes.contains(tool) { Access::Write } else { Access::Read };
        sites.acquire(&principal.context.site, access).await.map(Some)
    }

    /// The idempotency of a call whose tool got `key`: the key and the arguments `call_tool` hashed.
    fn idempotency(ctx: &RequestContext<RoleServer>, key: Option<&str>) -> Option<(String, [u8; 32])> {
        let key = key?;
        let request = ctx.extensions.get::<WriteRequest>()?;
        Some((key.to_string(), request.sha256))
    }

    fn note_replay(ctx: &RequestContext<RoleServer>, answered: Answered) {
        if answered == Answered::Before {
            if let Some(request) = ctx.extensions.get::<WriteRequest>() {
                request.replayed.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Answers are written by this LLM (the database still governs and signs them).
    pub fn with_llm(mut self, llm: Option<crate::llm::Llm>) -> Self {
        self.llm = llm;
        self
    }

    /// Every tool of this server (all scopes), as `tools/list` would show them: the one source
    /// of the exported function-calling schemas (`querylayer tool-schemas`).
    pub fn all_tools() -> Vec<rmcp::model::Tool> {
        let db = Db::connect("postgres://nobody@127.0.0.1:1/none", 1, std::time::Duration::from_secs(1))
            .expect("a pool can be described without connecting");
        QueryLayerMcp::for_http(db).tools.list_all()
    }

    /// For HTTP: each request's principal comes from the auth middleware.
    pub fn for_http(db: Db) -> Self {
        Self::new(db, None)
    }

    /// For stdio: one secret for the life of the process, authenticated at every call.
    pub fn for_stdio(db: Db, secret: &str) -> Self {
        Self::new(db, Some(Fingerprint::of(secret)))
    }

    /// The HTTP request's parts: shared on the direct path (`SharedParts`), owned where rmcp's
    /// service put them.
    fn parts(ctx: &RequestContext<RoleServer>) -> Option<&http::request::Parts> {
        match ctx.extensions.get::<SharedParts>() {
            Some(SharedParts(parts)) => Some(parts),
            None => ctx.extensions.get::<http::request::Parts>(),
        }
    }

    fn principal(ctx: &RequestContext<RoleServer>) -> Option<&Principal> {
        Self::parts(ctx).and_then(|parts| parts.extensions.get::<Principal>())
    }

    fn fingerprint(&self, ctx: &RequestContext<RoleServer>) -> Option<Fingerprint> {
        Self::principal(ctx).map(|p| p.fingerprint.clone()).or_else(|| self.stdio_fingerprint.clone())
    }

    /// Before a refusal made without the database: authenticates an unconfirmed principal now
    /// and, when its credential is dead, records that and marks the answer as the 401. True
    /// when it is dead.
    async fn confirm(&self, ctx: &RequestContext<RoleServer>) -> bool {
        let Some(principal) = Self::principal(ctx).filter(|p| !p.confirmed) else {
            return false;
        };
        let db = self.db(ctx);
        match db.authenticate(&principal.fingerprint).await {
            Err(e) if e.code == Code::Unauthenticated => {
                db.record_failed_authentication(&principal.fingerprint, "mcp").await;
                principal.found_dead();
                true
            }
            _ => false,
        }
    }

    /// The scopes the connection holds now (HTTP: resolved by the middleware for this request;
    /// stdio: resolved again here).
    async fn scopes(&self, ctx: &RequestContext<RoleServer>) -> Result<Vec<String>, McpError> {
        if let Some(principal) = Self::principal(ctx) {
            return Ok(principal.context.scopes.clone());
        }
        let Some(fingerprint) = &self.stdio_fingerprint else {
            return Err(McpError::invalid_request("authentication failed", None));
        };
        match self.db.authenticate(fingerprint).await {
            Ok(context) => Ok(context.scopes),
            Err(e) => {
                if e.code == Code::Unauthenticated {
                    self.db.record_failed_authentication(fingerprint, "stdio").await;
                }
                Err(McpError::invalid_request(e.message, None))
            }
        }
    }

    /// What the database needs of a tool call: the credential, the tool and when it began, a
    /// write's key; and whether the call takes its request's token of the connection's rate (not
    /// when the middleware's authentication took it).
    fn tool_call(
        ctx: &RequestContext<RoleServer>,
        fingerprint: Fingerprint,
        tool: &'static str,
        started: Instant,
        idempotency: Option<(String, [u8; 32])>,
    ) -> ToolCall {
        let principal = Self::principal(ctx);
        ToolCall {
            fingerprint,
            tool,
            started,
            idempotency,
            connection_id: principal.map(|p| p.context.connection_id),
            takes_token: principal.is_none_or(|p| !p.took_token),
        }
    }

    /// The pool, counting into the request's round trips (HTTP).
    fn db(&self, ctx: &RequestContext<RoleServer>) -> Db {
        match Self::principal(ctx) {
            Some(principal) => self.db.counting(&principal.trips),
            None => self.db.clone(),
        }
    }

    /// As `call`, for a tool whose work takes more than one governed call in its transaction.
    async fn steps<T: Serialize + DeserializeOwned>(
        &self,
        ctx: &RequestContext<RoleServer>,
        idempotency_key: Option<String>,
        steps: impl AsyncFnOnce(&deadpool_postgres::Transaction<'_>) -> Result<serde_json::Value, Error>,
    ) -> Result<Json<T>, CallToolResult> {
        self.governed(ctx, idempotency_key.as_deref(), Json::typed, async |db: Db, tool: ToolCall| {
            db.tool_steps(&tool, steps).await
        })
        .await
    }

    /// The body of every tool: one `querylayer_api` call as the connection, audited, its JSON
    /// answer read into the tool's output type and written from it (`Json::typed`); any refusal
    /// becomes a tool error.
    async fn call<T: Serialize + DeserializeOwned>(
        &self,
        ctx: &RequestContext<RoleServer>,
        call: Call,
    ) -> Result<Json<T>, CallToolResult> {
        self.call_as(ctx, call, Json::typed).await
    }

    /// As `call`, for a tool whose answer is exactly what its output type writes: the answer is
    /// passed on as the database wrote it, unread (`Json::answer`, which a debug build checks).
    /// The tools agents call most (content, runs) take this path.
    async fn call_as_written<T: Serialize + DeserializeOwned>(
        &self,
        ctx: &RequestContext<RoleServer>,
        call: Call,
    ) -> Result<Json<T>, CallToolResult> {
        self.call_as(ctx, call, Json::answer).await
    }

    async fn call_as<T: Serialize + DeserializeOwned>(
        &self,
        ctx: &RequestContext<RoleServer>,
        call: Call,
        written: fn(JsonText) -> Result<Json<T>, Error>,
    ) -> Result<Json<T>, CallToolResult> {
        let key = call.idempotency_key().map(str::to_string);
        let replica = self.replica.clone();
        let writes = self.writes.clone();
        let standby = ctx.extensions.get::<ServedByStandby>().map(|s| s.0.clone());
        self.governed(ctx, key.as_deref(), written, async |db: Db, tool: ToolCall| {
            let reads = !writes.contains(tool.tool);
            if let (true, Some(replica)) = (reads, &replica) {
                if let Some(floor) = replica.floor(tool.connection_id, Instant::now()) {
                    match db.replica_read(&replica.db, &tool, &call, &floor).await? {
                        FromStandby::Served(value) => {
                            if let Some(standby) = &standby {
                                standby.store(true, Ordering::Relaxed);
                            }
                            return Ok((value, Answered::Now));
                        }
                        FromStandby::Unserved { unreachable: true } => replica.unreachable(),
                        FromStandby::Unserved { unreachable: false } => {}
                    }
                }
            }
            db.tool_call(&tool, &call).await
        })
        .await
    }

    /// The one path of an agent's tool call: the tool's name from its dispatch, the site permit,
    /// the database work (`run`: `Db::tool_call` or `Db::tool_steps`, which audit it and record
    /// a refusal), the log line, the result as `written` writes it, or the tool error.
    async fn governed<T>(
        &self,
        ctx: &RequestContext<RoleServer>,
        idempotency_key: Option<&str>,
        written: fn(JsonText) -> Result<Json<T>, Error>,
        run: impl AsyncFnOnce(Db, ToolCall) -> Result<(JsonText, Answered), Error>,
    ) -> Result<Json<T>, CallToolResult> {
        let Some(Dispatched { tool, started }) = ctx.extensions.get::<Dispatched>().copied() else {
            return Err(Error::internal("a tool ran without its dispatch").into_tool_result());
        };
        let Some(fingerprint) = self.fingerprint(ctx) else {
            return Err(Error::unauthenticated().into_tool_result());
        };
        let _permit = self.site_permit(ctx, tool).await.map_err(Error::into_tool_result)?;
        let idempotency = Self::idempotency(ctx, idempotency_key);
        let call = Self::tool_call(ctx, fingerprint, tool, started, idempotency);
        let result = run(self.db(ctx), call).await.and_then(|(answer, answered)| {
            Self::note_replay(ctx, answered);
            written(answer)
        });
        let principal = Self::principal(ctx);
        let connection_id = principal.map(|p| p.context.connection_id.to_string());
        let db_round_trips = principal.map(|p| p.trips.count());
        let duration_ms = started.elapsed().as_millis() as u64;
        let served_by = match ctx.extensions.get::<ServedByStandby>() {
            Some(s) if s.0.load(Ordering::Relaxed) => "standby",
            _ => "primary",
        };
        match result {
            Ok(value) => {
                // A write returned: this connection's next reads need the standby past it.
                if let (Some(replica), Some(principal), true) =
                    (&self.replica, principal, self.writes.contains(tool))
                {
                    replica.wrote(principal.context.connection_id);
                }
                tracing::info!(
                    tool,
                    connection_id,
                    duration_ms,
                    db_round_trips,
                    served_by,
                    outcome = "ok",
                    "tool call"
                );
                Ok(value)
            }
            Err(error) => {
                tracing::info!(
                    tool,
                    connection_id,
                    duration_ms,
                    db_round_trips,
                    outcome = "error",
                    code = error.code.as_str(),
                    "tool call"
                );
                if let Some(principal) = principal {
                    if error.code == Code::Unauthenticated {
                        principal.found_dead();
                    }
                    if let Some(scope) = error.required_scope() {
                        principal.lacks_scope(scope);
                    }
                    if let Some(secs) = error.retry_after_secs() {
                        principal.retry_after(secs);
                    }
                }
                if error.status.is_server_error() {
                    error.log(tool);
                }
                Err(error.into_tool_result())
            }
        }
    }
}

#[tool_handler(router = self.tools)]
impl ServerHandler for QueryLayerMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_resources().build())
            .with_server_info(Implementation::new("querylayer", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    /// Only the tools the connection's scopes allow, in a stable (alphabetical) order.
    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let scopes = self.scopes(&ctx).await?;
        let tools = self.tools.list_all().into_iter().filter(|t| visible(&t.name, &scopes)).collect();
        Ok(ListToolsResult::with_all_items(tools).with_ttl_ms(0).with_cache_scope(CacheScope::Private))
    }

    /// The resources, when the connection may read content.
    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let scopes = self.scopes(&ctx).await?;
        let readable = scopes.iter().any(|s| s == "content:read");
        let resources = RESOURCES
            .iter()
            .filter(|_| readable)
            .map(|(uri, name, _, description)| {
                Resource::new(*uri, *name).with_description(*description).with_mime_type("application/json")
            })
            .collect();
        Ok(ListResourcesResult::with_all_items(resources)
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private))
    }

    /// Reads a resource as the connection (one call, audited like a tool call).
    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let Some((uri, _, function, _)) = RESOURCES.iter().find(|(uri, ..)| *uri == request.uri) else {
            return Err(McpError::resource_not_found(format!("unknown resource {}", request.uri), None));
        };
        let started = Instant::now();
        let Some(fingerprint) = self.fingerprint(&ctx) else {
            return Err(McpError::invalid_request("authentication failed", None));
        };
        let permit = match self.site_permit(&ctx, "read_resource").await {
            Ok(permit) => permit,
            Err(error) => return Err(error.to_mcp_error()),
        };
        let call = Self::tool_call(&ctx, fingerprint, "read_resource", started, None);
        let outcome = self.db(&ctx).tool_call(&call, &Call::new(function)).await;
        drop(permit);
        if let (Err(error), Some(principal)) = (&outcome, Self::principal(&ctx)) {
            if error.code == Code::Unauthenticated {
                principal.found_dead();
            }
        }
        match outcome.map(|(value, _)| value) {
            Ok(value) => Ok(ReadResourceResult::new(vec![
                ResourceContents::text(value.into_string(), *uri).with_mime_type("application/json")
            ])
            .into()),
            Err(error) if error.is_retryable() => {
                error.log("read_resource");
                Err(error.to_mcp_error())
            }
            Err(error) => {
                error.log("read_resource");
                Err(McpError::invalid_request(serde_json::json!({ "error": error.body() }).to_string(), None))
            }
        }
    }

    /// Dispatches to the tool; arguments that do not match its schema (unknown fields such as
    /// a site or agent, missing or mistyped values) become an `invalid_argument` tool error.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let started = Instant::now();
        let Some(tool) = registry::entry(&request.name).map(|t| t.name) else {
            // Refused before the database: the credential first.
            if self.confirm(&ctx).await {
                return Err(McpError::invalid_request("authentication failed", None));
            }
            return Err(McpError::invalid_params(format!("unknown tool: {}", request.name), None));
        };
        let fingerprint = self.fingerprint(&ctx);
        let arguments = request.arguments.clone();
        let mut ctx = ctx;
        ctx.extensions.insert(Dispatched { tool, started });
        ctx.extensions.insert(ServedByStandby::default());
        let principal = Self::principal(&ctx).cloned();
        let db = self.db(&ctx);
        let replayed = Arc::new(AtomicBool::new(false));
        let keyed = arguments.as_ref().is_some_and(|a| a.contains_key("idempotency_key"));
        if keyed && self.writes.contains(tool) {
            let sha256 = request_sha256(tool, arguments.as_ref());
            ctx.extensions.insert(WriteRequest { sha256, replayed: replayed.clone() });
        }
        let span = crate::telemetry::tool_span(tool, Self::parts(&ctx));
        let direct = ctx.extensions.get::<output::Direct>().is_some();
        let response =
            tracing::Instrument::instrument(self.tools.call(ToolCallContext::new(self, request, ctx)), span)
                .await;
        let (outcome, code) = crate::error::tool_outcome(&response);
        crate::metrics::tool_call(tool, started, outcome, &code);
        let response = response?;
        // "Retry later" is one JSON-RPC error for every MCP client, not a tool result.
        if let Some(error) = retryable_error(&response) {
            return Err(error);
        }
        let Some(detail) = argument_error(&response) else {
            // The direct path writes the output's text as its structured content; rmcp needs it read.
            let response = if direct { response } else { output::fill_structured(response) };
            return Ok(if replayed.load(Ordering::Relaxed) { mark_replayed(response) } else { response });
        };
        let fields = match self.tools.get(tool) {
            Some(definition) => offending_fields(&definition.input_schema, arguments),
            None => Vec::new(),
        };
        let message = match fields.as_slice() {
            [] => format!("invalid arguments for {tool}: {detail}"),
            [field] => {
                format!("invalid arguments for {tool}: `{field}` does not match the inputSchema ({detail})")
            }
            fields => format!(
                "invalid arguments for {tool}: {} do not match the inputSchema ({detail})",
                fields.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ")
            ),
        };
        let error = Error::invalid_argument(message).with_hint(
            "arguments must match the tool's inputSchema; the connection is bound to one site, \
             organization and agent, so no argument may name them",
        );
        if let Some(fingerprint) = fingerprint {
            let call = ToolCall {
                fingerprint,
                tool,
                started,
                idempotency: None,
                connection_id: principal.as_ref().map(|p| p.context.connection_id),
                takes_token: false,
            };
            if db.record_refused_tool_call(&call, error.code.as_str()).await {
                if let Some(principal) = &principal {
                    principal.found_dead();
                }
            }
        }
        let db_round_trips = principal.as_ref().map(|p| p.trips.count());
        tracing::info!(tool, db_round_trips, outcome = "error", code = error.code.as_str(), "tool call");
        Ok(error.into_tool_result().into())
    }
}

/// A tool error that says "retry later" (its `_meta` error has a retryable code), as the
/// JSON-RPC error `RETRY_LATER` with the same error object as `data`.
fn retryable_error(response: &CallToolResponse) -> Option<McpError> {
    let CallToolResponse::Complete(result) = response else {
        return None;
    };
    if result.is_error != Some(true) {
        return None;
    }
    let error = result.meta.as_ref()?.0.get(TOOL_ERROR_META_KEY)?;
    let code = error.get("code")?.as_str()?;
    if !crate::error::is_retryable_code(code) {
        return None;
    }
    let message = error.get("message").and_then(|m| m.as_str()).unwrap_or("retry later").to_string();
    Some(McpError::new(rmcp::model::ErrorCode(crate::error::RETRY_LATER), message, Some(error.clone())))
}

/// Marks a tool result as the stored answer of an earlier call with the same idempotency key.
fn mark_replayed(response: CallToolResponse) -> CallToolResponse {
    let CallToolResponse::Complete(mut result) = response else {
        return response;
    };
    let mut meta = result.meta.take().unwrap_or_default();
    meta.0.insert(REPLAY_META_KEY.to_string(), serde_json::Value::Bool(true));
    result.meta = Some(meta);
    CallToolResponse::Complete(result)
}

/// rmcp answers arguments that do not deserialize with a bare tool error (`isError`, one text
/// block "failed to deserialize parameters: …", no `_meta`); the edge's own errors always
/// carry `_meta`. Returns serde's explanation.
fn argument_error(response: &CallToolResponse) -> Option<String> {
    const PREFIX: &str = "failed to deserialize parameters:";
    let CallToolResponse::Complete(result) = response else {
        return None;
    };
    if result.is_error != Some(true) || result.meta.is_some() {
        return None;
    }
    let text = result.content.first()?.as_text()?.text.as_str();
    text.strip_prefix(PREFIX).map(|detail| detail.trim().to_string())
}

/// The values that break the tool's input schema, as paths (`days`, `record_ids[0]`,
/// `steps[1].key`), in the schema's order. Serde's explanation names a missing or unknown
/// field but not a mistyped or malformed value ("invalid type: string \"many\", expected
/// u32"); this names it. Runs only after a call was refused, never on the hot path.
fn offending_fields(
    schema: &rmcp::model::JsonObject,
    arguments: Option<rmcp::model::JsonObject>,
) -> Vec<String> {
    let Some(arguments) = arguments else {
        return Vec::new();
    };
    let schema = serde_json::Value::Object(schema.clone());
    let Ok(validator) = jsonschema::options().should_validate_formats(true).build(&schema) else {
        return Vec::new();
    };
    let instance = serde_json::Value::Object(arguments);
    let mut fields: Vec<String> = Vec::new();
    for error in validator.iter_errors(&instance) {
        let mut path = String::new();
        for segment in error.instance_path().segments() {
            match segment {
                jsonschema::paths::LocationSegment::Index(i) => path.push_str(&format!("[{i}]")),
                jsonschema::paths::LocationSegment::Property(name) => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(&name);
                }
            }
        }
        // An empty path is the arguments object itself (unknown or missing members), which
        // serde's explanation already names.
        if !path.is_empty() && !fields.contains(&path) {
            fields.push(path);
        }
    }
    fields
}

/// `/mcp`: authentication (the principal exists before any MCP server does), then the
/// per-connection rate limit, then the body gate (size, strict JSON, the JSON-RPC id, the time
/// limit), then rmcp.
pub fn router(state: &AppState) -> Router<AppState> {
    Router::new()
        .route_service(
            "/mcp",
            http_service(state.db.clone(), &state.config, state.sites.clone(), state.replica.clone()),
        )
        .route_layer(middleware::from_fn_with_state(state.clone(), crate::auth::mcp_gate))
        .route_layer(middleware::from_fn_with_state(state.clone(), limits::limit_connection))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_connection))
}

/// The Streamable HTTP service for `/mcp`: stateless (no session ids; a 2025-11-25 client's
/// initialize is answered and forgotten, a 2026-07-28 client needs none), JSON responses, and
/// rmcp's own Host/Origin check configured with the same lists as the edge's.
pub fn http_service(
    db: Db,
    config: &HttpConfig,
    sites: Arc<SiteLimits>,
    replica: Option<Arc<crate::replica::Replica>>,
) -> direct::McpService {
    let mut server = QueryLayerMcp::for_http(db).with_llm(config.llm.clone()).with_site_limits(sites);
    server.replica = replica;
    let mcp_config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_max_request_body_bytes(config.max_body_bytes)
        .with_allowed_hosts(config.allow.host_entries())
        .with_allowed_origins(config.allow.origin_entries());
    let factory = server.clone();
    let rmcp = StreamableHttpService::new(
        move || Ok(factory.clone()),
        Arc::new(NeverSessionManager::default()),
        mcp_config,
    );
    direct::McpService::new(server, rmcp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scopes(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_tool_has_a_scope_entry_and_every_entry_a_tool() {
        let db =
            Db::connect("postgres://nobody@127.0.0.1:1/none", 1, std::time::Duration::from_secs(1)).unwrap();
        let server = QueryLayerMcp::for_http(db);
        let mut names: Vec<String> =
            server.tools.list_all().into_iter().map(|t| t.name.to_string()).collect();
        names.sort();
        let mut table: Vec<String> = registry::TOOLS.iter().map(|t| t.name.to_string()).collect();
        table.sort();
        assert_eq!(names, table);
    }

    #[test]
    fn only_rmcp_argument_errors_are_rewritten() {
        use rmcp::model::ContentBlock;
        let bare: CallToolResponse = CallToolResult::error(vec![ContentBlock::text(
            "failed to deserialize parameters: unknown field `site`",
        )])
        .into();
        assert_eq!(argument_error(&bare).as_deref(), Some("unknown field `site`"));
        let ours: CallToolResponse =
            Error::invalid_argument("failed to deserialize parameters: x").into_tool_result().into();
        assert_eq!(argument_error(&ours), None);
        let ok: CallToolResponse = CallToolResult::structured(serde_json::json!({"a": 1})).into();
        assert_eq!(argument_error(&ok), None);
    }

    #[test]
    fn a_mistyped_or_malformed_argument_is_named() {
        let db =
            Db::connect("postgres://nobody@127.0.0.1:1/none", 1, std::time::Duration::from_secs(1)).unwrap();
        let server = QueryLayerMcp::for_http(db);
        let fields = |tool: &str, arguments: serde_json::Value| {
            let serde_json::Value::Object(arguments) = arguments else { unreachable!() };
            offending_fields(&server.tools.get(tool).unwrap().input_schema, Some(arguments))
        };
        assert_eq!(
            fields("querylayer_form_screening_metrics", serde_json::json!({"days": "many"})),
            ["days"]
        );
        assert_eq!(
            fields("querylayer_list_evidence", serde_json::json!({"content_id": "not-a-uuid"})),
            ["content_id"]
        );
        let run = "00000000-0000-4000-8000-000000000001";
        assert_eq!(
            fields(
                "querylayer_propose_topical_strategy_opportunities",
                serde_json::json!({"run_id": run, "opportunity_ids": [run, "nope"], "summary": 7})
            ),
            ["opportunity_ids[1]", "summary"]
        );
        // Unknown and missing members are the arguments object's own fault: serde names them.
        assert!(fields("querylayer_list_evidence", serde_json::json!({"site": "other"})).is_empty());
        assert!(fields("querylayer_form_screening_metrics", serde_json::json!({"days": 3})).is_empty());
    }

    #[test]
    fn a_connection_sees_the_tools_one_of_its_scopes_names() {
        let read = scopes(&["content:read", "site:read"]);
        for tool in registry::TOOLS {
            let shown = visible(tool.name, &read);
            let needs_read = tool.scopes.iter().any(|s| *s == "content:read" || *s == "site:read");
            assert_eq!(shown, needs_read, "{}", tool.name);
        }
        let shown = registry::TOOLS.iter().filter(|t| visible(t.name, &read)).count();
        assert_eq!(shown, 20, "a read-only connection sees the 20 reading tools");
        assert!(!visible("querylayer_unknown", &read));
        assert!(!visible("querylayer_begin_run", &read));
        assert!(visible("querylayer_create_proposal", &scopes(&["topical-map:write"])));
        assert!(visible("querylayer_begin_run", &scopes(&["runs:write"])));
    }

    #[test]
    fn every_tool_has_an_object_output_schema_and_honest_annotations() {
        let db =
            Db::connect("postgres://nobody@127.0.0.1:1/none", 1, std::time::Duration::from_secs(1)).unwrap();
        let server = QueryLayerMcp::for_http(db);
        for tool in server.tools.list_all() {
            let output =
                tool.output_schema.as_ref().unwrap_or_else(|| panic!("{} lacks an output schema", tool.name));
            assert_eq!(output.get("type").and_then(|t| t.as_str()), Some("object"), "{}", tool.name);
            let input = &tool.input_schema;
            assert_eq!(
                input.get("additionalProperties"),
                Some(&serde_json::json!(false)),
                "{} accepts unknown arguments",
                tool.name
            );
            let a = tool.annotations.as_ref().unwrap_or_else(|| panic!("{} lacks annotations", tool.name));
            let read_only = registry::entry(&tool.name).expect("a registry entry").read_only;
            assert_eq!(a.read_only_hint, Some(read_only), "{}", tool.name);
            assert_eq!(a.idempotent_hint, Some(read_only), "{}", tool.name);
            assert_eq!(a.destructive_hint, Some(false), "{}", tool.name);
            assert_eq!(a.open_world_hint, Some(false), "{}", tool.name);
            assert!(a.title.as_ref().is_some_and(|t| !t.is_empty()), "{} needs a title", tool.name);
            assert!(
                tool.description.as_ref().is_some_and(|d| d.len() > 40),
                "{} needs a description",
                tool.name
            );
            // Every tool that writes takes an idempotency key (optional); no read-only tool does.
            let keyed = input.get("properties").and_then(|p| p.get("idempotency_key")).is_some();
            assert_eq!(keyed, !read_only, "{}: idempotency_key", tool.name);
            let schemas = serde_json::json!([input.as_ref(), output.as_ref()]);
            assert!(!has_boolean_subschema(&schemas), "{} has a boolean subschema: {schemas}", tool.name);
        }
    }

    #[test]
    fn only_what_the_sql_function_requires_is_required() {
        let db =
            Db::connect("postgres://nobody@127.0.0.1:1/none", 1, std::time::Duration::from_secs(1)).unwrap();
        let server = QueryLayerMcp::for_http(db);
        let required = |name: &str| -> Vec<String> {
            let tool = server.tools.list_all().into_iter().find(|t| t.name == name).unwrap();
            let mut r: Vec<String> = tool
                .input_schema
                .get("required")
                .and_then(|r| r.as_array())
                .into_iter()
                .flatten()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            r.sort();
            r
        };
        for tool in registry::TOOLS {
            let mut listed: Vec<&str> = tool.required.to_vec();
            listed.sort();
            assert_eq!(required(tool.name), listed, "{}: required arguments", tool.name);
        }
    }

    /// querylayer_get_run describes the run as the other run tools do (the same `Run`), with its
    /// events and artifacts: clients see one schema of a run, whichever tool answered.
    #[test]
    fn the_run_reading_tool_describes_the_run_with_its_events_and_artifacts() {
        let db =
            Db::connect("postgres://nobody@127.0.0.1:1/none", 1, std::time::Duration::from_secs(1)).unwrap();
        let server = QueryLayerMcp::for_http(db);
        let output = |name: &str| server.tools.get(name).unwrap().output_schema.clone().unwrap();
        let names = |schema: &serde_json::Map<String, serde_json::Value>, key: &str| -> Vec<String> {
            let value = schema.get(key).unwrap_or_else(|| panic!("no {key}"));
            match value {
                serde_json::Value::Object(map) => map.keys().cloned().collect(),
                serde_json::Value::Array(items) => {
                    items.iter().map(|v| v.as_str().unwrap().to_string()).collect()
                }
                other => panic!("{key}: {other}"),
            }
        };
        let (run, read) = (output("querylayer_begin_run"), output("querylayer_get_run"));
        let mut expected = names(&run, "properties");
        expected.extend(["events".to_string(), "artifacts".to_string()]);
        let mut described = names(&read, "properties");
        expected.sort();
        described.sort();
        assert_eq!(described, expected);
        let required = names(&read, "required");
        for member in ["run_id", "run_type", "state", "artifact_keys", "events", "artifacts"] {
            assert!(required.iter().any(|r| r == member), "{member} is not required: {required:?}");
        }
        let text = serde_json::Value::Object((*read).clone()).to_string();
        for member in ["event_id", "kind", "at", "artifact_id", "value", "affected_objects", "recorded_at"] {
            assert!(text.contains(&format!("\"{member}\"")), "the schema does not describe {member}");
        }
    }

    /// `true`/`false` where a subschema stands (properties, items, $defs).
    fn has_boolean_subschema(v: &serde_json::Value) -> bool {
        use serde_json::Value;
        match v {
            Value::Object(map) => map.iter().any(|(k, v)| match (k.as_str(), v) {
                ("properties" | "$defs", Value::Object(props)) => {
                    props.values().any(|p| p.is_boolean() || has_boolean_subschema(p))
                }
                ("items", Value::Bool(_)) => true,
                (_, v) => has_boolean_subschema(v),
            }),
            Value::Array(items) => items.iter().any(has_boolean_subschema),
            _ => false,
        }
    }
}

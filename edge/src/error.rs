//! The one error type of the edge and the one table that turns a SQLSTATE into a stable
//! machine-readable code and an HTTP status (docs/errors.md). HTTP handlers return it as a
//! response; MCP tools return it as a tool error (`isError`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use rmcp::model::{CallToolResult, ContentBlock, MetaObject};
use serde_json::{json, Value};

/// Every machine-readable code a client may receive (`error.code`, `data.code`). The first
/// group comes from the database through the SQLSTATE table below; the second is the edge's own
/// refusals and faults, each documented once in docs/errors.md ("The edge's own codes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    // From SQLSTATEs (the rows and classes below).
    Unauthenticated,
    ReadOnly,
    NotAuthenticated,
    Forbidden,
    NotFound,
    Conflict,
    RunFinished,
    InvalidState,
    Immutable,
    TooLarge,
    Busy,
    IdempotencyKeyReused,
    LedgerBroken,
    InvalidArgument,
    PermissionDenied,
    Timeout,
    Unavailable,
    Internal,
    // The edge's own.
    ForbiddenHost,
    ForbiddenOrigin,
    PayloadTooLarge,
    RateLimited,
    Overloaded,
    RequestTimeout,
    Upstream,
    StaleRequest,
    CrossSite,
    Csrf,
}

impl Code {
    /// Every code, in declaration order.
    pub const ALL: &'static [Code] = &[
        Code::Unauthenticated,
        Code::ReadOnly,
        Code::NotAuthenticated,
        Code::Forbidden,
        Code::NotFound,
        Code::Conflict,
        Code::RunFinished,
        Code::InvalidState,
        Code::Immutable,
        Code::TooLarge,
        Code::Busy,
        Code::IdempotencyKeyReused,
        Code::LedgerBroken,
        Code::InvalidArgument,
        Code::PermissionDenied,
        Code::Timeout,
        Code::Unavailable,
        Code::Internal,
        Code::ForbiddenHost,
        Code::ForbiddenOrigin,
        Code::PayloadTooLarge,
        Code::RateLimited,
        Code::Overloaded,
        Code::RequestTimeout,
        Code::Upstream,
        Code::StaleRequest,
        Code::CrossSite,
        Code::Csrf,
    ];

    /// The stable spelling clients branch on.
    pub const fn as_str(self) -> &'static str {
        match self {
            Code::Unauthenticated => "unauthenticated",
            Code::ReadOnly => "read_only",
            Code::NotAuthenticated => "not_authenticated",
            Code::Forbidden => "forbidden",
            Code::NotFound => "not_found",
            Code::Conflict => "conflict",
            Code::RunFinished => "run_finished",
            Code::InvalidState => "invalid_state",
            Code::Immutable => "immutable",
            Code::TooLarge => "too_large",
            Code::Busy => "busy",
            Code::IdempotencyKeyReused => "idempotency_key_reused",
            Code::LedgerBroken => "ledger_broken",
            Code::InvalidArgument => "invalid_argument",
            Code::PermissionDenied => "permission_denied",
            Code::Timeout => "timeout",
            Code::Unavailable => "unavailable",
            Code::Internal => "internal",
            Code::ForbiddenHost => "forbidden_host",
            Code::ForbiddenOrigin => "forbidden_origin",
            Code::PayloadTooLarge => "payload_too_large",
            Code::RateLimited => "rate_limited",
            Code::Overloaded => "overloaded",
            Code::RequestTimeout => "request_timeout",
            Code::Upstream => "upstream",
            Code::StaleRequest => "stale_request",
            Code::CrossSite => "cross_site",
            Code::Csrf => "csrf",
        }
    }

    /// The code spelled `code` (as read back from an error object).
    pub fn parse(code: &str) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| c.as_str() == code)
    }

    /// "Nothing was decided against you: try again later". A write that may have committed
    /// before the failure (a timeout, a lost connection) is safe to retry with the same
    /// idempotency key.
    pub const fn is_retryable(self) -> bool {
        matches!(
            self,
            Code::Busy
                | Code::Unavailable
                | Code::Overloaded
                | Code::Timeout
                | Code::RequestTimeout
                | Code::RateLimited
        )
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// SQLSTATE → (code, HTTP status). The governed functions raise these (docs/errors.md); the
/// edge never invents a refusal of its own beyond the few edge-level codes below. A 5xx row names
/// the code clients receive (`from_db` answers every other 5xx as `internal`). `25000` (a second
/// authentication in one transaction, a prepared transaction with a request context) has no row:
/// every transaction of the edge authenticates once and none is prepared, so meeting it is a
/// defect of the edge, answered `internal` with the detail in the log.
const SQLSTATES: &[(&str, Code, u16)] = &[
    ("28000", Code::Unauthenticated, 401),
    ("25006", Code::ReadOnly, 403),
    ("QL401", Code::NotAuthenticated, 401),
    ("QL403", Code::Forbidden, 403),
    ("QL404", Code::NotFound, 404),
    ("QL409", Code::Conflict, 409),
    ("QL410", Code::RunFinished, 410),
    ("QL422", Code::InvalidState, 422),
    ("QL423", Code::Immutable, 423),
    ("QL413", Code::TooLarge, 413),
    ("QL503", Code::Busy, 503),
    ("QL429", Code::RateLimited, 429),
    ("QLR01", Code::Busy, 503),
    ("QLI09", Code::IdempotencyKeyReused, 409),
    ("QLL09", Code::LedgerBroken, 409),
    ("55P03", Code::Busy, 503),
    ("22023", Code::InvalidArgument, 400),
    ("42501", Code::PermissionDenied, 403),
];

/// The JSON-RPC error code of every "retry later" answer on `/mcp` (the database unavailable or
/// busy, a site's history held, the edge overloaded, a rate limit, a timeout): one code in the
/// implementation-defined range (-32000..-32019) that the SDKs do not use themselves, with the
/// edge's error object (`code`, `message`, `retry_after`) as its `data`. Answered with HTTP 200,
/// as the response to a JSON-RPC request, so that every MCP client surfaces it as an error it
/// can read rather than as a transport failure (docs/errors.md).
pub const RETRY_LATER: i32 = -32010;

/// Whether the code spelled `code` means "retry later" (`Code::is_retryable`).
pub fn is_retryable_code(code: &str) -> bool {
    Code::parse(code).is_some_and(Code::is_retryable)
}

/// SQLSTATEs without an entry above, by prefix (first match wins): PostgreSQL's own data errors
/// (a malformed value that reached a cast), integrity violations, statement timeouts, and the
/// database being busy or unavailable.
const SQLSTATE_CLASSES: &[(&str, Code, u16)] = &[
    ("22", Code::InvalidArgument, 400),
    ("23", Code::Conflict, 409),
    ("40", Code::Busy, 503),
    ("53", Code::Unavailable, 503),
    ("08", Code::Unavailable, 503),
    ("57014", Code::Timeout, 504),
    ("57", Code::Unavailable, 503),
];

/// The code and status of a SQLSTATE: its row, else its class, else `internal` (500).
fn classify(sqlstate: &str) -> (Code, StatusCode) {
    SQLSTATES
        .iter()
        .find(|(s, _, _)| *s == sqlstate)
        .or_else(|| SQLSTATE_CLASSES.iter().find(|(class, _, _)| sqlstate.starts_with(class)))
        .map(|(_, code, status)| (*code, StatusCode::from_u16(*status).expect("valid status")))
        .unwrap_or((Code::Internal, StatusCode::INTERNAL_SERVER_ERROR))
}

/// What an integrity violation (SQLSTATE class 23) means to a caller, without the internal
/// constraint names of PostgreSQL's own message.
fn integrity_message(sqlstate: &str) -> Option<&'static str> {
    match sqlstate {
        "23505" => Some("the request conflicts with an existing record (a concurrent request may have made it); read it again"),
        "23503" => Some("the request refers to a record that does not exist, or one that others still refer to"),
        "23502" => Some("a required value is missing"),
        "23514" => Some("a value is outside what its field allows"),
        s if s.starts_with("23") => Some("the request conflicts with the current state of a record"),
        _ => None,
    }
}

/// The key under which a tool error is repeated in the result's `_meta`.
pub const TOOL_ERROR_META_KEY: &str = "querylayer/error";

#[derive(Debug)]
pub struct Error {
    pub status: StatusCode,
    pub code: Code,
    pub message: String,
    pub hint: Option<String>,
    /// For the log only; never sent to a client.
    detail: Option<String>,
    retry_after_secs: Option<u64>,
    /// What a refusal of the database says besides its message (rare: kept out of line).
    facts: Option<Box<Facts>>,
}

/// The machine-readable part of a refusal's DETAIL.
#[derive(Debug, Clone, Default)]
struct Facts {
    /// The scope a `forbidden` refusal names as missing (`required_scope=…`): in the error
    /// object, and the step-up challenge of an OAuth client.
    required_scope: Option<String>,
    /// What a `rate_limited` refusal limited (`of=…`: `connection`, `peer`, `registration`):
    /// the edge repeats the refusal until `retry_after` has passed.
    rate_of: Option<String>,
}

impl Error {
    pub fn new(status: StatusCode, code: Code, message: impl Into<String>) -> Self {
        Error {
            status,
            code,
            message: message.into(),
            hint: None,
            detail: None,
            retry_after_secs: None,
            facts: None,
        }
    }

    /// The scope a `forbidden` refusal lacks (the error object's `required_scope`).
    pub fn with_required_scope(mut self, scope: &str) -> Self {
        self.facts.get_or_insert_default().required_scope = Some(scope.to_string());
        self
    }

    pub fn required_scope(&self) -> Option<&str> {
        self.facts.as_ref()?.required_scope.as_deref()
    }

    /// What a `rate_limited` refusal of the database limited (`connection`, `peer`, `registration`).
    pub fn rate_of(&self) -> Option<&str> {
        self.facts.as_ref()?.rate_of.as_deref()
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Missing, malformed, unknown, revoked and expired credentials all look like this.
    pub fn unauthenticated() -> Self {
        Error::new(StatusCode::UNAUTHORIZED, Code::Unauthenticated, "authentication failed").with_hint(
            "send the credential as `Authorization: Bearer <secret>`; an operator can issue a new one",
        )
    }

    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Error::new(StatusCode::BAD_REQUEST, Code::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Error::new(StatusCode::NOT_FOUND, Code::NotFound, message)
    }

    pub fn rate_limited(retry_after_secs: u64) -> Self {
        let mut e = Error::new(
            StatusCode::TOO_MANY_REQUESTS,
            Code::RateLimited,
            format!("too many requests for this credential; retry in {retry_after_secs} s"),
        );
        e.retry_after_secs = Some(retry_after_secs);
        e
    }

    /// A 5xx whose body is opaque; the detail goes to the log.
    pub fn internal(detail: impl Into<String>) -> Self {
        let mut e = Error::new(StatusCode::INTERNAL_SERVER_ERROR, Code::Internal, "internal error");
        e.detail = Some(detail.into());
        e
    }

    /// An upstream service the edge was configured to use (the LLM) failed: 502, opaque body.
    pub fn upstream(detail: impl Into<String>) -> Self {
        let mut e = Error::new(
            StatusCode::BAD_GATEWAY,
            Code::Upstream,
            "the configured language model failed; retry later",
        );
        e.detail = Some(detail.into());
        e
    }

    /// The edge sheds load: a site's share of the pool, or the connection limit, is used up.
    pub fn overloaded(message: impl Into<String>, retry_after_secs: u64) -> Self {
        let mut e = Error::new(StatusCode::SERVICE_UNAVAILABLE, Code::Overloaded, message);
        e.retry_after_secs = Some(retry_after_secs);
        e.hint = Some("retry after `retry_after` seconds (a write with the same idempotency key)".into());
        e
    }

    /// A request cut off by the edge's time limit: it may or may not have taken effect.
    pub fn request_timeout() -> Self {
        let mut e = Error::new(
            StatusCode::REQUEST_TIMEOUT,
            Code::RequestTimeout,
            "the request took longer than this edge allows; it may or may not have taken effect",
        )
        .with_hint("retry (a write with the same idempotency key); an operator sets the limit with --request-timeout-secs");
        e.retry_after_secs = Some(1);
        e
    }

    /// A copy for a second use (the log, a record) of an error that is also returned.
    pub fn clone_of(e: &Error) -> Error {
        Error {
            status: e.status,
            code: e.code,
            message: e.message.clone(),
            hint: e.hint.clone(),
            detail: e.detail.clone(),
            retry_after_secs: e.retry_after_secs,
            facts: e.facts.clone(),
        }
    }

    /// A standby could not serve a read (edge/src/replica.rs): it is behind (QLR01), refused a
    /// write as read-only (class 25: a budget to spend), cancelled the statement for a conflict
    /// with its replay (40001), or is unreachable. The primary serves it.
    pub fn cannot_serve_here(&self) -> bool {
        let sqlstate =
            self.detail.as_deref().and_then(|d| d.strip_prefix("SQLSTATE ")).map(|d| &d[..5.min(d.len())]);
        matches!(self.code, Code::Unavailable)
            // Behind the floor, or a statement cancelled by a conflict with the standby's replay.
            || matches!(sqlstate, Some("QLR01" | "40001"))
            || sqlstate.is_some_and(|s| s.starts_with("25"))
    }

    /// Whether a client should retry this later (see `RETRYABLE`).
    pub fn is_retryable(&self) -> bool {
        self.code.is_retryable()
    }

    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after_secs
    }

    /// The message with its cause, for an operator's terminal or log (`querylayer admin`,
    /// `worker`, `mcp-serve`): an `unavailable` error then says what failed (TLS, TLS required,
    /// authentication, refused, unreachable: `pgtls::describe`), which a client's message never does.
    pub fn with_cause(&self) -> String {
        match (self.code, &self.detail) {
            (Code::Unavailable, Some(detail)) => {
                format!("the database is unavailable: {}", detail.trim_start_matches("database connection: "))
            }
            _ => self.message.clone(),
        }
    }

    pub fn unavailable(detail: impl Into<String>) -> Self {
        let mut e = Error::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Code::Unavailable,
            "the database is unavailable; retry later",
        );
        e.detail = Some(detail.into());
        e.retry_after_secs = Some(1);
        e
    }

    /// Maps a database error through the SQLSTATE table. Messages and hints of 4xx refusals
    /// come from the governed functions and are meant for the caller; anything else is opaque.
    pub fn from_db(e: &tokio_postgres::Error) -> Self {
        crate::metrics::database_error(e.as_db_error().map(|db| db.code().code()));
        let Some(db) = e.as_db_error() else {
            return Error::unavailable(format!("database connection: {}", crate::pgtls::describe(e)));
        };
        let sqlstate = db.code().code();
        let (code, status) = classify(sqlstate);
        let detail = format!("SQLSTATE {sqlstate}: {}", db.message());
        if status.is_server_error() {
            let mut e = match (code, sqlstate) {
                (Code::Busy, "QL503") => Error::new(
                    status,
                    code,
                    "this site's history is held by another transaction; retry shortly",
                )
                .with_hint("retry the call (a write with the same idempotency key)"),
                (Code::Busy, _) => Error::new(status, code, "the database is busy; retry the call"),
                (Code::Timeout, _) => {
                    Error::new(status, code, "the database call took too long; it did not take effect")
                        .with_hint("retry later; an operator sets the limit with --statement-timeout-secs")
                }
                (Code::Unavailable, _) => {
                    Error::new(status, code, "the database is unavailable; retry later")
                }
                _ => Error::new(status, Code::Internal, "internal error"),
            };
            e.detail = Some(detail);
            if e.is_retryable() {
                e.retry_after_secs = Some(1);
            }
            return e;
        }
        // PostgreSQL's own integrity messages name internal constraints and tables; the governed
        // functions refuse with messages of their own, so one that reaches here says what
        // happened in the caller's terms and keeps the constraint for the log.
        if let Some(message) = integrity_message(sqlstate) {
            let mut e = Error::new(status, code, message);
            e.detail = Some(detail);
            return e;
        }
        let mut e = Error::new(status, code, db.message());
        e.hint = db.hint().map(str::to_string);
        if code == Code::RateLimited {
            for part in db.detail().unwrap_or_default().split_whitespace() {
                if let Some(secs) = part.strip_prefix("retry_after=").and_then(|s| s.parse().ok()) {
                    e.retry_after_secs = Some(secs);
                }
                if let Some(of) = part.strip_prefix("of=") {
                    e.facts.get_or_insert_default().rate_of = Some(of.to_string());
                }
            }
            e.retry_after_secs = Some(e.retry_after_secs.unwrap_or(1));
        }
        if code == Code::Forbidden {
            let scope = db.detail().and_then(|d| d.strip_prefix("required_scope=")).filter(|s| {
                (1..=40).contains(&s.len())
                    && s.bytes().all(|b| b.is_ascii_lowercase() || b == b':' || b == b'-')
            });
            if let Some(scope) = scope {
                e = e.with_required_scope(scope);
            }
        }
        e.detail = Some(detail);
        e
    }

    /// The JSON object sent to clients: `{"code", "message", "hint"?, "retry_after"?,
    /// "required_scope"?}`.
    pub fn body(&self) -> Value {
        let mut body = json!({ "code": self.code, "message": self.message });
        if let Some(hint) = &self.hint {
            body["hint"] = json!(hint);
        }
        if let Some(secs) = self.retry_after_secs {
            body["retry_after"] = json!(secs);
        }
        if let Some(scope) = self.required_scope() {
            body["required_scope"] = json!(scope);
        }
        body
    }

    /// The JSON-RPC error of `/mcp`: `RETRY_LATER` for what a client should retry, otherwise the
    /// closest JSON-RPC code; `data` is always the edge's error object.
    pub fn to_mcp_error(&self) -> rmcp::ErrorData {
        use rmcp::model::ErrorCode;
        let code = if self.is_retryable() {
            ErrorCode(RETRY_LATER)
        } else {
            match self.status {
                StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::INVALID_PARAMS,
                _ => ErrorCode::INTERNAL_ERROR,
            }
        };
        rmcp::ErrorData::new(code, self.message.clone(), Some(self.body()))
    }

    /// A JSON-RPC error response for `/mcp` answered by the edge itself (before or around rmcp):
    /// HTTP 200 with the request's id when it is known, so that the SDKs surface the error;
    /// `status` otherwise (an unreadable request has no id to answer).
    pub fn into_jsonrpc_response(
        self,
        id: Option<Value>,
        jsonrpc_code: Option<i32>,
        status: StatusCode,
    ) -> Response {
        if self.status.is_server_error() {
            self.log("request");
        }
        let code = jsonrpc_code.unwrap_or_else(|| self.to_mcp_error().code.0);
        let body = json!({
            "jsonrpc": "2.0",
            "id": id.clone().unwrap_or(Value::Null),
            "error": { "code": code, "message": self.message, "data": self.body() },
        });
        let status = if id.is_some() { StatusCode::OK } else { status };
        let mut response = (status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after_secs {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }

    /// Writes the server-side record of this error (the detail, never a credential).
    pub fn log(&self, what: &str) {
        if self.is_retryable() {
            tracing::warn!(code = self.code.as_str(), status = self.status.as_u16(), detail = ?self.detail, "{what} deferred");
        } else if self.status.is_server_error() {
            tracing::error!(code = self.code.as_str(), status = self.status.as_u16(), detail = ?self.detail, "{what} failed");
        } else {
            // Not the message: it may quote the caller's input (a refused value, a parse error).
            tracing::info!(code = self.code.as_str(), status = self.status.as_u16(), "{what} refused");
        }
    }

    /// The MCP form: `isError`, the error object as JSON text, and the same object in `_meta`.
    /// No `structuredContent`: some clients validate it against the tool's output schema even
    /// for errors.
    pub fn into_tool_result(self) -> CallToolResult {
        let error = self.body();
        let text = json!({ "error": error }).to_string();
        let mut meta = serde_json::Map::new();
        meta.insert(TOOL_ERROR_META_KEY.to_string(), error);
        CallToolResult::error(vec![ContentBlock::text(text)]).with_meta(Some(MetaObject(meta)))
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        Error::from_db(&e)
    }
}

impl From<deadpool_postgres::PoolError> for Error {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            // Only making a new connection fails here: whatever the SQLSTATE (a password, a
            // pg_hba.conf rule), the database is unavailable to this edge, and the log says why.
            deadpool_postgres::PoolError::Backend(e) => {
                crate::metrics::database_error(e.as_db_error().map(|db| db.code().code()));
                Error::unavailable(format!("database connection: {}", crate::pgtls::describe(&e)))
            }
            other => Error::unavailable(format!("connection pool: {other}")),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            self.log("request");
        }
        let mut response = (self.status, axum::Json(json!({ "error": self.body() }))).into_response();
        if let Some(secs) = self.retry_after_secs {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The outcome of one MCP tool call, for the metrics: `ok`, `error` with the edge's error code,
/// `retry_later` (a retryable refusal) or `protocol_error`.
pub fn tool_outcome(
    response: &Result<rmcp::model::CallToolResponse, rmcp::ErrorData>,
) -> (&'static str, String) {
    fn data_code(data: Option<&serde_json::Value>) -> String {
        data.and_then(|d| d.get("code")).and_then(|c| c.as_str()).unwrap_or("").to_string()
    }
    match response {
        Err(e) if e.code.0 == RETRY_LATER => ("retry_later", data_code(e.data.as_ref())),
        Err(e) => ("protocol_error", data_code(e.data.as_ref())),
        Ok(rmcp::model::CallToolResponse::Complete(result)) if result.is_error == Some(true) => {
            let meta = result.meta.as_ref().and_then(|m| m.0.get(TOOL_ERROR_META_KEY));
            match data_code(meta) {
                code if is_retryable_code(&code) => ("retry_later", code),
                code => ("error", code),
            }
        }
        Ok(_) => ("ok", String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_sqlstate_has_one_code_and_status() {
        let doc = include_str!("../../docs/errors.md");
        for (sqlstate, code, _) in SQLSTATES {
            let row = format!("| `{sqlstate}` | `{code}` |");
            assert!(doc.contains(&row), "docs/errors.md lacks the row {row}");
        }
        let documented =
            doc.lines().filter(|l| l.starts_with("| `") && l.len() > 9 && &l[8..11] == "` |").count();
        assert_eq!(documented, SQLSTATES.len(), "docs/errors.md and the SQLSTATE table disagree");
    }

    /// The codes that reach clients without a row of their own in the SQLSTATE table: the
    /// classes' and the edge's own.
    fn own_codes() -> Vec<Code> {
        Code::ALL.iter().copied().filter(|c| !SQLSTATES.iter().any(|(_, code, _)| code == c)).collect()
    }

    #[test]
    fn every_code_is_documented_once() {
        let doc = include_str!("../../docs/errors.md");
        let section =
            &doc[doc.find("\n## The edge's own codes\n").expect("docs/errors.md: the edge's own codes")..];
        let rows: Vec<&str> = section
            .lines()
            .skip_while(|l| !l.starts_with("| code |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .collect();
        for code in own_codes() {
            let row = format!("| `{code}` |");
            let times = doc.lines().filter(|l| l.starts_with(&row)).count();
            assert_eq!(times, 1, "docs/errors.md: {code} needs exactly one row in \"The edge's own codes\"");
            let status = rows.iter().find(|l| l.starts_with(&row)).expect("in the section");
            // Codes the table or a class gives: the status column says which.
            let mapped = SQLSTATE_CLASSES.iter().find(|(_, c, _)| *c == code).map(|(_, _, s)| *s);
            if let Some(mapped) = mapped {
                assert!(status.contains(&mapped.to_string()), "{code}: {status} lacks {mapped}");
            }
        }
        assert_eq!(rows.len(), own_codes().len(), "docs/errors.md lists a code the edge does not have");
        for code in Code::ALL {
            assert_eq!(Code::parse(code.as_str()), Some(*code));
        }
    }

    /// Standard PostgreSQL SQLSTATEs the SQL raises on purpose that neither have a row nor fall
    /// into a class of `SQLSTATE_CLASSES`: the edge answers them `internal` (500) by design. Each
    /// is documented in docs/errors.md ("Also raised, outside the edge's table").
    const INTERNAL_BY_DESIGN: &[(&str, &str)] = &[
        (
            "0A000",
            "only CREATE EXTENSION raises it (a database that is not UTF8); the edge never installs the extension",
        ),
        (
            "42P06",
            "only CREATE EXTENSION raises it (a schema it cannot adopt); the edge never installs the extension",
        ),
    ];

    /// Every `*.sql` file under `dir`, recursively (the install scripts and the upgrade steps).
    fn sql_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                sql_files(&path, out);
            } else if path.extension().is_some_and(|x| x == "sql") {
                out.push(path);
            }
        }
    }

    /// The five-character SQLSTATE literal that follows `at` after optional whitespace, a
    /// separator (`=` or `,`) and optional whitespace: `= 'QL404'`, `,'QL422'`.
    fn literal_after(text: &str, at: usize, separator: char) -> Option<&str> {
        let rest = text[at..].trim_start();
        let rest = rest.strip_prefix(separator)?.trim_start();
        let rest = rest.strip_prefix('\'')?;
        let (code, tail) = (rest.get(..5)?, rest.get(5..)?);
        let valid = code.chars().all(|c| c.is_ascii_alphanumeric());
        (valid && tail.starts_with('\'')).then_some(code)
    }

    /// The SQLSTATEs a script raises, with their line: `ERRCODE = 'XXXXX'` (any spacing or case,
    /// `USING` or not) and the `'sqlstate', 'XXXXX'` of a refusal returned as JSON and raised
    /// with `USING ERRCODE = v_result->>'sqlstate'` (sql/160_retention.sql).
    fn raised_sqlstates(text: &str) -> Vec<(String, usize)> {
        let lower = text.to_ascii_lowercase();
        let mut found = Vec::new();
        for (needle, separator) in [("errcode", '='), ("'sqlstate'", ',')] {
            for (at, _) in lower.match_indices(needle) {
                if let Some(code) = literal_after(text, at + needle.len(), separator) {
                    let line = text[..at].matches('\n').count() + 1;
                    found.push((code.to_ascii_uppercase(), line));
                }
            }
        }
        found
    }

    #[test]
    fn the_scanner_reads_every_spelling_of_a_raised_sqlstate() {
        let sql = "RAISE EXCEPTION 'x' USING ERRCODE = 'QL404';\n  using errcode='ql409', HINT = 'h'\n\
                   USING\n    ERRCODE\t=  '22023'\nRETURN jsonb_build_object('sqlstate', 'QL422', 'refused', 'r');\n\
                   USING ERRCODE = v_result->>'sqlstate';\nERRCODE = 'too long'";
        let found = raised_sqlstates(sql);
        let mut codes: Vec<_> = found.iter().map(|(c, l)| format!("{c}@{l}")).collect();
        codes.sort();
        assert_eq!(codes, ["22023@4", "QL404@1", "QL409@2", "QL422@5"]);
    }

    #[test]
    fn every_sqlstate_the_sql_raises_has_a_code() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../sql");
        let mut files = Vec::new();
        sql_files(&root, &mut files);
        files.sort();
        assert!(files.len() > 10, "no SQL scripts under {}", root.display());
        let mut missing: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        let mut raised = std::collections::BTreeSet::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let name = file.strip_prefix(&root).unwrap_or(file).display().to_string();
            for (sqlstate, line) in raised_sqlstates(&text) {
                raised.insert(sqlstate.clone());
                let has_row = SQLSTATES.iter().any(|(s, _, _)| *s == sqlstate);
                // The generic path is for PostgreSQL's own codes; a QueryLayer code needs a row.
                let by_class = !sqlstate.starts_with("QL")
                    && SQLSTATE_CLASSES.iter().any(|(class, _, _)| sqlstate.starts_with(class));
                let by_design = INTERNAL_BY_DESIGN.iter().any(|(s, _)| *s == sqlstate);
                if !(has_row || by_class || by_design) {
                    missing.entry(sqlstate).or_default().push(format!("sql/{name}:{line}"));
                }
            }
        }
        let report: Vec<String> = missing
            .iter()
            .map(|(code, places)| format!("{code} (raised in {})", places.join(", ")))
            .collect();
        assert!(
            report.is_empty(),
            "SQLSTATEs raised by the SQL without a row in SQLSTATES (error.rs) and docs/errors.md:\n  {}",
            report.join("\n  ")
        );
        let doc = include_str!("../../docs/errors.md");
        for (sqlstate, reason) in INTERNAL_BY_DESIGN {
            assert!(
                raised.contains(*sqlstate),
                "{sqlstate} is no longer raised: drop it from the allow-list"
            );
            assert_eq!(
                classify(sqlstate).0,
                Code::Internal,
                "{sqlstate} ({reason}) no longer falls to internal"
            );
            assert!(doc.contains(&format!("`{sqlstate}`")), "docs/errors.md does not mention {sqlstate}");
        }
    }

    #[test]
    fn a_server_error_row_names_the_code_clients_receive() {
        // from_db answers a 5xx as busy, timeout or unavailable (retry later), else `internal`.
        for (sqlstate, code, status) in SQLSTATES.iter().chain(SQLSTATE_CLASSES) {
            if *status >= 500 {
                assert!(
                    [Code::Busy, Code::Timeout, Code::Unavailable].contains(code),
                    "{sqlstate}: {code} is never sent"
                );
            }
        }
        assert_eq!(classify("25000"), (Code::Internal, StatusCode::INTERNAL_SERVER_ERROR));
        assert_eq!(classify("42P06"), (Code::Internal, StatusCode::INTERNAL_SERVER_ERROR));
        assert_eq!(classify("40001"), (Code::Busy, StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(classify("57014"), (Code::Timeout, StatusCode::GATEWAY_TIMEOUT));
        assert_eq!(classify("25006"), (Code::ReadOnly, StatusCode::FORBIDDEN));
    }

    #[test]
    fn integrity_violations_are_told_without_internal_names() {
        for sqlstate in ["23505", "23503", "23502", "23514", "23P01", "23000"] {
            let message = integrity_message(sqlstate).expect("every class 23 SQLSTATE has a message");
            for internal in ["constraint", "_key", "_pkey", "violates", "relation"] {
                assert!(!message.contains(internal), "{sqlstate}: {message}");
            }
        }
        assert_eq!(integrity_message("22023"), None);
        assert_eq!(integrity_message("QL409"), None);
    }

    #[test]
    fn tool_errors_carry_no_structured_content_and_repeat_the_error_in_meta() {
        let result = Error::invalid_argument("bad run_id").with_hint("use a uuid").into_tool_result();
        assert_eq!(result.is_error, Some(true));
        assert!(result.structured_content.is_none());
        let meta = result.meta.expect("meta");
        assert_eq!(meta.0[TOOL_ERROR_META_KEY]["code"], "invalid_argument");
        assert_eq!(meta.0[TOOL_ERROR_META_KEY]["hint"], "use a uuid");
        let text = result.content[0].as_text().expect("text").text.clone();
        let parsed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["error"]["message"], "bad run_id");
    }
}

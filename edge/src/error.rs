//! The one error type of the edge and the one table that turns a SQLSTATE into a stable
//! machine-readable code and an HTTP status (docs/errors.md). HTTP handlers return it as a
//! response; MCP tools return it as a tool error (`isError`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use rmcp::model::{CallToolResult, ContentBlock, MetaObject};
use serde_json::{json, Value};

/// SQLSTATE → (code, HTTP status). The governed functions raise these (docs/errors.md); the
/// edge never invents a refusal of its own beyond the few edge-level codes below.
const SQLSTATES: &[(&str, &str, u16)] = &[
    ("28000", "unauthenticated", 401),
    ("25000", "invalid_transaction_state", 500),
    ("25006", "read_only", 403),
    ("QL401", "not_authenticated", 401),
    ("QL403", "forbidden", 403),
    ("QL404", "not_found", 404),
    ("QL409", "conflict", 409),
    ("QL410", "run_finished", 410),
    ("QL422", "invalid_state", 422),
    ("QL423", "immutable", 423),
    ("22023", "invalid_argument", 400),
    ("42501", "permission_denied", 403),
];

/// SQLSTATEs without an entry above, by prefix (first match wins): PostgreSQL's own data errors
/// (a malformed value that reached a cast), integrity violations, statement timeouts, and the
/// database being busy or unavailable.
const SQLSTATE_CLASSES: &[(&str, &str, u16)] = &[
    ("22", "invalid_argument", 400),
    ("23", "conflict", 409),
    ("40", "busy", 503),
    ("53", "unavailable", 503),
    ("08", "unavailable", 503),
    ("57014", "timeout", 504),
    ("57", "unavailable", 503),
];

/// The key under which a tool error is repeated in the result's `_meta`.
pub const TOOL_ERROR_META_KEY: &str = "querylayer/error";

#[derive(Debug)]
pub struct Error {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub hint: Option<String>,
    /// For the log only; never sent to a client.
    detail: Option<String>,
    retry_after_secs: Option<u64>,
}

impl Error {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Error { status, code, message: message.into(), hint: None, detail: None, retry_after_secs: None }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Missing, malformed, unknown, revoked and expired credentials all look like this.
    pub fn unauthenticated() -> Self {
        Error::new(StatusCode::UNAUTHORIZED, "unauthenticated", "authentication failed").with_hint(
            "send the credential as `Authorization: Bearer <secret>`; an operator can issue a new one",
        )
    }

    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Error::new(StatusCode::BAD_REQUEST, "invalid_argument", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Error::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn rate_limited(retry_after_secs: u64) -> Self {
        let mut e = Error::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!("too many requests for this credential; retry in {retry_after_secs} s"),
        );
        e.retry_after_secs = Some(retry_after_secs);
        e
    }

    /// A 5xx whose body is opaque; the detail goes to the log.
    pub fn internal(detail: impl Into<String>) -> Self {
        let mut e = Error::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error");
        e.detail = Some(detail.into());
        e
    }

    /// An upstream service the edge was configured to use (the LLM) failed: 502, opaque body.
    pub fn upstream(detail: impl Into<String>) -> Self {
        let mut e = Error::new(
            StatusCode::BAD_GATEWAY,
            "upstream",
            "the configured language model failed; retry later",
        );
        e.detail = Some(detail.into());
        e
    }

    pub fn unavailable(detail: impl Into<String>) -> Self {
        let mut e = Error::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the database is unavailable; retry later",
        );
        e.detail = Some(detail.into());
        e.retry_after_secs = Some(1);
        e
    }

    /// Maps a database error through the SQLSTATE table. Messages and hints of 4xx refusals
    /// come from the governed functions and are meant for the caller; anything else is opaque.
    pub fn from_db(e: &tokio_postgres::Error) -> Self {
        let Some(db) = e.as_db_error() else {
            return Error::unavailable(format!("database connection: {e}"));
        };
        let sqlstate = db.code().code();
        let (code, status) = SQLSTATES
            .iter()
            .find(|(s, _, _)| *s == sqlstate)
            .or_else(|| SQLSTATE_CLASSES.iter().find(|(class, _, _)| sqlstate.starts_with(class)))
            .map(|(_, code, status)| (*code, StatusCode::from_u16(*status).expect("valid status")))
            .unwrap_or(("internal", StatusCode::INTERNAL_SERVER_ERROR));
        let detail = format!("SQLSTATE {sqlstate}: {}", db.message());
        if status.is_server_error() {
            let mut e = match code {
                "busy" => Error::new(status, code, "the database is busy; retry the call"),
                "timeout" => Error::new(status, code, "the database call took too long"),
                "unavailable" => Error::new(status, code, "the database is unavailable; retry later"),
                _ => Error::new(status, "internal", "internal error"),
            };
            e.detail = Some(detail);
            if status == StatusCode::SERVICE_UNAVAILABLE {
                e.retry_after_secs = Some(1);
            }
            return e;
        }
        let mut e = Error::new(status, code, db.message());
        e.hint = db.hint().map(str::to_string);
        e.detail = Some(detail);
        e
    }

    /// The JSON object sent to clients: `{"code", "message", "hint"?}`.
    pub fn body(&self) -> Value {
        let mut body = json!({ "code": self.code, "message": self.message });
        if let Some(hint) = &self.hint {
            body["hint"] = json!(hint);
        }
        body
    }

    /// Writes the server-side record of this error (the detail, never a credential).
    pub fn log(&self, what: &str) {
        if self.status.is_server_error() {
            tracing::error!(code = self.code, status = self.status.as_u16(), detail = ?self.detail, "{what} failed");
        } else {
            // Not the message: it may quote the caller's input (a refused value, a parse error).
            tracing::info!(code = self.code, status = self.status.as_u16(), "{what} refused");
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
            deadpool_postgres::PoolError::Backend(e) => Error::from_db(&e),
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
        let documented = doc.lines().filter(|l| l.starts_with("| `")).count();
        assert_eq!(documented, SQLSTATES.len(), "docs/errors.md and the SQLSTATE table disagree");
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

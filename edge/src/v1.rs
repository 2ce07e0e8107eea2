//! The governed `/v1` API (served with `--require-auth`): `POST /v1/models/import/osi` and
//! `POST /v1/answer`, each authenticated by a signed TypeDID envelope in `x-qg-envelope`. The
//! edge only hands the header, the method, the exact path and the SHA-256 of the exact body to
//! `querylayer_api.authenticate_envelope`, in the request's transaction; the database checks
//! the envelope, records the receipt, and — when it allows — the route's one call runs as the
//! connection the sender's did:key is bound to. A refusal answers 401 with the receipt.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::answer::answer_signed;
use crate::body::MalformedBody;
use crate::db::{Call, EnvelopeOutcome};
use crate::error::Error;
use crate::state::AppState;

pub const ENVELOPE_HEADER: &str = "x-qg-envelope";

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/models/import/osi", post(import_osi))
        .route("/v1/answer", post(answer))
        .route("/v1/health", get(|| async { Json(json!({"status": "ok"})) }))
}

/// The body of `POST /v1/answer`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // read for validation only: the database reads the signed bytes themselves
struct AnswerBody {
    question: String,
    purpose: Option<String>,
    dialect: Option<String>,
}

/// The header's value when it is visible ASCII (anything else is "missing", as in the reference).
fn envelope_header(headers: &HeaderMap) -> Option<String> {
    headers
        .get(ENVELOPE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .filter(|v| !v.trim().is_empty())
}

/// What a governed route reads of its request: the method, the exact URI and the headers, whether
/// the body is strict JSON, and the exact body bytes.
struct SignedRequest {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    malformed: Option<Extension<MalformedBody>>,
    body: Bytes,
}

impl<S: Send + Sync> FromRequest<S> for SignedRequest {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (method, uri, headers, malformed, body) =
            <(Method, Uri, HeaderMap, Option<Extension<MalformedBody>>, Bytes)>::from_request(request, state)
                .await?;
        Ok(SignedRequest { method, uri, headers, malformed, body })
    }
}

/// Runs one governed route: envelope authentication, then `steps` as the bound connection.
async fn governed(
    state: &AppState,
    request: SignedRequest,
    steps: impl AsyncFnOnce(&deadpool_postgres::Transaction<'_>) -> Result<Value, Error>,
) -> Response {
    let SignedRequest { method, uri, headers, malformed, body } = request;
    // A body that is not strict JSON is refused once the envelope holds, never before.
    let steps = async move |tx: &deadpool_postgres::Transaction<'_>| match malformed {
        Some(Extension(MalformedBody(problem))) => Err(Error::invalid_argument(problem)),
        None => steps(tx).await,
    };
    let header = envelope_header(&headers);
    let path = uri.path();
    let body_sha256 = Sha256::digest(&body);
    // The per-connection rate limit, keyed on the connection the database verified (never on
    // what the unverified header claims, which anyone could use to exhaust another's bucket):
    // decided in the database (`Db::with_envelope`); a refusal it made is repeated here.
    let admit = |receipt: &Value| {
        let connection =
            receipt["context"]["connection_id"].as_str().and_then(|id| id.parse::<uuid::Uuid>().ok());
        match connection {
            Some(connection) => match state.db.connection_held(&connection) {
                Some(retry_after) => Err(Error::rate_limited(retry_after)),
                None => Ok(()),
            },
            None => Err(Error::internal("an allowed envelope receipt names no connection")),
        }
    };
    let outcome = state
        .db
        .with_envelope(header.as_deref(), method.as_str(), path, body_sha256.as_slice(), admit, steps)
        .await;
    match outcome {
        Ok(EnvelopeOutcome::Allowed { value, .. }) => (StatusCode::OK, Json(value)).into_response(),
        Ok(EnvelopeOutcome::Denied(receipt)) => {
            tracing::info!(path, error = receipt["error"].as_str().unwrap_or(""), "envelope refused");
            (StatusCode::UNAUTHORIZED, Json(refusal(&receipt))).into_response()
        }
        Err(error) => {
            error.log(path);
            error.into_response()
        }
    }
}

/// `{"error", "receipt": {"allowed": false, "path", "checks", "contract"}}`, as the seed shows.
fn refusal(receipt: &Value) -> Value {
    json!({
        "error": receipt["error"],
        "receipt": {
            "allowed": false,
            "path": receipt["path"],
            "method": receipt["method"],
            "profile": receipt["profile"],
            "checks": receipt["checks"],
            "contract": receipt["contract"],
        }
    })
}

async fn import_osi(State(state): State<AppState>, request: SignedRequest) -> Response {
    let document = String::from_utf8_lossy(&request.body).into_owned();
    governed(&state, request, async move |tx| {
        Call::new("import_semantic_model").arg("p_document", document).run(tx).await
    })
    .await
}

async fn answer(State(state): State<AppState>, request: SignedRequest) -> Response {
    // Parsed here only to refuse a malformed body with a clear message; the database reads the
    // question from the exact signed bytes.
    let parsed = serde_path_to_error::deserialize::<_, AnswerBody>(
        &mut serde_json::Deserializer::from_slice(&request.body),
    )
    .map(|_| String::from_utf8_lossy(&request.body).into_owned())
    .map_err(|e| match e.path().to_string().as_str() {
        "." | "" => e.inner().to_string(),
        path => format!("{path}: {}", e.inner()),
    });
    let llm = state.config.llm.clone();
    governed(&state, request, async move |tx| {
        let body = parsed.map_err(|e| {
            Error::invalid_argument(format!(
                "the body must be {{\"question\", \"purpose\"?, \"dialect\"?}}: {e}"
            ))
        })?;
        answer_signed(tx, llm.as_ref(), body).await
    })
    .await
}

/// `GET /.well-known/agent-card.json`: the A2A card, with the server key read from the database.
pub async fn agent_card(State(state): State<AppState>) -> Response {
    match state.db.server_keys().await {
        Ok(keys) => Json(crate::card::agent_card(
            &state.config.public_url,
            keys["current"].as_str(),
            keys["envelope_recipient"].as_str().unwrap_or("did:web:qg-server"),
        ))
        .into_response(),
        Err(error) => {
            error.log("agent card");
            error.into_response()
        }
    }
}

//! The governed `/v1` API (served with `--require-auth`): `POST /v1/models/import/osi` and
//! `POST /v1/answer`, each authenticated by a signed TypeDID envelope in `x-qg-envelope`. The
//! edge only hands the header, the method, the exact path and the SHA-256 of the exact body to
//! `querylayer_api.authenticate_envelope`, in the request's one statement (or, for an answer an
//! LLM writes, its transaction); the database checks the envelope, records the receipt, and —
//! when it allows — the route's call runs as the connection the sender's did:key is bound to.
//! A refusal answers 401 with the receipt.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::answer::{answer_signed, signed_call};
use crate::body::MalformedBody;
use crate::db::{Call, EnvelopeOutcome, RoundTrips, SignedRequestFacts};
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

/// What a governed route reads of its request: the method, the exact URI, the envelope's header,
/// whether the body is strict JSON, and the exact body bytes with their SHA-256.
struct SignedRequest {
    method: Method,
    uri: Uri,
    header: Option<String>,
    malformed: Option<Extension<MalformedBody>>,
    body: Bytes,
    body_sha256: [u8; 32],
}

impl<S: Send + Sync> FromRequest<S> for SignedRequest {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (method, uri, headers, malformed, body) =
            <(Method, Uri, HeaderMap, Option<Extension<MalformedBody>>, Bytes)>::from_request(request, state)
                .await?;
        let body_sha256 = Sha256::digest(&body).into();
        Ok(SignedRequest { method, uri, header: envelope_header(&headers), malformed, body, body_sha256 })
    }
}

impl SignedRequest {
    /// What the database decides the envelope on.
    fn facts(&self) -> SignedRequestFacts<'_> {
        SignedRequestFacts {
            header: self.header.as_deref(),
            method: self.method.as_str(),
            path: self.uri.path(),
            body_sha256: &self.body_sha256,
        }
    }

    /// A body that is not strict JSON: refused once the envelope holds, never before.
    fn malformed(&self) -> Option<Error> {
        self.malformed
            .as_ref()
            .map(|Extension(MalformedBody(problem))| Error::invalid_argument(problem.clone()))
    }
}

/// Runs a governed route of one call (`Err`: the route's refusal of the request, given once the
/// envelope holds): the envelope's authentication, the connection's rate and the call as the
/// bound connection, in one statement (`Db::envelope_call`). The per-connection rate is keyed on
/// the connection the database verified, never on what the unverified header claims (which
/// anyone could use to exhaust another's bucket). The request's round trips are logged with it
/// (`db_round_trips`).
async fn governed(state: &AppState, request: SignedRequest, call: Result<Call, Error>) -> Response {
    let call = match request.malformed() {
        Some(refusal) => Err(refusal),
        None => call,
    };
    let trips = RoundTrips::default();
    let outcome = state.db.counting(&trips).envelope_call(&request.facts(), call).await;
    let mut response = respond(request.uri.path(), outcome);
    response.extensions_mut().insert(trips);
    response
}

/// Runs a governed route of several steps (an answer an LLM writes) in one transaction that
/// keeps the receipt whatever the steps do (`Db::with_envelope`).
async fn governed_steps(
    state: &AppState,
    request: SignedRequest,
    steps: impl AsyncFnOnce(&deadpool_postgres::Transaction<'_>) -> Result<Value, Error>,
) -> Response {
    let malformed = request.malformed();
    let steps = async move |tx: &deadpool_postgres::Transaction<'_>| match malformed {
        Some(refusal) => Err(refusal),
        None => steps(tx).await,
    };
    let outcome = state.db.with_envelope(&request.facts(), steps).await;
    respond(request.uri.path(), outcome)
}

/// The answer of a governed route: its value, the envelope's refusal (401 with the receipt), or
/// the route's error.
fn respond(path: &str, outcome: Result<EnvelopeOutcome, Error>) -> Response {
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
    governed(&state, request, Ok(Call::new("import_semantic_model").arg("p_document", document))).await
}

async fn answer(State(state): State<AppState>, request: SignedRequest) -> Response {
    // Parsed here only to refuse a malformed body with a clear message; the database reads the
    // question from the exact signed bytes.
    let body = serde_path_to_error::deserialize::<_, AnswerBody>(&mut serde_json::Deserializer::from_slice(
        &request.body,
    ))
    .map(|_| String::from_utf8_lossy(&request.body).into_owned())
    .map_err(|e| {
        let e = match e.path().to_string().as_str() {
            "." | "" => e.inner().to_string(),
            path => format!("{path}: {}", e.inner()),
        };
        Error::invalid_argument(format!("the body must be {{\"question\", \"purpose\"?, \"dialect\"?}}: {e}"))
    });
    match state.config.llm.clone() {
        // Without an LLM the answer is one call: one statement with its envelope.
        None => governed(&state, request, body.map(|body| signed_call(false, body))).await,
        Some(llm) => {
            governed_steps(&state, request, async move |tx| answer_signed(tx, &llm, body?).await).await
        }
    }
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

//! The console API for human members at `/api/console/…`, authenticated by a member token
//! (`Authorization: Bearer qlm_…`). Each request is one transaction: authenticate_member, then
//! one `querylayer_api` call. Roles are the database's business (owner and admin manage
//! connections; the proposal type says who may decide).

use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use std::sync::atomic::{AtomicBool, Ordering};

use crate::auth::bearer;
use crate::body::{MalformedBody, RequestDigest};
use crate::bulkhead::Access;
use crate::db::{Answered, Call, Fingerprint, Idempotency, MemberContext, RoundTrips};
use crate::error::{Code, Error};
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/console/me", get(me))
        // ?state=pending&limit=50&cursor=… → {proposals: [proposal with items], next_cursor}
        .route("/api/console/proposals", get(list_proposals))
        // the proposal with its run, agent, and per item the requested revision and what is live
        .route("/api/console/proposals/{id}", by_id("get_proposal", "p_proposal_id"))
        .route("/api/console/proposals/{id}/approve", post(approve))
        .route("/api/console/proposals/{id}/reject", post(reject))
        .route("/api/console/runs", get(list_runs))
        // the run with its outcome, events and artifacts
        .route("/api/console/runs/{id}", by_id("get_run", "p_run_id"))
        // owner, admin: finished `cancelled`, reason code `cancelled_by_member`
        .route("/api/console/runs/{id}/cancel", with_id::<ReasonBody>("console_cancel_run", "p_run_id"))
        // owner, admin; prefixes, never a secret
        .route("/api/console/connections", paged("console_list_connections").post(create_connection))
        .route(
            "/api/console/connections/{id}/revoke",
            with_id::<ReasonBody>("console_revoke_connection", "p_connection_id"),
        )
        .route("/api/console/connections/{id}/budgets", post(set_connection_budget))
        // any member: [{connection_id, name, agent, budgets}]
        .route("/api/console/budgets", fixed("console_list_connection_budgets"))
        .route("/api/console/did-challenges", post(create_did_challenge))
        .route("/api/console/sessions", post(register_session))
        .route("/api/console/sessions/{id}/end", post(end_session))
        // conversations with their newest turns and problem
        .route("/api/console/conversations", paged("console_list_conversations").post(open_conversation))
        // exactly hermes://sessions/{session_id}?profile_id={profile_id}; 422 when it no longer holds
        .route(
            "/api/console/conversations/{id}/link",
            by_id("console_conversation_link", "p_conversation_id"),
        )
        .route("/api/console/conversations/{id}/turns", get(list_turns).post(add_turn))
        // the turn with its plan versions, steps, runs and proposals
        .route("/api/console/turns/{id}", by_id("console_get_turn", "p_turn_id"))
        // the turn cancelled, its active plan with it
        .route("/api/console/turns/{id}/cancel", with_id::<ReasonBody>("console_cancel_turn", "p_turn_id"))
        // a failed or cancelled turn queued again, its automatic retries restored
        .route("/api/console/turns/{id}/reopen", with_id::<NoteBody>("console_reopen_turn", "p_turn_id"))
        // the plan cancelled; the turn ends with it
        .route("/api/console/plans/{id}/cancel", with_id::<ReasonBody>("console_cancel_plan", "p_plan_id"))
        .route("/api/console/form-screening", post(report_form_screening))
        .route("/api/console/evidence-reviews", get(list_evidence_reviews))
        // re-verification resumes
        .route(
            "/api/console/evidence-reviews/{id}/close",
            with_id::<NoteBody>("console_close_evidence_review", "p_review_id"),
        )
        // {templates: [{name, version, fields, versions}], next_cursor}, by name
        .route("/api/console/templates", paged("list_templates"))
        .route("/api/console/content", get(list_content).post(create_draft))
        // the item with its draft and live revisions
        .route("/api/console/content/{id}", by_id("get_content", "p_content_id"))
        .route("/api/console/content/{id}/revisions", get(list_revisions))
        // fields, template and version, author, run
        .route("/api/console/revisions/{id}", by_id("get_revision", "p_revision_id"))
        // one's own dashboard sessions (owners and admins: everyone's on the site), newest first
        .route("/api/console/member-sessions", paged("console_list_member_sessions"))
        // one's own; owners and admins: anyone's
        .route(
            "/api/console/member-sessions/{id}/revoke",
            with_id::<ReasonBody>("console_revoke_member_session", "p_session_id"),
        )
        .route("/api/console/invitations", post(invite_member))
        // owner, admin: {public, tokens: [...]}, prefixes, never a token
        .route("/api/console/delivery", fixed("console_list_delivery"))
        .route("/api/console/delivery/tokens", post(create_delivery_token))
        // owner, admin
        .route(
            "/api/console/delivery/tokens/{id}/revoke",
            with_id::<ReasonBody>("console_revoke_delivery_token", "p_token_id"),
        )
        .route("/api/console/delivery/public", post(set_delivery_public))
}

// The shapes most routes share (docs/edge.md lists every route and its function): the function
// called with nothing, with a page, with the path's id, or with the id and an optional text.

/// `GET` → `function()`.
fn fixed(function: &'static str) -> MethodRouter<AppState> {
    get(move |State(state): State<AppState>, member: Member| async move {
        member.answer(&state, StatusCode::OK, || Ok(Call::new(function))).await
    })
}

/// `GET ?limit=&cursor=` → `function(p_limit, p_cursor)`: `{<items>, next_cursor}`.
fn paged(function: &'static str) -> MethodRouter<AppState> {
    get(
        move |State(state): State<AppState>, member: Member, page: Result<Query<Page>, QueryRejection>| async move {
            let call =
                query(page).map(|p| Call::new(function).opt("p_limit", p.limit).opt("p_cursor", p.cursor));
            member.answer(&state, StatusCode::OK, || call).await
        },
    )
}

/// `GET …/{id}` → `function(<id_arg> => id)`.
fn by_id(function: &'static str, id_arg: &'static str) -> MethodRouter<AppState> {
    get(
        move |State(state): State<AppState>, member: Member, id: Result<Path<Uuid>, PathRejection>| async move {
            let call = path_id(id).map(|id| Call::new(function).arg(id_arg, id));
            member.answer(&state, StatusCode::OK, || call).await
        },
    )
}

/// `POST …/{id}/<verb>` with the optional body `B` (`{"reason"?}` or `{"note"?}`) →
/// `function(<id_arg> => id, <B's argument> => its text)`.
fn with_id<B: OptionalText>(function: &'static str, id_arg: &'static str) -> MethodRouter<AppState> {
    post(
        move |State(state): State<AppState>,
              member: Member,
              id: Result<Path<Uuid>, PathRejection>,
              body: Bytes| async move {
            member
                .answer(&state, StatusCode::OK, || {
                    let id = path_id(id)?;
                    let body: B = optional_body(&body)?;
                    Ok(Call::new(function).arg(id_arg, id).opt(B::ARG, body.text()))
                })
                .await
        },
    )
}

/// An optional body of one optional text (`with_id`).
trait OptionalText: DeserializeOwned + Default + Send + 'static {
    /// The function's argument the text goes to.
    const ARG: &'static str;
    fn text(self) -> Option<String>;
}

/// The presented member token, as a fingerprint (checked by the database in the request's
/// transaction, not here), what the request does to the site, and its idempotency key.
pub struct Member {
    fingerprint: Fingerprint,
    access: Access,
    /// A malformed `Idempotency-Key` (or a body that is not strict JSON) is refused once the
    /// token holds, like any malformed input.
    idempotency: Result<Option<Idempotency>, Error>,
    replayed: AtomicBool,
    /// The request's database round trips, on its `request` log line.
    trips: RoundTrips,
}

/// The header that makes a console write safe to retry.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set on an answer that an earlier request with the same key produced.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

fn idempotency(parts: &Parts) -> Result<Option<Idempotency>, Error> {
    if let Some(MalformedBody(problem)) = parts.extensions.get::<MalformedBody>() {
        return Err(Error::invalid_argument(problem.clone()));
    }
    let Some(value) = parts.headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|k| (1..=255).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| {
            Error::invalid_argument(
                "Idempotency-Key must be 1 to 255 printable ASCII characters without spaces",
            )
        })?;
    let digest = parts
        .extensions
        .get::<RequestDigest>()
        .copied()
        .unwrap_or_else(|| RequestDigest::of(parts.method.as_str(), parts.uri.path(), b""));
    Ok(Some(Idempotency {
        key: key.to_string(),
        action: format!("{} {}", parts.method, parts.uri.path()),
        request_sha256: digest.0,
    }))
}

impl FromRequestParts<AppState> for Member {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &AppState) -> Result<Self, Self::Rejection> {
        let Some(token) = bearer(&parts.headers) else {
            return Err(respond(Err(Error::unauthenticated()), StatusCode::OK));
        };
        let access =
            if matches!(parts.method, Method::GET | Method::HEAD) { Access::Read } else { Access::Write };
        Ok(Member {
            fingerprint: Fingerprint::of(token),
            access,
            idempotency: idempotency(parts),
            replayed: AtomicBool::new(false),
            trips: RoundTrips::default(),
        })
    }
}

impl Member {
    /// The site's permit and the token's rate when this edge has seen the token before
    /// (`AppState::admit`); then, for a call without an idempotency key, one statement
    /// (`Db::member_call`); otherwise BEGIN; authenticate_member; the rate of a token not seen
    /// before; the call (or none: the member's own context), under its idempotency key; COMMIT.
    /// A token's first request takes the transaction, so its rate is taken before anything is
    /// written.
    async fn act(&self, state: &AppState, call: Option<&Call>) -> Result<Value, Error> {
        let admitted = match state.admit(self.fingerprint.as_bytes(), self.access).await {
            Ok(admitted) => admitted,
            Err(e) => {
                e.log(call.map(Call::function).unwrap_or("authenticate_member"));
                return Err(e);
            }
        };
        let db = state.db.counting(&self.trips);
        if let (true, Some(call), Ok(None)) = (admitted.rated, call, &self.idempotency) {
            let result = db.member_call(&self.fingerprint, call).await;
            if let Err(e) = &result {
                e.log(call.function());
            }
            return result;
        }
        let limiter = state.limiter.clone();
        let sites = state.sites.clone();
        let fingerprint = self.fingerprint.clone();
        let rated = admitted.rated;
        let check = move |m: &MemberContext| {
            sites.remember(fingerprint.as_bytes(), &m.site, Some(m.member_token_id));
            match rated {
                true => Ok(()),
                false => limiter.check(m.member_token_id).map_err(Error::rate_limited),
            }
        };
        let idem = match (&self.idempotency, call) {
            (Ok(Some(idem)), Some(_)) => Some(idem),
            _ => None,
        };
        let result = db.call_as_member(&self.fingerprint, check, call, idem).await;
        if let Err(e) = &result {
            e.log(call.map(Call::function).unwrap_or("authenticate_member"));
        }
        result.map(|(value, answered)| {
            if answered == Answered::Before {
                self.replayed.store(true, Ordering::Relaxed);
            }
            value
        })
    }

    /// The response, marked when it is the stored answer of an earlier request with this key.
    fn reply(&self, result: Result<Value, Error>, ok: StatusCode) -> Response {
        let mut response = respond(result, ok);
        if self.replayed.load(Ordering::Relaxed) {
            response.headers_mut().insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        }
        response.extensions_mut().insert(self.trips.clone());
        response
    }

    /// The member's own context (who am I).
    async fn me(&self, state: &AppState) -> Result<Value, Error> {
        self.act(state, None).await
    }

    /// The call `build` makes of the request, as the member: the one place of the console's
    /// rule that the token is checked first. A request whose path, query, header or body is
    /// malformed learns that only once its credential holds (an invalid token gets the same 401
    /// whatever else is wrong).
    async fn call(
        &self,
        state: &AppState,
        build: impl FnOnce() -> Result<Call, Error>,
    ) -> Result<Value, Error> {
        let call = match &self.idempotency {
            Err(malformed) => Err(Error::invalid_argument(malformed.message.clone())),
            Ok(_) => build(),
        };
        match call {
            Ok(call) => self.act(state, Some(&call)).await,
            Err(malformed) => {
                self.me(state).await?;
                Err(malformed)
            }
        }
    }

    /// `call`, answered: `ok` with the JSON result, or the refusal (every console handler).
    async fn answer(
        &self,
        state: &AppState,
        ok: StatusCode,
        build: impl FnOnce() -> Result<Call, Error>,
    ) -> Response {
        self.reply(self.call(state, build).await, ok)
    }
}

/// JSON out, never cached (a creation response holds a secret); 401s carry a challenge.
fn respond(result: Result<Value, Error>, ok: StatusCode) -> Response {
    match result {
        Ok(value) => {
            let mut response = (ok, Json(value)).into_response();
            response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        Err(e) if e.status == StatusCode::UNAUTHORIZED => {
            let mut response = Error::unauthenticated().into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(r#"Bearer realm="querylayer-console""#),
            );
            response
        }
        Err(e) => e.into_response(),
    }
}

fn path_id(path: Result<Path<Uuid>, PathRejection>) -> Result<Uuid, Error> {
    path.map(|Path(id)| id)
        .map_err(|e| Error::invalid_argument(format!("the id in the path is not a uuid: {e}")))
}

fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, Error> {
    query.map(|Query(q)| q).map_err(|e| Error::invalid_argument(e.body_text()))
}

/// A JSON body; an empty body is the type's default.
fn optional_body<T: DeserializeOwned + Default>(body: &Bytes) -> Result<T, Error> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    required_body(body)
}

/// A JSON body whose refusal names the offending field (`expires_at: invalid type: …`).
fn required_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        match path.as_str() {
            "." | "" => Error::invalid_argument(format!("invalid JSON body: {}", e.inner())),
            _ => Error::invalid_argument(format!("{path}: {}", e.inner())),
        }
    })
}

/// `GET /api/console/me`: the member, role and site this token acts as.
async fn me(State(state): State<AppState>, member: Member) -> Response {
    member.reply(member.me(&state).await, StatusCode::OK)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProposalFilter {
    /// `pending` (default), `approved`, `applied`, `failed`, `rejected`.
    state: Option<String>,
    limit: Option<i32>,
    cursor: Option<String>,
}

/// A page of a list: `limit` and the `next_cursor` of the previous page (docs/edge.md).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Page {
    limit: Option<i32>,
    cursor: Option<String>,
}

/// `GET /api/console/proposals?state=pending&limit=50&cursor=…` → `{"proposals": [proposal with
/// items], "next_cursor"}`.
async fn list_proposals(
    State(state): State<AppState>,
    member: Member,
    filter: Result<Query<ProposalFilter>, QueryRejection>,
) -> Response {
    member
        .answer(&state, StatusCode::OK, || {
            let f = query(filter)?;
            let call = Call::new("console_list_proposals")
                .opt("p_state", f.state)
                .opt("p_limit", f.limit)
                .opt("p_cursor", f.cursor);
            Ok(call)
        })
        .await
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    note: Option<String>,
}

/// `POST /api/console/proposals/{id}/approve` with `{"note": …}` → the proposal after the
/// decision (an approved publish proposal has executed: see `execution`).
async fn approve(
    State(state): State<AppState>,
    member: Member,
    id: Result<Path<Uuid>, PathRejection>,
    body: Bytes,
) -> Response {
    decide(state, member, id, body, "approve").await
}

/// `POST /api/console/proposals/{id}/reject` with `{"note": …}`.
async fn reject(
    State(state): State<AppState>,
    member: Member,
    id: Result<Path<Uuid>, PathRejection>,
    body: Bytes,
) -> Response {
    decide(state, member, id, body, "reject").await
}

async fn decide(
    state: AppState,
    member: Member,
    id: Result<Path<Uuid>, PathRejection>,
    body: Bytes,
    decision: &'static str,
) -> Response {
    let result = member
        .call(&state, || {
            let id = path_id(id)?;
            let body: DecisionBody = optional_body(&body)?;
            let call = Call::new("decide_proposal")
                .arg("p_proposal_id", id)
                .arg("p_decision", decision.to_string())
                .opt("p_note", body.note);
            Ok(call)
        })
        .await;
    // An approval of a request that no longer matches its content (the draft moved, the live
    // page changed) is recorded (approved, execution failed) but is not a success: 409.
    if let Ok(proposal) = &result {
        if decision == "approve" && proposal["state"] == "failed" {
            let body = json!({"error": stale_refusal(proposal).body(), "proposal": proposal});
            let mut response = (StatusCode::CONFLICT, Json(body)).into_response();
            response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            if member.replayed.load(Ordering::Relaxed) {
                response.headers_mut().insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            }
            return response;
        }
    }
    member.reply(result, StatusCode::OK)
}

/// The refusal an approval of a stale request answers with: the problems the execution met.
pub(crate) fn stale_refusal(proposal: &Value) -> Error {
    let problems: Vec<&str> = proposal["execution"]["detail"]["problems"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["message"].as_str())
        .collect();
    Error::new(
        StatusCode::CONFLICT,
        Code::StaleRequest,
        format!(
            "the request is stale and nothing changed: {}; the approval is recorded with its failed execution",
            problems.join("; ")
        ),
    )
    .with_hint("reject stale requests; the agent can request again with the current draft")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ContentFilter {
    /// `draft`, `published` or `archived`.
    state: Option<String>,
    limit: Option<i32>,
    /// The previous page's `next_cursor`.
    cursor: Option<String>,
}

/// `GET /api/console/content?state=&limit=&cursor=` → `{items, counts, next_cursor}`.
async fn list_content(
    State(state): State<AppState>,
    member: Member,
    filter: Result<Query<ContentFilter>, QueryRejection>,
) -> Response {
    let call = query(filter).map(|f| {
        Call::new("console_list_content")
            .opt("p_state", f.state)
            .opt("p_limit", f.limit)
            .opt("p_cursor", f.cursor)
    });
    member.answer(&state, StatusCode::OK, || call).await
}

/// `GET /api/console/content/{id}/revisions?limit=&cursor=` → `{content, revisions, next_cursor}`, newest first.
async fn list_revisions(
    State(state): State<AppState>,
    member: Member,
    id: Result<Path<Uuid>, PathRejection>,
    page: Result<Query<Page>, QueryRejection>,
) -> Response {
    member
        .answer(&state, StatusCode::OK, || {
            let id = path_id(id)?;
            let p = query(page)?;
            Ok(Call::new("list_revisions")
                .arg("p_content_id", id)
                .opt("p_limit", p.limit)
                .opt("p_cursor", p.cursor))
        })
        .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewDraft {
    /// The template of a new item.
    template: Option<String>,
    fields: Value,
    /// The item to revise; omit for a new item (then give `slug`).
    content_id: Option<Uuid>,
    slug: Option<String>,
}

/// `POST /api/console/content` (owner, admin, editor) → 201, a member's draft revision through
/// the same template contract as agents' drafts; it never publishes.
async fn create_draft(State(state): State<AppState>, member: Member, body: Bytes) -> Response {
    member
        .answer(&state, StatusCode::CREATED, || {
            let d: NewDraft = required_body(&body)?;
            Ok(Call::new("create_draft")
                .arg("p_run_id", None::<Uuid>)
                .arg("p_template", d.template)
                .arg("p_fields", d.fields)
                .opt("p_content_id", d.content_id)
                .opt("p_slug", d.slug))
        })
        .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunFilter {
    limit: Option<i32>,
    /// Only runs started before this instant (RFC 3339).
    before: Option<DateTime<Utc>>,
    cursor: Option<String>,
}

/// `GET /api/console/runs?limit=50&before=…&cursor=…` → `{"runs": [run], "next_cursor"}`.
async fn list_runs(
    State(state): State<AppState>,
    member: Member,
    filter: Result<Query<RunFilter>, QueryRejection>,
) -> Response {
    member
        .answer(&state, StatusCode::OK, || {
            let f = query(filter)?;
            let call = Call::new("list_runs")
                .opt("p_limit", f.limit)
                .opt("p_before", f.before)
                .opt("p_cursor", f.cursor);
            Ok(call)
        })
        .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewConnection {
    /// The agent's handle.
    agent: String,
    name: String,
    scopes: Vec<String>,
    /// When it expires (RFC 3339) …
    expires_at: Option<DateTime<Utc>>,
    /// … or how long it lives (a PostgreSQL interval such as `24 hours` or `30 days`).
    expires_in: Option<String>,
    harness: Option<String>,
    /// An Ed25519 did:key to bind: signed envelopes from it act as the connection.
    did: Option<String>,
    /// The key holder's proof of possession: `{"challenge", "signature"}` over the challenge
    /// from `POST /api/console/did-challenges`.
    did_proof: Option<Value>,
}

/// `POST /api/console/connections` (owner, admin) → 201 with the connection and its secret,
/// the only time the secret exists.
async fn create_connection(State(state): State<AppState>, member: Member, body: Bytes) -> Response {
    member
        .answer(&state, StatusCode::CREATED, || {
            let c: NewConnection = required_body(&body)?;
            let call = Call::new("console_create_connection")
                .arg("p_agent", c.agent)
                .arg("p_name", c.name)
                .arg("p_scopes", c.scopes);
            let call = match (c.expires_at, c.expires_in) {
                (Some(_), Some(_)) => {
                    return Err(Error::invalid_argument("give expires_at or expires_in, not both"))
                }
                (None, Some(interval)) => call.arg_as("p_expires_at", "now() + {}::text::interval", interval),
                (at, None) => call.arg("p_expires_at", at),
            };
            Ok(call.opt("p_harness", c.harness).opt("p_did", c.did).opt("p_did_proof", c.did_proof))
        })
        .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewDidChallenge {
    /// The did:key to be bound.
    did: String,
}

/// `POST /api/console/did-challenges` with `{"did"}` (owner, admin) → 201 with `{challenge,
/// message, expires_at}`: the key's holder signs `message` (`querylayer envelope prove`) and the
/// signature goes with the challenge as `did_proof` to `POST /api/console/connections`.
async fn create_did_challenge(State(state): State<AppState>, member: Member, body: Bytes) -> Response {
    member
        .answer(&state, StatusCode::CREATED, || {
            let c: NewDidChallenge = required_body(&body)?;
            Ok(Call::new("console_create_did_challenge").arg("p_did", c.did))
        })
        .await
}

/// `{"reason"?}`: the optional body of revocations, cancellations and session ends.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReasonBody {
    reason: Option<String>,
}

impl OptionalText for ReasonBody {
    const ARG: &'static str = "p_reason";
    fn text(self) -> Option<String> {
        self.reason
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetBody {
    /// A scope of the catalogue, or `*write` for every call that needs a write scope.
    scope: String,
    /// `hour` or `day`.
    period: String,
    /// The most calls in one window; null removes the budget.
    max_calls: Option<i32>,
}

/// `POST /api/console/connections/{id}/budgets` with `{"scope", "period", "max_calls"}` (owner,
/// admin) → the connection's budgets. Every edge refuses its calls past one (429).
async fn set_connection_budget(
    State(state): State<AppState>,
    member: Member,
    id: Result<Path<Uuid>, PathRejection>,
    body: Bytes,
) -> Response {
    member
        .answer(&state, StatusCode::OK, || {
            let id = path_id(id)?;
            let body: BudgetBody = required_body(&body)?;
            Ok(Call::new("console_set_connection_budget")
                .arg("p_connection", id)
                .arg("p_scope", body.scope)
                .arg("p_period", body.period)
                .arg("p_max_calls", body.max_calls))
        })
        .await
}

// ---------------------------------------------------------------------------------------------
// The Agent Console: Hermes sessions, conversations, turns and their plans (docs/console.md).

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSession {
    /// The agent's immutable Hermes profile id.
    profile_id: String,
    /// The id of a session that exists in Hermes (QueryLayer never creates one).
    session_id: String,
}

/// `POST /api/console/sessions` with `{"profile_id", "session_id"}` → 201 with the registered session.
async fn register_session(State(state): State<AppState>, member: Member, body: Bytes) -> Response {
    member
        .answer(&state, StatusCode::CREATED, || {
            let s: NewSession = required_body(&body)?;
            let call = Call::new("console_register_session")
                .arg("p_profile_id", s.profile_id)
                .arg("p_session_id", s.session_id);
            Ok(call)
        })
        .await
}

/// `POST /api/console/sessions/{session_id}/end` with `{"reason"?}`: the Hermes session ended or
/// went missing; its conversation fails closed from now on.
async fn end_session(
    State(state): State<AppState>,
    member: Member,
    id: Result<Path<String>, PathRejection>,
    body: Bytes,
) -> Response {
    member
        .answer(&state, StatusCode::OK, || {
            let Path(session_id) =
                id.map_err(|e| Error::invalid_argument(format!("the session id in the path: {e}")))?;
            let body: ReasonBody = optional_body(&body)?;
            let call =
                Call::new("console_end_session").arg("p_session_id", session_id).opt("p_reason", body.reason);
            Ok(call)
        })
        .await
}

/// `GET /api/console/conversations/{id}/turns?limit=…&cursor=…` → `{"turns": [...], "next_cursor"}`,
/// oldest first.
async fn list_turns(
    State(state): State<AppState>,
    member: Member,
    id: Result<Path<Uuid>, PathRejection>,
    page: Result<Query<Page>, QueryRejection>,
) -> Response {
    member
        .answer(&state, StatusCode::OK, || {
            let id = path_id(id)?;
            let p = query(page)?;
            let call = Call::new("console_list_turns")
                .arg("p_conversation_id", id)
                .opt("p_limit", p.limit)
                .opt("p_cursor", p.cursor);
            Ok(call)
        })
        .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewConversation {
    profile_id: String,
    session_id: String,
    title: Option<String>,
}

/// `POST /api/console/conversations` with `{"profile_id", "session_id", "title"?}` → 201: the
/// session's one conversation.
async fn open_conversation(State(state): State<AppState>, member: Member, body: Bytes) -> Response {
    member
        .answer(&state, StatusCode::CREATED, || {
            let c: NewConversation = required_body(&body)?;
            let call = Call::new("console_open_conversation")
                .arg("p_profile_id", c.profile_id)
                .arg("p_session_id", c.session_id)
                .arg("p_title", c.title);
            Ok(call)
        })
        .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTurn {
    request: String,
}

/// `POST /api/console/conversations/{id}/turns` with `{"request"}` → 201 with the queued turn.
async fn add_turn(
    State(state): State<AppState>,
    member: Member,
    id: Result<Path<Uuid>, PathRejection>,
    body: Bytes,
) -> Response {
    member
        .answer(&state, StatusCode::CREATED, || {
            let id = path_id(id)?;
            let t: NewTurn = required_body(&body)?;
            let call = Call::new("console_add_turn").arg("p_conversation_id", id).arg("p_request", t.request);
            Ok(call)
        })
        .await
}

/// `{"note"?}`: the optional body of reopening a turn and closing a review.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NoteBody {
    note: Option<String>,
}

impl OptionalText for NoteBody {
    const ARG: &'static str = "p_note";
    fn text(self) -> Option<String> {
        self.note
    }
}

// ---------------------------------------------------------------------------------------------
// Editorial: form screening reports and evidence reviews (what agents never see).

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FormScreeningReport {
    /// `[{"form", "decision": "accepted" | "rejected" | "review", "reason", "occurred_at"?, …}]`.
    events: Value,
}

/// `POST /api/console/form-screening` with `{"events": [...]}` → `{"recorded": n}`.
async fn report_form_screening(State(state): State<AppState>, member: Member, body: Bytes) -> Response {
    member
        .answer(&state, StatusCode::OK, || {
            let r: FormScreeningReport = required_body(&body)?;
            let call = Call::new("console_report_form_screening").arg("p_events", r.events);
            Ok(call)
        })
        .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReviewFilter {
    /// `open` (default), `closed` or `all`.
    state: Option<String>,
    limit: Option<i32>,
    cursor: Option<String>,
}

/// `GET /api/console/evidence-reviews?state=open|closed|all&limit=…&cursor=…` → `{"reviews": [...],
/// "next_cursor"}` with what the re-verification observed.
async fn list_evidence_reviews(
    State(state): State<AppState>,
    member: Member,
    filter: Result<Query<ReviewFilter>, QueryRejection>,
) -> Response {
    member
        .answer(&state, StatusCode::OK, || {
            let f = query(filter)?;
            let call = Call::new("console_list_evidence_reviews");
            let call = match f.state.as_deref() {
                Some("all") => call.arg("p_state", None::<String>),
                _ => call.opt("p_state", f.state),
            };
            Ok(call.opt("p_limit", f.limit).opt("p_cursor", f.cursor))
        })
        .await
}

// ---------------------------------------------------------------------------------------------
// Dashboard sign-ins, invitations and website delivery (sql/175_dashboard.sql, sql/180_delivery.sql).

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewInvitation {
    /// The member's handle (a new one creates the member).
    member: String,
    role: Option<String>,
    display_name: Option<String>,
    /// How long the link works (a PostgreSQL interval; default 72 hours, at most 30 days).
    expires_in: Option<String>,
}

/// `POST /api/console/invitations` (owner, admin) → 201 `{invitation_id, token, path, …}`: the
/// one-time link to set a dashboard password, shown once.
async fn invite_member(State(state): State<AppState>, member: Member, body: Bytes) -> Response {
    member
        .answer(&state, StatusCode::CREATED, || {
            let i: NewInvitation = required_body(&body)?;
            let call = Call::new("console_invite_member")
                .arg("p_member", i.member)
                .arg("p_role", i.role)
                .arg("p_display_name", i.display_name);
            Ok(match i.expires_in {
                Some(interval) => call.arg_as("p_expires_at", "now() + {}::text::interval", interval),
                None => call,
            })
        })
        .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewDeliveryToken {
    name: String,
    /// A PostgreSQL interval such as `90 days` (at most a year).
    expires_in: String,
}

/// `POST /api/console/delivery/tokens` (owner, admin) → 201 `{delivery_token_id, token, …}`,
/// the only time the token exists.
async fn create_delivery_token(State(state): State<AppState>, member: Member, body: Bytes) -> Response {
    member
        .answer(&state, StatusCode::CREATED, || {
            let t: NewDeliveryToken = required_body(&body)?;
            Ok(Call::new("console_create_delivery_token").arg("p_name", t.name).arg_as(
                "p_expires_at",
                "now() + {}::text::interval",
                t.expires_in,
            ))
        })
        .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeliveryPublic {
    public: bool,
}

/// `POST /api/console/delivery/public` with `{"public": true|false}` (owner only).
async fn set_delivery_public(State(state): State<AppState>, member: Member, body: Bytes) -> Response {
    member
        .answer(&state, StatusCode::OK, || {
            let p: DeliveryPublic = required_body(&body)?;
            Ok(Call::new("console_set_delivery_public").arg("p_public", p.public))
        })
        .await
}

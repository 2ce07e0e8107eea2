//! The dashboard's pages and actions. A page: one read-only transaction as the session, then a
//! template. An action: an origin check, the session's CSRF token, one transaction that makes the
//! same `querylayer_api` call the console API makes, then a redirect (or the page again with the
//! database's refusal).

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::{
    error_page, page, render, run_calls, same_origin, see_other, session_cookie, session_secret, to_sign_in,
    Form, Me,
};
use crate::db::{Call, Fingerprint};
use crate::error::{Code, Error};
use crate::state::AppState;

type Params = Query<HashMap<String, String>>;

const INTERVAL: &str = "now() + {}::text::interval";

fn param(params: &Params, name: &str) -> Option<String> {
    params.0.get(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// The given filters as a query string prefix (`k=v&…`), for a link to the next page.
fn filter_query(params: &Params, keys: &[&str]) -> String {
    keys.iter()
        .filter_map(|k| {
            param(params, k).map(|v| {
                format!("{k}={}&", form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>())
            })
        })
        .collect()
}

fn uuid_path(path: Result<Path<Uuid>, PathRejection>) -> Result<Uuid, Error> {
    path.map(|Path(id)| id).map_err(|_| Error::not_found("no such page: the id in the address is not valid"))
}

/// What a page shows after an action that redirected to it (`?done=…`): fixed texts only.
fn flash(params: &Params) -> Option<&'static str> {
    Some(match params.0.get("done")?.as_str() {
        "approved" => "Approved. The decision is recorded.",
        "rejected" => "Rejected. The decision is recorded.",
        "saved" => "Draft saved as a new revision. Nothing was published.",
        "revoked" => "Revoked. It stops working at its next request.",
        "granted" => "Scopes updated.",
        "queued" => "Turn queued for the agent.",
        "cancelled" => "Plan cancelled.",
        "run_cancelled" => "Run cancelled. Its history records who cancelled it and why.",
        "opened" => "Conversation opened.",
        "ended" => "Session marked as ended; its conversation takes no new turns.",
        "closed" => "Review closed; re-verification resumes.",
        "public" => "Delivery setting changed.",
        "signed_out" => "You are signed out.",
        _ => return None,
    })
}

/// A page of `calls` results, rendered by `view`; refusals become the error page.
async fn show(
    state: &AppState,
    headers: &HeaderMap,
    calls: Vec<Call>,
    back: &str,
    view: impl FnOnce(&Me, Vec<Value>) -> Response,
) -> Response {
    let Some(secret) = session_secret(state, headers) else {
        return to_sign_in(state);
    };
    match run_calls(state, &secret, None, &calls).await {
        (Some(me), Ok(results)) => view(&me, results),
        (me, Err(e)) => error_page(state, me.as_ref(), &e, back),
        (None, Ok(_)) => to_sign_in(state),
    }
}

/// `show` for a page of one thing the path names: a malformed id is the error page (with a way
/// `back`), otherwise `calls` of the id.
async fn show_id(
    state: &AppState,
    headers: &HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
    back: &str,
    calls: impl FnOnce(Uuid) -> Vec<Call>,
    view: impl FnOnce(&Me, Vec<Value>) -> Response,
) -> Response {
    match uuid_path(id) {
        Ok(id) => show(state, headers, calls(id), back, view).await,
        Err(e) => error_page(state, None, &e, back),
    }
}

/// The common start of an action: same origin, a session, its CSRF token.
fn guard<'a>(state: &AppState, headers: &HeaderMap, form: &'a Form) -> Result<(String, &'a str), Response> {
    if !same_origin(headers) {
        let e = Error::new(StatusCode::FORBIDDEN, Code::CrossSite, "a request from another site was refused")
            .with_hint("use the dashboard's own pages");
        return Err(error_page(state, None, &e, "/"));
    }
    let Some(secret) = session_secret(state, headers) else {
        return Err(to_sign_in(state));
    };
    let Some(csrf) = form.get("csrf_token").filter(|t| !t.is_empty()) else {
        let e = Error::new(StatusCode::FORBIDDEN, Code::Csrf, "the form carried no CSRF token")
            .with_hint("reload the page and submit its form again");
        return Err(error_page(state, None, &e, "/"));
    };
    Ok((secret, csrf))
}

/// An action: `call` as the session with its CSRF token, then a redirect to `done`.
async fn act(
    state: &AppState,
    headers: &HeaderMap,
    body: &Bytes,
    back: &str,
    call: impl FnOnce(&Form) -> Result<Call, Error>,
    done: impl FnOnce(&Value) -> String,
) -> Response {
    let form = Form::parse(body);
    let (secret, csrf) = match guard(state, headers, &form) {
        Ok(g) => g,
        Err(response) => return response,
    };
    let call = match call(&form) {
        Ok(c) => c,
        Err(e) => return error_page(state, None, &e, back),
    };
    match run_calls(state, &secret, Some(csrf), &[call]).await {
        (_, Ok(results)) => see_other(&done(&results[0])),
        (me, Err(e)) => error_page(state, me.as_ref(), &e, back),
    }
}

// ---------------------------------------------------------------------------------------------
// Signing in and out, invitations.

pub async fn home(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match session_secret(&state, &headers) {
        Some(_) => see_other("/inbox"),
        None => see_other("/sign-in"),
    }
}

pub async fn sign_in_form(params: Params) -> Response {
    let signed_out = params.0.get("done").map(String::as_str) == Some("signed_out");
    page(
        StatusCode::OK,
        "sign_in.html",
        None,
        "",
        json!({"title": "Sign in", "site": param(&params, "site"), "handle": param(&params, "member"),
               "next": param(&params, "next").filter(|n| sign_in_next(n)),
               "flash": signed_out.then_some("You are signed out.")}),
    )
}

/// Where a sign-in may continue besides the inbox: an OAuth authorization request waiting for
/// the member (`oauth::consent`). Nothing else, so the link cannot redirect anywhere.
fn sign_in_next(next: &str) -> bool {
    next.starts_with("/authorize?") && !next.contains(['\\', '\r', '\n'])
}

/// Signs in: a new session every time (a cookie presented before is never reused), or the same
/// 401 page whatever was wrong. Failures spend this address's failed-authentication budget; the
/// database locks a member out after five failures in fifteen minutes.
pub async fn sign_in(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let form = Form::parse(&body);
    if !same_origin(&headers) {
        let e = Error::new(StatusCode::FORBIDDEN, Code::CrossSite, "a sign-in from another site was refused");
        return error_page(&state, None, &e, "/sign-in");
    }
    let site = form.text("site").unwrap_or_default();
    let handle = form.text("handle").unwrap_or_default();
    let password = form.get("password").unwrap_or_default().to_string();
    let result = async {
        let client = state.db.client().await?;
        let row = client
            .query_one("SELECT querylayer_api.sign_in($1, $2, $3)", &[&site, &handle, &password])
            .await?;
        Ok::<Value, Error>(row.get(0))
    }
    .await;
    match result {
        Ok(v) if v["ok"] == true => {
            let secret = v["secret"].as_str().unwrap_or_default();
            let next = form.text("next").filter(|n| sign_in_next(n)).unwrap_or_else(|| "/inbox".into());
            let mut response = see_other(&next);
            response.headers_mut().insert(header::SET_COOKIE, session_cookie(&state, secret));
            tracing::info!(session_id = v["session_id"].as_str(), "signed in");
            response
        }
        Ok(v) => {
            tracing::info!(reason = v["reason"].as_str(), "sign-in refused");
            page(
                StatusCode::UNAUTHORIZED,
                "sign_in.html",
                None,
                "",
                json!({"title": "Sign in", "failed": true, "site": site, "handle": handle,
                       "next": form.text("next").filter(|n| sign_in_next(n))}),
            )
        }
        Err(e) => error_page(&state, None, &e, "/sign-in"),
    }
}

/// Ends the session in the database, then removes the cookie.
pub async fn sign_out(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let form = Form::parse(&body);
    let (secret, csrf) = match guard(&state, &headers, &form) {
        Ok(g) => g,
        Err(response) => return response,
    };
    match run_calls(&state, &secret, Some(csrf), &[Call::new("sign_out")]).await {
        (_, Ok(_)) | (None, Err(_)) => {
            let mut response = see_other("/sign-in?done=signed_out");
            response.headers_mut().insert(header::SET_COOKIE, super::clear_cookie(&state));
            response
        }
        (me, Err(e)) => error_page(&state, me.as_ref(), &e, "/"),
    }
}

async fn invitation_info(state: &AppState, token: &str) -> Result<Value, Error> {
    let fingerprint = Fingerprint::of(token);
    let client = state.db.client().await?;
    let row = client.query_one("SELECT querylayer_api.invitation($1)", &[&fingerprint.as_bytes()]).await?;
    Ok(row.get(0))
}

fn dead_invitation(state: &AppState) -> Response {
    let e = Error::not_found("this invitation link is not valid: it was used, revoked or has expired")
        .with_hint("ask the person who invited you, or an operator, for a new one");
    error_page(state, None, &e, "/sign-in")
}

/// `GET /invite?token=qli_…`: the form to set a password (the token travels in the query, which
/// the edge never logs, and no page sends a referrer).
pub async fn invite_form(State(state): State<AppState>, params: Params) -> Response {
    let Some(token) = param(&params, "token") else {
        return dead_invitation(&state);
    };
    match invitation_info(&state, &token).await {
        Ok(info) => page(
            StatusCode::OK,
            "invite.html",
            None,
            "",
            json!({"title": "Set your password", "invitation": info, "token": token}),
        ),
        Err(e) if e.status == StatusCode::UNAUTHORIZED => dead_invitation(&state),
        Err(e) => error_page(&state, None, &e, "/sign-in"),
    }
}

/// The invitation form again, with what was wrong with the password.
async fn invite_again(state: &AppState, token: &str, message: String) -> Response {
    match invitation_info(state, token).await {
        Ok(info) => page(
            StatusCode::BAD_REQUEST,
            "invite.html",
            None,
            "",
            json!({"title": "Set your password", "invitation": info, "token": token, "error": message}),
        ),
        Err(_) => dead_invitation(state),
    }
}

pub async fn accept_invite(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let form = Form::parse(&body);
    if !same_origin(&headers) {
        let e = Error::new(StatusCode::FORBIDDEN, Code::CrossSite, "a request from another site was refused");
        return error_page(&state, None, &e, "/sign-in");
    }
    let token = form.text("token").unwrap_or_default();
    let password = form.get("password").unwrap_or_default().to_string();
    if form.get("confirm") != Some(password.as_str()) {
        return invite_again(&state, &token, "The two passwords differ.".into()).await;
    }
    let result = async {
        let fingerprint = Fingerprint::of(&token);
        let client = state.db.client().await?;
        let row = client
            .query_one(
                "SELECT querylayer_api.accept_invitation($1, $2)",
                &[&fingerprint.as_bytes(), &password],
            )
            .await?;
        Ok::<Value, Error>(row.get(0))
    }
    .await;
    match result {
        Ok(done) => page(
            StatusCode::OK,
            "invite_done.html",
            None,
            "",
            json!({"title": "Password set", "site": done["site"], "member": done["member"],
                   "sessions_ended": done["sessions_ended"]}),
        ),
        Err(e) if e.status == StatusCode::UNAUTHORIZED => dead_invitation(&state),
        Err(e) if e.status == StatusCode::BAD_REQUEST => invite_again(&state, &token, e.message).await,
        Err(e) => error_page(&state, None, &e, "/sign-in"),
    }
}

// ---------------------------------------------------------------------------------------------
// Approvals.

pub async fn inbox(State(state): State<AppState>, headers: HeaderMap, params: Params) -> Response {
    show(
        &state,
        &headers,
        vec![Call::new("console_inbox").arg("p_limit", 50).opt("p_cursor", param(&params, "cursor"))],
        "/",
        |me, r| {
            page(
                StatusCode::OK,
                "inbox.html",
                Some(me),
                "inbox",
                json!({"title": "Approvals", "inbox": r[0], "flash": flash(&params)}),
            )
        },
    )
    .await
}

/// The proposal as `get_proposal` describes it, with each requested revision rendered and
/// diffed against what is live.
fn proposal_view(mut p: Value) -> Value {
    let details: Vec<Value> = p["details"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|mut d| {
            let template = template_fields_of(&d["requested"], &d["live"]);
            if d["requested"].is_object() {
                d["rendered"] = json!(render::fields(&template, &d["requested"]["fields"]));
                d["diff"] = json!(render::diff(&template, &d["live"]["fields"], &d["requested"]["fields"]));
            }
            d
        })
        .collect();
    let revision_rendered = if p["revision"].is_object() {
        json!(render::fields(&Value::Null, &p["revision"]["fields"]))
    } else {
        Value::Null
    };
    let revision = p["revision"].take();
    json!({"p": p, "details": details, "revision": revision, "revision_rendered": revision_rendered})
}

/// Field order for rendering: the revision's own keys (the template's order is in its fields).
fn template_fields_of(requested: &Value, live: &Value) -> Value {
    let mut names: Vec<String> = Vec::new();
    for source in [requested, live] {
        for key in source["fields"].as_object().into_iter().flat_map(Map::keys) {
            if !names.contains(key) {
                names.push(key.clone());
            }
        }
    }
    // Title first, then body, then the rest as they come.
    names.sort_by_key(|n| match n.as_str() {
        "title" => 0,
        "summary" => 1,
        "body" => 2,
        _ => 3,
    });
    json!(names.iter().map(|n| json!({"name": n, "type": guess_type(requested, n)})).collect::<Vec<_>>())
}

fn guess_type(revision: &Value, name: &str) -> &'static str {
    match &revision["fields"][name] {
        Value::Array(_) => "list",
        Value::String(s) if name == "body" || s.contains('\n') => "markdown",
        Value::String(s) if s.starts_with("http://") || s.starts_with("https://") => "url",
        _ => "text",
    }
}

pub async fn proposal(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
    params: Params,
) -> Response {
    let calls = |id| vec![Call::new("get_proposal").arg("p_proposal_id", id)];
    show_id(&state, &headers, id, "/inbox", calls, |me, mut r| {
        let mut data = proposal_view(r.remove(0));
        data["title"] = json!("Proposal");
        data["flash"] = json!(flash(&params));
        page(StatusCode::OK, "proposal.html", Some(me), "inbox", data)
    })
    .await
}

/// Approve or reject. The database decides who may; an approval of a stale request is recorded
/// (approved, execution failed) and shown as a refusal (409), never as a success.
pub async fn decide(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
    body: Bytes,
) -> Response {
    let id = match uuid_path(id) {
        Ok(id) => id,
        Err(e) => return error_page(&state, None, &e, "/inbox"),
    };
    let form = Form::parse(&body);
    let (secret, csrf) = match guard(&state, &headers, &form) {
        Ok(g) => g,
        Err(response) => return response,
    };
    let decision = match form.get("decision") {
        Some(d @ ("approve" | "reject")) => d.to_string(),
        _ => {
            return error_page(
                &state,
                None,
                &Error::invalid_argument("decision: approve or reject"),
                "/inbox",
            )
        }
    };
    let call = Call::new("decide_proposal")
        .arg("p_proposal_id", id)
        .arg("p_decision", decision.clone())
        .opt("p_note", form.text("note"));
    let refusal = match run_calls(&state, &secret, Some(csrf), &[call]).await {
        (_, Ok(r)) if decision == "approve" && r[0]["state"] == "failed" => {
            crate::console::stale_refusal(&r[0])
        }
        (_, Ok(_)) => {
            let done = if decision == "approve" { "approved" } else { "rejected" };
            return see_other(&format!("/proposals/{id}?done={done}"));
        }
        (None, Err(e)) => return error_page(&state, None, &e, "/inbox"),
        (Some(_), Err(e)) => e,
    };
    // The proposal again, with the refusal on it.
    let (me, result) =
        run_calls(&state, &secret, None, &[Call::new("get_proposal").arg("p_proposal_id", id)]).await;
    match (me, result) {
        (Some(me), Ok(mut r)) => {
            let mut data = proposal_view(r.remove(0));
            data["title"] = json!("Proposal");
            data["refusal"] = refusal.body();
            data["replace_url"] = json!(format!("/proposals/{id}"));
            page(refusal.status, "proposal.html", Some(&me), "inbox", data)
        }
        (me, _) => error_page(&state, me.as_ref(), &refusal, "/inbox"),
    }
}

// ---------------------------------------------------------------------------------------------
// Content.

pub async fn content_list(State(state): State<AppState>, headers: HeaderMap, params: Params) -> Response {
    let wanted = param(&params, "state");
    let call = Call::new("console_list_content")
        .opt("p_state", wanted.clone())
        .arg("p_limit", 50)
        .opt("p_cursor", param(&params, "cursor"));
    show(&state, &headers, vec![call], "/content", |me, r| {
        page(
            StatusCode::OK,
            "content_list.html",
            Some(me),
            "content",
            json!({"title": "Content", "list": r[0], "state": wanted, "flash": flash(&params)}),
        )
    })
    .await
}

pub async fn content_item(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
    params: Params,
) -> Response {
    let calls = |id| {
        vec![
            Call::new("get_content").arg("p_content_id", id),
            Call::new("list_revisions").arg("p_content_id", id).arg("p_limit", 50),
        ]
    };
    show_id(&state, &headers, id, "/content", calls, |me, r| {
        let item = &r[0];
        let template = &item["template_fields"];
        page(
            StatusCode::OK,
            "content_item.html",
            Some(me),
            "content",
            json!({"title": item["title"].as_str().or(item["slug"].as_str()), "item": item, "history": r[1],
                   "draft_rendered": render::fields(template, &item["draft"]["fields"]),
                   "diff": render::diff(template, &item["live"]["fields"], &item["draft"]["fields"]),
                   "flash": flash(&params)}),
        )
    })
    .await
}

pub async fn revision(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
) -> Response {
    let id = match uuid_path(id) {
        Ok(id) => id,
        Err(e) => return error_page(&state, None, &e, "/content"),
    };
    let Some(secret) = session_secret(&state, &headers) else {
        return to_sign_in(&state);
    };
    let (me, result) =
        run_calls(&state, &secret, None, &[Call::new("get_revision").arg("p_revision_id", id)]).await;
    let (me, revision) = match (me, result) {
        (Some(me), Ok(mut r)) => (me, r.remove(0)),
        (me, Err(e)) => return error_page(&state, me.as_ref(), &e, "/content"),
        (None, Ok(_)) => return to_sign_in(&state),
    };
    // The revision before it, for the diff, and the item's template for the field order.
    let content_id = revision["content_id"].as_str().and_then(|s| s.parse::<Uuid>().ok()).unwrap_or_default();
    let number = revision["revision_number"].as_i64().unwrap_or(1) as i32;
    let mut calls = vec![Call::new("get_content").arg("p_content_id", content_id)];
    if let Some(pid) = revision["previous_revision_id"].as_str().and_then(|s| s.parse::<Uuid>().ok()) {
        calls.push(Call::new("get_revision").arg("p_revision_id", pid));
    }
    let (_, context) = run_calls(&state, &secret, None, &calls).await;
    let context = context.unwrap_or_default();
    let template = context.first().map(|c| c["template_fields"].clone()).unwrap_or(Value::Null);
    let previous = context.get(1).cloned().unwrap_or(Value::Null);
    let previous_fields = previous["fields"].clone();
    page(
        StatusCode::OK,
        "revision.html",
        Some(&me),
        "content",
        json!({"title": format!("Revision {number}"), "r": revision,
               "rendered": render::fields(&template, &revision["fields"]),
               "previous": if previous.is_object() { previous } else { Value::Null },
               "diff": render::diff(&template, &previous_fields, &revision["fields"])}),
    )
}

/// The fields of a content form, as the template declares them: lists one item per line.
fn draft_fields(form: &Form, template: &Value) -> Value {
    let mut fields = Map::new();
    for f in template.as_array().into_iter().flatten() {
        let Some(name) = f["name"].as_str() else { continue };
        let Some(value) = form.get(&format!("field.{name}")) else { continue };
        let value = value.replace("\r\n", "\n");
        if value.trim().is_empty() {
            continue;
        }
        let v = if f["type"] == "list" {
            json!(value.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>())
        } else {
            json!(value)
        };
        fields.insert(name.to_string(), v);
    }
    Value::Object(fields)
}

fn form_values(fields: &Value, template: &Value) -> Value {
    let mut values = Map::new();
    for f in template.as_array().into_iter().flatten() {
        let Some(name) = f["name"].as_str() else { continue };
        let text = match &fields[name] {
            Value::Array(items) => items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n"),
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        values.insert(name.to_string(), json!(text));
    }
    Value::Object(values)
}

pub async fn new_content_form(State(state): State<AppState>, headers: HeaderMap, params: Params) -> Response {
    let wanted = param(&params, "template");
    show(&state, &headers, vec![Call::new("list_templates").arg("p_limit", 500)], "/content", |me, r| {
        let template = wanted.as_deref().and_then(|w| {
            r[0]["templates"].as_array().and_then(|ts| ts.iter().find(|t| t["name"] == w)).cloned()
        });
        page(
            StatusCode::OK,
            "content_form.html",
            Some(me),
            "content",
            json!({"title": "New draft", "templates": r[0]["templates"], "template": template, "new": true,
                   "action": "/content/new", "values": {}}),
        )
    })
    .await
}

/// A member's draft: `create_draft` without a run, through the same template contract agents meet.
pub async fn create_content(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    save_draft(state, headers, body, None).await
}

pub async fn edit_content_form(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
) -> Response {
    let id = match uuid_path(id) {
        Ok(id) => id,
        Err(e) => return error_page(&state, None, &e, "/content"),
    };
    show(&state, &headers, vec![Call::new("get_content").arg("p_content_id", id)], "/content", |me, r| {
        let item = &r[0];
        let template = json!({"name": item["template"], "version": item["draft"]["template_version"],
                              "fields": item["template_fields"]});
        page(
            StatusCode::OK,
            "content_form.html",
            Some(me),
            "content",
            json!({"title": format!("Edit {}", item["slug"].as_str().unwrap_or_default()), "template": template,
                   "new": false, "action": format!("/content/{id}/edit"),
                   "values": form_values(&item["draft"]["fields"], &item["template_fields"])}),
        )
    })
    .await
}

pub async fn edit_content(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
    body: Bytes,
) -> Response {
    match uuid_path(id) {
        Ok(id) => save_draft(state, headers, body, Some(id)).await,
        Err(e) => error_page(&state, None, &e, "/content"),
    }
}

async fn save_draft(state: AppState, headers: HeaderMap, body: Bytes, content_id: Option<Uuid>) -> Response {
    let form = Form::parse(&body);
    let (secret, csrf) = match guard(&state, &headers, &form) {
        Ok(g) => g,
        Err(response) => return response,
    };
    let template_name = form.text("template").unwrap_or_default();
    // The template's fields, to read the form by (the database checks the contract again).
    let (me, templates) =
        run_calls(&state, &secret, None, &[Call::new("list_templates").arg("p_limit", 500)]).await;
    let templates = match templates {
        Ok(mut t) => t.remove(0),
        Err(e) => return error_page(&state, me.as_ref(), &e, "/content"),
    };
    let template = templates["templates"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == template_name.as_str()))
        .cloned()
        .unwrap_or(Value::Null);
    let fields = draft_fields(&form, &template["fields"]);
    let call = Call::new("create_draft")
        .arg("p_run_id", None::<Uuid>)
        .arg("p_template", Some(template_name.clone()).filter(|t| !t.is_empty()))
        .arg("p_fields", fields.clone())
        .opt("p_content_id", content_id)
        .opt("p_slug", if content_id.is_none() { form.text("slug") } else { None });
    match run_calls(&state, &secret, Some(csrf), &[call]).await {
        (_, Ok(r)) => {
            let id = r[0]["content_id"].as_str().unwrap_or_default();
            see_other(&format!("/content/{id}?done=saved"))
        }
        (None, Err(e)) => error_page(&state, None, &e, "/content"),
        (Some(me), Err(e)) if e.status.is_client_error() && e.status != StatusCode::FORBIDDEN => {
            // The form again, as filled in, with the database's refusal (which names the fields).
            let mut values = form_values(&fields, &template["fields"]);
            values["slug"] = json!(form.text("slug"));
            let action = match content_id {
                Some(id) => format!("/content/{id}/edit"),
                None => "/content/new".to_string(),
            };
            page(
                e.status,
                "content_form.html",
                Some(&me),
                "content",
                json!({"title": "Draft", "template": template, "new": content_id.is_none(), "action": action,
                       "values": values, "refusal": e.body()}),
            )
        }
        (me, Err(e)) => error_page(&state, me.as_ref(), &e, "/content"),
    }
}

// ---------------------------------------------------------------------------------------------
// Runs.

pub async fn runs(State(state): State<AppState>, headers: HeaderMap, params: Params) -> Response {
    let filter = json!({"outcome": param(&params, "outcome"), "agent": param(&params, "agent"),
                        "since": param(&params, "since"), "until": param(&params, "until")});
    let mut call = Call::new("console_list_runs")
        .opt("p_outcome", param(&params, "outcome"))
        .opt("p_agent", param(&params, "agent"))
        .arg("p_limit", 100)
        .opt("p_cursor", param(&params, "cursor"));
    if let Some(since) = param(&params, "since") {
        call = call.arg_as("p_since", "{}::text::timestamptz", since);
    }
    if let Some(until) = param(&params, "until") {
        call = call.arg_as("p_until", "{}::text::date + 1", until);
    }
    // The filters again, for the link to older runs.
    let query = filter_query(&params, &["outcome", "agent", "since", "until"]);
    show(&state, &headers, vec![call, Call::new("console_list_agents")], "/runs", |me, r| {
        page(
            StatusCode::OK,
            "runs.html",
            Some(me),
            "runs",
            json!({"title": "Runs", "runs": r[0]["runs"], "next_cursor": r[0]["next_cursor"], "query": query,
                   "agents": r[1]["agents"], "filter": filter}),
        )
    })
    .await
}

pub async fn run(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
    params: Params,
) -> Response {
    let calls = |id| vec![Call::new("get_run").arg("p_run_id", id)];
    show_id(&state, &headers, id, "/runs", calls, |me, r| {
        page(
            StatusCode::OK,
            "run.html",
            Some(me),
            "runs",
            json!({"title": "Run", "run": r[0], "flash": flash(&params)}),
        )
    })
    .await
}

/// Cancels an open run (owner, admin): the run is finished as `cancelled` (`cancelled_by_member`),
/// with the reason the form gives.
pub async fn cancel_run(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
    body: Bytes,
) -> Response {
    let id = uuid_path(id);
    act(
        &state,
        &headers,
        &body,
        "/runs",
        |form| {
            let reason = form
                .get("reason")
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .unwrap_or("cancelled in the dashboard");
            Ok(Call::new("console_cancel_run").arg("p_run_id", id?).arg("p_reason", reason.to_string()))
        },
        |run| format!("/runs/{}?done=run_cancelled", run["run_id"].as_str().unwrap_or_default()),
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// Connections and agents.

async fn connections_page(
    state: &AppState,
    secret: &str,
    status: StatusCode,
    refusal: Option<Value>,
) -> Response {
    let calls = [Call::new("console_list_connections"), Call::new("console_list_agents")];
    match run_calls(state, secret, None, &calls).await {
        (Some(me), Ok(r)) => page(
            status,
            "connections.html",
            Some(&me),
            "connections",
            json!({"title": "Connections", "connections": r[0]["connections"], "next_cursor": r[0]["next_cursor"], "agents": r[1]["agents"], "scopes": r[1]["scopes"],
                   "refusal": refusal, "replace_url": refusal.as_ref().map(|_| "/connections")}),
        ),
        (me, Err(e)) => error_page(state, me.as_ref(), &e, "/"),
        (None, Ok(_)) => to_sign_in(state),
    }
}

pub async fn connections(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match session_secret(&state, &headers) {
        Some(secret) => connections_page(&state, &secret, StatusCode::OK, None).await,
        None => to_sign_in(&state),
    }
}

/// Client configurations that carry a new connection's secret.
fn client_configs(mcp_url: &str, secret: &str) -> Vec<Value> {
    let bearer = format!("Bearer {secret}");
    let pretty = |v: Value| serde_json::to_string_pretty(&v).unwrap_or_default();
    vec![
        json!({"title": "Claude Desktop", "where": "claude_desktop_config.json (Settings → Developer → Edit Config)",
               "text": pretty(json!({"mcpServers": {"querylayer": {"command": "npx",
                   "args": ["-y", "mcp-remote", mcp_url, "--header", "Authorization:${QUERYLAYER_AUTH}"],
                   "env": {"QUERYLAYER_AUTH": bearer}}}}))}),
        json!({"title": "Cursor", "where": "~/.cursor/mcp.json or .cursor/mcp.json in a project",
               "text": pretty(json!({"mcpServers": {"querylayer": {"url": mcp_url,
                   "headers": {"Authorization": bearer}}}}))}),
        json!({"title": "VS Code", "where": ".vscode/mcp.json (its top-level key is servers)",
               "text": pretty(json!({"servers": {"querylayer": {"type": "http", "url": mcp_url,
                   "headers": {"Authorization": bearer}}}}))}),
        json!({"title": "Any MCP client (Streamable HTTP)", "where": "the usual mcpServers shape; or send the header yourself",
               "text": format!("{}\n\ncurl -s {mcp_url} -H 'Authorization: {bearer}' -H 'Content-Type: application/json' \\\n  -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2025-11-25' \\\n  -d '{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}}'",
                   pretty(json!({"mcpServers": {"querylayer": {"type": "http", "url": mcp_url,
                       "headers": {"Authorization": bearer}}}})))}),
    ]
}

/// A secret shown once: in this response only, never stored, never cached, and with its
/// history entry replaced so that a reload shows the plain list instead.
fn secret_page(me: &Me, nav: &str, data: Value) -> Response {
    let mut response = page(StatusCode::CREATED, "secret.html", Some(me), nav, data);
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

pub async fn create_connection(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let form = Form::parse(&body);
    let (secret, csrf) = match guard(&state, &headers, &form) {
        Ok(g) => g,
        Err(response) => return response,
    };
    let call = Call::new("console_create_connection")
        .arg("p_agent", form.text("agent").unwrap_or_default())
        .arg("p_name", form.text("name").unwrap_or_default())
        .arg("p_scopes", form.all("scopes"))
        .arg_as("p_expires_at", INTERVAL, form.text("expires_in").unwrap_or_else(|| "7 days".into()))
        .opt("p_harness", form.text("harness"));
    match run_calls(&state, &secret, Some(csrf), &[call]).await {
        (Some(me), Ok(r)) => {
            let c = &r[0];
            let new_secret = c["secret"].as_str().unwrap_or_default();
            let mcp_url = format!("{}/mcp", state.config.public_url);
            secret_page(
                &me,
                "connections",
                json!({"title": "Connection created", "heading": format!("Connection “{}” created", c["name"].as_str().unwrap_or_default()),
                       "secret_label": "Connection secret (a bearer token)", "secret": new_secret,
                       "facts": [["Agent", c["agent_id"]], ["Scopes", c["scopes"]], ["Expires", c["expires_at"]],
                                 ["Harness", c["harness"]], ["Endpoint", mcp_url]],
                       "configs": client_configs(&mcp_url, new_secret), "back": "/connections",
                       "replace_url": "/connections"}),
            )
        }
        (None, Err(e)) => error_page(&state, None, &e, "/connections"),
        (Some(_), Err(e)) if e.status.is_client_error() && e.status != StatusCode::UNAUTHORIZED => {
            connections_page(&state, &secret, e.status, Some(e.body())).await
        }
        (me, Err(e)) => error_page(&state, me.as_ref(), &e, "/connections"),
        (None, Ok(_)) => to_sign_in(&state),
    }
}

pub async fn revoke_connection(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
    body: Bytes,
) -> Response {
    let id = uuid_path(id);
    act(
        &state,
        &headers,
        &body,
        "/connections",
        |_| {
            Ok(Call::new("console_revoke_connection")
                .arg("p_connection_id", id?)
                .arg("p_reason", "revoked in the dashboard"))
        },
        |_| "/connections".into(),
    )
    .await
}

pub async fn agents(State(state): State<AppState>, headers: HeaderMap, params: Params) -> Response {
    show(&state, &headers, vec![Call::new("console_list_agents")], "/", |me, r| {
        page(
            StatusCode::OK,
            "agents.html",
            Some(me),
            "agents",
            json!({"title": "Agents", "agents": r[0]["agents"], "scopes": r[0]["scopes"], "flash": flash(&params)}),
        )
    })
    .await
}

pub async fn agent_scopes(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(handle): Path<String>,
    body: Bytes,
) -> Response {
    act(
        &state,
        &headers,
        &body,
        "/agents",
        |form| {
            let function = match form.get("action") {
                Some("grant") => "console_grant_agent_scopes",
                Some("revoke") => "console_revoke_agent_scopes",
                _ => return Err(Error::invalid_argument("action: grant or revoke")),
            };
            Ok(Call::new(function).arg("p_agent", handle).arg("p_scopes", form.all("scopes")))
        },
        |_| "/agents?done=granted".into(),
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// The Agent Console.

pub async fn console(State(state): State<AppState>, headers: HeaderMap, params: Params) -> Response {
    show(&state, &headers, vec![Call::new("console_list_conversations")], "/", |me, r| {
        page(
            StatusCode::OK,
            "console.html",
            Some(me),
            "console",
            json!({"title": "Agent Console", "conversations": r[0]["conversations"], "next_cursor": r[0]["next_cursor"], "flash": flash(&params)}),
        )
    })
    .await
}

/// Registers the Hermes session and opens its conversation, in one transaction.
pub async fn open_conversation(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let form = Form::parse(&body);
    let (secret, csrf) = match guard(&state, &headers, &form) {
        Ok(g) => g,
        Err(response) => return response,
    };
    let profile = form.text("profile_id").unwrap_or_default();
    let session = form.text("session_id").unwrap_or_default();
    let calls = [
        Call::new("console_register_session")
            .arg("p_profile_id", profile.clone())
            .arg("p_session_id", session.clone()),
        Call::new("console_open_conversation")
            .arg("p_profile_id", profile)
            .arg("p_session_id", session)
            .arg("p_title", form.text("title")),
    ];
    match run_calls(&state, &secret, Some(csrf), &calls).await {
        (_, Ok(_)) => see_other("/console?done=opened"),
        (me, Err(e)) => error_page(&state, me.as_ref(), &e, "/console"),
    }
}

pub async fn register_session(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    act(
        &state,
        &headers,
        &body,
        "/console",
        |form| {
            Ok(Call::new("console_register_session")
                .arg("p_profile_id", form.text("profile_id").unwrap_or_default())
                .arg("p_session_id", form.text("session_id").unwrap_or_default()))
        },
        |_| "/console".into(),
    )
    .await
}

pub async fn end_session(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(session_id): Path<String>,
    body: Bytes,
) -> Response {
    act(
        &state,
        &headers,
        &body,
        "/console",
        |_| {
            Ok(Call::new("console_end_session")
                .arg("p_session_id", session_id)
                .arg("p_reason", "ended (dashboard)"))
        },
        |_| "/console?done=ended".into(),
    )
    .await
}

/// "Open in Hermes": the exact deep link, checked by the database at the moment of the click
/// (303 to `hermes://sessions/{session_id}?profile_id={profile_id}`), or the refusal (422).
pub async fn open_in_hermes(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
) -> Response {
    let id = match uuid_path(id) {
        Ok(id) => id,
        Err(e) => return error_page(&state, None, &e, "/console"),
    };
    show(
        &state,
        &headers,
        vec![Call::new("console_conversation_link").arg("p_conversation_id", id)],
        "/console",
        |_, r| see_other(r[0]["link"].as_str().unwrap_or("/console")),
    )
    .await
}

pub async fn add_turn(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
    body: Bytes,
) -> Response {
    let id = uuid_path(id);
    act(
        &state,
        &headers,
        &body,
        "/console",
        |form| {
            Ok(Call::new("console_add_turn")
                .arg("p_conversation_id", id?)
                .arg("p_request", form.get("request").unwrap_or_default().to_string()))
        },
        |_| "/console?done=queued".into(),
    )
    .await
}

pub async fn turn(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
    params: Params,
) -> Response {
    let calls = |id| vec![Call::new("console_get_turn").arg("p_turn_id", id)];
    show_id(&state, &headers, id, "/console", calls, |me, r| {
        page(
            StatusCode::OK,
            "turn.html",
            Some(me),
            "console",
            json!({"title": "Turn", "turn": r[0], "flash": flash(&params)}),
        )
    })
    .await
}

pub async fn cancel_plan(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
    body: Bytes,
) -> Response {
    let id = uuid_path(id);
    act(
        &state,
        &headers,
        &body,
        "/console",
        |_| Ok(Call::new("console_cancel_plan").arg("p_plan_id", id?)),
        |plan| format!("/console/turns/{}?done=cancelled", plan["turn_id"].as_str().unwrap_or_default()),
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// Audit, evidence, forms.

pub async fn audit(State(state): State<AppState>, headers: HeaderMap, params: Params) -> Response {
    let filter = json!({"since": param(&params, "since"), "until": param(&params, "until"),
                        "actor": param(&params, "actor"), "action": param(&params, "action")});
    let mut call = Call::new("console_list_audit")
        .opt("p_actor", param(&params, "actor"))
        .opt("p_action", param(&params, "action"))
        .arg("p_limit", 50);
    if let Some(since) = param(&params, "since") {
        call = call.arg_as("p_since", "{}::text::timestamptz", since);
    }
    if let Some(until) = param(&params, "until") {
        call = call.arg_as("p_until", "{}::text::date + 1", until);
    }
    if let Some(cursor) = param(&params, "cursor") {
        call = call.arg("p_cursor", cursor);
    }
    let verify = param(&params, "verify").is_some();
    let mut calls = vec![call];
    if verify {
        calls.push(Call::new("console_verify_ledger"));
    }
    // The filters again, for the link to older records.
    let query = filter_query(&params, &["since", "until", "actor", "action"]);
    show(&state, &headers, calls, "/", |me, r| {
        page(
            StatusCode::OK,
            "audit.html",
            Some(me),
            "audit",
            json!({"title": "Audit", "audit": r[0], "ledger": r.get(1), "filter": filter, "query": query}),
        )
    })
    .await
}

pub async fn evidence(State(state): State<AppState>, headers: HeaderMap, params: Params) -> Response {
    let wanted = param(&params, "state").unwrap_or_else(|| "open".into());
    let call = match wanted.as_str() {
        "all" => Call::new("console_list_evidence_reviews").arg("p_state", None::<String>),
        s => Call::new("console_list_evidence_reviews").arg("p_state", s.to_string()),
    };
    show(&state, &headers, vec![call], "/", |me, r| {
        page(
            StatusCode::OK,
            "evidence.html",
            Some(me),
            "evidence",
            json!({"title": "Evidence reviews", "reviews": r[0]["reviews"], "next_cursor": r[0]["next_cursor"], "state": wanted, "flash": flash(&params)}),
        )
    })
    .await
}

pub async fn close_review(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
    body: Bytes,
) -> Response {
    let id = uuid_path(id);
    act(
        &state,
        &headers,
        &body,
        "/evidence",
        |form| {
            Ok(Call::new("console_close_evidence_review")
                .arg("p_review_id", id?)
                .opt("p_note", form.text("note")))
        },
        |_| "/evidence?done=closed".into(),
    )
    .await
}

pub async fn forms(State(state): State<AppState>, headers: HeaderMap, params: Params) -> Response {
    let days = param(&params, "days").and_then(|d| d.parse::<i32>().ok()).unwrap_or(30);
    show(&state, &headers, vec![Call::new("form_screening_metrics").arg("p_days", days)], "/", |me, r| {
        page(
            StatusCode::OK,
            "forms.html",
            Some(me),
            "forms",
            json!({"title": "Form screening", "metrics": r[0]}),
        )
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Members: invitations and sessions.

pub async fn members(State(state): State<AppState>, headers: HeaderMap, params: Params) -> Response {
    let Some(secret) = session_secret(&state, &headers) else {
        return to_sign_in(&state);
    };
    let (me, sessions) = run_calls(&state, &secret, None, &[Call::new("console_list_member_sessions")]).await;
    let (me, sessions) = match (me, sessions) {
        (Some(me), Ok(mut r)) => (me, r.remove(0)),
        (me, Err(e)) => return error_page(&state, me.as_ref(), &e, "/"),
        (None, Ok(_)) => return to_sign_in(&state),
    };
    // The member list is for owners and admins; others see only their own sessions.
    let members = if matches!(me["role"].as_str(), Some("owner" | "admin")) {
        run_calls(&state, &secret, None, &[Call::new("console_list_members")])
            .await
            .1
            .ok()
            .map(|mut r| r.remove(0))
    } else {
        None
    };
    page(
        StatusCode::OK,
        "members.html",
        Some(&me),
        "members",
        json!({"title": "Members", "members": members.as_ref().map(|m| m["members"].clone()),
               "sessions": sessions["sessions"], "flash": flash(&params)}),
    )
}

pub async fn invite_member(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let form = Form::parse(&body);
    let (secret, csrf) = match guard(&state, &headers, &form) {
        Ok(g) => g,
        Err(response) => return response,
    };
    let call = Call::new("console_invite_member")
        .arg("p_member", form.text("member").unwrap_or_default())
        .arg("p_role", form.text("role"))
        .arg("p_display_name", form.text("display_name"));
    match run_calls(&state, &secret, Some(csrf), &[call]).await {
        (Some(me), Ok(r)) => {
            let inv = &r[0];
            let link = format!("{}{}", state.config.public_url, inv["path"].as_str().unwrap_or_default());
            secret_page(
                &me,
                "members",
                json!({"title": "Invitation created", "heading": format!("Invitation for {}", inv["member"].as_str().unwrap_or_default()),
                       "secret_label": "One-time invitation link (send it to them privately)", "secret": link,
                       "facts": [["Member", inv["member"]], ["Site", inv["site"]], ["Expires", inv["expires_at"]]],
                       "configs": [], "back": "/members", "replace_url": "/members"}),
            )
        }
        (me, Err(e)) => error_page(&state, me.as_ref(), &e, "/members"),
        (None, Ok(_)) => to_sign_in(&state),
    }
}

pub async fn revoke_member_session(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
    body: Bytes,
) -> Response {
    let id = uuid_path(id);
    act(
        &state,
        &headers,
        &body,
        "/members",
        |_| Ok(Call::new("console_revoke_member_session").arg("p_session_id", id?)),
        |_| "/members?done=revoked".into(),
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// Delivery tokens.

pub async fn delivery(State(state): State<AppState>, headers: HeaderMap, params: Params) -> Response {
    show(&state, &headers, vec![Call::new("console_list_delivery")], "/", |me, r| {
        let base = format!(
            "{}/delivery/v1/sites/{}",
            state.config.public_url,
            me["site"].as_str().unwrap_or_default()
        );
        page(
            StatusCode::OK,
            "delivery.html",
            Some(me),
            "delivery",
            json!({"title": "Delivery", "delivery": r[0], "base": base, "flash": flash(&params)}),
        )
    })
    .await
}

pub async fn create_delivery_token(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = Form::parse(&body);
    let (secret, csrf) = match guard(&state, &headers, &form) {
        Ok(g) => g,
        Err(response) => return response,
    };
    let call = Call::new("console_create_delivery_token")
        .arg("p_name", form.text("name").unwrap_or_default())
        .arg_as("p_expires_at", INTERVAL, form.text("expires_in").unwrap_or_else(|| "90 days".into()));
    match run_calls(&state, &secret, Some(csrf), &[call]).await {
        (Some(me), Ok(r)) => {
            let t = &r[0];
            let token = t["token"].as_str().unwrap_or_default();
            let url = format!(
                "{}/delivery/v1/sites/{}/content",
                state.config.public_url,
                t["site"].as_str().unwrap_or_default()
            );
            secret_page(
                &me,
                "delivery",
                json!({"title": "Delivery token created", "heading": format!("Delivery token “{}”", t["name"].as_str().unwrap_or_default()),
                       "secret_label": "Delivery token (read-only, published content of this site only)", "secret": token,
                       "facts": [["Expires", t["expires_at"]], ["Listing", url]],
                       "configs": [{"title": "Fetch published content", "where": "from the website's build or server",
                                    "text": format!("curl -s {url} -H 'Authorization: Bearer {token}'")}],
                       "back": "/delivery", "replace_url": "/delivery"}),
            )
        }
        (me, Err(e)) => error_page(&state, me.as_ref(), &e, "/delivery"),
        (None, Ok(_)) => to_sign_in(&state),
    }
}

pub async fn revoke_delivery_token(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
    body: Bytes,
) -> Response {
    let id = uuid_path(id);
    act(
        &state,
        &headers,
        &body,
        "/delivery",
        |_| Ok(Call::new("console_revoke_delivery_token").arg("p_token_id", id?)),
        |_| "/delivery?done=revoked".into(),
    )
    .await
}

pub async fn delivery_public(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    act(
        &state,
        &headers,
        &body,
        "/delivery",
        |form| {
            Ok(Call::new("console_set_delivery_public").arg("p_public", form.get("public") == Some("true")))
        },
        |_| "/delivery?done=public".into(),
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// Documentation and assets (public: they hold nothing a site owns).

const DOCS: &[(&str, &str)] = &[
    ("dashboard", include_str!("../../../docs/dashboard.md")),
    ("api", include_str!("../../../docs/api.md")),
    ("edge", include_str!("../../../docs/edge.md")),
    ("console", include_str!("../../../docs/console.md")),
    ("errors", include_str!("../../../docs/errors.md")),
    ("envelope", include_str!("../../../docs/envelope.md")),
    ("semantics", include_str!("../../../docs/semantics.md")),
];

fn doc_names() -> Vec<&'static str> {
    DOCS.iter().map(|(n, _)| *n).collect()
}

pub async fn docs_index() -> Response {
    page(StatusCode::OK, "docs.html", None, "", json!({"title": "Documentation", "docs": doc_names()}))
}

pub async fn doc(State(state): State<AppState>, Path(name): Path<String>) -> Response {
    let name = name.trim_end_matches(".md");
    match DOCS.iter().find(|(n, _)| *n == name) {
        Some((n, source)) => page(
            StatusCode::OK,
            "docs.html",
            None,
            "",
            json!({"title": n, "name": n, "docs": doc_names(), "doc": render::markdown(source)}),
        ),
        None => error_page(&state, None, &Error::not_found("no such document"), "/docs"),
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=300"));
    response
}

pub async fn stylesheet() -> Response {
    asset("text/css; charset=utf-8", include_str!("assets/app.css"))
}

pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", include_str!("assets/app.js"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_fields_follow_the_template_and_lists_take_one_item_a_line() {
        let template = json!([{"name": "title", "type": "text"}, {"name": "tags", "type": "list"},
                              {"name": "summary", "type": "text"}]);
        let form = Form::parse(&Bytes::from_static(
            b"field.title=Hello&field.tags=a%0D%0Ab%0A%0A&field.summary=+&field.evil=x",
        ));
        assert_eq!(draft_fields(&form, &template), json!({"title": "Hello", "tags": ["a", "b"]}));
        assert_eq!(form_values(&json!({"tags": ["a", "b"]}), &template)["tags"], "a\nb");
    }

    #[test]
    fn client_configs_carry_the_secret_in_the_shapes_each_client_reads() {
        let configs = client_configs("https://edge.example/mcp", "qlc_x");
        let vscode: Value = serde_json::from_str(configs[2]["text"].as_str().unwrap()).unwrap();
        assert_eq!(vscode["servers"]["querylayer"]["headers"]["Authorization"], "Bearer qlc_x");
        let cursor: Value = serde_json::from_str(configs[1]["text"].as_str().unwrap()).unwrap();
        assert_eq!(cursor["mcpServers"]["querylayer"]["url"], "https://edge.example/mcp");
    }
}

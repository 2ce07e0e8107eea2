//! The reviewer's desk: the web dashboard for members, served at `/`. Server-rendered HTML
//! (minijinja templates compiled into the binary, a stylesheet and one small script, no build
//! step), usable without JavaScript. Every page and every action is one transaction that
//! authenticates the session cookie (`authenticate_session`) and calls the same
//! `querylayer_api` functions the console API calls: the database decides, the edge renders.
//!
//! Web security: the session cookie is `HttpOnly; SameSite=Strict` (and `Secure`, under a
//! `__Host-` name, when the public URL is https) and carries only an opaque secret; every
//! state-changing request must come from this origin and carry the session's CSRF token, which
//! the database checks (without one the transaction is read-only); pages forbid framing and
//! inline script; a secret is rendered once, in the response that created it, never stored.

mod pages;
pub mod render;
mod templates;

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::bulkhead::Access;
use crate::db::{Call, Fingerprint};
use crate::error::Error;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(pages::home))
        .route("/sign-in", get(pages::sign_in_form).post(pages::sign_in))
        .route("/sign-out", post(pages::sign_out))
        .route("/invite", get(pages::invite_form).post(pages::accept_invite))
        .route("/inbox", get(pages::inbox))
        .route("/proposals/{id}", get(pages::proposal))
        .route("/proposals/{id}/decide", post(pages::decide))
        .route("/content", get(pages::content_list))
        .route("/content/new", get(pages::new_content_form).post(pages::create_content))
        .route("/content/{id}", get(pages::content_item))
        .route("/content/{id}/edit", get(pages::edit_content_form).post(pages::edit_content))
        .route("/revisions/{id}", get(pages::revision))
        .route("/runs", get(pages::runs))
        .route("/runs/{id}", get(pages::run))
        .route("/runs/{id}/cancel", post(pages::cancel_run))
        .route("/connections", get(pages::connections).post(pages::create_connection))
        .route("/connections/{id}/revoke", post(pages::revoke_connection))
        .route("/agents", get(pages::agents))
        .route("/agents/{handle}/scopes", post(pages::agent_scopes))
        .route("/console", get(pages::console))
        .route("/console/sessions", post(pages::register_session))
        .route("/console/sessions/{id}/end", post(pages::end_session))
        .route("/console/conversations", post(pages::open_conversation))
        .route("/console/conversations/{id}/open", get(pages::open_in_hermes))
        .route("/console/conversations/{id}/turns", post(pages::add_turn))
        .route("/console/turns/{id}", get(pages::turn))
        .route("/console/plans/{id}/cancel", post(pages::cancel_plan))
        .route("/audit", get(pages::audit))
        .route("/evidence", get(pages::evidence))
        .route("/evidence/{id}/close", post(pages::close_review))
        .route("/forms", get(pages::forms))
        .route("/members", get(pages::members))
        .route("/members/invite", post(pages::invite_member))
        .route("/members/sessions/{id}/revoke", post(pages::revoke_member_session))
        .route("/delivery", get(pages::delivery))
        .route("/delivery/tokens", post(pages::create_delivery_token))
        .route("/delivery/tokens/{id}/revoke", post(pages::revoke_delivery_token))
        .route("/delivery/public", post(pages::delivery_public))
        .route("/docs", get(pages::docs_index))
        .route("/docs/{name}", get(pages::doc))
        .route("/assets/app.css", get(pages::stylesheet))
        .route("/assets/app.js", get(pages::script))
        .layer(middleware::from_fn(security_headers))
}

/// The headers of every dashboard response: no framing, no inline script, no sniffing, no
/// referrer to other sites (an invitation link must not leak through one; `no-referrer` would
/// also make the browser send `Origin: null` on the dashboard's own posts), pages never cached.
async fn security_headers(request: Request, next: Next) -> Response {
    let is_asset = request.uri().path().starts_with("/assets/");
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert("cross-origin-opener-policy", HeaderValue::from_static("same-origin"));
    if !is_asset {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// The session cookie's name: the `__Host-` prefix (Secure, whole host, no Domain) under https.
pub(crate) fn cookie_name(state: &AppState) -> &'static str {
    cookie_name_for(&state.config.public_url)
}

fn cookie_name_for(public_url: &str) -> &'static str {
    if public_url.starts_with("https://") {
        "__Host-ql_session"
    } else {
        "ql_session"
    }
}

/// `Set-Cookie` for a new session (twelve hours, as the database's session): HttpOnly,
/// SameSite=Strict, and Secure whenever the public URL is https.
fn set_cookie_for(public_url: &str, value: &str, max_age: u32) -> HeaderValue {
    let secure = if public_url.starts_with("https://") { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Strict{secure}",
        cookie_name_for(public_url)
    ))
    .expect("a session secret is a valid cookie value")
}

pub(crate) fn session_cookie(state: &AppState, secret: &str) -> HeaderValue {
    set_cookie_for(&state.config.public_url, secret, 43200)
}

/// `Set-Cookie` that removes the session cookie.
pub(crate) fn clear_cookie(state: &AppState) -> HeaderValue {
    set_cookie_for(&state.config.public_url, "", 0)
}

/// The session secret the browser presented, if the cookie is there and well formed.
pub(crate) fn session_secret(state: &AppState, headers: &HeaderMap) -> Option<String> {
    let name = cookie_name(state);
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| v.starts_with("qls_") && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
}

/// A state-changing request must come from this origin: its `Origin` (which browsers send on
/// every POST) names the host it was sent to, or, without one, `Sec-Fetch-Site` says
/// same-origin. Non-browser clients send neither; the CSRF token still binds them to a session.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).map(str::to_ascii_lowercase);
    if let Some(origin) = headers.get(header::ORIGIN) {
        let Ok(origin) = origin.to_str() else { return false };
        let authority = origin.split_once("://").map(|(_, rest)| rest.to_ascii_lowercase());
        return authority.is_some() && authority == host;
    }
    match headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        Some(site) => site == "same-origin" || site == "none",
        None => true,
    }
}

/// An `application/x-www-form-urlencoded` body as (name, value) pairs, repeated names kept.
pub(crate) struct Form(Vec<(String, String)>);

impl Form {
    pub(crate) fn parse(body: &Bytes) -> Form {
        Form(form_urlencoded::parse(body).map(|(k, v)| (k.into_owned(), v.into_owned())).collect())
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// A value, or None when missing or blank.
    pub(crate) fn text(&self, name: &str) -> Option<String> {
        self.get(name).map(str::trim).filter(|v| !v.is_empty()).map(str::to_string)
    }

    pub(crate) fn all(&self, name: &str) -> Vec<String> {
        self.0.iter().filter(|(k, _)| k == name).map(|(_, v)| v.clone()).collect()
    }
}

/// The signed-in member as the database described them (member, role, site, csrf_token, …).
pub(crate) type Me = Value;

/// One transaction as the session: authenticate (with the CSRF token for a change, without one
/// read-only), the rate limit, then `calls` in order. The member is known whenever the session
/// held, also when a call was refused (the error page then keeps its navigation).
pub(crate) async fn run_calls(
    state: &AppState,
    secret: &str,
    csrf: Option<&str>,
    calls: &[Call],
) -> (Option<Me>, Result<Vec<Value>, Error>) {
    let fingerprint = Fingerprint::of(secret);
    // The site's share of the pool (once this edge has seen the session): a page with its CSRF
    // token may write, one without only reads.
    let access = if csrf.is_some() { Access::Write } else { Access::Read };
    let _permit = match state.sites.site_of(fingerprint.as_bytes()) {
        Some(site) => match state.sites.acquire(&site, access).await {
            Ok(permit) => Some(permit),
            Err(e) => return (None, Err(e)),
        },
        None => None,
    };
    let mut client = match state.db.client().await {
        Ok(c) => c,
        Err(e) => return (None, Err(e)),
    };
    let tx = match client.transaction().await {
        Ok(tx) => tx,
        Err(e) => return (None, Err(e.into())),
    };
    // Prepared once per pooled connection, not at every page.
    let authenticate = match tx.prepare_cached("SELECT querylayer_api.authenticate_session($1, $2)").await {
        Ok(statement) => statement,
        Err(e) => return (None, Err(e.into())),
    };
    let me: Value = match tx.query_one(&authenticate, &[&fingerprint.as_bytes(), &csrf]).await {
        Ok(row) => row.get(0),
        Err(e) => return (None, Err(e.into())),
    };
    let session = me["session_id"].as_str().and_then(|s| s.parse::<Uuid>().ok());
    if let Some(site) = me["site"].as_str() {
        state.sites.remember(fingerprint.as_bytes(), site, session);
    }
    if let Some(id) = session {
        if let Err(retry) = state.limiter.check(id) {
            return (Some(me), Err(Error::rate_limited(retry)));
        }
    }
    let mut results = Vec::with_capacity(calls.len());
    for call in calls {
        match call.run(&tx).await {
            Ok(v) => results.push(v),
            Err(e) => return (Some(me), Err(e.into())),
        }
    }
    match tx.commit().await {
        Ok(()) => (Some(me), Ok(results)),
        Err(e) => (Some(me), Err(e.into())),
    }
}

/// A redirect after a POST (303: the browser follows with a GET).
pub(crate) fn see_other(location: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    response
}

/// Where a request without a live session goes: the sign-in page (its dead cookie removed).
pub(crate) fn to_sign_in(state: &AppState) -> Response {
    let mut response = see_other("/sign-in");
    response.headers_mut().insert(header::SET_COOKIE, clear_cookie(state));
    response
}

/// An HTML page.
pub(crate) fn html(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    response
}

/// Renders `template` with the page's data, the member and the CSRF token every form carries.
pub(crate) fn page(status: StatusCode, template: &str, me: Option<&Me>, nav: &str, data: Value) -> Response {
    let mut context = json!({
        "me": me.cloned().unwrap_or(Value::Null),
        "csrf": me.and_then(|m| m["csrf_token"].as_str()).unwrap_or_default(),
        "nav": nav,
        "can_manage": me.and_then(|m| m["role"].as_str()).is_some_and(|r| r == "owner" || r == "admin"),
        "can_edit": me.and_then(|m| m["role"].as_str()).is_some_and(|r| r != "viewer"),
    });
    if let (Value::Object(c), Value::Object(d)) = (&mut context, data) {
        c.extend(d);
    }
    match templates::render(template, &context) {
        Ok(body) => html(status, body),
        Err(e) => {
            tracing::error!(template, error = %e, "rendering a dashboard page failed");
            html(
                StatusCode::INTERNAL_SERVER_ERROR,
                "<!doctype html><title>Error</title><p>internal error</p>".into(),
            )
        }
    }
}

/// The page for a refusal: the database's message and hint, the status of the SQLSTATE table.
pub(crate) fn error_page(state: &AppState, me: Option<&Me>, error: &Error, back: &str) -> Response {
    if error.status == StatusCode::UNAUTHORIZED {
        return to_sign_in(state);
    }
    if error.status.is_server_error() {
        error.log("dashboard");
    }
    let title = match error.status {
        StatusCode::FORBIDDEN => "Not allowed",
        StatusCode::NOT_FOUND => "Not found",
        StatusCode::CONFLICT => "Conflict",
        StatusCode::TOO_MANY_REQUESTS => "Too many requests",
        s if s.is_server_error() => "Something went wrong",
        _ => "Refused",
    };
    let mut response = page(
        error.status,
        "error.html",
        me,
        "",
        json!({"title": title, "error": error.body(), "back": back}),
    );
    if error.status == StatusCode::TOO_MANY_REQUESTS {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn only_a_same_origin_browser_request_passes_the_origin_check() {
        assert!(same_origin(&headers(&[("host", "127.0.0.1:8080"), ("origin", "http://127.0.0.1:8080")])));
        assert!(!same_origin(&headers(&[("host", "127.0.0.1:8080"), ("origin", "http://localhost:9000")])));
        assert!(!same_origin(&headers(&[("host", "127.0.0.1:8080"), ("origin", "null")])));
        assert!(!same_origin(&headers(&[("host", "127.0.0.1:8080"), ("sec-fetch-site", "cross-site")])));
        assert!(same_origin(&headers(&[("host", "127.0.0.1:8080"), ("sec-fetch-site", "same-origin")])));
        assert!(same_origin(&headers(&[("host", "127.0.0.1:8080")])), "a non-browser client");
    }

    #[test]
    fn the_session_cookie_is_httponly_strict_and_secure_under_https() {
        let http = set_cookie_for("http://127.0.0.1:8080", "qls_x", 43200);
        assert_eq!(http, "ql_session=qls_x; Max-Age=43200; Path=/; HttpOnly; SameSite=Strict");
        let https = set_cookie_for("https://edge.example.com", "qls_x", 43200);
        assert_eq!(
            https,
            "__Host-ql_session=qls_x; Max-Age=43200; Path=/; HttpOnly; SameSite=Strict; Secure"
        );
    }

    #[test]
    fn forms_keep_repeated_names() {
        let form =
            Form::parse(&Bytes::from_static(b"scopes=site%3Aread&scopes=content%3Aread&name=+x+&empty="));
        assert_eq!(form.all("scopes"), ["site:read", "content:read"]);
        assert_eq!(form.text("name").as_deref(), Some("x"));
        assert_eq!(form.text("empty"), None);
    }
}

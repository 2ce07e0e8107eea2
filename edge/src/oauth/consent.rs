//! The authorization endpoint: `GET /authorize` checks the client and its redirect URI, sends a
//! member without a session to the dashboard's sign-in (and back here), and shows the consent
//! page: the client's name and redirect host (and, for a client named by its metadata document,
//! its client_id URL), the site (another one through its sign-in), the agent (one of the
//! organization's, or a new one registered for this client), the scopes (checkboxes: what the
//! client asked for, else the read-only preset) and the expiry. `POST /authorize` is the page's form (same origin, the
//! session's CSRF token): "Allow" asks the database for a code (`oauth_consent`, owners and
//! admins only, never more than the agent holds) and redirects to the client with it; "Deny"
//! redirects with `access_denied`. A request with an unknown client or a redirect URI the client
//! did not register is never redirected anywhere (RFC 6749 §4.1.2.1).

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Query, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use crate::dashboard::{error_page, page, run_calls, same_origin, see_other, session_secret, Form};
use crate::db::Call;
use crate::error::{Code, Error};
use crate::state::AppState;

/// The agent choice that registers a new agent for the client (`oauth_consent`'s `p_new_agent`).
const NEW_AGENT: &str = "(new)";

/// The scopes of the read-only preset: every `…:read` scope.
fn read_only(scope: &str) -> bool {
    scope.ends_with(":read")
}

/// What an authorization request asks for, from the query string or the consent form.
struct Request {
    client_id: String,
    redirect_uri: String,
    state: Option<String>,
    code_challenge: Option<String>,
    code_challenge_method: Option<String>,
    resource: Option<String>,
    scope: Option<String>,
    response_type: Option<String>,
}

impl Request {
    fn from(get: impl Fn(&str) -> Option<String>) -> Option<Request> {
        Some(Request {
            client_id: get("client_id")?,
            redirect_uri: get("redirect_uri")?,
            state: get("state"),
            code_challenge: get("code_challenge"),
            code_challenge_method: get("code_challenge_method"),
            resource: get("resource"),
            scope: get("scope"),
            response_type: get("response_type"),
        })
    }

    /// The client's redirect URI with `params`, `state` and the issuer (RFC 9207) added.
    fn back(&self, state: &AppState, params: &[(&str, &str)]) -> Response {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (k, v) in params {
            query.append_pair(k, v);
        }
        if let Some(s) = &self.state {
            query.append_pair("state", s);
        }
        query.append_pair("iss", &state.config.public_url);
        let sep = if self.redirect_uri.contains('?') { '&' } else { '?' };
        see_other(&format!("{}{sep}{}", self.redirect_uri, query.finish()))
    }
}

/// The origin of a redirect URI (`scheme://host[:port]`), for the page's form-action policy.
fn origin_of(uri: &str) -> Option<String> {
    let parsed: axum::http::Uri = uri.parse().ok()?;
    Some(format!("{}://{}", parsed.scheme_str()?, parsed.authority()?))
}

/// Asks the database about the client: its name, or the page that refuses the request. A client
/// named by its metadata document has the document fetched first, when the copy the edge last
/// fetched is no longer fresh (`documents`).
async fn client_of(state: &AppState, request: &Request) -> Result<Value, Response> {
    let refuse = |message: &str| {
        let e = Error::new(StatusCode::BAD_REQUEST, Code::InvalidArgument, message).with_hint(
            "the application that sent you here is not registered for this address; go back to it",
        );
        error_page(state, None, &e, "")
    };
    if let Err(e) = state.client_documents.refresh(&state.db, &request.client_id).await {
        return Err(error_page(state, None, &e, ""));
    }
    let result = async {
        let client = state.db.client().await?;
        let row = client
            .query_one(
                "SELECT querylayer_api.oauth_client($1, $2)",
                &[&request.client_id, &request.redirect_uri],
            )
            .await?;
        Ok::<Value, Error>(row.get(0))
    }
    .await;
    match result {
        Ok(c) if c["redirect_uri_ok"] == true => Ok(c),
        Ok(_) => Err(refuse("redirect_uri: not one this client registered")),
        Err(e) if e.status.is_client_error() => Err(refuse(&e.message)),
        Err(e) => Err(error_page(state, None, &e, "")),
    }
}

/// `GET /authorize`.
pub async fn authorize(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
    RawQuery(raw): RawQuery,
) -> Response {
    let get = |k: &str| params.get(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    let Some(request) = Request::from(get) else {
        let e = Error::invalid_argument("client_id and redirect_uri are required");
        return error_page(&state, None, &e, "");
    };
    let client = match client_of(&state, &request).await {
        Ok(c) => c,
        Err(response) => return response,
    };
    // From here on, errors go back to the client (RFC 6749 §4.1.2.1).
    if request.response_type.as_deref() != Some("code") {
        return request.back(&state, &[("error", "unsupported_response_type")]);
    }
    if request.code_challenge_method.as_deref() != Some("S256") || request.code_challenge.is_none() {
        return request.back(
            &state,
            &[
                ("error", "invalid_request"),
                ("error_description", "PKCE with code_challenge_method S256 is required"),
            ],
        );
    }
    if request.resource.as_ref().is_some_and(|r| *r != state.config.resource_url()) {
        return request.back(&state, &[("error", "invalid_target")]);
    }
    let Some(secret) = session_secret(&state, &headers) else {
        return to_sign_in(raw.as_deref().unwrap_or_default());
    };
    let (me, result) = run_calls(&state, &secret, None, &[Call::new("console_list_agents")]).await;
    let (me, agents) = match (me, result) {
        (Some(me), Ok(r)) => (me, r.into_iter().next().unwrap_or_default()),
        (_, Err(e)) if e.status == StatusCode::UNAUTHORIZED => {
            return to_sign_in(raw.as_deref().unwrap_or_default())
        }
        (me, Err(e)) => return error_page(&state, me.as_ref(), &e, "/"),
        (None, Ok(_)) => return to_sign_in(raw.as_deref().unwrap_or_default()),
    };
    let requested: Vec<&str> = request.scope.as_deref().unwrap_or_default().split_whitespace().collect();
    let scopes: Vec<Value> = agents["scopes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|s| {
            let name = s["scope"].as_str().unwrap_or_default().to_string();
            let checked = if requested.is_empty() { read_only(&name) } else { requested.contains(&name.as_str()) };
            json!({"scope": name, "description": s["description"], "checked": checked, "read_only": read_only(&name)})
        })
        .collect();
    let redirect_host = origin_of(&request.redirect_uri).unwrap_or_default();
    // Another site: the member signs in there (a session is one site's) and comes back here.
    let other_site = sign_in_url(raw.as_deref().unwrap_or_default());
    let mut response = page(
        StatusCode::OK,
        "consent.html",
        Some(&me),
        "",
        json!({
            "title": "Allow access", "client_name": client["client_name"], "redirect_host": redirect_host,
            "client_id": request.client_id, "from_document": client["from_document"],
            "other_site": other_site,
            "agents": agents["agents"], "scopes": scopes,
            "request": {
                "client_id": request.client_id, "redirect_uri": request.redirect_uri, "state": request.state,
                "code_challenge": request.code_challenge, "code_challenge_method": request.code_challenge_method,
                "resource": state.config.resource_url(),
            },
        }),
    );
    consent_headers(&mut response, &redirect_host);
    response
}

/// The dashboard's headers, with the client's origin added to `form-action`: the consent form's
/// answer is a redirect there, which the policy would otherwise block.
fn consent_headers(response: &mut Response, redirect_origin: &str) {
    let csp = format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
         form-action 'self' {redirect_origin}; frame-ancestors 'none'; base-uri 'none'"
    );
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&csp) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// The sign-in page, which comes back to this authorization request once the member is in.
fn sign_in_url(raw_query: &str) -> String {
    let next = format!("/authorize?{raw_query}");
    let encoded: String = form_urlencoded::byte_serialize(next.as_bytes()).collect();
    format!("/sign-in?next={encoded}")
}

fn to_sign_in(raw_query: &str) -> Response {
    see_other(&sign_in_url(raw_query))
}

/// `POST /authorize`: the consent form's Allow or Deny.
pub async fn decide(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let form = Form::parse(&body);
    if !same_origin(&headers) {
        let e = Error::new(StatusCode::FORBIDDEN, Code::CrossSite, "a consent from another site was refused")
            .with_hint("consent only on this server's own page");
        return error_page(&state, None, &e, "/");
    }
    let Some(request) = Request::from(|k| form.text(k)) else {
        return error_page(
            &state,
            None,
            &Error::invalid_argument("client_id and redirect_uri are required"),
            "/",
        );
    };
    if let Err(response) = client_of(&state, &request).await {
        return response;
    }
    let Some(secret) = session_secret(&state, &headers) else {
        return see_other("/sign-in");
    };
    let Some(csrf) = form.get("csrf_token").filter(|t| !t.is_empty()) else {
        let e = Error::new(StatusCode::FORBIDDEN, Code::Csrf, "the form carried no CSRF token")
            .with_hint("go back to the application and start again");
        return error_page(&state, None, &e, "/");
    };
    if form.get("decision") != Some("allow") {
        // Deny still needs the session's CSRF token: nobody but the member on this page says no.
        return match run_calls(&state, &secret, Some(csrf), &[]).await {
            (Some(_), Ok(_)) => request.back(&state, &[("error", "access_denied")]),
            (me, Err(e)) => error_page(&state, me.as_ref(), &e, "/"),
            (None, Ok(_)) => see_other("/sign-in"),
        };
    }
    let call = Call::new("oauth_consent")
        .arg("p_client_id", request.client_id.clone())
        .arg("p_redirect_uri", request.redirect_uri.clone())
        .arg("p_code_challenge", request.code_challenge.clone().unwrap_or_default())
        .arg("p_code_challenge_method", request.code_challenge_method.clone().unwrap_or_default())
        .arg("p_resource", state.config.resource_url())
        .arg("p_agent", form.text("agent").unwrap_or_default())
        .arg("p_new_agent", form.get("agent") == Some(NEW_AGENT))
        .arg("p_scopes", form.all("scopes"))
        .arg_as("p_expires_at", "now() + {}::text::interval", expiry(form.text("expires_in")));
    match run_calls(&state, &secret, Some(csrf), &[call]).await {
        (Some(_), Ok(r)) => {
            let code = r[0]["code"].as_str().unwrap_or_default().to_string();
            tracing::info!(client_id = %request.client_id, "OAuth consent given");
            request.back(&state, &[("code", code.as_str())])
        }
        (me, Err(e)) => error_page(&state, me.as_ref(), &e, "/"),
        (None, Ok(_)) => see_other("/sign-in"),
    }
}

/// The grant's lifetime: one of the page's choices, 30 days otherwise.
fn expiry(choice: Option<String>) -> String {
    match choice.as_deref() {
        Some(c @ ("1 day" | "7 days" | "30 days" | "90 days")) => c.to_string(),
        _ => "30 days".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_redirect_origin_is_scheme_host_and_port() {
        assert_eq!(
            origin_of("http://127.0.0.1:33418/callback?x=1").as_deref(),
            Some("http://127.0.0.1:33418")
        );
        assert_eq!(origin_of("https://client.example/cb").as_deref(), Some("https://client.example"));
        assert_eq!(origin_of("not a uri"), None);
    }

    #[test]
    fn the_sign_in_comes_back_to_the_same_authorization_request() {
        let r = to_sign_in("client_id=qlo_1&redirect_uri=http%3A%2F%2F127.0.0.1%3A9%2Fcb");
        let location = r.headers()[header::LOCATION].to_str().unwrap();
        assert_eq!(location, "/sign-in?next=%2Fauthorize%3Fclient_id%3Dqlo_1%26redirect_uri%3Dhttp%253A%252F%252F127.0.0.1%253A9%252Fcb");
    }
}

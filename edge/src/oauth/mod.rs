//! The edge as an OAuth 2.1 authorization server for MCP clients (docs/security.md, "OAuth"):
//! the RFC 8414 metadata, dynamic client registration (RFC 7591), the authorization endpoint
//! and the member's consent in the dashboard (`consent.rs`), the token endpoint (authorization
//! code with PKCE S256 and the RFC 8707 resource, refresh tokens that rotate) and revocation
//! (RFC 7009). As everywhere, the database decides (`sql/190_oauth.sql`): the edge hands it only
//! the SHA-256 of a code or refresh token, and the access token it returns is a connection's
//! secret, issued by the database when the code is redeemed.

mod consent;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, Extensions, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::auth::SCOPES;
use crate::dashboard::Form;
use crate::db::Fingerprint;
use crate::error::{Code, Error};
use crate::state::AppState;

/// The endpoints clients call directly (metadata, registration, token, revocation): no Host or
/// Origin guard beyond the app's own layers, since clients in browsers call them cross-origin.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/.well-known/oauth-authorization-server", get(metadata))
        .route("/register", post(register))
        .route("/token", post(token))
        .route("/revoke", post(revoke))
}

/// The authorization endpoint, a dashboard page: behind the Host/Origin guard like the dashboard.
pub fn pages() -> Router<AppState> {
    Router::new().route("/authorize", get(consent::authorize).post(consent::decide))
}

/// RFC 8414 metadata. The issuer is the edge itself, at its public URL.
async fn metadata(State(state): State<AppState>) -> impl IntoResponse {
    let base = &state.config.public_url;
    Json(json!({
        "issuer": base,
        "authorization_endpoint": format!("{base}/authorize"),
        "token_endpoint": format!("{base}/token"),
        "registration_endpoint": format!("{base}/register"),
        "revocation_endpoint": format!("{base}/revoke"),
        "scopes_supported": SCOPES,
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
        "revocation_endpoint_auth_methods_supported": ["none"],
        "authorization_response_iss_parameter_supported": true,
        "client_id_metadata_document_supported": true,
        "service_documentation": format!("{base}/docs/edge"),
    }))
}

/// An OAuth error answer (RFC 6749 §5.2, RFC 7591 §3.2.2): `{error, error_description}`, never cached.
fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response {
    no_store((status, Json(json!({"error": error, "error_description": description}))).into_response())
}

fn no_store(mut response: Response) -> Response {
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response.headers_mut().insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    response
}

/// 429 with `Retry-After`: a peer over its registration rate or its failed-authentication budget.
fn slow_down(retry_after: u64, what: &str) -> Response {
    let mut response = oauth_error(
        StatusCode::TOO_MANY_REQUESTS,
        "temporarily_unavailable",
        &format!("{what}; retry in {retry_after} s"),
    );
    if let Ok(v) = HeaderValue::from_str(&retry_after.to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, v);
    }
    response
}

/// Dynamic client registration (RFC 7591): a public client (no secret; PKCE binds its codes)
/// with its name and redirect URIs (https, or loopback http for native clients, RFC 8252). A
/// peer address registers at most `--registration-rate` clients a second beyond its burst.
async fn register(State(state): State<AppState>, extensions: Extensions, body: Bytes) -> Response {
    let peer = crate::rate::peer(&extensions).map(|p| p.to_string());
    let Ok(Value::Object(metadata)) = serde_json::from_slice::<Value>(&body) else {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_client_metadata",
            "the body must be a JSON object",
        );
    };
    let uris: Option<Vec<String>> = metadata
        .get("redirect_uris")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect());
    let Some(uris) = uris.filter(|u| !u.is_empty()) else {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_redirect_uri", "redirect_uris is required");
    };
    if let Some(grants) = metadata.get("grant_types").and_then(Value::as_array) {
        if grants.iter().any(|g| !matches!(g.as_str(), Some("authorization_code" | "refresh_token"))) {
            return oauth_error(
                StatusCode::BAD_REQUEST,
                "invalid_client_metadata",
                "grant_types: only authorization_code and refresh_token",
            );
        }
    }
    let name = metadata.get("client_name").and_then(Value::as_str).map(str::to_string);
    let limits = state.db.limits();
    let result = async {
        let client = state.db.client().await?;
        let row = client
            .query_one(
                "SELECT querylayer_api.oauth_register_client($1, $2, $3, $4, $5)",
                &[&name, &uris, &peer, &limits.registration_rate, &limits.registration_burst],
            )
            .await?;
        Ok::<Value, Error>(row.get(0))
    }
    .await;
    match result {
        Ok(c) => {
            tracing::info!(client_id = c["client_id"].as_str(), "OAuth client registered");
            let answer = json!({
                "client_id": c["client_id"], "client_id_issued_at": c["client_id_issued_at"],
                "client_name": c["client_name"], "redirect_uris": c["redirect_uris"],
                "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
                "token_endpoint_auth_method": "none",
            });
            no_store((StatusCode::CREATED, Json(answer)).into_response())
        }
        Err(e) if e.code == Code::InvalidArgument => {
            oauth_error(StatusCode::BAD_REQUEST, "invalid_redirect_uri", &e.message)
        }
        Err(e) if e.code == Code::RateLimited => {
            tracing::warn!(peer = ?peer, "refused a client registration over the address's rate");
            slow_down(e.retry_after_secs().unwrap_or(1), "too many client registrations from this address")
        }
        Err(e) => server_error(e),
    }
}

fn server_error(e: Error) -> Response {
    if e.status.is_server_error() {
        e.log("oauth");
        return oauth_error(e.status, "server_error", "the authorization server could not answer; try again");
    }
    oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", &e.message)
}

/// The resource a request names (RFC 8707): this edge's MCP endpoint, or (left out) the same.
fn resource_of(state: &AppState, form: &Form) -> Result<String, Response> {
    let ours = state.config.resource_url();
    match form.text("resource") {
        None => Ok(ours),
        Some(r) if r == ours => Ok(ours),
        Some(_) => Err(oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_target",
            "resource: this authorization server issues tokens for its own MCP endpoint only",
        )),
    }
}

/// The token endpoint: `authorization_code` (PKCE S256, the same redirect URI and resource) and
/// `refresh_token` (rotated at every use; a reused one ends the grant). A code or refresh token
/// that is refused spends the peer's failed-authentication budget, as a wrong secret does
/// (`--auth-failure-rate`); over it, 429 before any database work.
async fn token(State(state): State<AppState>, extensions: Extensions, body: Bytes) -> Response {
    let peer = crate::rate::peer(&extensions);
    if let Some(retry_after) = peer.and_then(|p| state.peer_holds.held(&p)) {
        tracing::warn!(peer = ?peer, "refused a token request from an address over its failed-authentication budget");
        return slow_down(retry_after, "too many refused token requests from this address");
    }
    let form = Form::parse(&body);
    let resource = match resource_of(&state, &form) {
        Ok(r) => r,
        Err(response) => return response,
    };
    let client_id = form.text("client_id").unwrap_or_default();
    let (sql, args): (&str, Vec<Option<String>>) = match form.get("grant_type") {
        Some("authorization_code") => {
            let (Some(code), Some(redirect_uri), Some(verifier)) =
                (form.text("code"), form.text("redirect_uri"), form.text("code_verifier"))
            else {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "code, redirect_uri and code_verifier are required",
                );
            };
            (
                "SELECT querylayer_api.oauth_redeem_code($1, $2, $3, $4, $5)",
                vec![Some(code), Some(client_id), Some(redirect_uri), Some(verifier), Some(resource)],
            )
        }
        Some("refresh_token") => {
            let Some(refresh) = form.text("refresh_token") else {
                return oauth_error(StatusCode::BAD_REQUEST, "invalid_request", "refresh_token is required");
            };
            (
                "SELECT querylayer_api.oauth_refresh($1, $2, $3)",
                vec![Some(refresh), Some(client_id), Some(resource)],
            )
        }
        _ => {
            return oauth_error(
                StatusCode::BAD_REQUEST,
                "unsupported_grant_type",
                "grant_type: authorization_code or refresh_token",
            )
        }
    };
    let fingerprint = Fingerprint::of(args[0].as_deref().unwrap_or_default());
    let result = async {
        let client = state.db.client().await?;
        let row = match args.len() {
            5 => {
                client
                    .query_one(sql, &[&fingerprint.as_bytes(), &args[1], &args[2], &args[3], &args[4]])
                    .await?
            }
            _ => client.query_one(sql, &[&fingerprint.as_bytes(), &args[1], &args[2]]).await?,
        };
        Ok::<Value, Error>(row.get(0))
    }
    .await;
    match result {
        Ok(v) if v["ok"] == true => {
            tracing::info!(
                grant_id = v["grant_id"].as_str(),
                connection_id = v["connection_id"].as_str(),
                "OAuth tokens issued"
            );
            no_store(
                Json(json!({
                    "access_token": v["access_token"], "token_type": "Bearer", "expires_in": v["expires_in"],
                    "refresh_token": v["refresh_token"], "scope": v["scope"],
                }))
                .into_response(),
            )
        }
        Ok(v) => {
            tracing::info!(reason = v["reason"].as_str(), "OAuth token request refused");
            if let Some(peer) = peer {
                if let Some(wait) = state.db.spend_peer_failure(peer).await {
                    state.peer_holds.hold(peer, wait);
                }
            }
            oauth_error(
                StatusCode::BAD_REQUEST,
                "invalid_grant",
                "the code or refresh token is not valid for this request",
            )
        }
        Err(e) => server_error(e),
    }
}

/// Revocation (RFC 7009): a refresh token ends its grant; an access token (a connection secret)
/// ends its grant too, or the connection alone. Always 200, whatever the token was.
async fn revoke(State(state): State<AppState>, body: Bytes) -> Response {
    let form = Form::parse(&body);
    let Some(token) = form.text("token") else {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_request", "token is required");
    };
    let fingerprint = Fingerprint::of(&token);
    let client_id = form.text("client_id");
    let result = async {
        let mut client = state.db.client().await?;
        if token.starts_with("qlr_") {
            client
                .query_one(
                    "SELECT querylayer_api.oauth_revoke_refresh($1, $2)",
                    &[&fingerprint.as_bytes(), &client_id],
                )
                .await?;
        } else if token.starts_with("qlc_") {
            let tx = client.transaction().await?;
            if tx
                .query_one("SELECT querylayer_api.authenticate($1)", &[&fingerprint.as_bytes()])
                .await
                .is_ok()
            {
                tx.query_one("SELECT querylayer_api.oauth_revoke_current()", &[]).await?;
                tx.commit().await?;
            }
        }
        Ok::<(), Error>(())
    }
    .await;
    match result {
        Ok(()) => no_store(StatusCode::OK.into_response()),
        Err(e) => server_error(e),
    }
}

//! Authentication before anything else: the bearer secret becomes a SHA-256 fingerprint, the
//! database resolves it (`querylayer_api.authenticate`), and only then does an MCP server exist
//! for the request. Every failure is the same 401. Also the protected-resource metadata
//! (RFC 9728) that the 401 challenge points to.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::db::ConnectionContext;
use crate::error::{Code, Error};
use crate::state::AppState;

/// The SHA-256 of a presented secret: all the edge ever hands to the database. Its `Debug`
/// prints nothing of it, so it cannot reach a log line by accident.
#[derive(Clone)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn of(secret: &str) -> Self {
        Fingerprint(Sha256::digest(secret.as_bytes()).into())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fingerprint(..)")
    }
}

/// The longest secret the edge hashes; anything longer cannot be a QueryLayer secret.
const MAX_SECRET_LEN: usize = 512;

/// The bearer token of `Authorization: Bearer <token>`, if the header is well formed.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    let well_formed = scheme.eq_ignore_ascii_case("bearer")
        && !token.is_empty()
        && token.len() <= MAX_SECRET_LEN
        && token.bytes().all(|b| b.is_ascii_graphic());
    well_formed.then_some(token)
}

/// An authenticated agent connection, in the request's extensions from here on.
#[derive(Clone, Debug)]
pub struct Principal {
    pub fingerprint: Fingerprint,
    pub context: ConnectionContext,
}

/// Middleware in front of `/mcp`: resolves the bearer secret or answers 401. A presented but
/// dead secret is recorded as a failed authentication (in a transaction of its own).
pub async fn require_connection(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let Some(fingerprint) = bearer(request.headers()).map(Fingerprint::of) else {
        return challenge(&state, Error::unauthenticated());
    };
    match state.db.authenticate(&fingerprint).await {
        Ok(context) => {
            request.extensions_mut().insert(Principal { fingerprint, context });
            next.run(request).await
        }
        Err(e) if e.code == Code::Unauthenticated => {
            state.db.record_failed_authentication(&fingerprint, "mcp").await;
            challenge(&state, Error::unauthenticated())
        }
        Err(e) => crate::body::mcp_refusal(request, e, state.config.max_body_bytes).await,
    }
}

/// The one 401 of the edge: no site, agent or reason, and a pointer to the resource metadata.
pub fn challenge(state: &AppState, error: Error) -> Response {
    let mut response = error.into_response();
    let value = format!(r#"Bearer resource_metadata="{}""#, state.config.resource_metadata_url());
    if let Ok(value) = HeaderValue::from_str(&value) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// The scopes of the contract, advertised in the resource metadata.
pub const SCOPES: &[&str] = &[
    "site:read",
    "content:read",
    "content:write",
    "topical-map:read",
    "topical-map:write",
    "runs:read",
    "runs:write",
    "publish:request",
];

/// `/.well-known/oauth-protected-resource` (and the RFC 9728 path-suffixed form for `/mcp`).
/// There is no authorization server: operators and owners issue connection secrets.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/.well-known/oauth-protected-resource", get(resource_metadata))
        .route("/.well-known/oauth-protected-resource/mcp", get(resource_metadata))
}

async fn resource_metadata(State(state): State<AppState>) -> impl IntoResponse {
    Json(json!({
        "resource": state.config.resource_url(),
        "resource_name": "QueryLayer",
        "bearer_methods_supported": ["header"],
        "scopes_supported": SCOPES,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn bearer_accepts_only_a_well_formed_bearer_header() {
        assert_eq!(bearer(&headers("Bearer qlc_abc")), Some("qlc_abc"));
        assert_eq!(bearer(&headers("bearer  qlc_abc ")), Some("qlc_abc"));
        assert_eq!(bearer(&headers("Basic qlc_abc")), None);
        assert_eq!(bearer(&headers("Bearer")), None);
        assert_eq!(bearer(&headers("Bearer a b")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
        assert_eq!(bearer(&headers(&format!("Bearer {}", "x".repeat(513)))), None);
    }

    #[test]
    fn fingerprint_is_the_sha256_of_the_secret_and_never_prints() {
        let fp = Fingerprint::of("abc");
        assert_eq!(
            fp.as_bytes(),
            [
                0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22,
                0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00,
                0x15, 0xad
            ]
        );
        assert_eq!(format!("{fp:?}"), "Fingerprint(..)");
    }
}

//! The delivery API: what a website fetches its published content from, read-only, per site.
//! `GET /delivery/v1/sites/{site}/content` (a page of live items, by slug) and
//! `GET /delivery/v1/sites/{site}/content/{slug}` (one live item), with the site's delivery
//! token (`Authorization: Bearer qld_…`) or none when the site's owner made delivery public. Each
//! request is one statement, its own read-only transaction: `authenticate_delivery`, then one
//! delivery function; the database serves only what is live. Validators (`ETag`, `Last-Modified`) come from the
//! database; `If-None-Match` and `If-Modified-Since` are answered 304 here.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use chrono::{DateTime, SubsecRound, Utc};
use serde::Deserialize;

use crate::auth::bearer;
use crate::bulkhead::Access;
use crate::db::{Call, Delivered, Fingerprint, RoundTrips};
use crate::error::Error;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/delivery/v1/sites/{site}/content", get(list))
        .route("/delivery/v1/sites/{site}/content/{*slug}", get(item))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Page {
    /// 1 to 100 (default 20).
    limit: Option<i32>,
    /// The previous page's `next_cursor`.
    cursor: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    Path(site): Path<String>,
    headers: HeaderMap,
    page: Result<Query<Page>, QueryRejection>,
) -> Response {
    let call = match page {
        Ok(Query(p)) => Call::new("delivery_items").opt("p_limit", p.limit).opt("p_cursor", p.cursor),
        Err(e) => return Error::invalid_argument(e.body_text()).into_response(),
    };
    deliver(&state, &site, &headers, call).await
}

async fn item(
    State(state): State<AppState>,
    Path((site, slug)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    deliver(&state, &site, &headers, Call::new("delivery_item").arg("p_slug", slug)).await
}

/// One statement: `authenticate_delivery`, then the call in a transaction made read-only
/// (`Db::deliver`). Then the conditional answer.
async fn deliver(state: &AppState, site: &str, headers: &HeaderMap, call: Call) -> Response {
    let token = bearer(headers).map(Fingerprint::of);
    // The site's share of the pool and the token's rate, before the database is asked, once
    // this edge has served the token (or the public site): `AppState::admit`.
    let presented = token.clone().unwrap_or_else(|| Fingerprint::of(&format!("public delivery: {site}")));
    let trips = RoundTrips::default();
    let db = state.db.counting(&trips);
    let result = async {
        let admitted = state.admit(presented.as_bytes(), Access::Read).await?;
        let (auth, value) = db.deliver(site, token.as_ref(), &call).await?;
        let id = auth["delivery_token_id"].as_str().and_then(|s| s.parse::<uuid::Uuid>().ok());
        state.sites.remember(presented.as_bytes(), auth["site"].as_str().unwrap_or(site), id);
        // A token this edge had not served: its rate's token is taken now, before the answer
        // leaves. (A new bucket starts full, so this refuses only a token the edge forgot.)
        if let (false, Some(id)) = (admitted.rated, id) {
            state.limiter.check(id).map_err(Error::rate_limited)?;
        }
        Ok::<_, Error>(value)
    }
    .await;
    let delivered = match result {
        Ok(v) => v,
        Err(e) if e.status == StatusCode::UNAUTHORIZED => {
            if let Some(token) = &token {
                db.record_failed_delivery_authentication(token).await;
            }
            let mut response = Error::unauthenticated().into_response();
            response.extensions_mut().insert(trips);
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(r#"Bearer realm="querylayer-delivery""#),
            );
            return response;
        }
        Err(e) => {
            e.log(call_name(&call));
            let mut response = e.into_response();
            response.extensions_mut().insert(trips);
            return response;
        }
    };
    let Delivered { body, etag, last_modified } = delivered;
    let last_modified = last_modified
        .and_then(|s| DateTime::parse_from_rfc3339(&s).ok())
        .map(|t| t.with_timezone(&Utc).trunc_subsecs(0));
    let mut response = if not_modified(headers, etag.as_deref(), last_modified) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        // The database's JSON, passed on as it wrote it.
        (StatusCode::OK, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body)
            .into_response()
    };
    let h = response.headers_mut();
    if let Some(etag) = etag.and_then(|e| HeaderValue::from_str(&e).ok()) {
        h.insert(header::ETAG, etag);
    }
    if let Some(t) = last_modified {
        if let Ok(v) = HeaderValue::from_str(&http_date(t)) {
            h.insert(header::LAST_MODIFIED, v);
        }
    }
    // Revalidate every time: an unpublished item must disappear at once, from caches too.
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(if token.is_some() { "private, no-cache" } else { "public, no-cache" }),
    );
    h.insert(header::VARY, HeaderValue::from_static("Authorization"));
    response.extensions_mut().insert(trips);
    response
}

fn call_name(call: &Call) -> &'static str {
    call.function()
}

fn http_date(t: DateTime<Utc>) -> String {
    t.format("%a, %d %b %Y %H:%M:%S GMT").to_string()
}

/// RFC 9110: If-None-Match (weak comparison) decides when present; otherwise If-Modified-Since.
fn not_modified(headers: &HeaderMap, etag: Option<&str>, last_modified: Option<DateTime<Utc>>) -> bool {
    if let Some(inm) = headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) {
        let Some(etag) = etag else { return false };
        let ours = etag.trim_start_matches("W/");
        return inm.split(',').map(str::trim).any(|t| t == "*" || t.trim_start_matches("W/") == ours);
    }
    if let (Some(ims), Some(lm)) =
        (headers.get(header::IF_MODIFIED_SINCE).and_then(|v| v.to_str().ok()), last_modified)
    {
        if let Ok(since) = DateTime::parse_from_rfc2822(ims) {
            return lm <= since.with_timezone(&Utc);
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn conditional_requests_follow_rfc_9110() {
        let lm = DateTime::parse_from_rfc3339("2026-11-30T10:00:00Z").unwrap().with_timezone(&Utc);
        let etag = Some("\"abc\"");
        assert!(not_modified(&headers(&[("if-none-match", "\"abc\"")]), etag, Some(lm)));
        assert!(not_modified(&headers(&[("if-none-match", "W/\"x\", W/\"abc\"")]), etag, Some(lm)));
        assert!(not_modified(&headers(&[("if-none-match", "*")]), etag, Some(lm)));
        assert!(!not_modified(&headers(&[("if-none-match", "\"old\"")]), etag, Some(lm)));
        // If-None-Match wins over If-Modified-Since.
        assert!(!not_modified(
            &headers(&[("if-none-match", "\"old\""), ("if-modified-since", "Mon, 30 Nov 2026 11:00:00 GMT")]),
            etag,
            Some(lm)
        ));
        assert!(not_modified(
            &headers(&[("if-modified-since", "Mon, 30 Nov 2026 10:00:00 GMT")]),
            etag,
            Some(lm)
        ));
        assert!(!not_modified(
            &headers(&[("if-modified-since", "Mon, 30 Nov 2026 09:59:59 GMT")]),
            etag,
            Some(lm)
        ));
        assert!(!not_modified(&headers(&[]), etag, Some(lm)));
        assert_eq!(http_date(lm), "Mon, 30 Nov 2026 10:00:00 GMT");
    }
}

//! OAuth Client ID Metadata Documents (for `oauth`, on the ground floor: the state holds them): a client whose `client_id` is an https URL is described by the
//! JSON document at that URL. The edge fetches it (the address rules and limits of
//! `crate::fetch`: public addresses only unless the operator allows private networks, at most
//! 16 KiB, a few seconds, no redirect off the rules), and hands the parsed document to the
//! database, which checks it (it must name itself, list https or loopback redirect URIs, be a
//! public client) and keeps each new version (`oauth_record_client_document`). A document is
//! fetched again once its `Cache-Control: max-age` has passed (between one minute and a day; an
//! hour without one), so a client that changes its redirect URIs is followed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::Error;
use crate::fetch::{FetchLimits, Fetcher};

/// The largest document read.
const MAX_DOCUMENT_BYTES: usize = 16 * 1024;
/// How long a document is trusted without `max-age`, and the bounds of `max-age`.
const DEFAULT_FRESH: Duration = Duration::from_secs(3600);
const MIN_FRESH: Duration = Duration::from_secs(60);
const MAX_FRESH: Duration = Duration::from_secs(86_400);
/// Documents remembered as fresh before the oldest are forgotten.
const MAX_REMEMBERED: usize = 10_000;

/// How the edge fetches client documents: `serve --client-metadata-allow-private-networks`,
/// `--client-metadata-ca-file`, `--client-metadata-timeout-secs`.
#[derive(Clone, Debug, Default)]
pub struct DocumentLimits {
    pub allow_private_networks: bool,
    pub ca_pem: Option<Vec<u8>>,
    pub timeout_secs: u64,
}

/// The fetcher and what it fetched recently (URL → fresh until).
pub struct ClientDocuments {
    fetcher: Fetcher,
    fresh: Mutex<HashMap<String, Instant>>,
}

/// Whether `client_id` names a metadata document (an https URL) rather than a registered client.
pub fn is_document_url(client_id: &str) -> bool {
    client_id.starts_with("https://")
}

impl ClientDocuments {
    pub fn new(limits: &DocumentLimits) -> Result<Self, String> {
        let fetcher = Fetcher::new(&FetchLimits {
            allow_private_networks: limits.allow_private_networks,
            max_redirects: 3,
            fetch_timeout_secs: limits.timeout_secs.max(1),
            max_body_bytes: MAX_DOCUMENT_BYTES,
            extra_roots_pem: limits.ca_pem.clone(),
            user_agent: concat!("querylayer-oauth/", env!("CARGO_PKG_VERSION")),
        })
        .map_err(|e| format!("--client-metadata-ca-file: {e}"))?;
        Ok(ClientDocuments { fetcher, fresh: Mutex::new(HashMap::new()) })
    }

    fn is_fresh(&self, url: &str) -> bool {
        let fresh = self.fresh.lock().unwrap_or_else(|e| e.into_inner());
        fresh.get(url).is_some_and(|until| *until > Instant::now())
    }

    fn remember(&self, url: &str, for_how_long: Duration) {
        let mut fresh = self.fresh.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if fresh.len() >= MAX_REMEMBERED {
            fresh.retain(|_, until| *until > now);
        }
        if fresh.len() < MAX_REMEMBERED {
            fresh.insert(url.to_string(), now + for_how_long);
        }
    }

    /// Makes sure the database holds a current version of the document `client_id` names (a
    /// no-op for a registered client). A document that cannot be fetched or does not describe a
    /// client is refused with the reason, for the page the member sees.
    pub async fn refresh(&self, db: &crate::db::Db, client_id: &str) -> Result<(), Error> {
        if !is_document_url(client_id) || self.is_fresh(client_id) {
            return Ok(());
        }
        let refused = |why: &str| {
            tracing::info!(client_id, reason = why, "OAuth client metadata document refused");
            Error::invalid_argument(format!(
                "client_id: the client metadata document could not be used: {why}"
            ))
            .with_hint(
                "the application publishes its client metadata at its client_id URL; ask its developer",
            )
        };
        let response = self.fetcher.get(client_id, Some("application/json")).await.map_err(refused)?;
        if response.status() != reqwest::StatusCode::OK {
            return Err(refused(&format!("HTTP {}", response.status().as_u16())));
        }
        let max_age = max_age(response.headers().get(reqwest::header::CACHE_CONTROL));
        let body = self.fetcher.body(response, Some(MAX_DOCUMENT_BYTES)).await.map_err(refused)?;
        let document: Value = serde_json::from_slice(&body).map_err(|_| refused("it is not JSON"))?;
        let client = db.client().await?;
        client
            .query_one("SELECT querylayer_api.oauth_record_client_document($1, $2)", &[&client_id, &document])
            .await?;
        self.remember(client_id, max_age);
        tracing::info!(client_id, max_age_secs = max_age.as_secs(), "OAuth client metadata document fetched");
        Ok(())
    }
}

/// How long a document stays fresh, from its `Cache-Control` (`max-age`, `no-cache`/`no-store`:
/// the minimum), within the bounds.
fn max_age(value: Option<&reqwest::header::HeaderValue>) -> Duration {
    let Some(text) = value.and_then(|v| v.to_str().ok()) else {
        return DEFAULT_FRESH;
    };
    let mut age = DEFAULT_FRESH;
    for directive in text.split(',').map(str::trim) {
        let lower = directive.to_ascii_lowercase();
        if lower == "no-cache" || lower == "no-store" {
            return MIN_FRESH;
        }
        if let Some(secs) =
            lower.strip_prefix("max-age=").and_then(|s| s.trim_matches('"').parse::<u64>().ok())
        {
            age = Duration::from_secs(secs);
        }
    }
    age.clamp(MIN_FRESH, MAX_FRESH)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(v: &str) -> reqwest::header::HeaderValue {
        reqwest::header::HeaderValue::from_str(v).unwrap()
    }

    #[test]
    fn a_document_stays_fresh_for_its_max_age_within_bounds() {
        assert_eq!(max_age(None), DEFAULT_FRESH);
        assert_eq!(max_age(Some(&header("public, max-age=600"))), Duration::from_secs(600));
        assert_eq!(max_age(Some(&header("max-age=5"))), MIN_FRESH);
        assert_eq!(max_age(Some(&header("max-age=99999999"))), MAX_FRESH);
        assert_eq!(max_age(Some(&header("no-store"))), MIN_FRESH);
        assert_eq!(max_age(Some(&header("garbage"))), DEFAULT_FRESH);
    }

    #[test]
    fn only_https_client_ids_name_documents() {
        assert!(is_document_url("https://app.example/oauth/client.json"));
        assert!(!is_document_url("qlo_0123456789abcdef0123456789abcdef"));
        assert!(!is_document_url("http://app.example/client.json"));
    }
}

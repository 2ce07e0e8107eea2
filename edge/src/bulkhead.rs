//! Bulkheads: one site cannot take the whole database pool. Every call that reaches the
//! database for a site first takes a permit of that site — reads and writes from separate
//! budgets, both smaller than the pool — waiting at most `wait`, then refused as `overloaded`
//! (retryable). A site whose history is held (its writes wait on the database, up to the ledger
//! lock timeout) therefore holds at most its write budget of connections; its reads, and every
//! other site, go on. Permits are per edge instance, like the pool they protect.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use crate::error::Error;

/// What a call does to its site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Reads only: never waits on the site's history.
    Read,
    /// Writes (or records what it decided): may wait on the site's history.
    Write,
}

struct Permits {
    read: Arc<Semaphore>,
    write: Arc<Semaphore>,
}

/// Per-site permits, and what this edge learned of each credential it authenticated: its site
/// and the id its rate is kept under. Neither ever changes for a credential, so a request can
/// take its permit, and its rate token, before it takes a connection.
pub struct SiteLimits {
    reads: usize,
    writes: usize,
    wait: Duration,
    sites: Mutex<HashMap<String, Arc<Permits>>>,
    credentials: Mutex<HashMap<[u8; 32], Known>>,
}

/// A credential this edge has authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Known {
    pub site: String,
    /// The key of its rate limit (a token's or a session's id); none for a public site.
    pub rate_key: Option<Uuid>,
}

/// Entries kept before the credential cache starts over.
const CREDENTIALS_KEPT: usize = 50_000;

impl SiteLimits {
    /// Budgets for a pool of `pool_size` connections: by default a site may hold half of it for
    /// reads and a quarter for writes.
    pub fn new(pool_size: usize, reads: Option<usize>, writes: Option<usize>, wait: Duration) -> Self {
        let reads = reads.unwrap_or(pool_size / 2).max(1);
        let writes = writes.unwrap_or(pool_size / 4).max(1);
        SiteLimits {
            reads,
            writes,
            wait,
            sites: Mutex::new(HashMap::new()),
            credentials: Mutex::new(HashMap::new()),
        }
    }

    pub fn budgets(&self) -> (usize, usize) {
        (self.reads, self.writes)
    }

    fn permits(&self, site: &str) -> Arc<Permits> {
        let mut sites = self.sites.lock().unwrap_or_else(|e| e.into_inner());
        sites
            .entry(site.to_string())
            .or_insert_with(|| {
                Arc::new(Permits {
                    read: Arc::new(Semaphore::new(self.reads)),
                    write: Arc::new(Semaphore::new(self.writes)),
                })
            })
            .clone()
    }

    /// A permit for one call on `site`, or `overloaded` once `wait` has passed.
    pub async fn acquire(&self, site: &str, access: Access) -> Result<OwnedSemaphorePermit, Error> {
        let permits = self.permits(site);
        let semaphore = match access {
            Access::Read => permits.read.clone(),
            Access::Write => permits.write.clone(),
        };
        match tokio::time::timeout(self.wait, semaphore.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => {
                tracing::warn!(
                    site,
                    ?access,
                    "a site's share of the database connections is in use; call refused"
                );
                Err(Error::overloaded(
                    "this site's calls are using every database connection this edge gives a site; retry shortly",
                    1,
                ))
            }
        }
    }

    /// The site a credential fingerprint authenticated for, if this edge has seen it.
    pub fn site_of(&self, fingerprint: &[u8]) -> Option<String> {
        self.known(fingerprint).map(|k| k.site)
    }

    /// What this edge learned of a credential fingerprint when it authenticated it, if it has.
    pub fn known(&self, fingerprint: &[u8]) -> Option<Known> {
        let key: [u8; 32] = fingerprint.try_into().ok()?;
        self.credentials.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned()
    }

    /// Called once the database has authenticated the credential.
    pub fn remember(&self, fingerprint: &[u8], site: &str, rate_key: Option<Uuid>) {
        let Ok(key) = <[u8; 32]>::try_from(fingerprint) else {
            return;
        };
        let mut credentials = self.credentials.lock().unwrap_or_else(|e| e.into_inner());
        if credentials.len() >= CREDENTIALS_KEPT {
            credentials.clear();
        }
        credentials.insert(key, Known { site: site.to_string(), rate_key });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_site_holds_at_most_its_budget_and_others_are_not_held_up() {
        let limits = SiteLimits::new(8, None, None, Duration::from_millis(50));
        assert_eq!(limits.budgets(), (4, 2));
        let w1 = limits.acquire("a", Access::Write).await.unwrap();
        let _w2 = limits.acquire("a", Access::Write).await.unwrap();
        let refused = limits.acquire("a", Access::Write).await.unwrap_err();
        assert_eq!((refused.code, refused.is_retryable()), (crate::error::Code::Overloaded, true));
        // Reads of the same site and writes of another site have their own permits.
        let _r = limits.acquire("a", Access::Read).await.unwrap();
        let _b = limits.acquire("b", Access::Write).await.unwrap();
        drop(w1);
        assert!(limits.acquire("a", Access::Write).await.is_ok());
    }

    #[test]
    fn credentials_remember_their_site() {
        let limits = SiteLimits::new(16, None, None, Duration::from_secs(1));
        let fp = [7u8; 32];
        assert_eq!(limits.site_of(&fp), None);
        let id = Uuid::new_v4();
        limits.remember(&fp, "demo", Some(id));
        assert_eq!(limits.site_of(&fp).as_deref(), Some("demo"));
        assert_eq!(limits.known(&fp), Some(Known { site: "demo".into(), rate_key: Some(id) }));
        assert_eq!(limits.known(&[8u8; 32]), None);
    }
}

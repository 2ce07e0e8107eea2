//! The ground floor of the edge: what every request may use (`AppState`) and what the serving
//! processes stop on (`shutdown_signal`). Imports only the modules that own the parts of the
//! state, never the router (`lib.rs`).

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::FromRef;

use crate::bulkhead::{Access, SiteLimits};
use crate::client_documents::ClientDocuments;
use crate::config::HttpConfig;
use crate::db::Db;
use crate::error::Error;
use crate::health::Readiness;
use crate::rate::{Holds, RateLimiter, SharedLimits};
use crate::replica::Replica;

/// Everything a request may use. Cloned per request (every middleware layer clones its state):
/// one reference count, the parts behind it shared. Holds no per-client state beyond the rate
/// limiter's buckets and the sites' permits.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// The parts of the state (`AppState` dereferences to them).
#[derive(Clone)]
pub struct Shared {
    pub db: Db,
    pub config: Arc<HttpConfig>,
    /// Rate limits of member tokens, dashboard sessions and delivery tokens (per edge).
    pub limiter: Arc<RateLimiter>,
    /// Addresses whose failed-authentication budget the database said is spent, until when.
    pub peer_holds: Arc<Holds<IpAddr>>,
    pub sites: Arc<SiteLimits>,
    pub readiness: Arc<Readiness>,
    /// The OAuth clients named by their metadata documents (`client_documents`).
    pub client_documents: Arc<ClientDocuments>,
    /// The hot standby read tools may be served from (`replica`), if one is configured.
    pub replica: Option<Arc<Replica>>,
}

impl AppState {
    pub fn new(db: Db, config: HttpConfig) -> Result<Self, String> {
        let limiter = Arc::new(RateLimiter::new(config.rate_limit_per_sec, config.rate_burst));
        let db = db.with_limits(SharedLimits {
            rate: config.rate_limit_per_sec,
            burst: f64::from(config.rate_burst),
            failure_rate: config.auth_failure_rate,
            failure_burst: f64::from(config.auth_failure_burst),
            registration_rate: config.registration_rate,
            registration_burst: f64::from(config.registration_burst),
        });
        let sites =
            Arc::new(SiteLimits::new(0, Some(config.site_reads), Some(config.site_writes), config.site_wait));
        let readiness = Readiness::new(config.readiness.clone(), config.readiness_tls.clone());
        let client_documents = Arc::new(ClientDocuments::new(&config.client_documents)?);
        Ok(AppState(Arc::new(Shared {
            db,
            config: Arc::new(config),
            limiter,
            peer_holds: Arc::default(),
            sites,
            readiness,
            client_documents,
            replica: None,
        })))
    }

    /// Serves read tools from `replica` when it is fresh enough (`serve --read-database-url`).
    pub fn with_replica(mut self, replica: Arc<Replica>) -> Self {
        Arc::make_mut(&mut self.0).replica = Some(replica);
        self
    }
}

/// What `AppState::admit` took for a request with a credential.
pub struct Admitted {
    /// The site's permit, held for the request.
    pub permit: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Whether the credential's rate token is taken: the edge had its id.
    pub rated: bool,
}

impl AppState {
    /// For a credential (its fingerprint) this edge has authenticated before: its site's permit
    /// (`access`) and its rate token (member tokens, sessions, delivery tokens: by the id
    /// learned then), both before the database is asked. Nothing for one it has not seen: a site
    /// is never given permits on the word of an unauthenticated request, and its rate is taken
    /// once the database has said whose it is (`rated` false).
    pub async fn admit(&self, fingerprint: &[u8], access: Access) -> Result<Admitted, Error> {
        let known = self.sites.known(fingerprint);
        let permit = match &known {
            Some(k) => Some(self.sites.acquire(&k.site, access).await?),
            None => None,
        };
        let rated = match known.and_then(|k| k.rate_key) {
            Some(id) => {
                self.limiter.check(id).map_err(Error::rate_limited)?;
                true
            }
            None => false,
        };
        Ok(Admitted { permit, rated })
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl FromRef<AppState> for Arc<Readiness> {
    fn from_ref(state: &AppState) -> Self {
        state.readiness.clone()
    }
}

/// Resolves on Ctrl-C or SIGTERM: what `serve` and `worker` stop on.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

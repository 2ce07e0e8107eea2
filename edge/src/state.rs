//! The ground floor of the edge: what every request may use (`AppState`) and what the serving
//! processes stop on (`shutdown_signal`). Imports only the modules that own the parts of the
//! state, never the router (`lib.rs`).

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::FromRef;

use crate::bulkhead::SiteLimits;
use crate::client_documents::ClientDocuments;
use crate::config::HttpConfig;
use crate::db::Db;
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

//! Liveness and readiness for load balancers and supervisors: `/healthz` says the process
//! answers; `/readyz` says what it checked — the database reachable, holding an extension version
//! this edge speaks (it reports both versions), and writable (not a standby, not read-only, room
//! on its disks) — on a connection of its own, outside the pool, so that a site whose calls hold
//! pooled connections does not make a healthy database look down (and readiness does not flap
//! with one slow site).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::Mutex;

use crate::compat::Compatibility;

/// `/healthz` and `/readyz` for any state that hands out the readiness check (`AppState`).
pub fn router<S>() -> Router<S>
where
    Arc<Readiness>: FromRef<S>,
    S: Clone + Send + Sync + 'static,
{
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz))
}

async fn healthz() -> Response {
    Json(json!({ "status": "ok" })).into_response()
}

/// How long one answer is reused (a load balancer polling every instance often costs one query).
const FRESH_FOR: Duration = Duration::from_millis(500);
/// How long the database may take to answer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The readiness connection and the last answer.
pub struct Readiness {
    config: tokio_postgres::Config,
    tls: crate::pgtls::MakeTls,
    state: Mutex<ReadinessState>,
}

#[derive(Default)]
struct ReadinessState {
    client: Option<tokio_postgres::Client>,
    last: Option<(Instant, bool, Value)>,
}

impl Readiness {
    pub fn new(config: tokio_postgres::Config, tls: crate::pgtls::MakeTls) -> Arc<Self> {
        Arc::new(Readiness { config, tls, state: Mutex::new(ReadinessState::default()) })
    }

    /// (ready, report).
    pub async fn check(&self) -> (bool, Value) {
        let mut state = self.state.lock().await;
        if let Some((at, ready, report)) = &state.last {
            if at.elapsed() < FRESH_FOR {
                return (*ready, report.clone());
            }
        }
        let (ready, report) = match tokio::time::timeout(CHECK_TIMEOUT, self.ask(&mut state)).await {
            Ok(Ok((compat, health))) => judge(&compat, health.as_ref()),
            Ok(Err(reason)) => {
                state.client = None;
                (
                    false,
                    json!({ "status": "unavailable", "checks": { "database": { "ok": false, "error": reason } } }),
                )
            }
            Err(_) => {
                state.client = None;
                (
                    false,
                    json!({ "status": "unavailable", "checks": { "database": { "ok": false, "error": "no answer within 2 s" } } }),
                )
            }
        };
        state.last = Some((Instant::now(), ready, report.clone()));
        (ready, report)
    }

    /// The installed version, and `health()` when it is a version this edge speaks (an older
    /// extension may not have that function).
    async fn ask(&self, state: &mut ReadinessState) -> Result<(Compatibility, Option<Value>), String> {
        if state.client.as_ref().is_none_or(|c| c.is_closed()) {
            let (client, connection) = self
                .config
                .connect(self.tls.clone())
                .await
                .map_err(|e| format!("cannot connect: {}", short(&e)))?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            state.client = Some(client);
        }
        let client = state.client.as_ref().expect("connected above");
        let version: Option<String> = client
            .query_opt("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'querylayer'", &[])
            .await
            .map_err(|e| short(&e))?
            .map(|r| r.get(0));
        let compat = Compatibility::of(version.as_deref());
        if compat.refusal().is_some() {
            return Ok((compat, None));
        }
        let row = client.query_one("SELECT querylayer_api.health()", &[]).await.map_err(|e| short(&e))?;
        Ok((compat, Some(row.get(0))))
    }
}

/// The first line of a database error, without detail that could quote configuration.
fn short(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("SQLSTATE {}: {}", db.code().code(), db.message()),
        None => "the connection failed".to_string(),
    }
}

/// What the database said, as checks; ready when it is reachable, holds an extension version
/// this edge speaks, and is writable.
fn judge(compat: &Compatibility, health: Option<&Value>) -> (bool, Value) {
    let refusal = compat.refusal();
    let mut checks = json!({
        "database": { "ok": true },
        "version": { "ok": refusal.is_none() },
    });
    if let Some(reason) = &refusal {
        checks["version"]["reason"] = Value::String(reason.clone());
    }
    let mut writable = false;
    if let Some(health) = health {
        writable = health.get("writable").and_then(Value::as_bool).unwrap_or(false);
        checks["writable"] = json!({
            "ok": writable,
            "in_recovery": health.get("in_recovery"),
            "read_only": health.get("read_only"),
            "free_bytes": health.get("free_bytes"),
            "min_free_bytes": health.get("min_free_bytes"),
        });
    }
    let ready = refusal.is_none() && writable;
    let report = json!({
        "status": if ready { "ready" } else { "unavailable" },
        "checks": checks,
        "versions": compat.versions(),
    });
    (ready, report)
}

async fn readyz(State(readiness): State<Arc<Readiness>>) -> Response {
    let (ready, report) = readiness.check().await;
    if ready {
        Json(report).into_response()
    } else {
        tracing::warn!(report = %report, "not ready");
        (StatusCode::SERVICE_UNAVAILABLE, Json(report)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_means_reachable_speaking_this_version_and_writable() {
        let version = crate::compat::EDGE_VERSION;
        let supported = Compatibility::of(Some(version));
        let healthy = json!({"writable": true, "in_recovery": false, "read_only": false, "free_bytes": 1,
                             "min_free_bytes": 0, "extension_version": version});
        let (ready, report) = judge(&supported, Some(&healthy));
        assert!(ready);
        assert_eq!(report["status"], "ready");
        assert_eq!(report["versions"], json!({"edge": version, "extension": version}));
        assert_eq!(report["checks"]["version"]["ok"], true);
        let full = json!({"writable": false, "free_bytes": 0, "min_free_bytes": 67108864});
        let (ready, report) = judge(&supported, Some(&full));
        assert!(!ready);
        assert_eq!(report["checks"]["writable"]["ok"], false);
        assert_eq!(report["checks"]["database"]["ok"], true);
        let older = Compatibility::of(Some("0.1.0"));
        let (ready, report) = judge(&older, None);
        assert!(!ready);
        assert_eq!(report["status"], "unavailable");
        assert_eq!(report["versions"]["extension"], "0.1.0");
        assert!(report["checks"]["version"]["reason"]
            .as_str()
            .unwrap()
            .contains("ALTER EXTENSION querylayer UPDATE"));
    }
}

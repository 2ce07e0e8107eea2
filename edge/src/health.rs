//! Liveness and readiness for load balancers and supervisors: `/healthz` says the process
//! answers, `/readyz` that the database answers too and holds an extension version this edge
//! speaks (it reports both versions).

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::{compat, AppState};

pub fn router() -> Router<AppState> {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz))
}

async fn healthz() -> Response {
    Json(json!({ "status": "ok" })).into_response()
}

async fn readyz(State(state): State<AppState>) -> Response {
    match tokio::time::timeout(Duration::from_secs(2), compat::check(&state.db)).await {
        Ok(Ok(compat)) => match compat.refusal() {
            None => Json(json!({ "status": "ready", "versions": compat.versions() })).into_response(),
            Some(reason) => (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "status": "unavailable", "reason": reason, "versions": compat.versions() })),
            )
                .into_response(),
        },
        Ok(Err(e)) => {
            e.log("readiness check");
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "unavailable" }))).into_response()
        }
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "unavailable" }))).into_response(),
    }
}

//! Request guards that hold no authority: the Host and Origin allow-lists (DNS rebinding and
//! cross-origin browsers) and the per-credential rate limit. The rate limit is an in-memory
//! token bucket per edge instance: N instances admit up to N times the configured rate.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use uuid::Uuid;

use crate::auth::Principal;
use crate::error::Error;
use crate::AppState;

/// Rejects requests whose Host is not ours (403) or that come from a foreign browser Origin
/// (403). Runs before authentication, so a rebinding page learns nothing else.
pub async fn check_host_and_origin(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let allow = &state.config.allow;
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    let Some(host) = host else {
        return Error::invalid_argument("the Host header is missing").into_response();
    };
    if !allow.host_allowed(&host) {
        tracing::warn!(host = %host, "refused a request for a host that is not allowed");
        return Error::new(StatusCode::FORBIDDEN, "forbidden_host", "this Host is not served here")
            .with_hint("an operator can allow it with --allowed-host")
            .into_response();
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let allowed = origin.to_str().map(|o| allow.origin_allowed(o)).unwrap_or(false);
        if !allowed {
            tracing::warn!(origin = ?origin, "refused a request from an origin that is not allowed");
            return Error::new(
                StatusCode::FORBIDDEN,
                "forbidden_origin",
                "requests from this Origin are not accepted",
            )
            .with_hint("an operator can allow it with --allowed-origin")
            .into_response();
        }
    }
    next.run(request).await
}

/// Middleware after authentication on `/mcp`: one bucket per connection.
pub async fn limit_connection(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(principal) = request.extensions().get::<Principal>() {
        if let Err(retry_after) = state.limiter.check(principal.context.connection_id) {
            tracing::info!(connection_id = %principal.context.connection_id, "rate limited");
            return Error::rate_limited(retry_after).into_response();
        }
    }
    next.run(request).await
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

pub struct RateLimiter {
    per_sec: f64,
    burst: f64,
    buckets: Mutex<HashMap<Uuid, Bucket>>,
}

/// Buckets kept before idle (full) ones are swept.
const SWEEP_AT: usize = 10_000;

impl RateLimiter {
    /// `per_sec` 0 (or less) admits everything.
    pub fn new(per_sec: f64, burst: u32) -> Self {
        RateLimiter { per_sec, burst: f64::from(burst.max(1)), buckets: Mutex::new(HashMap::new()) }
    }

    /// Takes one token for `key`, or says after how many seconds one will be there.
    pub fn check(&self, key: Uuid) -> Result<(), u64> {
        self.check_at(key, Instant::now())
    }

    fn check_at(&self, key: Uuid, now: Instant) -> Result<(), u64> {
        if self.per_sec <= 0.0 {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= SWEEP_AT {
            let (per_sec, burst) = (self.per_sec, self.burst);
            buckets.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * per_sec < burst);
        }
        let bucket = buckets.entry(key).or_insert(Bucket { tokens: self.burst, at: now });
        bucket.tokens =
            (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * self.per_sec).min(self.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - bucket.tokens) / self.per_sec).ceil().max(1.0) as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bucket_admits_its_burst_then_refuses_with_a_retry_after() {
        let limiter = RateLimiter::new(2.0, 3);
        let key = Uuid::new_v4();
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(limiter.check_at(key, t0).is_ok());
        }
        assert_eq!(limiter.check_at(key, t0), Err(1));
        assert!(limiter.check_at(key, t0 + Duration::from_millis(600)).is_ok());
        assert!(limiter.check_at(Uuid::new_v4(), t0).is_ok(), "buckets are per key");
    }

    #[test]
    fn a_zero_rate_admits_everything() {
        let limiter = RateLimiter::new(0.0, 1);
        let key = Uuid::new_v4();
        for _ in 0..100 {
            assert!(limiter.check(key).is_ok());
        }
    }
}

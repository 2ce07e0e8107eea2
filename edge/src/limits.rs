//! Request guards that hold no authority: the Host and Origin allow-lists (DNS rebinding and
//! cross-origin browsers), the per-credential rate limit, and the per-address budget of failed
//! authentications. Both limits are in-memory token buckets per edge instance: N instances admit
//! up to N times the configured rate.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{ConnectInfo, Request, State};
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

/// Middleware after authentication on `/mcp`: one bucket per connection; over it, the request's
/// JSON-RPC error (retryable, with `retry_after`).
pub async fn limit_connection(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    if let Some(connection_id) = request.extensions().get::<Principal>().map(|p| p.context.connection_id) {
        if let Err(retry_after) = state.limiter.check(connection_id) {
            tracing::info!(connection_id = %connection_id, "rate limited");
            if let Err(challenge) = crate::auth::confirm(&state, request.extensions_mut(), None).await {
                return challenge;
            }
            return crate::body::mcp_refusal(
                request,
                Error::rate_limited(retry_after),
                state.config.max_body_bytes,
            )
            .await;
        }
    }
    next.run(request).await
}

/// Middleware in front of every credential check (`/mcp`, the console, `/v1`): a peer address
/// whose failed authentications (answers 401) have used up their budget is answered 429 before
/// any database work, so a stream of bad secrets cannot fill the audit log or the pool. Behind a
/// reverse proxy every client shares the proxy's address: raise the budget or set its rate to 0.
pub async fn limit_auth_failures(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    if let Some(peer) = peer {
        if let Err(retry_after) = state.auth_failures.admits(&peer) {
            tracing::warn!(peer = %peer, "refused a request from an address over its failed-authentication budget");
            return Error::rate_limited(retry_after)
                .with_hint(
                    "too many failed authentications from this address; wait, then use a valid credential",
                )
                .into_response();
        }
    }
    let response = next.run(request).await;
    if let Some(peer) = peer.filter(|_| response.status() == StatusCode::UNAUTHORIZED) {
        let _ = state.auth_failures.check(peer);
    }
    response
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets by key (a credential's id, a peer address).
pub struct RateLimiter<K = Uuid> {
    per_sec: f64,
    burst: f64,
    buckets: Mutex<HashMap<K, Bucket>>,
}

/// Buckets kept before idle (full) ones are swept.
const SWEEP_AT: usize = 10_000;

impl<K: Hash + Eq> RateLimiter<K> {
    /// `per_sec` 0 (or less) admits everything.
    pub fn new(per_sec: f64, burst: u32) -> Self {
        RateLimiter { per_sec, burst: f64::from(burst.max(1)), buckets: Mutex::new(HashMap::new()) }
    }

    /// Takes one token for `key`, or says after how many seconds one will be there.
    pub fn check(&self, key: K) -> Result<(), u64> {
        self.check_at(key, Instant::now())
    }

    /// Whether `key` has a token now, without taking it.
    pub fn admits(&self, key: &K) -> Result<(), u64> {
        self.admits_at(key, Instant::now())
    }

    fn refilled(&self, bucket: &Bucket, now: Instant) -> f64 {
        (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * self.per_sec).min(self.burst)
    }

    fn wait_for(&self, tokens: f64) -> u64 {
        ((1.0 - tokens) / self.per_sec).ceil().max(1.0) as u64
    }

    fn admits_at(&self, key: &K, now: Instant) -> Result<(), u64> {
        if self.per_sec <= 0.0 {
            return Ok(());
        }
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        match buckets.get(key).map(|b| self.refilled(b, now)) {
            Some(tokens) if tokens < 1.0 => Err(self.wait_for(tokens)),
            _ => Ok(()),
        }
    }

    fn check_at(&self, key: K, now: Instant) -> Result<(), u64> {
        if self.per_sec <= 0.0 {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= SWEEP_AT {
            buckets.retain(|_, b| self.refilled(b, now) < self.burst);
        }
        let burst = self.burst;
        let bucket = buckets.entry(key).or_insert(Bucket { tokens: burst, at: now });
        let tokens = self.refilled(bucket, now);
        bucket.at = now;
        if tokens >= 1.0 {
            bucket.tokens = tokens - 1.0;
            Ok(())
        } else {
            bucket.tokens = tokens;
            Err(self.wait_for(tokens))
        }
    }
}

/// The failed-authentication budget, by peer address.
pub type FailureBudget = RateLimiter<IpAddr>;

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
    fn asking_whether_a_key_is_admitted_takes_no_token() {
        let budget: FailureBudget = RateLimiter::new(1.0, 2);
        let peer: IpAddr = "192.0.2.7".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..10 {
            assert!(budget.admits_at(&peer, t0).is_ok(), "an unknown address is admitted");
        }
        assert!(budget.check_at(peer, t0).is_ok() && budget.check_at(peer, t0).is_ok());
        assert_eq!(budget.admits_at(&peer, t0), Err(1), "two failures used the budget");
        assert_eq!(budget.check_at(peer, t0), Err(1));
        assert!(budget.admits_at(&peer, t0 + Duration::from_millis(1100)).is_ok(), "and it refills");
        assert!(budget.admits_at(&"192.0.2.8".parse().unwrap(), t0).is_ok(), "per address");
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

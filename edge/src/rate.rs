//! Token buckets in memory, per edge instance (the rate limits of member tokens, dashboard
//! sessions and delivery tokens), and what the database said of the limits it decides for every
//! edge at once (a connection's rate, an address's failed-authentication budget, its client
//! registrations: sql/157_rate.sql): a refusal with its `retry_after`, repeated here without
//! asking until the time is up (`Holds`). The middleware that consults them is in `limits`.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

use uuid::Uuid;

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

/// The peer's address, when the listener recorded it (`ConnectInfo`).
pub fn peer(extensions: &http::Extensions) -> Option<IpAddr> {
    extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|c| c.0.ip())
}

/// The failed-authentication budget, by peer address.
pub type FailureBudget = RateLimiter<IpAddr>;

/// Refusals the database decided, until they end: the database said "no token before `retry_after`
/// seconds", and no edge can get one sooner, so this edge answers the same without asking.
pub struct Holds<K> {
    until: Mutex<HashMap<K, Instant>>,
}

impl<K: Hash + Eq> Default for Holds<K> {
    fn default() -> Self {
        Holds { until: Mutex::new(HashMap::new()) }
    }
}

impl<K: Hash + Eq> Holds<K> {
    /// Remembers a refusal of `key` for `secs` seconds.
    pub fn hold(&self, key: K, secs: u64) {
        let mut until = self.until.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if until.len() >= SWEEP_AT {
            until.retain(|_, at| *at > now);
        }
        until.insert(key, now + std::time::Duration::from_secs(secs.max(1)));
    }

    /// The seconds left of a refusal of `key`, if one holds.
    pub fn held(&self, key: &K) -> Option<u64> {
        let until = self.until.lock().unwrap_or_else(|e| e.into_inner());
        let left = until.get(key)?.checked_duration_since(Instant::now())?;
        Some(left.as_secs_f64().ceil().max(1.0) as u64)
    }
}

/// The limits the database decides, as this edge was started with them (`serve --rate-limit`,
/// `--rate-burst`, `--auth-failure-rate`, `--auth-failure-burst`, `--registration-rate`,
/// `--registration-burst`); every edge started alike shares one limit. Zero rates: no limit.
#[derive(Clone, Copy, Debug, Default)]
pub struct SharedLimits {
    pub rate: f64,
    pub burst: f64,
    pub failure_rate: f64,
    pub failure_burst: f64,
    pub registration_rate: f64,
    pub registration_burst: f64,
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
    fn a_hold_lasts_its_seconds() {
        let holds: Holds<u32> = Holds::default();
        assert_eq!(holds.held(&1), None);
        holds.hold(1, 3);
        assert!(matches!(holds.held(&1), Some(2..=3)), "{:?}", holds.held(&1));
        assert_eq!(holds.held(&2), None, "per key");
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

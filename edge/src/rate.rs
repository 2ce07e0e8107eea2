//! Token buckets: the per-credential rate limit and the per-address failed-authentication
//! budget. In memory, per edge instance; the middleware that consults them is in `limits`.

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

//! Read tools served by a hot standby (`serve --read-database-url`; docs/operations.md, "Read
//! replicas"). A read-only tool goes to the standby when the standby is fresh enough: it must
//! have replayed the primary's WAL up to where it stood `--replica-max-staleness-ms` ago (the
//! edge samples `pg_current_wal_lsn()` on the primary every 100 ms), and, for a connection that
//! wrote through this edge, past a sample taken after that write returned (read-your-writes).
//! The standby checks this itself in the call's statement (`open_replica_read`, QLR01 when it
//! is behind: the call is then served by the primary). Before the answer leaves, the primary
//! writes the call's audit row (`record_replica_read`): a read is audited durably, once, on
//! the primary, or not answered.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::db::Db;

/// How often the primary's WAL position is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Connections remembered as having written lately, before the oldest are forgotten.
const WRITERS_KEPT: usize = 50_000;
/// How long a standby that could not be reached is left alone before a read tries it again.
const UNREACHABLE_PAUSE: Duration = Duration::from_secs(5);

/// The standby's pool and what the edge knows of the primary's WAL.
pub struct Replica {
    pub db: Db,
    staleness: Duration,
    /// (when, the primary's WAL position then), oldest first.
    samples: Mutex<VecDeque<(Instant, u64)>>,
    /// Connections that wrote through this edge, and when their write returned.
    writes: Mutex<HashMap<Uuid, Instant>>,
    /// The standby could not be reached: reads go to the primary until then.
    paused_until: Mutex<Option<Instant>>,
}

/// A WAL position as PostgreSQL prints it (`16/B374D848`).
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

impl Replica {
    pub fn new(db: Db, staleness: Duration) -> Arc<Replica> {
        Arc::new(Replica {
            db,
            staleness,
            samples: Mutex::default(),
            writes: Mutex::default(),
            paused_until: Mutex::default(),
        })
    }

    /// Samples the primary's WAL position until `stop`.
    pub fn spawn_sampler(self: &Arc<Self>, primary: Db, mut stop: tokio::sync::watch::Receiver<bool>) {
        let replica = self.clone();
        tokio::spawn(async move {
            loop {
                match current_lsn(&primary).await {
                    Ok(lsn) => replica.sampled(Instant::now(), lsn),
                    Err(e) => tracing::debug!(error = %e, "the primary's WAL position could not be read"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(SAMPLE_EVERY) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        });
    }

    fn sampled(&self, at: Instant, lsn: u64) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.push_back((at, lsn));
        let keep = self.staleness + Duration::from_secs(5);
        while samples.front().is_some_and(|(t, _)| at.duration_since(*t) > keep) {
            samples.pop_front();
        }
    }

    /// A write of `connection` returned just now: its next reads need the standby past it.
    pub fn wrote(&self, connection: Uuid) {
        let mut writes = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        if writes.len() >= WRITERS_KEPT {
            let old = Instant::now() - self.staleness - Duration::from_secs(5);
            writes.retain(|_, at| *at > old);
        }
        writes.insert(connection, Instant::now());
    }

    /// The standby could not be reached: no read tries it for a few seconds (a standby whose
    /// address does not answer would otherwise cost every read the connect timeout).
    pub fn unreachable(&self) {
        *self.paused_until.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Instant::now() + UNREACHABLE_PAUSE);
    }

    /// The WAL position the standby must have replayed to serve a read of `connection` now, or
    /// None when no sample can vouch for it yet, or the standby was unreachable moments ago
    /// (the read goes to the primary).
    pub fn floor(&self, connection: Option<Uuid>, now: Instant) -> Option<String> {
        if self.paused_until.lock().unwrap_or_else(|e| e.into_inner()).is_some_and(|until| now < until) {
            return None;
        }
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let bound = now.checked_sub(self.staleness)?;
        // The newest sample at or before the bound: everything committed before it.
        let stale = samples.iter().rev().find(|(t, _)| *t <= bound).map(|(_, l)| *l)?;
        let wrote =
            connection.and_then(|c| self.writes.lock().unwrap_or_else(|e| e.into_inner()).get(&c).copied());
        let floor = match wrote {
            // A sample taken after the write returned holds its commit.
            Some(at) => stale.max(samples.iter().find(|(t, _)| *t > at).map(|(_, l)| *l)?),
            None => stale,
        };
        Some(format_lsn(floor))
    }
}

async fn current_lsn(primary: &Db) -> Result<u64, crate::error::Error> {
    let client = primary.client().await?;
    let row = client.query_one("SELECT pg_catalog.pg_current_wal_lsn()::text", &[]).await?;
    let text: String = row.get(0);
    parse_lsn(&text).ok_or_else(|| crate::error::Error::internal(format!("a WAL position {text:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(staleness_ms: u64) -> Arc<Replica> {
        let db = Db::connect("postgres://nobody@127.0.0.1:1/none", 1, Duration::from_secs(1)).unwrap();
        Replica::new(db, Duration::from_millis(staleness_ms))
    }

    #[test]
    fn lsns_read_and_print_as_postgres_does() {
        assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(format_lsn(0x16_B374_D848), "16/B374D848");
        assert_eq!(parse_lsn("0/0"), Some(0));
        assert_eq!(parse_lsn("nope"), None);
    }

    #[test]
    fn the_floor_is_the_primary_as_it_stood_the_staleness_ago_and_after_a_connections_write() {
        let r = replica(1000);
        let t0 = Instant::now();
        assert_eq!(r.floor(None, t0 + Duration::from_millis(1500)), None, "no sample yet");
        r.sampled(t0, 100);
        r.sampled(t0 + Duration::from_millis(600), 200);
        r.sampled(t0 + Duration::from_millis(1200), 300);
        assert_eq!(
            r.floor(None, t0 + Duration::from_millis(1700)).as_deref(),
            Some("0/C8"),
            "200: 1.1 s before"
        );
        let c = Uuid::new_v4();
        r.writes.lock().unwrap().insert(c, t0 + Duration::from_millis(1100));
        assert_eq!(
            r.floor(Some(c), t0 + Duration::from_millis(1700)).as_deref(),
            Some("0/12C"),
            "300: after the write"
        );
        r.writes.lock().unwrap().insert(c, t0 + Duration::from_millis(1300));
        assert_eq!(r.floor(Some(c), t0 + Duration::from_millis(1700)), None, "no sample after the write yet");
        assert_eq!(r.floor(Some(Uuid::new_v4()), t0 + Duration::from_millis(1700)).as_deref(), Some("0/C8"));
    }

    #[test]
    fn an_unreachable_standby_is_left_alone_for_a_while() {
        let r = replica(100);
        let t0 = Instant::now();
        r.sampled(t0, 100);
        let later = t0 + Duration::from_millis(200);
        assert!(r.floor(None, later).is_some());
        r.unreachable();
        assert_eq!(r.floor(None, Instant::now() + Duration::from_secs(1)), None);
        assert!(r.floor(None, Instant::now() + UNREACHABLE_PAUSE + Duration::from_millis(10)).is_some());
    }
}

//! `envelope-verify`: verifies one `x-qg-envelope` header in a tight loop, in this process only
//! (`Envelope::parse` + `Envelope::check`, what an edge would do without asking the database),
//! on a given number of threads for a fixed time, and prints one JSON line: verifications per
//! second and nanoseconds per verification per thread. Every verification must pass; a failing
//! one stops the run. Used by scripts/bench-envelope as the baseline of the in-database rate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use querylayer_envelope::{Envelope, RequestFacts};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// A file holding the header value.
    #[arg(long)]
    header_file: std::path::PathBuf,
    #[arg(long, default_value = "POST")]
    method: String,
    /// The request path the header was minted for.
    #[arg(long)]
    path: String,
    /// Lowercase hex SHA-256 of the request body.
    #[arg(long)]
    body_sha256: String,
    /// The server's DID (the envelope's recipient).
    #[arg(long, default_value = "did:web:qg-server")]
    server_did: String,
    /// Now, in Unix seconds, for the freshness check of v2 envelopes.
    #[arg(long, default_value_t = 0)]
    now: i64,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Unmeasured seconds first.
    #[arg(long, default_value_t = 1)]
    warmup: u64,
}

/// One verification as the edge process would make it: parse, then every stateless check.
fn verify(header: &str, facts: &RequestFacts<'_>) -> bool {
    match Envelope::parse(header) {
        Ok(envelope) => envelope.check(facts).all_passed(),
        Err(_) => false,
    }
}

fn facts(a: &Args) -> RequestFacts<'_> {
    RequestFacts {
        method: &a.method,
        path: &a.path,
        body_sha256: &a.body_sha256,
        server_did: &a.server_did,
        now: a.now,
        freshness_seconds: 300,
        require_v2: false,
    }
}

fn main() {
    let args = Arc::new(Args::parse());
    let header =
        Arc::new(std::fs::read_to_string(&args.header_file).expect("--header-file").trim().to_string());
    if let Ok(envelope) = Envelope::parse(&header) {
        let checks = envelope.check(&facts(&args));
        assert!(checks.all_passed(), "the header does not verify: {}", checks.to_json());
    } else {
        panic!("the header does not parse");
    }

    let failed = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let measure_from = start + Duration::from_secs(args.warmup);
    let end = measure_from + Duration::from_secs(args.seconds);
    let workers: Vec<_> = (0..args.threads)
        .map(|_| {
            let (args, header, failed) = (args.clone(), header.clone(), failed.clone());
            std::thread::spawn(move || {
                let facts = facts(&args);
                let mut counted = 0u64;
                let mut counted_time = Duration::ZERO;
                loop {
                    // Check the clock once per batch: a verification takes tens of microseconds.
                    let batch_start = Instant::now();
                    if batch_start >= end {
                        break;
                    }
                    for _ in 0..32 {
                        if !verify(&header, &facts) {
                            failed.store(true, Ordering::Relaxed);
                            return (counted, counted_time);
                        }
                    }
                    let batch_end = Instant::now();
                    if batch_start >= measure_from && batch_end <= end {
                        counted += 32;
                        counted_time += batch_end - batch_start;
                    }
                }
                (counted, counted_time)
            })
        })
        .collect();
    let mut total = 0u64;
    let mut busy = Duration::ZERO;
    for w in workers {
        let (n, t) = w.join().expect("worker");
        total += n;
        busy += t;
    }
    assert!(!failed.load(Ordering::Relaxed), "a verification failed during the run");
    println!(
        "{}",
        json!({
            "threads": args.threads,
            "verifications": total,
            "verifications_per_sec": total as f64 / args.seconds as f64,
            "us_per_verification": if total > 0 { busy.as_secs_f64() * 1e6 / total as f64 } else { f64::NAN },
        })
    );
}

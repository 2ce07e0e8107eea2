//! `edge-load`: drives one MCP tool through the edge's `/mcp` at a fixed concurrency for a fixed
//! time and prints one JSON line: calls per second, p50 and p99 latency in milliseconds, errors.
//! Each call is a self-contained stateless `tools/call` POST (protocol 2025-11-25), as any
//! instance of the edge accepts. The secret comes from BENCH_SECRET. Used by scripts/bench-edge.

use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// The edge's MCP endpoint, e.g. http://127.0.0.1:18281/mcp.
    #[arg(long)]
    url: String,
    /// Tool name.
    #[arg(long)]
    tool: String,
    /// Tool arguments (JSON object).
    #[arg(long, default_value = "{}")]
    arguments: String,
    #[arg(long)]
    concurrency: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Unmeasured seconds first.
    #[arg(long, default_value_t = 2)]
    warmup: u64,
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i]) / 1000.0
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let secret = std::env::var("BENCH_SECRET").expect("BENCH_SECRET");
    let arguments: serde_json::Value = serde_json::from_str(&args.arguments).expect("--arguments is JSON");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": args.tool, "arguments": arguments}})
    .to_string();
    let client =
        reqwest::Client::builder().pool_max_idle_per_host(args.concurrency * 2).http1_only().build().unwrap();

    let start = Instant::now();
    let measure_from = start + Duration::from_secs(args.warmup);
    let end = measure_from + Duration::from_secs(args.seconds);
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (client, body, url, secret) = (client.clone(), body.clone(), args.url.clone(), secret.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies: Vec<u32> = Vec::new();
            let mut errors = 0u64;
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let response = client
                    .post(&url)
                    .header("authorization", format!("Bearer {secret}"))
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .header("mcp-protocol-version", "2025-11-25")
                    .body(body.clone())
                    .send()
                    .await;
                let ok = match response {
                    Ok(r) if r.status().is_success() => match r.bytes().await {
                        Ok(b) => !b.windows(14).any(|w| w == b"\"isError\":true"),
                        Err(_) => false,
                    },
                    _ => false,
                };
                let done = Instant::now();
                if sent >= measure_from && done <= end {
                    if ok {
                        latencies.push(done.duration_since(sent).as_micros().min(u32::MAX as u128) as u32);
                    } else {
                        errors += 1;
                    }
                }
            }
            (latencies, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for w in workers {
        let (l, e) = w.await.unwrap();
        all.extend(l);
        errors += e;
    }
    all.sort_unstable();
    println!(
        "{}",
        json!({
            "calls": all.len(),
            "calls_per_sec": all.len() as f64 / args.seconds as f64,
            "p50_ms": percentile(&all, 0.50),
            "p99_ms": percentile(&all, 0.99),
            "errors": errors,
        })
    );
}

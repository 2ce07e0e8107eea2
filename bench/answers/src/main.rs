//! `answer-load`: asks one question over and over at a fixed concurrency for a fixed time and
//! prints one JSON line: governed answers per second, p50 and p99 latency in milliseconds, and
//! failures. Every answer is parsed and checked (the expected denied source, the expected number
//! of plans); anything else counts as a failure. Used by scripts/bench-answers.
//!
//! Targets:
//! * `v1` — `POST <url>/v1/answer` with an `x-qg-envelope` header: v1 (minted once and reused,
//!   as v1 envelopes are replayable) or v2 (minted for every request: fresh time and nonce);
//! * `mcp` — stateless `tools/call` of `answer_question` (protocol 2025-11-25), bearer secret
//!   from BENCH_SECRET, as the edge serves MCP;
//! * `mcp-session` — the same call over a session (`initialize`, `notifications/initialized`,
//!   then `tools/call` with `mcp-session-id`), one session per worker, as a stateful
//!   Streamable HTTP server such as the Python reference requires; SSE or JSON answers.

use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use querylayer_envelope::{Envelope, Signer};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the did:key of a QueryGraph-style seed (the secret is SHA-256 of it).
    Did {
        #[arg(long)]
        seed: String,
    },
    /// Drive one target and print the measurement.
    Run(RunArgs),
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Target {
    V1,
    Mcp,
    McpSession,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Profile {
    V1,
    V2,
}

#[derive(Parser, Clone)]
struct RunArgs {
    #[arg(long, value_enum)]
    target: Target,
    /// The server's base URL (`/v1/answer` or `/mcp` is appended).
    #[arg(long)]
    url: String,
    #[arg(long)]
    question: String,
    /// The seed of the key bound to a connection (target v1).
    #[arg(long)]
    seed: Option<String>,
    /// The envelope profile (target v1).
    #[arg(long, value_enum, default_value = "v1")]
    envelope: Profile,
    /// The envelope's recipient (the server's DID).
    #[arg(long, default_value = "did:web:qg-server")]
    recipient: String,
    /// The one source every answer must name as denied.
    #[arg(long)]
    expect_denied: String,
    /// How many planned queries every answer must carry.
    #[arg(long)]
    expect_plans: usize,
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

/// The JSON-RPC message of an MCP answer: the body itself, or the last `data:` line of an SSE
/// stream.
fn jsonrpc_message(content_type: &str, body: &[u8]) -> Option<Value> {
    if content_type.starts_with("text/event-stream") {
        let text = std::str::from_utf8(body).ok()?;
        text.lines()
            .rev()
            .filter_map(|l| l.strip_prefix("data:"))
            .find_map(|d| serde_json::from_str(d.trim()).ok())
    } else {
        serde_json::from_slice(body).ok()
    }
}

/// The governed answer's shape: the expected denial, the expected number of plans.
fn answer_ok(answer: &Value, args: &RunArgs) -> bool {
    answer["denied_sources"] == json!([args.expect_denied])
        && answer["plans"].as_array().is_some_and(|p| p.len() == args.expect_plans)
        && answer["answer"].as_str().is_some_and(|a| !a.is_empty())
}

struct Worker {
    client: reqwest::Client,
    args: RunArgs,
    body: String,
    body_sha256: String,
    signer: Option<Signer>,
    v1_header: Option<String>,
    /// `Bearer <BENCH_SECRET>`, when that is set.
    bearer: Option<String>,
    session: Option<String>,
    id: u64,
    name: String,
}

impl Worker {
    fn envelope(&mut self) -> String {
        if let Some(h) = &self.v1_header {
            return h.clone();
        }
        let signer = self.signer.as_ref().expect("--seed");
        let payload = json!({"bodySha256": self.body_sha256});
        let now = chrono::Utc::now();
        self.id += 1;
        // Unique per sender within the freshness window: worker, time, counter.
        let nonce = format!("{}-{:x}-{:x}", self.name, now.timestamp_nanos_opt().unwrap_or(0), self.id);
        Envelope::mint_v2(
            signer,
            &self.args.recipient,
            "invoke",
            "/v1/answer",
            &payload,
            "POST",
            &now.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            &nonce,
        )
        .to_header_json()
    }

    async fn mcp_post(&mut self, message: Value) -> Result<reqwest::Response, reqwest::Error> {
        let mut request = self
            .client
            .post(format!("{}/mcp", self.args.url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(bearer) = &self.bearer {
            request = request.header("authorization", bearer);
        }
        if let Some(s) = &self.session {
            request = request.header("mcp-session-id", s);
        }
        request.body(message.to_string()).send().await
    }

    /// `initialize` and `notifications/initialized`, keeping the session id.
    async fn open_session(&mut self) -> Result<(), String> {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "answer-load", "version": "0.1.0"}}});
        let r = self.mcp_post(init).await.map_err(|e| e.to_string())?;
        if !r.status().is_success() {
            return Err(format!("initialize answered {}", r.status()));
        }
        self.session = r.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
        if self.session.is_none() {
            return Err("initialize gave no mcp-session-id".into());
        }
        r.bytes().await.map_err(|e| e.to_string())?;
        let r = self
            .mcp_post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await
            .map_err(|e| e.to_string())?;
        if !r.status().is_success() {
            return Err(format!("notifications/initialized answered {}", r.status()));
        }
        r.bytes().await.map_err(|e| e.to_string())?;
        Ok(())
    }

    /// One governed answer; true when it came back and had the expected shape.
    async fn ask(&mut self) -> bool {
        match self.args.target {
            Target::V1 => {
                let header = self.envelope();
                let response = self
                    .client
                    .post(format!("{}/v1/answer", self.args.url))
                    .header("content-type", "application/json")
                    .header("x-qg-envelope", header)
                    .body(self.body.clone())
                    .send()
                    .await;
                match response {
                    Ok(r) if r.status().is_success() => match r.bytes().await {
                        Ok(b) => serde_json::from_slice::<Value>(&b).is_ok_and(|a| answer_ok(&a, &self.args)),
                        Err(_) => false,
                    },
                    _ => false,
                }
            }
            Target::Mcp | Target::McpSession => {
                self.id += 1;
                let call = json!({"jsonrpc": "2.0", "id": self.id, "method": "tools/call",
                                  "params": {"name": "answer_question", "arguments": {"question": self.args.question}}});
                let response = self.mcp_post(call).await;
                match response {
                    Ok(r) if r.status().is_success() => {
                        let ct = r
                            .headers()
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        match r.bytes().await {
                            Ok(b) => jsonrpc_message(&ct, &b).is_some_and(|m| {
                                m["result"]["isError"] != json!(true)
                                    && answer_ok(&m["result"]["structuredContent"], &self.args)
                            }),
                            Err(_) => false,
                        }
                    }
                    _ => false,
                }
            }
        }
    }
}

async fn run(args: RunArgs) {
    let body = json!({"question": args.question}).to_string();
    let body_sha256 = hex::encode(Sha256::digest(body.as_bytes()));
    let signer = args.seed.as_deref().map(|s| Signer::from_seed_bytes(s.as_bytes()));
    if args.target == Target::V1 && signer.is_none() {
        panic!("--target v1 needs --seed");
    }
    let v1_header = match (&signer, args.envelope) {
        (Some(s), Profile::V1) if args.target == Target::V1 => Some(
            Envelope::mint_v1(
                s,
                &args.recipient,
                "invoke",
                "/v1/answer",
                &json!({"bodySha256": body_sha256}),
                &chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            )
            .to_header_json(),
        ),
        _ => None,
    };
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency * 2)
        .http1_only()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();

    let start = Instant::now();
    let measure_from = start + Duration::from_secs(args.warmup);
    let end = measure_from + Duration::from_secs(args.seconds);
    let mut workers = Vec::new();
    for n in 0..args.concurrency {
        let mut worker = Worker {
            client: client.clone(),
            args: args.clone(),
            body: body.clone(),
            body_sha256: body_sha256.clone(),
            signer: signer.clone(),
            v1_header: v1_header.clone(),
            bearer: std::env::var("BENCH_SECRET").ok().map(|s| format!("Bearer {s}")),
            session: None,
            id: 0,
            name: format!("w{n}"),
        };
        workers.push(tokio::spawn(async move {
            if worker.args.target == Target::McpSession {
                if let Err(e) = worker.open_session().await {
                    panic!("could not open an MCP session: {e}");
                }
            }
            let mut latencies: Vec<u32> = Vec::new();
            let mut errors = 0u64;
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let ok = worker.ask().await;
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
            "answers": all.len(),
            "answers_per_sec": all.len() as f64 / args.seconds as f64,
            "p50_ms": percentile(&all, 0.50),
            "p99_ms": percentile(&all, 0.99),
            "errors": errors,
        })
    );
}

#[tokio::main]
async fn main() {
    match Cli::parse().command {
        Command::Did { seed } => println!("{}", Signer::from_seed_bytes(seed.as_bytes()).did_key()),
        Command::Run(args) => run(args).await,
    }
}

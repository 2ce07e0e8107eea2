//! `querylayer worker`: the background jobs, as a login holding `querylayer_worker` (EXECUTE on
//! the worker functions and nothing else). Each pass takes the due claim-evidence jobs, fetches
//! every source, and reports what it saw (HTTP status, SHA-256 of the body, a short text
//! excerpt); the database decides what that means and opens human reviews. Each pass also closes
//! the runs still open past their deadline, and fails closed the Agent Console tasks whose binding
//! went while nobody touched them (a connection that expired). On their own schedules it runs the
//! form screening purge, retention (sql/160_retention.sql) and, with `--witness`, the ledger
//! checkpoints (sql/185_checkpoints.sql, docs/ledger.md). Bodies and excerpts are never logged.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::task::JoinSet;
use uuid::Uuid;

use crate::db::{parse, Call, Db};
use crate::error::Error;
use crate::shutdown_signal;

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// PostgreSQL connection string of a login in the querylayer_worker role.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// Run one pass (runs past their deadline, the due evidence jobs, unbound console tasks,
    /// retention, the purge and checkpoints) and exit: for tests and cron.
    #[arg(long)]
    pub once: bool,

    /// Seconds between passes.
    #[arg(long, env = "QUERYLAYER_WORKER_INTERVAL", default_value_t = 60)]
    pub interval_secs: u64,

    /// Seconds between form screening retention purges; 0 turns the purge off.
    #[arg(long, env = "QUERYLAYER_PURGE_INTERVAL", default_value_t = 3600)]
    pub purge_interval_secs: u64,

    /// Seconds between retention passes (month partitions kept ready, aged-out months dropped
    /// with their signed summaries, expired idempotency keys and nonces deleted); 0 turns them off.
    #[arg(long, env = "QUERYLAYER_RETENTION_INTERVAL", default_value_t = 3600)]
    pub retention_interval_secs: u64,

    /// Open runs past their deadline closed per site and pass.
    #[arg(long, default_value_t = 100)]
    pub close_batch_size: i32,

    /// Witnesses of the ledger (directories or postgres:// URLs, comma-separated): each pass that
    /// is due checkpoints every site whose ledger grew and brings them up to date. None: no
    /// checkpoints.
    #[arg(long = "witness", env = "QUERYLAYER_WITNESS", value_delimiter = ',')]
    pub witnesses: Vec<String>,

    /// Seconds between checkpoints (with --witness).
    #[arg(long, env = "QUERYLAYER_CHECKPOINT_INTERVAL", default_value_t = 300)]
    pub checkpoint_interval_secs: u64,

    /// Evidence jobs taken per batch (a pass takes batches until fewer are due, at most 10).
    #[arg(long, default_value_t = 20)]
    pub batch_size: i32,

    /// Sources fetched at the same time.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,

    /// Seconds a whole fetch (connect, redirects, body) may take.
    #[arg(long, default_value_t = 20)]
    pub fetch_timeout_secs: u64,

    /// Redirects followed at most.
    #[arg(long, default_value_t = 5)]
    pub max_redirects: usize,

    /// The largest body that is hashed; a larger source is reported unhashed (an error attempt).
    #[arg(long, default_value_t = 10 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Also fetch sources on loopback, private, link-local and other non-public addresses.
    /// Off by default: evidence URLs come from agents.
    #[arg(long)]
    pub allow_private_networks: bool,
}

/// Characters of text kept as the excerpt reviewers see.
const EXCERPT_CHARS: usize = 500;
/// Bytes of the body read for the excerpt (markup included).
const EXCERPT_SOURCE_BYTES: usize = 64 * 1024;
/// Batches a pass takes at most (so a pass ends even when jobs fall due as fast as it works).
const MAX_BATCHES_PER_PASS: usize = 10;

/// Runs the worker; returns the process exit code.
pub async fn run(args: WorkerArgs) -> i32 {
    let db = match Db::connect(&args.database_url, args.concurrency.max(1) + 1, Duration::from_secs(60)) {
        Ok(db) => db,
        Err(e) => {
            tracing::error!("{e}");
            return 2;
        }
    };
    if let Err(reason) = crate::compat::require(&db).await {
        tracing::error!("{reason}");
        return 2;
    }
    let fetcher = match Fetcher::new(&args) {
        Ok(f) => Arc::new(f),
        Err(e) => {
            tracing::error!("cannot build the HTTP client: {e}");
            return 2;
        }
    };
    let purge_every = (args.purge_interval_secs > 0).then(|| Duration::from_secs(args.purge_interval_secs));
    let mut last_purge: Option<Instant> = None;
    let retention_every =
        (args.retention_interval_secs > 0).then(|| Duration::from_secs(args.retention_interval_secs));
    let mut last_retention: Option<Instant> = None;
    let witnesses = match args
        .witnesses
        .iter()
        .map(|w| crate::ledger::witness::AnyWitness::open(w.trim()))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(w) => w,
        Err(e) => {
            tracing::error!("--witness: {e}");
            return 2;
        }
    };
    let mut last_checkpoint: Option<Instant> = None;
    tracing::info!(
        once = args.once,
        interval_secs = args.interval_secs,
        purge_interval_secs = args.purge_interval_secs,
        "querylayer worker started"
    );
    // SIGTERM or Ctrl-C: the pass in progress finishes (its jobs are reported), then the worker stops.
    let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    loop {
        let mut ok = true;
        if let Err(e) = close_expired_runs(&db, args.close_batch_size).await {
            failed("closing runs past their deadline", &e);
            ok = false;
        }
        if let Err(e) = reverify_due_evidence(&db, &fetcher, &args).await {
            failed("evidence re-verification", &e);
            ok = false;
        }
        if let Err(e) = fail_unbound_tasks(&db).await {
            failed("console task binding check", &e);
            ok = false;
        }
        if let Some(every) = retention_every {
            if last_retention.is_none_or(|at| at.elapsed() >= every) {
                match apply_retention(&db).await {
                    Ok(()) => last_retention = Some(Instant::now()),
                    Err(e) => {
                        failed("retention", &e);
                        ok = false;
                    }
                }
            }
        }
        if let Some(every) = purge_every {
            if last_purge.is_none_or(|at| at.elapsed() >= every) {
                match purge_form_screening(&db).await {
                    Ok(()) => last_purge = Some(Instant::now()),
                    Err(e) => {
                        failed("form screening purge", &e);
                        ok = false;
                    }
                }
            }
        }
        if !witnesses.is_empty()
            && last_checkpoint
                .is_none_or(|at| at.elapsed() >= Duration::from_secs(args.checkpoint_interval_secs))
        {
            match checkpoint(&db, &witnesses).await {
                Ok(()) => last_checkpoint = Some(Instant::now()),
                Err(e) => {
                    tracing::error!(error = %e, "checkpoints failed");
                    ok = false;
                }
            }
        }
        if args.once {
            return if ok { 0 } else { 1 };
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(args.interval_secs)) => {}
            _ = stop.wait_for(|stopping| *stopping) => {
                tracing::info!("stopped");
                return 0;
            }
        }
    }
}

/// Checkpoints every site whose ledger grew and brings every witness up to date.
async fn checkpoint(db: &Db, witnesses: &[crate::ledger::witness::AnyWitness]) -> Result<(), String> {
    let client = db.client().await.map_err(|e| e.message)?;
    let summary = crate::ledger::checkpoint_and_sync(&client, None, witnesses).await?;
    let made =
        summary["checkpoints"].as_array().map_or(0, |c| c.iter().filter(|c| c["created"] == true).count());
    tracing::info!(checkpoints = made, witnesses = witnesses.len(), "ledger checkpoints witnessed");
    Ok(())
}

/// A pass that the database refused or could not serve is an operator's problem: an error line
/// (with the detail of a 5xx, which `Error::log` keeps out of responses but not out of logs).
fn failed(what: &str, e: &Error) {
    if e.status.is_server_error() {
        e.log(what);
    } else {
        tracing::error!(code = e.code, message = %e.message, "{what} failed");
    }
}

/// A job the database handed out: what to fetch. The recorded hash stays in the database.
#[derive(Debug, Deserialize)]
struct Job {
    job_id: Uuid,
    evidence_id: Uuid,
    source_url: String,
}

/// What the database made of one attempt.
#[derive(Debug, Deserialize)]
struct Recorded {
    status: String,
    review_id: Option<Uuid>,
}

async fn reverify_due_evidence(db: &Db, fetcher: &Arc<Fetcher>, args: &WorkerArgs) -> Result<(), Error> {
    for _ in 0..MAX_BATCHES_PER_PASS {
        let claim = Call::new("worker_claim_evidence_jobs").arg("p_limit", args.batch_size);
        let jobs: Vec<Job> = parse(db.call_as_operator(&claim).await?)?;
        let taken = jobs.len();
        let limit = Arc::new(tokio::sync::Semaphore::new(args.concurrency.max(1)));
        let mut running = JoinSet::new();
        for job in jobs {
            let (db, fetcher, limit) = (db.clone(), fetcher.clone(), limit.clone());
            running.spawn(async move {
                let _permit = limit.acquire_owned().await;
                reverify(&db, &fetcher, job).await
            });
        }
        let mut failed = None;
        while let Some(done) = running.join_next().await {
            match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failed = Some(e),
                Err(e) => failed = Some(Error::internal(format!("a re-verification task failed: {e}"))),
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if taken < args.batch_size.max(1) as usize {
            break;
        }
    }
    Ok(())
}

/// Fetches one source and reports the observation. The job is `running` until reported; a
/// failed report leaves it so, and the error ends the pass.
async fn reverify(db: &Db, fetcher: &Fetcher, job: Job) -> Result<(), Error> {
    let started = Instant::now();
    let seen = fetcher.fetch(&job.source_url).await;
    let record = Call::new("worker_record_evidence_attempt")
        .arg("p_job_id", job.job_id)
        .arg("p_http_status", seen.http_status)
        .arg("p_observed_sha256", seen.sha256)
        .arg("p_observed_excerpt", seen.excerpt);
    let recorded: Recorded = parse(db.call_as_operator(&record).await?)?;
    tracing::info!(
        job_id = %job.job_id,
        evidence_id = %job.evidence_id,
        http_status = seen.http_status,
        fetch_problem = seen.problem,
        status = recorded.status,
        review_opened = recorded.review_id.is_some(),
        duration_ms = started.elapsed().as_millis() as u64,
        "evidence re-verified"
    );
    Ok(())
}

/// Closes the runs still open past their deadline, as `cancelled` (`deadline_exceeded`).
async fn close_expired_runs(db: &Db, batch: i32) -> Result<(), Error> {
    let result: Value =
        db.call_as_operator(&Call::new("worker_close_expired_runs").arg("p_limit", batch)).await?;
    let closed = result.get("closed").and_then(|v| v.as_i64()).unwrap_or(0);
    if closed > 0 {
        tracing::info!(closed, run_ids = %result["run_ids"], "closed runs past their deadline");
    }
    Ok(())
}

async fn apply_retention(db: &Db) -> Result<(), Error> {
    let result: Value = db.call_as_operator(&Call::new("apply_retention")).await?;
    let dropped = result.get("dropped").and_then(|v| v.as_array()).map(|d| d.len()).unwrap_or(0);
    let rows: i64 =
        result["dropped"].as_array().into_iter().flatten().filter_map(|d| d["rows"].as_i64()).sum();
    tracing::info!(
        partitions_created = %result["created"],
        partitions_dropped = dropped,
        rows_dropped = rows,
        idempotency_keys_deleted = result.get("idempotency_keys_deleted").and_then(|v| v.as_i64()),
        nonces_deleted = result.get("nonces_deleted").and_then(|v| v.as_i64()),
        retention_days = result.get("retention_days").and_then(|v| v.as_i64()),
        "retention"
    );
    Ok(())
}

/// Console tasks whose connection expired (or whose session, profile or permission went without
/// a transaction to notice) fail closed with their reason; logs turn ids only.
async fn fail_unbound_tasks(db: &Db) -> Result<(), Error> {
    let result: Value = db.call_as_operator(&Call::new("worker_fail_unbound_tasks")).await?;
    let closed = result.get("closed").and_then(|v| v.as_array()).cloned().unwrap_or_default();
    for turn in &closed {
        let turn_id = turn.get("turn_id").and_then(|v| v.as_str()).unwrap_or_default();
        tracing::info!(turn_id, "console task failed closed: its binding went");
    }
    tracing::info!(closed = closed.len(), "console task binding check");
    Ok(())
}

async fn purge_form_screening(db: &Db) -> Result<(), Error> {
    let result: Value = db.call_as_operator(&Call::new("purge_form_screening")).await?;
    let deleted = result.get("deleted").and_then(|v| v.as_i64());
    let retention_days = result.get("retention_days").and_then(|v| v.as_i64());
    tracing::info!(deleted, retention_days, "form screening retention purge");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Fetching.

/// What one fetch saw. `http_status` is None when no response arrived; `sha256` is None when the
/// body could not be read whole (the database then records an error attempt).
#[derive(Debug, Default)]
struct Observation {
    http_status: Option<i32>,
    sha256: Option<String>,
    excerpt: Option<String>,
    /// Why the fetch fell short, for the log (never a URL or body).
    problem: Option<&'static str>,
}

impl Observation {
    fn failed(problem: &'static str) -> Self {
        Observation { problem: Some(problem), ..Observation::default() }
    }
}

struct Fetcher {
    client: reqwest::Client,
    max_body_bytes: usize,
    allow_private: bool,
}

impl Fetcher {
    fn new(args: &WorkerArgs) -> Result<Self, reqwest::Error> {
        let allow_private = args.allow_private_networks;
        let max_redirects = args.max_redirects;
        let redirects = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > max_redirects {
                attempt.error("too many redirects")
            } else if !allow_private && names_non_public_address(attempt.url().host_str()) {
                attempt.error("a redirect to a non-public address")
            } else {
                attempt.follow()
            }
        });
        let timeout = Duration::from_secs(args.fetch_timeout_secs.max(1));
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .redirect(redirects)
            // Connect directly: a proxy would resolve names where the address check cannot see.
            .no_proxy()
            .user_agent(concat!("querylayer-evidence-worker/", env!("CARGO_PKG_VERSION")));
        if !allow_private {
            builder = builder.dns_resolver(Arc::new(PublicAddressesOnly));
        }
        Ok(Fetcher { client: builder.build()?, max_body_bytes: args.max_body_bytes, allow_private })
    }

    async fn fetch(&self, url: &str) -> Observation {
        let Ok(parsed) = reqwest::Url::parse(url) else {
            return Observation::failed("not a URL");
        };
        if !matches!(parsed.scheme(), "http" | "https") {
            return Observation::failed("not an http(s) URL");
        }
        if !self.allow_private && names_non_public_address(parsed.host_str()) {
            return Observation::failed("a non-public address");
        }
        let mut response = match self.client.get(parsed).send().await {
            Ok(r) => r,
            Err(e) if e.is_timeout() => return Observation::failed("timeout"),
            Err(e) if e.is_redirect() => return Observation::failed("redirects refused or too many"),
            Err(e) if e.is_connect() => return Observation::failed("cannot connect"),
            Err(_) => return Observation::failed("request failed"),
        };
        let http_status = Some(i32::from(response.status().as_u16()));
        let kind = TextKind::of(response.headers().get(reqwest::header::CONTENT_TYPE));
        let mut hasher = Sha256::new();
        let mut size = 0usize;
        let mut head = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    size += chunk.len();
                    if size > self.max_body_bytes {
                        return Observation {
                            http_status,
                            problem: Some("body larger than --max-body-bytes"),
                            ..Observation::default()
                        };
                    }
                    hasher.update(&chunk);
                    let room = EXCERPT_SOURCE_BYTES.saturating_sub(head.len());
                    head.extend_from_slice(&chunk[..room.min(chunk.len())]);
                }
                Ok(None) => break,
                Err(e) => {
                    return Observation {
                        http_status,
                        problem: Some(if e.is_timeout() { "timeout" } else { "body read failed" }),
                        ..Observation::default()
                    }
                }
            }
        }
        Observation {
            http_status,
            sha256: Some(hex(&hasher.finalize())),
            excerpt: excerpt(kind, &head),
            problem: None,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Resolves names to their public addresses only; a name with none fails to resolve.
struct PublicAddressesOnly;

impl reqwest::dns::Resolve for PublicAddressesOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let public: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.filter(|a| is_public(a.ip())).collect();
            if public.is_empty() {
                return Err("the name resolves to no public address".into());
            }
            Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// True when a URL's host is an IP literal outside the public internet. Names are checked when
/// they resolve.
fn names_non_public_address(host: Option<&str>) -> bool {
    let Some(host) = host else { return true };
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    literal.parse::<IpAddr>().is_ok_and(|ip| !is_public(ip))
}

fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // unique local
        || (s[0] & 0xffc0) == 0xfe80 // link local
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || (s[0] == 0x0064 && s[1] == 0xff9b)) // NAT64: could reach any IPv4 address
}

/// Whether a body is text a reviewer can read, and whether it is markup.
#[derive(Clone, Copy, PartialEq, Debug)]
enum TextKind {
    Plain,
    Markup,
    Binary,
}

impl TextKind {
    fn of(content_type: Option<&reqwest::header::HeaderValue>) -> Self {
        let Some(value) = content_type.and_then(|v| v.to_str().ok()) else {
            return TextKind::Binary;
        };
        let mime = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        if mime == "text/html"
            || mime == "application/xhtml+xml"
            || mime.ends_with("/xml")
            || mime.ends_with("+xml")
        {
            TextKind::Markup
        } else if mime.starts_with("text/") || mime == "application/json" || mime.ends_with("+json") {
            TextKind::Plain
        } else {
            TextKind::Binary
        }
    }
}

/// The first ~500 characters of a textual body, without markup, scripts or styles, whitespace
/// collapsed. None for binary bodies.
fn excerpt(kind: TextKind, head: &[u8]) -> Option<String> {
    if kind == TextKind::Binary {
        return None;
    }
    let text = String::from_utf8_lossy(head);
    let text = if kind == TextKind::Markup { strip_markup(&text) } else { text.into_owned() };
    let mut out = String::new();
    let mut count = 0;
    for word in text.split_whitespace() {
        let word: String = word.chars().filter(|c| !c.is_control() && *c != '\u{fffd}').collect();
        if word.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push(' ');
            count += 1;
        }
        for c in word.chars() {
            if count == EXCERPT_CHARS {
                return Some(out);
            }
            out.push(c);
            count += 1;
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Text outside tags, comments, scripts and styles, with the common entities decoded.
fn strip_markup(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let lower = html.to_ascii_lowercase();
    let mut i = 0;
    while i < html.len() {
        let rest = &lower[i..];
        if rest.starts_with("<!--") {
            i += rest.find("-->").map_or(rest.len(), |end| end + 3);
        } else if let Some(tag) = ["<script", "<style"].iter().find(|t| rest.starts_with(**t)) {
            let close = format!("</{}", &tag[1..]);
            i += rest
                .find(&close)
                .and_then(|end| rest[end..].find('>').map(|gt| end + gt + 1))
                .unwrap_or(rest.len());
            out.push(' ');
        } else if rest.starts_with('<') {
            i += rest.find('>').map_or(rest.len(), |end| end + 1);
            out.push(' ');
        } else {
            let next = rest.find('<').unwrap_or(rest.len());
            out.push_str(&html[i..i + next]);
            i += next;
        }
    }
    out.replace("&nbsp;", " ")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_fetched_by_default() {
        for private in [
            "127.0.0.1",
            "[::1]",
            "10.1.2.3",
            "192.168.0.1",
            "169.254.169.254",
            "100.64.0.1",
            "[fd00::1]",
            "[::ffff:127.0.0.1]",
            "0.0.0.0",
        ] {
            assert!(names_non_public_address(Some(private)), "{private}");
        }
        for public in ["93.184.216.34", "[2606:4700::1]", "example.com"] {
            assert!(!names_non_public_address(Some(public)), "{public}");
        }
    }

    #[test]
    fn excerpts_are_short_text_without_markup() {
        let html = b"<html><head><style>p{color:red}</style><script>var s='x';</script></head>\
                     <body><!-- note --><h1>Prices</h1>\n<p>Plans &amp; what   they include.</p></body></html>";
        assert_eq!(excerpt(TextKind::Markup, html).as_deref(), Some("Prices Plans & what they include."));
        assert_eq!(excerpt(TextKind::Binary, b"\x89PNG"), None);
        let long = "word ".repeat(400);
        let cut = excerpt(TextKind::Plain, long.as_bytes()).unwrap();
        assert_eq!(cut.chars().count(), EXCERPT_CHARS);
        let ct = reqwest::header::HeaderValue::from_static("text/html; charset=utf-8");
        assert_eq!(TextKind::of(Some(&ct)), TextKind::Markup);
        assert_eq!(TextKind::of(None), TextKind::Binary);
    }

    #[test]
    fn hashes_are_lowercase_hex() {
        assert_eq!(
            hex(&Sha256::digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

//! `querylayer worker`: the background jobs, as a login holding `querylayer_worker` (EXECUTE on
//! the worker functions and nothing else). Each pass takes the due claim-evidence jobs, fetches
//! every source, and reports what it saw (HTTP status, SHA-256 of the body, a short text
//! excerpt); the database decides what that means and opens human reviews. Each pass also closes
//! the runs still open past their deadline, and fails closed the Agent Console tasks whose binding
//! went while nobody touched them (a connection that expired). On their own schedules it runs the
//! form screening purge, retention (sql/160_retention.sql) and, with `--witness`, the ledger
//! checkpoints (sql/185_checkpoints.sql, docs/ledger.md); every second it seals the records that
//! writers left pending (sql/020_ledger.sql). Bodies and excerpts are never logged.

mod evidence;
mod excerpt;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Deserialize;
use serde_json::Value;
use tokio::task::JoinSet;
use uuid::Uuid;

use crate::db::{parse, Call, Db};
use crate::error::Error;
use crate::fetch::{FetchLimits, Fetcher};
use crate::state::shutdown_signal;

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

    /// Milliseconds between seals of the records that writers left pending while another
    /// transaction held their site's head (docs/ledger.md, "Writers of one site"); the next writer
    /// of a site seals them too. 0 turns the worker's sealing off.
    #[arg(long, env = "QUERYLAYER_SEAL_INTERVAL_MS", default_value_t = 1000)]
    pub seal_interval_ms: u64,

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
    let limits = FetchLimits {
        allow_private_networks: args.allow_private_networks,
        max_redirects: args.max_redirects,
        fetch_timeout_secs: args.fetch_timeout_secs,
        max_body_bytes: args.max_body_bytes,
        extra_roots_pem: None,
        user_agent: concat!("querylayer-evidence-worker/", env!("CARGO_PKG_VERSION")),
    };
    let fetcher = match Fetcher::new(&limits) {
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
    if args.seal_interval_ms > 0 && !args.once {
        let (db, mut stop, every) = (db.clone(), stop.clone(), Duration::from_millis(args.seal_interval_ms));
        tokio::spawn(async move {
            loop {
                if let Err(e) = seal(&db).await {
                    failed("sealing pending ledger records", &e);
                }
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stop.wait_for(|stopping| *stopping) => return,
                }
            }
        });
    }
    loop {
        let mut ok = true;
        if args.once && args.seal_interval_ms > 0 {
            if let Err(e) = seal(&db).await {
                failed("sealing pending ledger records", &e);
                ok = false;
            }
        }
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

/// Seals what writers left pending, on every site that has any (`seal_ledger`).
async fn seal(db: &Db) -> Result<(), Error> {
    let sealed: Vec<Value> = parse(db.call_as_operator(&Call::new("seal_ledger")).await?)?;
    if !sealed.is_empty() {
        let records: i64 = sealed.iter().filter_map(|s| s["sealed"].as_i64()).sum();
        tracing::info!(sites = sealed.len(), records, "sealed pending ledger records");
    }
    Ok(())
}

/// Checkpoints every site whose ledger grew and brings every witness up to date.
async fn checkpoint(db: &Db, witnesses: &[crate::ledger::witness::AnyWitness]) -> Result<(), String> {
    let client = db.client().await.map_err(|e| e.with_cause())?;
    let summary = crate::ledger::checkpoint_and_sync(&client, None, witnesses).await?;
    let made =
        summary["checkpoints"].as_array().map_or(0, |c| c.iter().filter(|c| c["created"] == true).count());
    tracing::info!(checkpoints = made, witnesses = witnesses.len(), "ledger checkpoints witnessed");
    Ok(())
}

/// A pass that the database refused or could not serve is an operator's problem: an error line
/// (with the detail of a 5xx, which `Error::log` keeps out of responses but not out of logs).
fn failed(what: &str, e: &Error) {
    if e.code == crate::error::Code::Unavailable {
        // What failed (TLS, authentication, refused, unreachable), not only "unavailable".
        tracing::error!(code = e.code.as_str(), "{what} failed: {}", e.with_cause());
    } else if e.status.is_server_error() {
        e.log(what);
    } else {
        tracing::error!(code = e.code.as_str(), message = %e.message, "{what} failed");
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
    let seen = evidence::observe(fetcher, &job.source_url).await;
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

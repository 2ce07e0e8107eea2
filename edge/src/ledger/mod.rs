//! `querylayer ledger …`: verifiable history for operators and auditors. `checkpoint` has the
//! database sign each site's ledger and carries the checkpoints to witnesses outside it; `verify`
//! checks a database (or an export) against the witnesses without trusting anything it computes;
//! `prove` prints a self-contained inclusion proof of one record and `verify-proof` checks one
//! with nothing but trusted keys; `export` writes a site's records with their proofs. docs/ledger.md.

pub mod operator;
pub mod verify;
pub mod witness;

use std::io::Write;

use clap::{Args, Subcommand};
use querylayer_ledger::{InclusionProof, TrustedKeys};
use tokio_postgres::Client;

use witness::{AnyWitness, Witness};

#[derive(Args, Debug)]
pub struct LedgerArgs {
    #[command(subcommand)]
    pub command: LedgerCommand,
}

#[derive(Subcommand, Debug)]
pub enum LedgerCommand {
    /// Sign the next checkpoint of one site (or of every site whose ledger grew) and bring the
    /// witnesses up to date. DATABASE_URL: an operator (querylayer_admin).
    Checkpoint {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Only this site (slug).
        #[arg(long)]
        site: Option<String>,
        /// A witness: a directory, or a postgres:// URL of another database. Repeatable.
        #[arg(long = "witness", env = "QUERYLAYER_WITNESS", value_delimiter = ',', required = true)]
        witnesses: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Check a database (or an export) against the witnesses: every record's canonical form and
    /// chain, every checkpoint's signature, that the history extends every witnessed checkpoint,
    /// and that the live pointers replay their events. Exit status 1 names the first failure.
    Verify {
        /// The database, as a superuser: the verifier reads the tables themselves.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true, conflicts_with = "export")]
        database_url: Option<String>,
        /// An export (`querylayer ledger export`) instead of a database.
        #[arg(long)]
        export: Option<String>,
        #[arg(long = "witness", env = "QUERYLAYER_WITNESS", value_delimiter = ',', required = true)]
        witnesses: Vec<String>,
        /// Trust only these server keys (did:key; repeatable). Default: the database's own keys;
        /// an export needs them named.
        #[arg(long = "trusted-key")]
        trusted_keys: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Print a self-contained inclusion proof of one record (JSON). DATABASE_URL: an operator.
    Prove {
        record_id: uuid::Uuid,
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Prove against the site's checkpoint of this many records (default: its newest).
        #[arg(long)]
        checkpoint_seq: Option<i64>,
    },
    /// Check inclusion proofs (a file of one proof, or of JSON lines) without any database.
    VerifyProof {
        file: String,
        /// Trust the keys of the checkpoints this witness holds, and require the proof's checkpoint
        /// to be one of them.
        #[arg(long = "witness")]
        witnesses: Vec<String>,
        #[arg(long = "trusted-key")]
        trusted_keys: Vec<String>,
    },
    /// A site's records in [--from, --to) as JSON lines, each a self-contained inclusion proof
    /// against the site's newest checkpoint. DATABASE_URL: an operator.
    Export {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        #[arg(long)]
        site: String,
        /// RFC 3339 time (records at or after it).
        #[arg(long)]
        from: Option<String>,
        /// RFC 3339 time (records before it).
        #[arg(long)]
        to: Option<String>,
        /// Write here instead of stdout.
        #[arg(long)]
        out: Option<String>,
    },
    /// Create the witness table in another PostgreSQL database (its owner runs this once).
    WitnessInit {
        #[arg(long)]
        witness: String,
    },
}

/// A connection for `querylayer ledger`, with TLS as the string says (`pgtls`).
pub async fn connect(url: &str) -> Result<Client, String> {
    let mut target = crate::pgtls::parse(url)?;
    if target.config.get_application_name().is_none() {
        target.config.application_name("querylayer-ledger");
    }
    crate::pgtls::connect(&target).await.map_err(|e| format!("cannot connect: {e}"))
}

fn open_all(specs: &[String]) -> Result<Vec<AnyWitness>, String> {
    specs.iter().map(|s| AnyWitness::open(s.trim())).collect()
}

fn time(text: &Option<String>, what: &str) -> Result<Option<chrono::DateTime<chrono::Utc>>, String> {
    text.as_deref()
        .map(|t| {
            chrono::DateTime::parse_from_rfc3339(t)
                .map(|d| d.with_timezone(&chrono::Utc))
                .map_err(|e| format!("--{what} {t:?}: an RFC 3339 time is required ({e})"))
        })
        .transpose()
}

/// Makes checkpoints and brings every witness up to date; returns a summary.
pub async fn checkpoint_and_sync(
    client: &Client,
    site: Option<&str>,
    witnesses: &[AnyWitness],
) -> Result<serde_json::Value, String> {
    let made = operator::create_checkpoints(client, site).await?;
    let mut synced = Vec::new();
    for w in witnesses {
        let n = operator::sync_witness(client, w).await?;
        synced.push(serde_json::json!({"witness": w.describe(), "appended": n}));
    }
    Ok(serde_json::json!({"checkpoints": made, "witnesses": synced}))
}

/// Runs a `querylayer ledger` command; returns the exit status (0 ok, 1 verification failed,
/// 2 the command could not run).
pub async fn run(args: LedgerArgs) -> i32 {
    match run_inner(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("querylayer ledger: {e}");
            2
        }
    }
}

async fn run_inner(args: LedgerArgs) -> Result<i32, String> {
    match args.command {
        LedgerCommand::Checkpoint { database_url, site, witnesses, json } => {
            let client = connect(&database_url).await?;
            let summary = checkpoint_and_sync(&client, site.as_deref(), &open_all(&witnesses)?).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&summary).expect("JSON"));
            } else {
                for c in summary["checkpoints"].as_array().into_iter().flatten() {
                    match c["checkpoint"].as_object() {
                        Some(cp) => println!(
                            "{}: {} checkpoint of {} records, root {}",
                            c["site"].as_str().unwrap_or("?"),
                            if c["created"] == true { "new" } else { "unchanged" },
                            cp["seq"],
                            cp["tree_root"].as_str().unwrap_or("?")
                        ),
                        None => println!("{}: no records yet", c["site"].as_str().unwrap_or("?")),
                    }
                }
                for w in summary["witnesses"].as_array().into_iter().flatten() {
                    println!(
                        "{}: {} checkpoint(s) appended",
                        w["witness"].as_str().unwrap_or("?"),
                        w["appended"]
                    );
                }
            }
            Ok(0)
        }
        LedgerCommand::Verify { database_url, export, witnesses, trusted_keys, json } => {
            let witnesses = open_all(&witnesses)?;
            let keys = TrustedKeys::new(trusted_keys.iter().cloned());
            let report = match (export, database_url) {
                (Some(file), _) => {
                    if keys.is_empty() {
                        return Err(
                            "an export is verified against named server keys: pass --trusted-key did:key:…"
                                .into(),
                        );
                    }
                    let text = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;
                    verify::verify_export(&text, &witnesses, &keys).await?
                }
                (None, Some(url)) => {
                    let client = connect(&url).await?;
                    verify::verify_database(&client, &witnesses, &keys, !trusted_keys.is_empty()).await?
                }
                (None, None) => {
                    return Err("name a database (DATABASE_URL, --database-url) or --export".into())
                }
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&report).expect("JSON"));
            } else {
                for s in &report.sites {
                    let name = if s.site.is_empty() { s.site_id.clone() } else { s.site.clone() };
                    match &s.problem {
                        None => println!(
                            "ok    {name}: {} records, witnessed up to {} in {} checkpoint(s){}",
                            s.records,
                            s.witnessed_seq,
                            s.witnessed_checkpoints,
                            s.notes.iter().map(|n| format!("; {n}")).collect::<String>()
                        ),
                        Some(p) => println!(
                            "FAIL  {name}: {}{}",
                            p.record.as_ref().map(|r| format!("{r}: ")).unwrap_or_default(),
                            p.reason
                        ),
                    }
                }
            }
            Ok(if report.ok { 0 } else { 1 })
        }
        LedgerCommand::Prove { record_id, database_url, checkpoint_seq } => {
            let client = connect(&database_url).await?;
            let proof = operator::prove(&client, record_id, checkpoint_seq).await?;
            println!("{}", serde_json::to_string_pretty(&proof).expect("JSON"));
            Ok(0)
        }
        LedgerCommand::VerifyProof { file, witnesses, trusted_keys } => {
            let text = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;
            let mut keys = TrustedKeys::new(trusted_keys.iter().cloned());
            let witnesses = open_all(&witnesses)?;
            let proofs: Vec<InclusionProof> = match serde_json::from_str::<InclusionProof>(&text) {
                Ok(p) => vec![p],
                Err(_) => text
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .enumerate()
                    .map(|(n, l)| {
                        serde_json::from_str(l)
                            .map_err(|e| format!("{file}: line {}: not an inclusion proof: {e}", n + 1))
                    })
                    .collect::<Result<_, _>>()?,
            };
            let mut held = Vec::new();
            for w in &witnesses {
                for site in proofs
                    .iter()
                    .map(|p| p.checkpoint.site_id.clone())
                    .collect::<std::collections::BTreeSet<_>>()
                {
                    for e in w.entries(&site).await? {
                        keys.insert(&e.checkpoint.key);
                        held.push(e.checkpoint);
                    }
                }
            }
            if keys.is_empty() {
                return Err(
                    "a proof is checked against trusted keys: pass --trusted-key did:key:… or --witness"
                        .into(),
                );
            }
            let mut failed = 0;
            for p in &proofs {
                let verdict = p.verify(&keys).map_err(|e| e.to_string()).and_then(|v| {
                    if !witnesses.is_empty() && !held.contains(&p.checkpoint) {
                        Err(format!(
                            "its checkpoint ({} records, {}) is not witnessed",
                            p.checkpoint.seq, p.checkpoint.checkpointed_at
                        ))
                    } else {
                        Ok(v)
                    }
                });
                match verdict {
                    Ok(v) => println!(
                        "ok    {} {} (record {} of site {}, checkpoint of {} records at {})",
                        v.table, v.id, v.seq, v.site_id, v.checkpoint_seq, v.checkpointed_at
                    ),
                    Err(e) => {
                        failed += 1;
                        println!("FAIL  {} {} (record {}): {e}", p.record.table, p.record.id, p.record.seq);
                    }
                }
            }
            Ok(if failed == 0 { 0 } else { 1 })
        }
        LedgerCommand::Export { database_url, site, from, to, out } => {
            let (from, to) = (time(&from, "from")?, time(&to, "to")?);
            let client = connect(&database_url).await?;
            let mut sink: Box<dyn Write> = match &out {
                Some(path) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(path).map_err(|e| format!("{path}: {e}"))?,
                )),
                None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
            };
            let (written, newer) = operator::export(&client, &site, from, to, &mut sink).await?;
            sink.flush().map_err(|e| e.to_string())?;
            eprintln!("querylayer ledger export: {written} record(s) of site {site} with proofs");
            if newer > 0 {
                eprintln!("querylayer ledger export: {newer} record(s) in the window are newer than the last checkpoint and were left out: run querylayer ledger checkpoint first");
            }
            Ok(0)
        }
        LedgerCommand::WitnessInit { witness } => match AnyWitness::open(&witness)? {
            AnyWitness::Pg(w) => {
                w.init().await?;
                println!("{} is ready", w.describe());
                Ok(0)
            }
            AnyWitness::Dir(_) => {
                Err("a directory needs no set-up; witness-init is for a postgres:// witness".into())
            }
        },
    }
}

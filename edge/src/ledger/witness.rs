//! Witnesses: append-only stores outside the database that keep every site's checkpoints and,
//! beside each, the leaf hashes of the records it adds. One small trait and two sinks: a
//! directory (files written once, fsynced, never replaced) and a table in another PostgreSQL
//! database (insert-only: its trigger refuses UPDATE, DELETE and TRUNCATE). A witness refuses a
//! checkpoint that does not extend the last one it holds for the site: a rewritten history can
//! only be witnessed as a fork, which is refused.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use querylayer_ledger::{Checkpoint, Hash};

/// One checkpoint and the leaf hashes of the records after the site's previous checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub checkpoint: Checkpoint,
    pub leaves: Vec<Hash>,
}

/// Where checkpoints are kept outside the database.
#[allow(async_fn_in_trait)]
pub trait Witness {
    /// Names the witness for messages (no credentials).
    fn describe(&self) -> String;
    /// Keeps an entry. The same entry again is a no-op; a different one for the same site and
    /// sequence number, or one that does not extend the site's last entry, is refused.
    async fn append(&self, entry: &Entry) -> Result<(), String>;
    /// The site's newest checkpoint here.
    async fn latest(&self, site_id: &str) -> Result<Option<Checkpoint>, String>;
    /// Every entry of a site, oldest first.
    async fn entries(&self, site_id: &str) -> Result<Vec<Entry>, String>;
    /// The sites it holds checkpoints of.
    async fn sites(&self) -> Result<Vec<String>, String>;
}

/// Refuses an entry that does not extend `latest`.
fn check_extends(latest: Option<&Checkpoint>, entry: &Entry, witness: &str) -> Result<(), String> {
    let cp = &entry.checkpoint;
    let expected_prev = latest.map(|l| hex::encode(l.hash()));
    let after = latest.map_or(0, |l| l.seq);
    if cp.prev_checkpoint_sha256 != expected_prev || cp.seq <= after {
        return Err(format!(
            "{witness} refuses the checkpoint of site {} at {} records: it does not extend the last one it holds ({})",
            cp.site_id,
            cp.seq,
            latest.map_or("none".to_string(), |l| format!("{} records, {}", l.seq, l.checkpointed_at))
        ));
    }
    if entry.leaves.len() as u64 != cp.seq - after {
        return Err(format!(
            "an entry of {} records must carry {} leaves, not {}",
            cp.seq,
            cp.seq - after,
            entry.leaves.len()
        ));
    }
    Ok(())
}

fn leaves_bytes(leaves: &[Hash]) -> Vec<u8> {
    leaves.concat()
}

fn leaves_from(bytes: &[u8], what: &str) -> Result<Vec<Hash>, String> {
    if bytes.len() % 32 != 0 {
        return Err(format!("{what}: {} bytes is not a whole number of 32-byte leaf hashes", bytes.len()));
    }
    Ok(bytes.chunks(32).map(|c| c.try_into().expect("32 bytes")).collect())
}

/// A directory: `<site id>/<seq, 20 digits>.leaves` (32-byte leaf hashes end to end) then
/// `<site id>/<seq, 20 digits>.json` (the checkpoint), each written to a temporary file, fsynced,
/// linked into place (never over an existing file) and the directory fsynced.
pub struct DirWitness {
    root: PathBuf,
}

impl DirWitness {
    pub fn new(root: impl Into<PathBuf>) -> DirWitness {
        DirWitness { root: root.into() }
    }

    fn site_dir(&self, site_id: &str) -> PathBuf {
        self.root.join(site_id)
    }

    /// Writes `bytes` at `path` once: an existing file must hold exactly these bytes.
    fn write_once(path: &Path, bytes: &[u8]) -> Result<(), String> {
        let dir = path.parent().expect("a file in a directory");
        let tmp =
            dir.join(format!(".tmp-{}-{}", std::process::id(), path.file_name().unwrap().to_string_lossy()));
        let result = (|| {
            let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            match fs::hard_link(&tmp, path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(e),
            }
        })();
        let _ = fs::remove_file(&tmp);
        match result {
            Ok(true) => {
                File::open(dir).and_then(|d| d.sync_all()).map_err(|e| format!("{}: {e}", dir.display()))
            }
            Ok(false) => match fs::read(path) {
                Ok(existing) if existing == bytes => Ok(()),
                Ok(_) => Err(format!(
                    "{} already holds something else; a witness never replaces a file",
                    path.display()
                )),
                Err(e) => Err(format!("{}: {e}", path.display())),
            },
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    fn checkpoint_files(&self, site_id: &str) -> Result<Vec<(u64, PathBuf)>, String> {
        let dir = self.site_dir(site_id);
        let read = match fs::read_dir(&dir) {
            Ok(r) => r,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        };
        let mut files = Vec::new();
        for item in read {
            let path = item.map_err(|e| format!("{}: {e}", dir.display()))?.path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if let Some(seq) = name.strip_suffix(".json").and_then(|s| s.parse::<u64>().ok()) {
                files.push((seq, path));
            }
        }
        files.sort();
        Ok(files)
    }

    fn read_checkpoint(path: &Path) -> Result<Checkpoint, String> {
        let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: not a checkpoint: {e}", path.display()))
    }
}

impl Witness for DirWitness {
    fn describe(&self) -> String {
        format!("the witness directory {}", self.root.display())
    }

    async fn append(&self, entry: &Entry) -> Result<(), String> {
        let cp = &entry.checkpoint;
        let dir = self.site_dir(&cp.site_id);
        let json = serde_json::to_string_pretty(cp).expect("JSON") + "\n";
        let name = format!("{:020}", cp.seq);
        let checkpoint_path = dir.join(format!("{name}.json"));
        if let Ok(existing) = fs::read(&checkpoint_path) {
            return if existing == json.as_bytes() {
                Ok(())
            } else {
                Err(format!(
                    "{} holds another checkpoint of site {} at {} records",
                    self.describe(),
                    cp.site_id,
                    cp.seq
                ))
            };
        }
        let latest = self.latest(&cp.site_id).await?;
        check_extends(latest.as_ref(), entry, &self.describe())?;
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Self::write_once(&dir.join(format!("{name}.leaves")), &leaves_bytes(&entry.leaves))?;
        Self::write_once(&checkpoint_path, json.as_bytes())
    }

    async fn latest(&self, site_id: &str) -> Result<Option<Checkpoint>, String> {
        match self.checkpoint_files(site_id)?.last() {
            Some((_, path)) => Self::read_checkpoint(path).map(Some),
            None => Ok(None),
        }
    }

    async fn entries(&self, site_id: &str) -> Result<Vec<Entry>, String> {
        let mut out = Vec::new();
        for (_, path) in self.checkpoint_files(site_id)? {
            let checkpoint = Self::read_checkpoint(&path)?;
            let leaves_path = path.with_extension("leaves");
            let bytes = fs::read(&leaves_path).map_err(|e| format!("{}: {e}", leaves_path.display()))?;
            out.push(Entry { checkpoint, leaves: leaves_from(&bytes, &leaves_path.display().to_string())? });
        }
        Ok(out)
    }

    async fn sites(&self) -> Result<Vec<String>, String> {
        let read = match fs::read_dir(&self.root) {
            Ok(r) => r,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("{}: {e}", self.root.display())),
        };
        let mut sites: Vec<String> = read
            .filter_map(|i| i.ok())
            .filter(|i| i.path().is_dir())
            .map(|i| i.file_name().to_string_lossy().to_string())
            .filter(|n| !n.starts_with('.'))
            .collect();
        sites.sort();
        Ok(sites)
    }
}

/// The witness table of another PostgreSQL database (`querylayer ledger witness-init` makes it;
/// the login that appends needs only INSERT and SELECT on it).
pub const WITNESS_SCHEMA: &str = "
CREATE SCHEMA IF NOT EXISTS querylayer_witness;
CREATE TABLE IF NOT EXISTS querylayer_witness.checkpoints (
    site_id     uuid NOT NULL,
    seq         bigint NOT NULL CHECK (seq > 0),
    checkpoint  text NOT NULL,
    leaves      bytea NOT NULL,
    received_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (site_id, seq)
);
CREATE OR REPLACE FUNCTION querylayer_witness.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'querylayer_witness.checkpoints is append-only: % is refused', TG_OP USING ERRCODE = '42501';
END
$$;
DROP TRIGGER IF EXISTS append_only ON querylayer_witness.checkpoints;
CREATE TRIGGER append_only BEFORE UPDATE OR DELETE ON querylayer_witness.checkpoints
    FOR EACH ROW EXECUTE FUNCTION querylayer_witness.refuse_change();
ALTER TABLE querylayer_witness.checkpoints ENABLE ALWAYS TRIGGER append_only;
DROP TRIGGER IF EXISTS append_only_truncate ON querylayer_witness.checkpoints;
CREATE TRIGGER append_only_truncate BEFORE TRUNCATE ON querylayer_witness.checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION querylayer_witness.refuse_change();
ALTER TABLE querylayer_witness.checkpoints ENABLE ALWAYS TRIGGER append_only_truncate;
REVOKE UPDATE, DELETE, TRUNCATE ON querylayer_witness.checkpoints FROM PUBLIC;
";

/// A witness in another PostgreSQL database, reached with TLS as its URL's `sslmode` and
/// `sslrootcert` say (`pgtls`, as every connection of the binary).
pub struct PgWitness {
    target: crate::pgtls::PgConnect,
    shown: String,
}

impl PgWitness {
    pub fn new(url: &str) -> Result<PgWitness, String> {
        let target = crate::pgtls::parse(url).map_err(|e| format!("a witness database URL: {e}"))?;
        let host = match target.config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(name)) => name.clone(),
            Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
            None => "?".into(),
        };
        let shown = format!("the witness database {} on {host}", target.config.get_dbname().unwrap_or("?"));
        Ok(PgWitness { target, shown })
    }

    async fn connect(&self) -> Result<tokio_postgres::Client, String> {
        crate::pgtls::connect(&self.target).await.map_err(|e| format!("{}: {e}", self.shown))
    }

    /// Creates the witness table (run once, by the witness database's owner).
    pub async fn init(&self) -> Result<(), String> {
        self.connect().await?.batch_execute(WITNESS_SCHEMA).await.map_err(|e| format!("{}: {e}", self.shown))
    }

    fn parse(&self, text: &str) -> Result<Checkpoint, String> {
        serde_json::from_str(text).map_err(|e| format!("{}: not a checkpoint: {e}", self.shown))
    }
}

impl Witness for PgWitness {
    fn describe(&self) -> String {
        self.shown.clone()
    }

    async fn append(&self, entry: &Entry) -> Result<(), String> {
        let cp = &entry.checkpoint;
        let site = uuid::Uuid::parse_str(&cp.site_id).map_err(|e| e.to_string())?;
        let text = serde_json::to_string(cp).expect("JSON");
        let mut client = self.connect().await?;
        let db = |e: tokio_postgres::Error| format!("{}: {e}", self.shown);
        let tx = client.transaction().await.map_err(db)?;
        tx.execute("SELECT pg_advisory_xact_lock(hashtextextended($1::text, 19))", &[&cp.site_id])
            .await
            .map_err(db)?;
        let existing = tx
            .query_opt(
                "SELECT checkpoint FROM querylayer_witness.checkpoints WHERE site_id = $1 AND seq = $2",
                &[&site, &(cp.seq as i64)],
            )
            .await
            .map_err(db)?;
        if let Some(row) = existing {
            let held = self.parse(row.get(0))?;
            return if &held == cp {
                Ok(())
            } else {
                Err(format!(
                    "{} holds another checkpoint of site {} at {} records",
                    self.shown, cp.site_id, cp.seq
                ))
            };
        }
        let latest = tx
            .query_opt(
                "SELECT checkpoint FROM querylayer_witness.checkpoints WHERE site_id = $1 ORDER BY seq DESC LIMIT 1",
                &[&site],
            )
            .await
            .map_err(db)?
            .map(|r| self.parse(r.get(0)))
            .transpose()?;
        check_extends(latest.as_ref(), entry, &self.shown)?;
        tx.execute(
            "INSERT INTO querylayer_witness.checkpoints (site_id, seq, checkpoint, leaves) VALUES ($1, $2, $3, $4)",
            &[&site, &(cp.seq as i64), &text, &leaves_bytes(&entry.leaves)],
        )
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)
    }

    async fn latest(&self, site_id: &str) -> Result<Option<Checkpoint>, String> {
        let site = uuid::Uuid::parse_str(site_id).map_err(|e| e.to_string())?;
        let client = self.connect().await?;
        let row = client
            .query_opt(
                "SELECT checkpoint FROM querylayer_witness.checkpoints WHERE site_id = $1 ORDER BY seq DESC LIMIT 1",
                &[&site],
            )
            .await
            .map_err(|e| format!("{}: {e}", self.shown))?;
        row.map(|r| self.parse(r.get(0))).transpose()
    }

    async fn entries(&self, site_id: &str) -> Result<Vec<Entry>, String> {
        let site = uuid::Uuid::parse_str(site_id).map_err(|e| e.to_string())?;
        let client = self.connect().await?;
        let rows = client
            .query("SELECT checkpoint, leaves FROM querylayer_witness.checkpoints WHERE site_id = $1 ORDER BY seq", &[&site])
            .await
            .map_err(|e| format!("{}: {e}", self.shown))?;
        rows.iter()
            .map(|r| {
                Ok(Entry { checkpoint: self.parse(r.get(0))?, leaves: leaves_from(r.get(1), &self.shown)? })
            })
            .collect()
    }

    async fn sites(&self) -> Result<Vec<String>, String> {
        let client = self.connect().await?;
        let rows = client
            .query("SELECT DISTINCT site_id::text FROM querylayer_witness.checkpoints ORDER BY 1", &[])
            .await
            .map_err(|e| format!("{}: {e}", self.shown))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}

/// A witness named on the command line: a `postgres://` or `postgresql://` URL, or a directory.
pub enum AnyWitness {
    Dir(DirWitness),
    Pg(PgWitness),
}

impl AnyWitness {
    pub fn open(spec: &str) -> Result<AnyWitness, String> {
        if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
            Ok(AnyWitness::Pg(PgWitness::new(spec)?))
        } else if spec.is_empty() {
            Err("a witness is a directory or a postgres:// URL".to_string())
        } else {
            Ok(AnyWitness::Dir(DirWitness::new(spec)))
        }
    }
}

impl Witness for AnyWitness {
    fn describe(&self) -> String {
        match self {
            AnyWitness::Dir(w) => w.describe(),
            AnyWitness::Pg(w) => w.describe(),
        }
    }
    async fn append(&self, entry: &Entry) -> Result<(), String> {
        match self {
            AnyWitness::Dir(w) => w.append(entry).await,
            AnyWitness::Pg(w) => w.append(entry).await,
        }
    }
    async fn latest(&self, site_id: &str) -> Result<Option<Checkpoint>, String> {
        match self {
            AnyWitness::Dir(w) => w.latest(site_id).await,
            AnyWitness::Pg(w) => w.latest(site_id).await,
        }
    }
    async fn entries(&self, site_id: &str) -> Result<Vec<Entry>, String> {
        match self {
            AnyWitness::Dir(w) => w.entries(site_id).await,
            AnyWitness::Pg(w) => w.entries(site_id).await,
        }
    }
    async fn sites(&self) -> Result<Vec<String>, String> {
        match self {
            AnyWitness::Dir(w) => w.sites().await,
            AnyWitness::Pg(w) => w.sites().await,
        }
    }
}

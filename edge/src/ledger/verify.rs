//! `querylayer ledger verify`: the offline verifier. It trusts nothing the database computes:
//! it reads the rows (as a superuser, with PostgreSQL's own functions only) or an export, and
//! recomputes every canonical hash, the chain, the Merkle tree and the live state's replay
//! itself, then holds them against every checkpoint the witnesses keep. It names the first site,
//! record and reason that fail.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures_util::{pin_mut, TryStreamExt};
use querylayer_ledger::merkle::Frontier;
use querylayer_ledger::{record_leaf, Checkpoint, Hash, InclusionProof, TrustedKeys};
use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use super::witness::{Entry, Witness};

/// Where a site first fails, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Problem {
    /// The record concerned (table, id, seq), when there is one.
    pub record: Option<Value>,
    pub reason: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct SiteReport {
    pub site: String,
    pub site_id: String,
    pub records: u64,
    pub witnessed_checkpoints: usize,
    pub witnessed_seq: u64,
    pub ok: bool,
    pub problem: Option<Problem>,
    /// Facts that are not failures (checkpoints not yet witnessed, checks an export cannot make).
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub ok: bool,
    pub sites: Vec<SiteReport>,
    pub first_failure: Option<Value>,
}

impl Report {
    pub fn new(sites: Vec<SiteReport>) -> Report {
        let first_failure = sites.iter().find(|s| !s.ok).map(|s| {
            let p = s.problem.clone().expect("a failing site has a problem");
            json!({"site": s.site, "site_id": s.site_id, "record": p.record, "reason": p.reason})
        });
        Report { ok: sites.iter().all(|s| s.ok), sites, first_failure }
    }
}

fn problem(record: Option<Value>, reason: impl Into<String>) -> Problem {
    Problem { record, reason: reason.into() }
}

fn hash_of(bytes: &[u8]) -> Hash {
    Sha256::digest(bytes).into()
}

fn genesis(site_id: &str) -> Hash {
    hash_of(format!("querylayer-ledger-genesis:{site_id}").as_bytes())
}

/// The witness's entries of a site, checked on their own: signatures by trusted keys, each
/// naming the one before, and leaves that reproduce every root. Returns the witnessed leaves.
pub fn check_witness(
    site_id: &str,
    entries: &[Entry],
    trusted: &TrustedKeys,
    witness: &str,
) -> Result<Vec<Hash>, Problem> {
    let mut frontier = Frontier::new();
    let mut leaves = Vec::new();
    let mut prev: Option<&Checkpoint> = None;
    for e in entries {
        let cp = &e.checkpoint;
        let at = format!("{witness}, checkpoint of {} records ({})", cp.seq, cp.checkpointed_at);
        if cp.site_id != site_id {
            return Err(problem(None, format!("{at}: it is of site {}", cp.site_id)));
        }
        if let Err(e) = cp.verify(trusted) {
            return Err(problem(None, format!("{at}: {e}")));
        }
        if cp.prev_checkpoint_sha256 != prev.map(|p| hex::encode(p.hash()))
            || cp.seq <= prev.map_or(0, |p| p.seq)
        {
            return Err(problem(None, format!("{at}: it does not name the checkpoint before it")));
        }
        if e.leaves.len() as u64 != cp.seq - prev.map_or(0, |p| p.seq) {
            return Err(problem(None, format!("{at}: it carries {} leaves", e.leaves.len())));
        }
        for leaf in &e.leaves {
            frontier.push(*leaf);
        }
        leaves.extend_from_slice(&e.leaves);
        if Some(frontier.root()) != cp.tree_root_hash() {
            return Err(problem(None, format!("{at}: its leaves do not reproduce its tree root")));
        }
        prev = Some(cp);
    }
    Ok(leaves)
}

/// One chained record as the verifier reads it.
pub struct Record {
    pub table: String,
    pub id: String,
    pub seq: u64,
    pub form: i32,
    /// None: its form is not registered.
    pub canonical: Option<String>,
    pub prev_sha256: Vec<u8>,
    pub content_sha256: Vec<u8>,
    pub record_sha256: Vec<u8>,
}

impl Record {
    fn at(&self) -> Value {
        json!({"table": self.table, "id": self.id, "seq": self.seq})
    }
}

/// A record whose link is still empty: committed, waiting to be sealed into the chain
/// (docs/ledger.md, "Writers of one site").
pub struct PendingRecord {
    pub table: String,
    pub id: String,
    pub form: i32,
    pub canonical: Option<String>,
    pub content_sha256: Vec<u8>,
    /// Its place in `querylayer.ledger_pending` (the order it was written in); None: not named there.
    pub written: Option<i64>,
}

impl PendingRecord {
    fn at(&self) -> Value {
        json!({"table": self.table, "id": self.id, "seq": null})
    }
}

/// Everything the verifier holds about one site of a database.
pub struct SiteHistory {
    pub site: String,
    pub site_id: String,
    /// The chain, in order.
    pub records: Vec<Record>,
    /// The records waiting to be sealed, in the order they were written.
    pub pending: Vec<PendingRecord>,
    /// How many entries `querylayer.ledger_pending` holds for the site.
    pub pending_entries: u64,
    pub head: Option<(u64, Vec<u8>)>,
    pub checkpoints: Vec<Checkpoint>,
    /// (subject, subject_id) → the live state, parsed.
    pub live: BTreeMap<(String, String), Value>,
}

/// Checks one site's history against its witnessed entries (from one or more witnesses).
pub fn check_site(h: &SiteHistory, witnessed: &[(String, Vec<Entry>)], trusted: &TrustedKeys) -> SiteReport {
    let mut report = SiteReport {
        site: h.site.clone(),
        site_id: h.site_id.clone(),
        records: h.records.len() as u64,
        witnessed_checkpoints: witnessed.iter().map(|(_, e)| e.len()).max().unwrap_or(0),
        witnessed_seq: 0,
        ok: true,
        problem: None,
        notes: Vec::new(),
    };
    if let Err(p) = check_site_inner(h, witnessed, trusted, &mut report) {
        report.ok = false;
        report.problem = Some(p);
    }
    report
}

fn check_site_inner(
    h: &SiteHistory,
    witnessed: &[(String, Vec<Entry>)],
    trusted: &TrustedKeys,
    report: &mut SiteReport,
) -> Result<(), Problem> {
    // 1. What the witnesses hold, on its own.
    let mut witness_leaves: Vec<(String, Vec<Hash>, &[Entry])> = Vec::new();
    for (name, entries) in witnessed {
        let leaves = check_witness(&h.site_id, entries, trusted, name)?;
        report.witnessed_seq = report.witnessed_seq.max(leaves.len() as u64);
        witness_leaves.push((name.clone(), leaves, entries));
    }
    // 2. Every record: canonical form, content hash, chain; its leaf against every witness.
    let mut prev = genesis(&h.site_id).to_vec();
    let mut frontier = Frontier::new();
    let mut roots: HashMap<u64, (Hash, Vec<u8>)> = HashMap::new();
    let wanted: BTreeSet<u64> = witness_leaves
        .iter()
        .flat_map(|(_, _, e)| e.iter().map(|e| e.checkpoint.seq))
        .chain(h.checkpoints.iter().map(|c| c.seq))
        .collect();
    for (i, r) in h.records.iter().enumerate() {
        let seq = i as u64 + 1;
        if r.seq != seq {
            return Err(problem(
                Some(r.at()),
                format!("record {seq} is missing or out of order (found {})", r.seq),
            ));
        }
        let Some(canonical) = &r.canonical else {
            return Err(problem(Some(r.at()), format!("unknown ledger form {}", r.form)));
        };
        let content = hash_of(canonical.as_bytes());
        let leaf = record_leaf(seq, &r.table, r.form, &content);
        for (name, leaves, entries) in &witness_leaves {
            if let Some(w) = leaves.get(i) {
                if *w != leaf {
                    let cp = &entries.iter().find(|e| e.checkpoint.seq >= seq).expect("covered").checkpoint;
                    return Err(problem(
                        Some(r.at()),
                        format!(
                            "its canonical form is not the one witnessed: {name} holds the checkpoint of {} records ({}) with another leaf for record {seq}; the record was rewritten after it was witnessed",
                            cp.seq, cp.checkpointed_at
                        ),
                    ));
                }
            }
        }
        if r.prev_sha256 != prev {
            return Err(problem(Some(r.at()), "prev_sha256 does not match the previous record"));
        }
        if r.content_sha256 != content {
            return Err(problem(Some(r.at()), "content does not match content_sha256 (record edited)"));
        }
        if r.record_sha256 != hash_of(&[prev.as_slice(), &content].concat()) {
            return Err(problem(Some(r.at()), "record_sha256 does not match"));
        }
        prev = r.record_sha256.clone();
        frontier.push(leaf);
        if wanted.contains(&seq) {
            roots.insert(seq, (frontier.root(), prev.clone()));
        }
    }
    match &h.head {
        Some((seq, head)) if *seq == h.records.len() as u64 && *head == prev => {}
        Some((seq, _)) => {
            return Err(problem(
                None,
                format!(
                    "the ledger head says {seq} records; the chain holds {} that end elsewhere",
                    h.records.len()
                ),
            ))
        }
        None => return Err(problem(None, "the site has no ledger head")),
    }
    // 3. The present history extends every witnessed checkpoint.
    for (name, _, entries) in &witness_leaves {
        for e in entries.iter() {
            let cp = &e.checkpoint;
            let Some((root, head)) = roots.get(&cp.seq) else {
                return Err(problem(
                    None,
                    format!("{name} holds a checkpoint of {} records ({}), but the history now holds {}: witnessed records are gone", cp.seq, cp.checkpointed_at, h.records.len()),
                ));
            };
            if Some(*root) != cp.tree_root_hash()
                || Some(head.as_slice()) != cp.head_hash().as_ref().map(|h| &h[..])
            {
                return Err(problem(
                    Some(h.records[cp.seq as usize - 1].at()),
                    format!("the history up to record {} no longer produces the checkpoint {name} holds ({}): its chain was relinked", cp.seq, cp.checkpointed_at),
                ));
            }
            if !h.checkpoints.iter().any(|c| c == cp) {
                return Err(problem(
                    None,
                    format!(
                        "the database lost or changed the checkpoint of {} records ({}) that {name} holds",
                        cp.seq, cp.checkpointed_at
                    ),
                ));
            }
        }
    }
    // 4. The database's own checkpoints: signed, and true of the present history.
    let witnessed_max = witness_leaves.iter().map(|(_, l, _)| l.len() as u64).max().unwrap_or(0);
    let mut unwitnessed = 0;
    for cp in &h.checkpoints {
        if let Err(e) = cp.verify(trusted) {
            return Err(problem(
                None,
                format!("the database's checkpoint of {} records ({}): {e}", cp.seq, cp.checkpointed_at),
            ));
        }
        match roots.get(&cp.seq) {
            Some((root, head))
                if Some(*root) == cp.tree_root_hash()
                    && cp.head_hash().is_some_and(|h| h[..] == head[..]) => {}
            _ => {
                return Err(problem(
                    None,
                    format!(
                        "the database's checkpoint of {} records ({}) is not of the present history",
                        cp.seq, cp.checkpointed_at
                    ),
                ))
            }
        }
        if cp.seq > witnessed_max {
            unwitnessed += 1;
        }
    }
    if unwitnessed > 0 {
        report.notes.push(format!("{unwitnessed} checkpoint(s) of the database are not witnessed yet"));
    }
    // 5. The records waiting to be sealed: each its own content, each named once in ledger_pending.
    for r in &h.pending {
        let Some(canonical) = &r.canonical else {
            return Err(problem(Some(r.at()), format!("unknown ledger form {}", r.form)));
        };
        if r.content_sha256 != hash_of(canonical.as_bytes()) {
            return Err(problem(Some(r.at()), "content does not match content_sha256 (record edited)"));
        }
        if r.written.is_none() {
            return Err(problem(
                Some(r.at()),
                "the record is not in the chain and waits for no seal (its ledger_pending entry is gone)",
            ));
        }
    }
    if h.pending_entries != h.pending.len() as u64 {
        return Err(problem(
            None,
            format!(
                "{} records wait to be sealed, but ledger_pending names {}: a pending record is missing",
                h.pending.len(),
                h.pending_entries
            ),
        ));
    }
    if !h.pending.is_empty() {
        report.notes.push(format!(
            "{} record(s) wait to be sealed into the chain (a checkpoint seals them first)",
            h.pending.len()
        ));
    }
    if h.records.len() as u64 > witnessed_max {
        report.notes.push(format!(
            "records {}..{} are after the last witnessed checkpoint",
            witnessed_max + 1,
            h.records.len()
        ));
    }
    // 6. The live state is the replay of its events.
    check_live(h)
}

/// Replays the site's state events (from their canonical forms) and compares the live rows.
fn check_live(h: &SiteHistory) -> Result<(), Problem> {
    let mut state: BTreeMap<(String, String), (Value, Value)> = BTreeMap::new();
    let mut approved: HashMap<String, String> = HashMap::new(); // decision id → proposal id
    let mut proposal_types: HashMap<String, String> = HashMap::new();
    let mut governed_seen = false;
    // The chain, then what waits to be sealed (newer than every sealed record), in written order.
    let replayed = h
        .records
        .iter()
        .map(|r| (r.table.as_str(), &r.id, r.canonical.as_deref(), r.at()))
        .chain(h.pending.iter().map(|r| (r.table.as_str(), &r.id, r.canonical.as_deref(), r.at())));
    for (table, id, canonical, at) in replayed {
        let parsed =
            || -> Value { canonical.and_then(|c| serde_json::from_str(c).ok()).unwrap_or(Value::Null) };
        match table {
            "querylayer.proposals" => {
                let v = parsed();
                proposal_types.insert(id.clone(), v["type"].as_str().unwrap_or_default().to_string());
            }
            "querylayer.proposal_decisions" => {
                let v = parsed();
                if v["decision"] == "approved" {
                    approved.insert(id.clone(), v["proposal_id"].as_str().unwrap_or_default().to_string());
                }
            }
            "querylayer.state_events" => {
                let v = parsed();
                let subject = v["subject"].as_str().unwrap_or_default().to_string();
                let cause = v["cause"].as_str().unwrap_or_default();
                match cause {
                    "baseline" if governed_seen => {
                        return Err(problem(Some(at.clone()), "a baseline state event after governed ones: baselines come only from the upgrade that started keeping events"))
                    }
                    "baseline" => {}
                    "decision" => {
                        governed_seen = true;
                        let decision = v["decision_id"].as_str().unwrap_or_default();
                        let Some(proposal) = approved.get(decision) else {
                            return Err(problem(Some(at.clone()), format!("the state event names decision {decision}, which is not an approval recorded before it")));
                        };
                        let kind = proposal_types.get(proposal).map(String::as_str).unwrap_or_default();
                        let fits = match subject.as_str() {
                            "content_item" => matches!(kind, "publish_lifecycle" | "content_lifecycle"),
                            _ => kind == "topical_map",
                        };
                        if !fits {
                            return Err(problem(Some(at.clone()), format!("the state event of a {subject} names the approval of a {kind} proposal")));
                        }
                    }
                    "operator" if subject != "content_item" => governed_seen = true,
                    other => return Err(problem(Some(at.clone()), format!("a state event of a {subject} with cause {other:?}"))),
                }
                state.insert(
                    (subject, v["subject_id"].as_str().unwrap_or_default().to_string()),
                    (v["state"].clone(), at.clone()),
                );
            }
            _ => {}
        }
    }
    let empty_item = json!({"published_revision_id": null, "published_at": null, "archived_at": null});
    let keys: BTreeSet<&(String, String)> = state.keys().chain(h.live.keys()).collect();
    for key in keys {
        let live = h.live.get(key).cloned().unwrap_or(Value::Null);
        let (replayed, last) = match state.get(key) {
            Some((s, at)) => (s.clone(), Some(at.clone())),
            None if key.0 == "content_item" => (empty_item.clone(), None),
            None => (Value::Null, None),
        };
        if live != replayed {
            let table = match key.0.as_str() {
                "content_item" => "querylayer.content_items",
                "topic" => "querylayer.topics",
                _ => "querylayer.topic_pages",
            };
            return Err(problem(
                Some(json!({"table": table, "id": key.1, "last_state_event": last})),
                format!(
                    "the live {} {} is {} but the replay of its state events says {}: it was changed outside the governed path",
                    key.0, key.1, live, replayed
                ),
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Reading a database: PostgreSQL's own functions only, as a superuser.

const SESSION: &str = "SET TimeZone = 'UTC'; SET IntervalStyle = 'postgres'; SET bytea_output = 'hex';
                       SET extra_float_digits = 1; SET search_path = pg_catalog; SET statement_timeout = 0;";

fn db(e: tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) if d.code().code() == "42501" => format!(
            "{}: querylayer ledger verify reads the tables themselves, as a superuser (or a role that may read schema querylayer past row-level security)",
            d.message()
        ),
        Some(d) => d.message().to_string(),
        None => e.to_string(),
    }
}

/// Reads one site of a database, whole.
pub async fn read_site(client: &Client, site_id: &str, slug: &str) -> Result<SiteHistory, String> {
    let site = uuid::Uuid::parse_str(site_id).map_err(|e| e.to_string())?;
    let tables: Vec<String> = client
        .query("SELECT table_name FROM querylayer.ledger_tables ORDER BY table_name", &[])
        .await
        .map_err(db)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let union: Vec<String> = tables
        .iter()
        .map(|t| {
            format!(
                "SELECT {lit}::text AS tbl, t.id::text, t.chain_seq, t.ledger_form::int4, t.prev_sha256, t.content_sha256, t.record_sha256,
                        (x.j - ARRAY(SELECT k FROM jsonb_object_keys(x.j) AS k WHERE NOT (k = ANY (f.fields))))::text,
                        p.written
                   FROM {t} t CROSS JOIN LATERAL (SELECT to_jsonb(t) AS j) x
                   LEFT JOIN querylayer.ledger_forms f ON f.table_name = {lit} AND f.form = t.ledger_form
                   LEFT JOIN querylayer.ledger_pending p ON p.record_id = t.id AND p.site_id = t.site_id
                  WHERE t.site_id = $1",
                lit = quote_literal(t)
            )
        })
        .collect();
    let sql = format!("{} ORDER BY chain_seq NULLS LAST, written", union.join(" UNION ALL "));
    let rows = client.query_raw(&sql, &[&site]).await.map_err(db)?;
    pin_mut!(rows);
    let (mut records, mut pending) = (Vec::new(), Vec::new());
    while let Some(row) = rows.try_next().await.map_err(db)? {
        match (
            row.get::<_, Option<i64>>(2),
            row.get::<_, Option<Vec<u8>>>(4),
            row.get::<_, Option<Vec<u8>>>(6),
        ) {
            (Some(seq), Some(prev_sha256), Some(record_sha256)) => records.push(Record {
                table: row.get(0),
                id: row.get(1),
                seq: seq as u64,
                form: row.get(3),
                prev_sha256,
                content_sha256: row.get(5),
                record_sha256,
                canonical: row.get(7),
            }),
            _ => pending.push(PendingRecord {
                table: row.get(0),
                id: row.get(1),
                form: row.get(3),
                content_sha256: row.get(5),
                canonical: row.get(7),
                written: row.get(8),
            }),
        }
    }
    let pending_entries = client
        .query_one("SELECT count(*) FROM querylayer.ledger_pending WHERE site_id = $1", &[&site])
        .await
        .map_err(db)?
        .get::<_, i64>(0) as u64;
    let head = client
        .query_opt("SELECT seq, head FROM querylayer.ledger_heads WHERE site_id = $1", &[&site])
        .await
        .map_err(db)?
        .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, Vec<u8>>(1)));
    let checkpoints = client
        .query(
            "SELECT jsonb_build_object('format', 'querylayer-checkpoint-v1', 'site_id', c.site_id, 'seq', c.seq,
                    'head_sha256', encode(c.head_sha256, 'hex'), 'tree_root', encode(c.tree_root, 'hex'),
                    'checkpointed_at', to_char(c.checkpointed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
                    'prev_checkpoint_sha256', encode(c.prev_sha256, 'hex'), 'key', k.did_key, 'signature', c.signature)
               FROM querylayer.ledger_checkpoints c LEFT JOIN querylayer.server_keys k ON k.id = c.server_key_id
              WHERE c.site_id = $1 ORDER BY c.seq",
            &[&site],
        )
        .await
        .map_err(db)?
        .iter()
        .map(|r| serde_json::from_value::<Checkpoint>(r.get(0)).map_err(|e| format!("a stored checkpoint: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let live = client
        .query(
            "SELECT 'content_item', i.id::text, jsonb_build_object('published_revision_id', j->'published_revision_id',
                    'published_at', j->'published_at', 'archived_at', j->'archived_at')
               FROM querylayer.content_items i CROSS JOIN LATERAL (SELECT to_jsonb(i) AS j) x WHERE i.site_id = $1
             UNION ALL
             SELECT 'topic', t.id::text, jsonb_build_object('slug', j->'slug', 'title', j->'title', 'parent_id', j->'parent_id')
               FROM querylayer.topics t CROSS JOIN LATERAL (SELECT to_jsonb(t) AS j) x WHERE t.site_id = $1
             UNION ALL
             SELECT 'topic_page', p.topic_id::text || '/' || p.content_id::text,
                    jsonb_build_object('topic_id', j->'topic_id', 'content_id', j->'content_id', 'role', j->'role')
               FROM querylayer.topic_pages p CROSS JOIN LATERAL (SELECT to_jsonb(p) AS j) x WHERE p.site_id = $1",
            &[&site],
        )
        .await
        .map_err(db)?
        .iter()
        .map(|r| ((r.get::<_, String>(0), r.get::<_, String>(1)), r.get::<_, Value>(2)))
        .collect();
    Ok(SiteHistory {
        site: slug.to_string(),
        site_id: site_id.to_string(),
        records,
        pending,
        pending_entries,
        head,
        checkpoints,
        live,
    })
}

fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Verifies a whole database against the witnesses.
pub async fn verify_database(
    client: &Client,
    witnesses: &[super::witness::AnyWitness],
    extra_keys: &TrustedKeys,
    explicit_keys: bool,
) -> Result<Report, String> {
    client.batch_execute(SESSION).await.map_err(db)?;
    // One snapshot for everything read: the chain, what waits to be sealed, the heads and the
    // live rows agree with each other while writers go on.
    client.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY").await.map_err(db)?;
    let mut trusted = extra_keys.clone();
    if !explicit_keys {
        for r in client.query("SELECT did_key FROM querylayer.server_keys", &[]).await.map_err(db)? {
            trusted.insert(r.get(0));
        }
    }
    let mut sites: BTreeMap<String, String> = client
        .query("SELECT id::text, slug FROM querylayer.sites", &[])
        .await
        .map_err(db)?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for w in witnesses {
        for s in w.sites().await? {
            sites.entry(s).or_insert_with(String::new);
        }
    }
    let mut ordered: Vec<(String, String)> = sites.into_iter().map(|(id, slug)| (slug, id)).collect();
    ordered.sort();
    let mut reports = Vec::new();
    for (slug, id) in ordered {
        let mut witnessed = Vec::new();
        for w in witnesses {
            witnessed.push((w.describe(), w.entries(&id).await?));
        }
        if slug.is_empty() {
            reports.push(SiteReport {
                site: String::new(),
                site_id: id.clone(),
                records: 0,
                witnessed_checkpoints: witnessed.iter().map(|(_, e)| e.len()).max().unwrap_or(0),
                witnessed_seq: 0,
                ok: false,
                problem: Some(problem(
                    None,
                    "the witnesses hold checkpoints of this site, but the database has no such site",
                )),
                notes: Vec::new(),
            });
            continue;
        }
        let history = read_site(client, &id, &slug).await?;
        reports.push(check_site(&history, &witnessed, &trusted));
    }
    client.batch_execute("COMMIT").await.map_err(db)?;
    Ok(Report::new(reports))
}

/// Verifies an export (JSON lines of inclusion proofs) against the witnesses: every proof, its
/// checkpoint witnessed, its leaf the witnessed one.
pub async fn verify_export(
    text: &str,
    witnesses: &[super::witness::AnyWitness],
    trusted: &TrustedKeys,
) -> Result<Report, String> {
    let mut by_site: BTreeMap<String, SiteReport> = BTreeMap::new();
    let mut witnessed: HashMap<String, Vec<(String, Vec<Hash>, Vec<Entry>)>> = HashMap::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = |seq: Option<u64>, id: Option<&str>| Some(json!({"line": n + 1, "seq": seq, "id": id}));
        let proof: InclusionProof = match serde_json::from_str(line) {
            Ok(p) => p,
            Err(e) => {
                let r = by_site.entry(String::new()).or_insert_with(|| empty_report(""));
                if r.ok {
                    r.ok = false;
                    r.problem = Some(problem(
                        at(None, None),
                        format!("line {} is not an inclusion proof: {e}", n + 1),
                    ));
                }
                continue;
            }
        };
        let site_id = proof.checkpoint.site_id.clone();
        if !witnessed.contains_key(&site_id) {
            let mut list = Vec::new();
            for w in witnesses {
                let entries = w.entries(&site_id).await?;
                let leaves = check_witness(&site_id, &entries, trusted, &w.describe()).unwrap_or_default();
                list.push((w.describe(), leaves, entries));
            }
            witnessed.insert(site_id.clone(), list);
        }
        let report = by_site.entry(site_id.clone()).or_insert_with(|| empty_report(&site_id));
        report.records += 1;
        if !report.ok {
            continue;
        }
        let rec = at(Some(proof.record.seq), Some(&proof.record.id));
        if let Err(e) = proof.verify(trusted) {
            report.ok = false;
            report.problem = Some(problem(rec, e.to_string()));
            continue;
        }
        for (name, leaves, entries) in &witnessed[&site_id] {
            if let Err(p) = check_witness(&site_id, entries, trusted, name) {
                report.ok = false;
                report.problem = Some(p);
                break;
            }
            report.witnessed_seq = report.witnessed_seq.max(leaves.len() as u64);
            report.witnessed_checkpoints = report.witnessed_checkpoints.max(entries.len());
            if !entries.iter().any(|e| e.checkpoint == proof.checkpoint) {
                report.ok = false;
                report.problem = Some(problem(
                    rec.clone(),
                    format!(
                        "its checkpoint ({} records, {}) is not one {name} holds",
                        proof.checkpoint.seq, proof.checkpoint.checkpointed_at
                    ),
                ));
                break;
            }
            if leaves.get(proof.record.seq as usize - 1) != Some(&proof.leaf()) {
                report.ok = false;
                report.problem = Some(problem(
                    rec.clone(),
                    format!("its leaf is not the one {name} holds for record {}", proof.record.seq),
                ));
                break;
            }
        }
    }
    for r in by_site.values_mut() {
        r.notes.push(
            "an export holds history, not the live tables: verify a database to check the live state"
                .to_string(),
        );
    }
    Ok(Report::new(by_site.into_values().collect()))
}

fn empty_report(site_id: &str) -> SiteReport {
    SiteReport {
        site: String::new(),
        site_id: site_id.to_string(),
        records: 0,
        witnessed_checkpoints: 0,
        witnessed_seq: 0,
        ok: true,
        problem: None,
        notes: Vec::new(),
    }
}

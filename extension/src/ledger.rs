//! Verifiable history inside the database: the seal mark, the leaf of each chained record, the
//! Merkle tree extended from one checkpoint's frontier to the next, and checkpoints signed with
//! the server key. The algorithms and formats are the `querylayer-ledger` crate's;
//! `sql/020_ledger.sql` decides when a pending record is sealed and `sql/185_checkpoints.sql`
//! when a checkpoint is made; they are the only callers (these functions are granted to the owner
//! role alone, and the server key never leaves the database).

use crate::jsonb::Jsonb;
use crate::spi::{by_index, column, first_row, rows, trigger_data, Arg, Refusal};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::Uuid;
use querylayer_envelope::Signer;
use querylayer_ledger::merkle::Frontier;
use querylayer_ledger::{record_leaf, Checkpoint, Hash};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::cell::Cell;

thread_local! {
    static SEALING: Cell<bool> = const { Cell::new(false) };
    /// The relation id of querylayer.ledger_pending, once looked up.
    static QUEUE: Cell<Option<pg_sys::Oid>> = const { Cell::new(None) };
}

/// Where the pending queue of the head `h` begins, in a statement whose `$2` is this cluster's
/// identifier (`cluster()`): its `pending_from` if that was set in this cluster, else 0, the
/// start (sql/020_ledger.sql, ledger_heads). The one place the rule is written. (COALESCE and
/// CASE are syntax, which no search_path can answer for.)
macro_rules! pending_from {
    () => {
        "COALESCE(CASE WHEN h.pending_cluster OPERATOR(pg_catalog.=) $2 THEN h.pending_from END, 0)"
    };
}
pub(crate) use pending_from;

/// This cluster's system identifier, as `ledger_heads.pending_cluster` holds it.
pub(crate) fn cluster() -> i64 {
    // SAFETY: the control file's identifier, read at start and never changed.
    unsafe { pg_sys::GetSystemIdentifier() as i64 }
}

/// Whether the pending queue numbers its entries by transaction (`xact`, from 0.8.0 on). The
/// library serves the objects of the release before until `ALTER EXTENSION … UPDATE`, and then
/// reads the whole queue, as that release did; so does a backend that cannot find the queue.
pub(crate) fn queue_bounded() -> bool {
    let relid = QUEUE.get().unwrap_or_else(|| {
        let relid = Spi::get_one::<pg_sys::Oid>(
            "SELECT pg_catalog.to_regclass('querylayer.ledger_pending')::pg_catalog.oid",
        )
        .ok()
        .flatten()
        .unwrap_or(pg_sys::InvalidOid);
        if relid != pg_sys::InvalidOid {
            QUEUE.set(Some(relid));
        }
        relid
    });
    // SAFETY: a syscache lookup; an unknown relation or column answers InvalidAttrNumber.
    let found = relid != pg_sys::InvalidOid
        && unsafe { pg_sys::get_attnum(relid, c"xact".as_ptr()) } != pg_sys::InvalidAttrNumber as i16;
    if !found {
        QUEUE.set(None);
    }
    found
}

/// Clears the seal mark when dropped, also when an error unwinds through `ledger_seal`.
pub(crate) struct SealGuard(bool);

impl SealGuard {
    pub(crate) fn set() -> SealGuard {
        SealGuard(SEALING.with(|m| m.replace(true)))
    }
}

impl Drop for SealGuard {
    fn drop(&mut self) {
        let outer = self.0;
        SEALING.with(|m| m.set(outer));
    }
}

pub fn clear() {
    SEALING.with(|m| m.set(false));
}

/// Whether this backend is sealing pending records right now: the one time `forbid_change`
/// admits an UPDATE of a chained record, and then only one that fills its empty link
/// (`is_seal`). Only `ledger_seal` sets it; no SQL can.
#[pg_extern(stable, parallel_restricted)]
fn ledger_sealing() -> bool {
    SEALING.with(|m| m.get())
}

/// Seals at most `max` of `site`'s committed pending records, in the order they were written:
/// each takes the next number of the site's chain and links to the record before it, and the
/// head moves once (sql/020_ledger.sql, "seal"). Takes the site's head, waiting for it unbounded:
/// callers take it first (chain_append, seal_site). Returns `{sealed, missing}`: how many, and the
/// first entry whose record is not there to seal (removed behind the triggers: passed over, so
/// the site's writers go on; `seal_now` refuses it where a broken ledger must stop).
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn ledger_seal(site: Uuid, max: i32) -> Jsonb {
    let _mark = SealGuard::set();
    let sealed = Spi::connect(|_| Ok::<_, pgrx::spi::Error>(unsafe { seal(site, max.max(1)) }))
        .unwrap_or_else(|e| error!("querylayer: sealing the ledger of site {site} failed: {e}"));
    Jsonb(json!({"sealed": sealed.0, "missing": sealed.1}))
}

/// The statement that fills the empty link of record `$3` of `table`, on site `$4`, as number
/// `$1` after the record hash `$2`; it returns the record's hash.
fn seal_statement(table: &str) -> String {
    format!(
        "UPDATE {table} SET chain_seq = $1, prev_sha256 = $2,
                record_sha256 = pg_catalog.sha256($2 OPERATOR(pg_catalog.||) content_sha256)
          WHERE id OPERATOR(pg_catalog.=) $3 AND site_id OPERATOR(pg_catalog.=) $4 AND chain_seq IS NULL
         RETURNING record_sha256"
    )
}

/// `ledger_seal`'s work, inside SPI and under the seal mark.
unsafe fn seal(site: Uuid, max: i32) -> (i64, Value) {
    let bounded = queue_bounded();
    // With the head: where its queue begins, and the oldest transaction running now (no later
    // than the queue's read below, which therefore sees every entry of an older one).
    let head = first_row(
        if bounded {
            concat!(
                "SELECT h.seq, h.head, ",
                pending_from!(),
                ", CAST(CAST(pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot()) AS pg_catalog.text) AS pg_catalog.int8)
                   FROM querylayer.ledger_heads h WHERE h.site_id OPERATOR(pg_catalog.=) $1
                    FOR NO KEY UPDATE"
            )
        } else {
            "SELECT h.seq, h.head, 0::pg_catalog.int8, 0::pg_catalog.int8
               FROM querylayer.ledger_heads h WHERE h.site_id OPERATOR(pg_catalog.=) $1 FOR NO KEY UPDATE"
        },
        &[Arg::of(site), Arg::of(cluster())],
        |t, d| {
            (
                column::<i64>(t, d, 1),
                column::<Vec<u8>>(t, d, 2),
                column::<i64>(t, d, 3),
                column::<i64>(t, d, 4),
            )
        },
    );
    let Some((Some(mut seq), Some(mut head), Some(from), Some(running))) = head else {
        return (0, Value::Null);
    };
    // Read from where the queue begins (ledger_pending_xact), sorted by the order of writing.
    let pending = by_index(|| {
        rows(
            if bounded {
                "SELECT p.table_name, p.record_id, p.xact FROM querylayer.ledger_pending p
              WHERE p.site_id OPERATOR(pg_catalog.=) $1 AND p.xact OPERATOR(pg_catalog.>=) $3
              ORDER BY p.written LIMIT $2"
            } else {
                "SELECT p.table_name, p.record_id, 0::pg_catalog.int8 FROM querylayer.ledger_pending p
              WHERE p.site_id OPERATOR(pg_catalog.=) $1 ORDER BY p.written LIMIT $2"
            },
            &[Arg::of(site), Arg::of(max as i64), Arg::of(from)],
            |t, d| (column::<String>(t, d, 1), column::<Uuid>(t, d, 2), column::<i64>(t, d, 3)),
        )
    });
    // Where the queue begins after this seal: where no entry of a transaction still running can
    // be, unless an entry is left behind (its record removed: it stays, and so does its place), or
    // the batch was cut (what is after it was not looked at: the beginning stays where it was).
    let mut begins = (pending.len() < max as usize).then_some(running);
    let (mut prev, mut done, mut missing) = (None::<Vec<u8>>, Vec::new(), Value::Null);
    for (table, record, xact) in pending {
        let (Some(table), Some(record), Some(xact)) = (table, record, xact) else {
            begins = None;
            continue;
        };
        let sealed = first_row(
            &seal_statement(&table),
            &[Arg::of(seq + 1), Arg::of(head.clone()), Arg::of(record), Arg::of(site)],
            |t, d| column::<Vec<u8>>(t, d, 1),
        )
        .flatten();
        let Some(record_sha256) = sealed else {
            // Its record was removed behind the triggers: left for verify_ledger to name.
            begins = begins.map(|b| b.min(xact));
            if missing.is_null() {
                missing = json!({"table": table, "id": record.to_string()});
            }
            continue;
        };
        seq += 1;
        prev = Some(std::mem::replace(&mut head, record_sha256));
        done.push(record);
    }
    // The queue's beginning only moves on.
    let begins = begins.filter(|b| bounded && *b > from);
    if let Some(prev) = prev {
        by_index(|| {
            first_row(
                "DELETE FROM querylayer.ledger_pending p
                  WHERE p.site_id OPERATOR(pg_catalog.=) $1 AND p.record_id OPERATOR(pg_catalog.=) ANY ($2)",
                &[Arg::of(site), Arg::of(done.clone())],
                |_, _| (),
            )
        });
        first_row(
            if begins.is_some() {
                "UPDATE querylayer.ledger_heads h SET seq = $2, prev = $3, head = $4, pending_from = $5, pending_cluster = $6
                  WHERE h.site_id OPERATOR(pg_catalog.=) $1"
            } else {
                "UPDATE querylayer.ledger_heads h SET seq = $2, prev = $3, head = $4
                  WHERE h.site_id OPERATOR(pg_catalog.=) $1"
            },
            &[Arg::of(site), Arg::of(seq), Arg::of(prev), Arg::of(head), Arg::of(begins), Arg::of(cluster())],
            |_, _| (),
        );
    } else if let Some(begins) = begins {
        first_row(
            "UPDATE querylayer.ledger_heads h SET pending_from = $2, pending_cluster = $3
              WHERE h.site_id OPERATOR(pg_catalog.=) $1",
            &[Arg::of(site), Arg::of(begins), Arg::of(cluster())],
            |_, _| (),
        );
    }
    (done.len() as i64, missing)
}

/// Whether an UPDATE of a chained record (`old` to `new`, rows of `rel`) only fills its empty
/// link, correctly: the link columns go from NULL to a number, the record hash of the previous
/// record and the hash of that and the record's content hash, and every other column keeps the
/// very value it had. (A table without link columns never qualifies.)
unsafe fn is_seal(rel: pg_sys::Relation, old: pg_sys::HeapTuple, new: pg_sys::HeapTuple) -> bool {
    let desc = (*rel).rd_att;
    let attnum = |name: &std::ffi::CStr| pg_sys::SPI_fnumber(desc, name.as_ptr());
    let (seq, prev, record, content) =
        (attnum(c"chain_seq"), attnum(c"prev_sha256"), attnum(c"record_sha256"), attnum(c"content_sha256"));
    if seq <= 0 || prev <= 0 || record <= 0 || content <= 0 {
        return false;
    }
    let get = |tuple: pg_sys::HeapTuple, n: i32| {
        let mut isnull = false;
        let datum = pg_sys::heap_getattr(tuple, n, desc, &mut isnull);
        (!isnull).then_some(datum)
    };
    if get(old, seq).is_some()
        || get(old, prev).is_some()
        || get(old, record).is_some()
        || get(new, seq).is_none()
    {
        return false;
    }
    for n in 1..=(*desc).natts {
        let att = (*desc).attrs.as_ptr().add(n as usize - 1);
        if (*att).attisdropped || n == seq || n == prev || n == record {
            continue;
        }
        match (get(old, n), get(new, n)) {
            (None, None) => {}
            (Some(a), Some(b)) if same_value(a, b, (*att).attbyval, (*att).attlen) => {}
            _ => return false,
        }
    }
    let bytes = |n: i32| get(new, n).and_then(|d| <Vec<u8> as pgrx::FromDatum>::from_datum(d, false));
    match (bytes(prev), bytes(content), bytes(record)) {
        (Some(p), Some(c), Some(r)) => {
            Sha256::new().chain_update(&p).chain_update(&c).finalize().as_slice() == r.as_slice()
        }
        _ => false,
    }
}

/// Whether two values of one column are the very same bytes (PostgreSQL's datumIsEqual).
unsafe fn same_value(a: pg_sys::Datum, b: pg_sys::Datum, byval: bool, len: i16) -> bool {
    if byval {
        return a.value() == b.value();
    }
    let (pa, pb) = (a.cast_mut_ptr::<u8>(), b.cast_mut_ptr::<u8>());
    let size = |p: *mut u8| match len {
        -1 => pgrx::varsize_any(p.cast()),
        -2 => std::ffi::CStr::from_ptr(p.cast()).to_bytes().len() + 1,
        n => n as usize,
    };
    let (sa, sb) = (size(pa), size(pb));
    sa == sb && std::slice::from_raw_parts(pa, sa) == std::slice::from_raw_parts(pb, sb)
}

crate::spi::c_function!(
    /// `querylayer.forbid_change()`: the append-only trigger (BEFORE UPDATE OR DELETE of each row,
    /// BEFORE TRUNCATE of the statement, enabled ALWAYS). Refuses all of them (QL423) but the one
    /// exception: the sealer filling a pending record's link, under the seal mark.
    forbid_change,
    pg_finfo_forbid_change,
    forbid
);

unsafe fn forbid(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    let trigger = trigger_data(fcinfo, "forbid_change");
    let event = (*trigger).tg_event;
    let rel = (*trigger).tg_relation;
    let op = event & pg_sys::TRIGGER_EVENT_OPMASK;
    if op == pg_sys::TRIGGER_EVENT_UPDATE
        && event & pg_sys::TRIGGER_EVENT_ROW != 0
        && SEALING.with(|m| m.get())
        && is_seal(rel, (*trigger).tg_trigtuple, (*trigger).tg_newtuple)
    {
        return Ok(pg_sys::Datum::from((*trigger).tg_newtuple));
    }
    let name = |p: *const std::ffi::c_char| std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned();
    let schema = name(pg_sys::get_namespace_name((*(*rel).rd_rel).relnamespace));
    let table = name((*(*rel).rd_rel).relname.data.as_ptr());
    let operation = match op {
        pg_sys::TRIGGER_EVENT_INSERT => "INSERT",
        pg_sys::TRIGGER_EVENT_DELETE => "DELETE",
        pg_sys::TRIGGER_EVENT_UPDATE => "UPDATE",
        _ => "TRUNCATE",
    };
    Err(Refusal {
        sqlstate: "QL423",
        message: format!("{schema}.{table} is append-only: {operation} is refused"),
        hint: Some("records here are immutable; append a new record instead"),
    })
}

fn hash(bytes: &[u8], what: &str) -> Hash {
    bytes.try_into().unwrap_or_else(|_| error!("querylayer: {what} must be 32 bytes, not {}", bytes.len()))
}

/// Hashes laid end to end (32 bytes each), as SQL passes lists of hashes.
fn hashes(bytes: &[u8], what: &str) -> Vec<Hash> {
    if bytes.len() % 32 != 0 {
        error!("querylayer: {what} must be 32-byte hashes end to end, not {} bytes", bytes.len());
    }
    bytes.chunks(32).map(|c| c.try_into().expect("32 bytes")).collect()
}

fn frontier(nodes: &[u8], size: i64) -> Frontier {
    let nodes = hashes(nodes, "a frontier");
    Frontier::from_parts(size as u64, nodes).unwrap_or_else(|| {
        error!(
            "querylayer: a frontier of a tree of {size} leaves must hold {} nodes",
            (size as u64).count_ones()
        )
    })
}

/// The leaf hash of a chained record (ledger/src/record.rs).
#[pg_extern(immutable, parallel_safe)]
fn ledger_leaf(seq: i64, table: &str, form: i16, content_sha256: &[u8]) -> Vec<u8> {
    record_leaf(seq as u64, table, form as i32, &hash(content_sha256, "content_sha256")).to_vec()
}

/// The frontier of the tree of `size` leaves (`frontier_nodes`) with `leaves` appended. Both
/// lists are 32-byte hashes end to end; so is the result.
#[pg_extern(immutable, parallel_safe)]
fn ledger_extend(frontier_nodes: &[u8], size: i64, leaves: &[u8]) -> Vec<u8> {
    let mut f = frontier(frontier_nodes, size);
    for leaf in hashes(leaves, "the leaves") {
        f.push(leaf);
    }
    f.nodes().concat()
}

/// The root of the tree of `size` leaves whose frontier is `frontier_nodes`.
#[pg_extern(immutable, parallel_safe)]
fn ledger_tree_root(frontier_nodes: &[u8], size: i64) -> Vec<u8> {
    frontier(frontier_nodes, size).root().to_vec()
}

/// Signs a checkpoint with the server key (its 32-byte secret): `{signature, checkpoint_sha256,
/// key}`.
#[pg_extern(immutable, parallel_safe)]
fn ledger_sign_checkpoint(
    site: Uuid,
    seq: i64,
    head: &[u8],
    root: &[u8],
    checkpointed_at: &str,
    prev: Option<&[u8]>,
    secret: &[u8],
) -> Jsonb {
    let secret: [u8; 32] =
        secret.try_into().unwrap_or_else(|_| error!("querylayer: a server key must be 32 bytes"));
    let prev = prev.map(|p| hash(p, "the previous checkpoint's hash"));
    let cp = Checkpoint::sign(
        &Signer::from_secret(secret),
        &site.to_string(),
        seq as u64,
        &hash(head, "the head"),
        &hash(root, "the tree root"),
        checkpointed_at,
        prev.as_ref(),
    );
    if let Err(e) = cp.verify_signature() {
        error!("querylayer: the checkpoint just signed does not verify: {e}");
    }
    Jsonb(json!({"signature": cp.signature, "checkpoint_sha256": hex::encode(cp.hash()), "key": cp.key}))
}

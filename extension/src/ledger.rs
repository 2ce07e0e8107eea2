//! Verifiable history inside the database: the seal mark, the leaf of each chained record, the
//! Merkle tree extended from one checkpoint's frontier to the next, and checkpoints signed with
//! the server key. The algorithms and formats are the `querylayer-ledger` crate's;
//! `sql/020_ledger.sql` decides when a pending record is sealed and `sql/185_checkpoints.sql`
//! when a checkpoint is made; they are the only callers (these functions are granted to the owner
//! role alone, and the server key never leaves the database).

use crate::jsonb::Jsonb;
use pgrx::prelude::*;
use pgrx::Uuid;
use querylayer_envelope::Signer;
use querylayer_ledger::merkle::Frontier;
use querylayer_ledger::{record_leaf, Checkpoint, Hash};
use serde_json::json;
use std::cell::Cell;

thread_local! {
    static SEALING: Cell<bool> = const { Cell::new(false) };
}

/// Clears the seal mark when dropped, also when an error unwinds through `ledger_seal`.
struct SealGuard(bool);

impl SealGuard {
    fn set() -> SealGuard {
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
/// (`querylayer.is_seal`). Only `ledger_seal` sets it; no SQL can.
#[pg_extern(stable, parallel_restricted)]
fn ledger_sealing() -> bool {
    SEALING.with(|m| m.get())
}

/// Seals at most `max` of `site`'s committed pending records (`querylayer.seal_pending`, under
/// the seal mark): `{sealed, missing}`.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn ledger_seal(site: Uuid, max: i32) -> Jsonb {
    let _mark = SealGuard::set();
    Spi::get_one_with_args::<Jsonb>("SELECT querylayer.seal_pending($1, $2)", &[site.into(), max.into()])
        .unwrap_or_else(|e| error!("querylayer: sealing the ledger of site {site} failed: {e}"))
        .unwrap_or_else(|| error!("querylayer: sealing the ledger of site {site} returned nothing"))
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

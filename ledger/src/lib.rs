//! Verifiable history of a site's ledger, outside the database: an RFC 9162 Merkle tree over the
//! chain's records (one leaf per record, by sequence number), checkpoints of that tree signed
//! with the server key, and inclusion proofs that a verifier checks with nothing but a trusted
//! key. No I/O, no clock: callers pass times in. The formats are documented in `docs/ledger.md`.

pub mod checkpoint;
pub mod merkle;
pub mod proof;
pub mod record;

pub use checkpoint::{Checkpoint, CheckpointError, TrustedKeys, CHECKPOINT_FORMAT};
pub use merkle::{Frontier, Hash, Tree};
pub use proof::{InclusionProof, ProofError, ProvenRecord, VerifiedRecord, PROOF_FORMAT};
pub use record::{leaf_input, record_leaf};

/// Lowercase hex of a hash.
pub fn to_hex(hash: &Hash) -> String {
    hex::encode(hash)
}

/// A hash from 64 lowercase hex characters; anything else is `None`.
pub fn from_hex(text: &str) -> Option<Hash> {
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    hex::decode(text).ok()?.try_into().ok()
}

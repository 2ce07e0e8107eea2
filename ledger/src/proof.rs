//! Inclusion proofs: a record's canonical form, its place in the site's chain, the audit path
//! from its leaf to the root of a signed checkpoint, and that checkpoint. A verifier needs the
//! proof and the server keys it trusts; nothing else.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::checkpoint::{Checkpoint, CheckpointError, TrustedKeys};
use crate::merkle::verify_inclusion;
use crate::record::{is_table_name, record_leaf};
use crate::{from_hex, Hash};

pub const PROOF_FORMAT: &str = "querylayer-inclusion-proof-v1";

/// The record a proof is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvenRecord {
    /// Its table, schema-qualified (`querylayer.content_revisions`).
    pub table: String,
    /// Its id (the canonical form's `id`).
    pub id: String,
    /// Its sequence number in the site's chain (its leaf is number seq - 1).
    pub seq: u64,
    /// The number of the canonical form it was hashed in.
    pub form: i32,
    /// Its canonical form: the exact text whose SHA-256 is the record's content_sha256.
    pub canonical: String,
}

/// A self-contained proof that a record is in a site's history as of a signed checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InclusionProof {
    /// `querylayer-inclusion-proof-v1`.
    pub format: String,
    pub record: ProvenRecord,
    /// The audit path (RFC 9162 section 2.1.3.1) from the record's leaf to the checkpoint's
    /// tree root, leaf end first, hex.
    pub path: Vec<String>,
    pub checkpoint: Checkpoint,
}

/// Why a proof does not verify.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProofError {
    Malformed(String),
    Checkpoint(CheckpointError),
    /// The record's canonical form does not say what the proof says (its id or site).
    RecordMismatch(String),
    /// The path does not lead from the record's leaf to the checkpoint's root.
    NotIncluded,
}

impl fmt::Display for ProofError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProofError::Malformed(why) => write!(f, "malformed proof: {why}"),
            ProofError::Checkpoint(e) => write!(f, "{e}"),
            ProofError::RecordMismatch(why) => write!(f, "the record's canonical form {why}"),
            ProofError::NotIncluded => {
                write!(f, "the audit path does not lead from the record's leaf to the checkpoint's tree root")
            }
        }
    }
}

impl std::error::Error for ProofError {}

/// What a verified proof establishes.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifiedRecord {
    pub site_id: String,
    pub table: String,
    pub id: String,
    pub seq: u64,
    pub checkpoint_seq: u64,
    pub checkpointed_at: String,
    pub content_sha256: Hash,
    /// The canonical form, parsed.
    pub record: Value,
}

impl InclusionProof {
    /// The leaf hash of the proven record.
    pub fn leaf(&self) -> Hash {
        let content: Hash = Sha256::digest(self.record.canonical.as_bytes()).into();
        record_leaf(self.record.seq, &self.record.table, self.record.form, &content)
    }

    /// Checks the proof; trusts the checkpoint only when signed by one of `trusted`.
    pub fn verify(&self, trusted: &TrustedKeys) -> Result<VerifiedRecord, ProofError> {
        let bad = |why: String| Err(ProofError::Malformed(why));
        if self.format != PROOF_FORMAT {
            return bad(format!("format is {:?}, not {PROOF_FORMAT}", self.format));
        }
        self.checkpoint.verify(trusted).map_err(ProofError::Checkpoint)?;
        let r = &self.record;
        if !is_table_name(&r.table) {
            return bad(format!("record.table {:?} is not a schema-qualified table name", r.table));
        }
        if r.form < 1 {
            return bad("record.form must be at least 1".to_string());
        }
        if r.seq == 0 || r.seq > self.checkpoint.seq {
            return bad(format!(
                "record.seq {} is not within the checkpoint's 1..={}",
                r.seq, self.checkpoint.seq
            ));
        }
        let path: Vec<Hash> = match self.path.iter().map(|h| from_hex(h)).collect::<Option<_>>() {
            Some(p) => p,
            None => return bad("a path element is not 64 lowercase hex characters".to_string()),
        };
        let record: Value = serde_json::from_str(&r.canonical)
            .map_err(|e| ProofError::Malformed(format!("record.canonical is not JSON: {e}")))?;
        if !record.is_object() {
            return bad("record.canonical is not a JSON object".to_string());
        }
        if record.get("id").and_then(Value::as_str) != Some(r.id.as_str()) {
            return Err(ProofError::RecordMismatch(format!("has another id than {}", r.id)));
        }
        if record.get("site_id").and_then(Value::as_str) != Some(self.checkpoint.site_id.as_str()) {
            return Err(ProofError::RecordMismatch(format!("is not of site {}", self.checkpoint.site_id)));
        }
        let root = self.checkpoint.tree_root_hash().expect("verified");
        if !verify_inclusion(&self.leaf(), r.seq - 1, self.checkpoint.seq, &path, &root) {
            return Err(ProofError::NotIncluded);
        }
        Ok(VerifiedRecord {
            site_id: self.checkpoint.site_id.clone(),
            table: r.table.clone(),
            id: r.id.clone(),
            seq: r.seq,
            checkpoint_seq: self.checkpoint.seq,
            checkpointed_at: self.checkpoint.checkpointed_at.clone(),
            content_sha256: Sha256::digest(r.canonical.as_bytes()).into(),
            record,
        })
    }
}

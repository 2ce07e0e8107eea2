//! Signed checkpoints of a site's ledger: the site, the number of records, the chain's head hash,
//! the Merkle tree's root over those records, the time, the hash of the site's previous
//! checkpoint and the did:key of the server key that signed. The signature is Ed25519 over a
//! small text (the checkpoint's body) that every field but the signature is written into, so a
//! change to any field breaks it. A checkpoint's hash (what the next one names as `prev`) is the
//! SHA-256 of its body.

use std::collections::BTreeSet;
use std::fmt;

use querylayer_envelope::{didkey, verify_signature, Signer};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{from_hex, Hash};

pub const CHECKPOINT_FORMAT: &str = "querylayer-checkpoint-v1";

/// A checkpoint as witnesses store it and proofs carry it (JSON, these field names).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// `querylayer-checkpoint-v1`.
    pub format: String,
    /// The site's id (a lowercase UUID).
    pub site_id: String,
    /// How many records the site's chain held: the tree's size and the head's sequence number.
    pub seq: u64,
    /// The chain's head: record_sha256 of record `seq` (hex).
    pub head_sha256: String,
    /// The RFC 9162 root over the leaves of records 1..=seq (hex).
    pub tree_root: String,
    /// When it was made: `YYYY-MM-DDTHH:MM:SS.ffffffZ`.
    pub checkpointed_at: String,
    /// The hash of the site's previous checkpoint (hex), null for its first (never left out).
    #[serde(deserialize_with = "present")]
    pub prev_checkpoint_sha256: Option<String>,
    /// The did:key of the server key that signed.
    pub key: String,
    /// `ed25519:` and the signature over the body, in hex.
    pub signature: String,
}

/// Why a checkpoint does not verify. Each names what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointError {
    Malformed(String),
    BadSignature,
    UntrustedKey(String),
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointError::Malformed(why) => write!(f, "malformed checkpoint: {why}"),
            CheckpointError::BadSignature => write!(f, "the checkpoint's signature does not verify"),
            CheckpointError::UntrustedKey(key) => {
                write!(f, "the checkpoint is signed by {key}, which is not trusted")
            }
        }
    }
}

impl std::error::Error for CheckpointError {}

/// The server keys a verifier trusts (did:keys). Empty trusts nothing.
#[derive(Clone, Debug, Default)]
pub struct TrustedKeys(BTreeSet<String>);

impl TrustedKeys {
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(keys: I) -> TrustedKeys {
        TrustedKeys(keys.into_iter().map(Into::into).collect())
    }

    pub fn insert(&mut self, key: &str) {
        self.0.insert(key.to_string());
    }

    pub fn contains(&self, key: &str) -> bool {
        self.0.contains(key)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A nullable field that must be present: serde would take a missing `Option` for `None`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(d)
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ`, the one spelling the database writes.
pub fn is_checkpoint_time(s: &str) -> bool {
    s.len() == 27
        && s.bytes().enumerate().all(|(i, b)| match i {
            4 | 7 => b == b'-',
            10 => b == b'T',
            13 | 16 => b == b':',
            19 => b == b'.',
            26 => b == b'Z',
            _ => b.is_ascii_digit(),
        })
}

impl Checkpoint {
    /// A signed checkpoint.
    pub fn sign(
        signer: &Signer,
        site_id: &str,
        seq: u64,
        head: &Hash,
        root: &Hash,
        checkpointed_at: &str,
        prev: Option<&Hash>,
    ) -> Checkpoint {
        let mut cp = Checkpoint {
            format: CHECKPOINT_FORMAT.to_string(),
            site_id: site_id.to_string(),
            seq,
            head_sha256: hex::encode(head),
            tree_root: hex::encode(root),
            checkpointed_at: checkpointed_at.to_string(),
            prev_checkpoint_sha256: prev.map(hex::encode),
            key: signer.did_key(),
            signature: String::new(),
        };
        cp.signature = signer.sign(cp.body().as_bytes());
        cp
    }

    /// The signed text: one `name value` line per field, the format first.
    pub fn body(&self) -> String {
        format!(
            "{}\nsite {}\nseq {}\nhead {}\nroot {}\ntime {}\nprev {}\nkey {}\n",
            self.format,
            self.site_id,
            self.seq,
            self.head_sha256,
            self.tree_root,
            self.checkpointed_at,
            self.prev_checkpoint_sha256.as_deref().unwrap_or("none"),
            self.key
        )
    }

    /// The checkpoint's hash: SHA-256 of its body (what the next checkpoint names as prev).
    pub fn hash(&self) -> Hash {
        Sha256::digest(self.body().as_bytes()).into()
    }

    pub fn tree_root_hash(&self) -> Option<Hash> {
        from_hex(&self.tree_root)
    }

    pub fn head_hash(&self) -> Option<Hash> {
        from_hex(&self.head_sha256)
    }

    pub fn prev_hash(&self) -> Option<Hash> {
        self.prev_checkpoint_sha256.as_deref().and_then(from_hex)
    }

    /// Every field well formed, and the signature good for the body under `key`. Says nothing
    /// about whether `key` is to be trusted (see `verify`).
    pub fn verify_signature(&self) -> Result<(), CheckpointError> {
        let bad = |why: &str| Err(CheckpointError::Malformed(why.to_string()));
        if self.format != CHECKPOINT_FORMAT {
            return bad(&format!("format is {:?}, not {CHECKPOINT_FORMAT}", self.format));
        }
        if !is_uuid(&self.site_id) {
            return bad("site_id is not a lowercase UUID");
        }
        if self.seq == 0 {
            return bad("seq must be at least 1");
        }
        if from_hex(&self.head_sha256).is_none() {
            return bad("head_sha256 is not 64 lowercase hex characters");
        }
        if from_hex(&self.tree_root).is_none() {
            return bad("tree_root is not 64 lowercase hex characters");
        }
        if !is_checkpoint_time(&self.checkpointed_at) {
            return bad("checkpointed_at is not YYYY-MM-DDTHH:MM:SS.ffffffZ");
        }
        if let Some(prev) = &self.prev_checkpoint_sha256 {
            if from_hex(prev).is_none() {
                return bad("prev_checkpoint_sha256 is not 64 lowercase hex characters");
            }
        }
        if !didkey::is_ed25519_did_key(&self.key) {
            return bad("key is not an Ed25519 did:key");
        }
        if !verify_signature(&self.key, self.body().as_bytes(), &self.signature) {
            return Err(CheckpointError::BadSignature);
        }
        Ok(())
    }

    /// `verify_signature`, and the key is one of `trusted`.
    pub fn verify(&self, trusted: &TrustedKeys) -> Result<(), CheckpointError> {
        self.verify_signature()?;
        if !trusted.contains(&self.key) {
            return Err(CheckpointError::UntrustedKey(self.key.clone()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Signer, Checkpoint) {
        let signer = Signer::from_seed_bytes(b"querylayer ledger test key");
        let cp = Checkpoint::sign(
            &signer,
            "0b6c1f4e-2d7a-4c1e-9f00-5a1b2c3d4e5f",
            3,
            &[1; 32],
            &[2; 32],
            "2026-01-02T03:04:05.123456Z",
            Some(&[3; 32]),
        );
        (signer, cp)
    }

    #[test]
    fn a_signed_checkpoint_verifies_against_its_trusted_key_only() {
        let (signer, cp) = sample();
        assert_eq!(cp.verify(&TrustedKeys::new([signer.did_key()])), Ok(()));
        assert_eq!(cp.verify(&TrustedKeys::default()), Err(CheckpointError::UntrustedKey(signer.did_key())));
        let json = serde_json::to_string(&cp).unwrap();
        assert_eq!(serde_json::from_str::<Checkpoint>(&json).unwrap(), cp);
    }

    #[test]
    fn the_body_holds_every_field_but_the_signature() {
        let (_, cp) = sample();
        let body = cp.body();
        for value in [
            cp.format.clone(),
            cp.site_id.clone(),
            cp.seq.to_string(),
            cp.head_sha256.clone(),
            cp.tree_root.clone(),
            cp.checkpointed_at.clone(),
            cp.prev_checkpoint_sha256.clone().unwrap(),
            cp.key.clone(),
        ] {
            assert!(body.contains(&value), "{value} missing from the body");
        }
        assert!(!body.contains(&cp.signature));
    }
}

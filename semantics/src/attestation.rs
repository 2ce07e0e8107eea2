//! Ed25519 attestations over lineage event hashes, issued by the server's did:key, and their
//! verification.
//!
//! # Format
//!
//! ```json
//! {"issuer":"did:key:z6Mk…","subject":"querylayer:answer:<16 hex>","event_hash":"<64 hex>",
//!  "merkle_root":"<64 hex>","signature_type":"QueryLayerEd25519Signature",
//!  "verification_method":"did:key:z6Mk…#z6Mk…","signature":"ed25519:<128 hex>",
//!  "signed_payload_sha256":"<64 hex>","created_at":"2026-11-30T03:01:41.590199Z"}
//! ```
//!
//! * `event_hash` = SHA-256 of the event's exact JSON text ([`crate::lineage::event_hash`]).
//! * `merkle_root` = SHA-256 of `"querygraph-lineage\n" + event_hash` (the reference's
//!   single-leaf root, kept so roots are comparable).
//! * The signature covers these lines joined with `\n` (no trailing newline):
//!   `querylayer-lineage-attestation-v1`, `issuer:<issuer>`, `subject:<subject>`,
//!   `event_hash:<hex>`, `merkle_root:<hex>`, `created_at:<created_at>`.
//! * `created_at` is [`crate::format_timestamp`] (UTC, six fraction digits, `Z`), and the signed
//!   line holds exactly the JSON value. (The reference signs Python's `isoformat()` — `+00:00`,
//!   fraction dropped at zero microseconds — while showing `…Z`; that ambiguity is why the domain
//!   line differs from the reference's `querygraph-lineage-attestation-v1`.)
//! * `issuer` is the signer's did:key and `verification_method` its `did:key:zX#zX`.
//! * `signed_payload_sha256` = SHA-256 of the signed text.

use crate::lineage::event_hash;
use chrono::{DateTime, Utc};
use querylayer_envelope::{verify_signature, Signer};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The first line of the signed text.
pub const ATTESTATION_DOMAIN: &str = "querylayer-lineage-attestation-v1";
/// `signature_type` of a signed attestation.
pub const SIGNATURE_TYPE: &str = "QueryLayerEd25519Signature";
/// The prefix hashed with the event hash into the Merkle root.
pub const MERKLE_LEAF_PREFIX: &str = "querygraph-lineage\n";

/// A lineage attestation (field order as serialized).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attestation {
    pub issuer: String,
    pub subject: String,
    pub event_hash: String,
    pub merkle_root: String,
    pub signature_type: String,
    pub verification_method: String,
    pub signature: String,
    pub signed_payload_sha256: String,
    pub created_at: String,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The single-leaf Merkle root of an event hash.
pub fn merkle_root(event_hash: &str) -> String {
    sha256_hex(format!("{MERKLE_LEAF_PREFIX}{event_hash}").as_bytes())
}

/// The text an attestation signs.
pub fn signing_payload(
    issuer: &str,
    subject: &str,
    event_hash: &str,
    merkle_root: &str,
    created_at: &str,
) -> String {
    [
        ATTESTATION_DOMAIN.to_string(),
        format!("issuer:{issuer}"),
        format!("subject:{subject}"),
        format!("event_hash:{event_hash}"),
        format!("merkle_root:{merkle_root}"),
        format!("created_at:{created_at}"),
    ]
    .join("\n")
}

/// Attests the event whose exact JSON text is `event_json`, as `subject`, signed by `signer`.
pub fn attest(signer: &Signer, subject: &str, event_json: &str, created_at: DateTime<Utc>) -> Attestation {
    let issuer = signer.did_key();
    let hash = event_hash(event_json);
    let root = merkle_root(&hash);
    let created_at = crate::format_timestamp(created_at);
    let payload = signing_payload(&issuer, subject, &hash, &root, &created_at);
    Attestation {
        signature: signer.sign(payload.as_bytes()),
        verification_method: signer.verification_method(),
        signature_type: SIGNATURE_TYPE.to_string(),
        signed_payload_sha256: sha256_hex(payload.as_bytes()),
        issuer,
        subject: subject.to_string(),
        event_hash: hash,
        merkle_root: root,
        created_at,
    }
}

/// True when `attestation` is a well-formed signature, by its issuer's key, over the event whose
/// exact JSON text is `event_json`. Any change to a byte of the event, or to any field of the
/// attestation, makes it false.
pub fn verify_attestation(attestation: &Attestation, event_json: &str) -> bool {
    // The issuer must be the key that signs: a verification method of another DID proves nothing.
    let method_did = attestation.verification_method.split('#').next().unwrap_or_default();
    method_did == attestation.issuer
        && verify_attestation_with_key(attestation, event_json, &attestation.issuer)
}

/// As [`verify_attestation`], but against a key given by the verifier (a did:key or one of its
/// verification methods) — e.g. the server's published key, or an earlier key after rotation.
pub fn verify_attestation_with_key(attestation: &Attestation, event_json: &str, key: &str) -> bool {
    let a = attestation;
    if a.signature_type != SIGNATURE_TYPE
        || a.event_hash != event_hash(event_json)
        || a.merkle_root != merkle_root(&a.event_hash)
    {
        return false;
    }
    let payload = signing_payload(&a.issuer, &a.subject, &a.event_hash, &a.merkle_root, &a.created_at);
    a.signed_payload_sha256 == sha256_hex(payload.as_bytes())
        && verify_signature(key, payload.as_bytes(), &a.signature)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn signer() -> Signer {
        Signer::from_seed_bytes(b"querylayer-test-server-key")
    }

    fn when() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 3, 1, 41).unwrap() + chrono::Duration::microseconds(590_199)
    }

    const EVENT: &str = r#"{"eventType":"COMPLETE","eventTime":"2026-11-30T03:01:41.590096Z","run":{"runId":"992bf660-7ed9-5b42-a0c6-1643a2cc5025"}}"#;

    #[test]
    fn an_attestation_verifies_and_names_the_signing_did_key() {
        let s = signer();
        let a = attest(&s, "querylayer:answer:e7d681b47d3e50ed", EVENT, when());
        assert_eq!(a.issuer, s.did_key());
        assert!(a.issuer.starts_with("did:key:z6Mk"));
        assert_eq!(a.verification_method, s.verification_method());
        assert_eq!(a.created_at, "2026-11-30T03:01:41.590199Z");
        assert!(a.signature.starts_with("ed25519:") && a.signature.len() == 8 + 128);
        assert!(verify_attestation(&a, EVENT));
        assert!(verify_attestation_with_key(&a, EVENT, &s.did_key()));
        let other = Signer::from_seed_bytes(b"another key");
        assert!(!verify_attestation_with_key(&a, EVENT, &other.did_key()));
        // Ed25519 is deterministic: the same inputs give the same attestation.
        assert_eq!(a, attest(&s, "querylayer:answer:e7d681b47d3e50ed", EVENT, when()));
        // The JSON round-trips.
        let back: Attestation = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert!(verify_attestation(&back, EVENT));
    }

    #[test]
    fn changing_any_byte_of_the_event_breaks_verification() {
        let a = attest(&signer(), "subject", EVENT, when());
        let bytes = EVENT.as_bytes();
        for i in 0..bytes.len() {
            let mut changed = bytes.to_vec();
            changed[i] ^= 0x01;
            // Flipping the low bit keeps ASCII as ASCII, so the text stays valid UTF-8.
            let text = String::from_utf8(changed).unwrap();
            assert!(!verify_attestation(&a, &text), "byte {i} changed and still verified");
        }
        assert!(!verify_attestation(&a, &format!("{EVENT} ")));
    }

    #[test]
    fn changing_the_attestation_breaks_verification() {
        let a = attest(&signer(), "subject", EVENT, when());
        let mut tampered = vec![];
        for f in 0..6 {
            let mut t = a.clone();
            match f {
                0 => t.subject.push('x'),
                1 => t.created_at = "2026-11-30T03:01:41.590198Z".into(),
                2 => t.issuer = Signer::from_seed_bytes(b"x").did_key(),
                3 => t.merkle_root = merkle_root("00"),
                4 => t.signature_type = "QueryGraphEd25519Signature".into(),
                _ => {
                    t.signature.replace_range(10..12, if &a.signature[10..12] == "00" { "11" } else { "00" })
                }
            }
            tampered.push(t);
        }
        for t in tampered {
            assert!(!verify_attestation(&t, EVENT), "{t:?}");
        }
    }
}

//! Signed statements of what retention removed (sql/160_retention.sql): the server key signs the
//! canonical JSON of a summary (counts, ranges, a hash of the rows), so anyone holding the
//! published did:key can check that the database, not a hand with table access, wrote it.

use crate::jsonb::Jsonb;
use pgrx::prelude::*;

use querylayer_envelope::canonical::canonical_json_value;
use querylayer_envelope::{verify_signature, Signer};

/// `ed25519:<hex>` over the canonical JSON of `statement`, with a server key's secret.
#[pg_extern(immutable, parallel_safe)]
fn sign_statement(statement: Jsonb, secret: &[u8]) -> String {
    let secret: [u8; 32] =
        secret.try_into().unwrap_or_else(|_| error!("querylayer: a server key must be 32 bytes"));
    Signer::from_secret(secret).sign(canonical_json_value(&statement.0).as_bytes())
}

/// Whether `signature` is the key of `did_key`'s signature over the canonical JSON of `statement`.
#[pg_extern(immutable, parallel_safe)]
fn statement_signature_valid(statement: Jsonb, signature: &str, did_key: &str) -> bool {
    verify_signature(did_key, canonical_json_value(&statement.0).as_bytes(), signature)
}

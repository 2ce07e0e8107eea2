//! TypeDID envelopes, byte-compatible with the QueryGraph clients: did:key for Ed25519, the
//! canonical payload bytes and hash, the newline-joined signing payloads (v1, and v2 which also
//! binds the HTTP method, a creation time and a nonce), Ed25519 signing and verification, and the
//! ordered checks a server applies to an `x-qg-envelope` header. No I/O, no clock, no RNG:
//! callers pass time and nonces in. The format is documented in `docs/envelope.md`.

mod base58;
pub mod canonical;
pub mod didkey;
pub mod envelope;
mod keys;

pub use envelope::{Checks, Envelope, ParseError, Profile, RequestFacts};
pub use keys::{binding_message, binding_proof, verify_signature, Signer, BINDING_DOMAIN};

//! Ed25519 keys: signing (`ed25519:` + hex) and verification against a did:key.

use crate::didkey;
use ed25519_dalek::{Signature, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

/// An Ed25519 signing key with its did:key identity.
#[derive(Clone)]
pub struct Signer {
    key: SigningKey,
}

impl Signer {
    /// From the 32-byte RFC 8032 secret key (the W3C did:key vectors' `seed`).
    pub fn from_secret(secret: [u8; 32]) -> Signer {
        Signer { key: SigningKey::from_bytes(&secret) }
    }

    /// As QueryGraph's clients derive a key from a seed: the secret is SHA-256(seed).
    pub fn from_seed_bytes(seed: &[u8]) -> Signer {
        Signer::from_secret(Sha256::digest(seed).into())
    }

    pub fn secret(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    pub fn public_key(&self) -> [u8; 32] {
        self.key.verifying_key().to_bytes()
    }

    pub fn did_key(&self) -> String {
        didkey::from_public_key(&self.public_key())
    }

    pub fn verification_method(&self) -> String {
        didkey::verification_method(&self.did_key())
    }

    /// `ed25519:` followed by the 64-byte signature in lowercase hex.
    pub fn sign(&self, message: &[u8]) -> String {
        use ed25519_dalek::Signer as _;
        format!("ed25519:{}", hex::encode(self.key.sign(message).to_bytes()))
    }
}

impl std::fmt::Debug for Signer {
    // Never prints the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("did", &self.did_key()).finish()
    }
}

/// Verifies an `ed25519:<hex>` signature over `message` with the key of a did:key (or one of its
/// verification methods). Any malformed input is simply `false`.
pub fn verify_signature(did_or_method: &str, message: &[u8], signature: &str) -> bool {
    let Some(key) = didkey::public_key(did_or_method) else {
        return false;
    };
    let Some(hex_sig) = signature.strip_prefix("ed25519:") else {
        return false;
    };
    let Ok(bytes) = hex::decode(hex_sig) else {
        return false;
    };
    let Ok(sig) = <[u8; 64]>::try_from(bytes.as_slice()) else {
        return false;
    };
    let Ok(vk) = VerifyingKey::from_bytes(&key) else {
        return false;
    };
    // verify_strict refuses small-order keys and malleable signatures.
    vk.verify_strict(message, &Signature::from_bytes(&sig)).is_ok()
}

/// The domain line of a did:key binding proof. Unlike an envelope's signing payload (which
/// starts with `querygraph-typedid-signing-…`), so no envelope signature is a binding proof.
pub const BINDING_DOMAIN: &str = "querylayer-did-binding-v1";

/// The exact text a key's holder signs to prove possession when the key is bound to a
/// connection: four lines joined by `\n` (domain, the did:key, the site's slug, the server's
/// challenge). The challenge is fresh, single-use and short-lived; the database issues it.
pub fn binding_message(did: &str, site: &str, challenge: &str) -> String {
    [BINDING_DOMAIN, did, site, challenge].join("\n")
}

/// The proof of possession for a binding: `{"challenge", "signature"}`.
pub fn binding_proof(signer: &Signer, site: &str, challenge: &str) -> serde_json::Value {
    serde_json::json!({
        "challenge": challenge,
        "signature": signer.sign(binding_message(&signer.did_key(), site, challenge).as_bytes()),
    })
}

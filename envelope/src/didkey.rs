//! did:key for Ed25519 public keys: `did:key:z` + base58btc(0xed 0x01 ‖ key), and its
//! verification method `did:key:zX#zX`.

use crate::base58;

/// The multicodec varint of an Ed25519 public key.
const ED25519_PUB: [u8; 2] = [0xed, 0x01];

/// The did:key of a 32-byte Ed25519 public key.
pub fn from_public_key(key: &[u8; 32]) -> String {
    format!("did:key:{}", multibase(key))
}

/// `z` + base58btc(0xed 0x01 ‖ key): the method-specific id and the fragment of the key.
pub fn multibase(key: &[u8; 32]) -> String {
    let mut bytes = Vec::with_capacity(34);
    bytes.extend_from_slice(&ED25519_PUB);
    bytes.extend_from_slice(key);
    format!("z{}", base58::encode(&bytes))
}

/// The verification method of a did:key: `did:key:zX#zX`.
pub fn verification_method(did: &str) -> String {
    match did.strip_prefix("did:key:") {
        Some(id) => format!("{did}#{id}"),
        None => did.to_string(),
    }
}

/// The Ed25519 public key of a did:key or of one of its verification methods (`#…` ignored).
/// Anything else — another method, another multicodec, a wrong length — is `None`.
pub fn public_key(did_or_method: &str) -> Option<[u8; 32]> {
    let did = did_or_method.split('#').next()?;
    let encoded = did.strip_prefix("did:key:z")?;
    let bytes = base58::decode(encoded)?;
    let key = bytes.strip_prefix(&ED25519_PUB[..])?;
    key.try_into().ok()
}

/// True for a well-formed Ed25519 did:key (no fragment).
pub fn is_ed25519_did_key(did: &str) -> bool {
    !did.contains('#') && public_key(did).is_some() && from_public_key(&public_key(did).unwrap()) == did
}

//! Credential secrets: generated here from the operating system's cryptographic RNG, returned
//! once to the creating function, and kept only as a display prefix and a SHA-256 fingerprint.

use pgrx::prelude::*;
use sha2::{Digest, Sha256};

/// Characters of the secret kept for display (`qlc_` plus eight random characters).
const DISPLAY_PREFIX_LEN: usize = 12;

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Unpadded base64url: the secret is pasted into shells and config files, so no `+`, `/` or `=`.
pub(crate) fn base64url(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// A fresh secret `<kind>_<43 base64url chars>` (256 bits), its fingerprint and display prefix.
#[pg_extern(volatile, parallel_unsafe)]
fn new_secret(
    kind: &str,
) -> TableIterator<'static, (name!(secret, String), name!(fingerprint, Vec<u8>), name!(prefix, String))> {
    // qlc connection, qlm member token, qls dashboard session, qli invitation, qld delivery token,
    // qla OAuth authorization code, qlr OAuth refresh token.
    if !matches!(kind, "qlc" | "qlm" | "qls" | "qli" | "qld" | "qla" | "qlr") {
        error!("querylayer: unknown secret kind {kind:?}");
    }
    let mut raw = [0u8; 32];
    if let Err(e) = getrandom::fill(&mut raw) {
        error!("querylayer: the operating system RNG failed: {e}");
    }
    let secret = format!("{kind}_{}", base64url(&raw));
    let fingerprint = Sha256::digest(secret.as_bytes()).to_vec();
    let prefix = secret[..DISPLAY_PREFIX_LEN].to_string();
    TableIterator::once((secret, fingerprint, prefix))
}

#[cfg(test)]
mod unit {
    use super::base64url;

    #[test]
    fn base64url_matches_rfc4648_vectors_without_padding() {
        assert_eq!(base64url(b""), "");
        assert_eq!(base64url(b"f"), "Zg");
        assert_eq!(base64url(b"fo"), "Zm8");
        assert_eq!(base64url(b"foo"), "Zm9v");
        assert_eq!(base64url(b"foob"), "Zm9vYg");
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
        assert_eq!(base64url(&[0u8; 32]).len(), 43);
    }
}

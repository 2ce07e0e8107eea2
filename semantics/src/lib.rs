//! The decision core of QueryLayer's governed semantics plane, as pure functions over serde types.
//!
//! * [`osi`] — OSI semantic models: JSON/YAML parsing, path-named validation errors, the
//!   normalized form that is stored.
//! * [`rights`] — RBAC + ODRL 2.2 decisions and access receipts.
//! * [`search`] — deterministic, ranked search of a model by names, synonyms, descriptions and
//!   `ai_context`.
//! * [`metrics`] — metric resolution with dialect fallback, and identifier quoting per dialect.
//! * [`navigator`] — the pure part of the navigator loop: search, gate, plan, synthesize, prompt.
//! * [`lineage`] — OpenLineage 2-0-2 run events, run ids and event hashes.
//! * [`attestation`] — Ed25519 attestations over lineage event hashes, and their verification.
//! * [`signing`] — binds an answer into a signed envelope, a run event and an attestation.
//! * [`story`] — the resilience-desk story: registered agents gated by the rights engine.
//! * [`demo`] — the embedded demo model, rights and story roster.
//!
//! Nothing here performs I/O or reads a clock or a random source: callers pass the time and the
//! signing key. Every result serializes with `serde_json`; structs serialize their fields in
//! declaration order, which is what makes the lineage event bytes (and so their hashes) stable
//! without depending on `serde_json`'s `preserve_order` feature.

pub mod attestation;
pub mod demo;
pub mod lineage;
pub mod metrics;
pub mod navigator;
pub mod osi;
pub mod rights;
pub mod search;
pub mod signing;
pub mod story;

pub use querylayer_envelope::Signer;

use chrono::{DateTime, Utc};

/// The one timestamp format of this crate: RFC 3339 in UTC with exactly six fractional digits and
/// a `Z`, e.g. `2026-11-30T03:01:41.564327Z`. Receipts (`issued_at`), lineage events
/// (`eventTime`) and attestations (`created_at`, both in JSON and in the signed bytes) all use it,
/// so the text that is signed is the text that is shown. Sub-microsecond precision is truncated.
pub fn format_timestamp(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn timestamps_always_have_six_fraction_digits_and_z() {
        let t = Utc.with_ymd_and_hms(2026, 11, 30, 3, 1, 41).unwrap();
        assert_eq!(format_timestamp(t), "2026-11-30T03:01:41.000000Z");
        let t = t + chrono::Duration::nanoseconds(564_327_999);
        assert_eq!(format_timestamp(t), "2026-11-30T03:01:41.564327Z");
    }
}

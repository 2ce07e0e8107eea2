//! Hostile input for the envelope parser and the canonical JSON: whatever text arrives, nothing
//! panics, a refusal says what is wrong, canonical bytes are stable, and only the key's holder
//! produces a valid envelope or binding proof.

use proptest::prelude::*;
use querylayer_envelope::{binding_message, canonical, verify_signature, Envelope, RequestFacts, Signer};
use serde_json::{json, Value};

fn config() -> ProptestConfig {
    ProptestConfig { cases: 256, ..ProptestConfig::default() }
}

/// Arbitrary JSON values, nested a little.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
        ".{0,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_parser_refuses_any_text_without_panicking(text in ".{0,400}") {
        if let Err(e) = Envelope::parse(&text) {
            prop_assert!(!e.to_string().is_empty());
        }
        let _ = canonical::parse(&text);
    }

    #[test]
    fn the_parser_survives_any_json_and_names_a_missing_field(value in json_value()) {
        match Envelope::parse(&value.to_string()) {
            Ok(env) => {
                // Whatever parsed, the checks run and a foreign envelope passes none of the bindings.
                let checks = env.check(&RequestFacts {
                    method: "POST", path: "/v1/answer", body_sha256: "00", server_did: "did:web:qg-server",
                    now: 0, freshness_seconds: 300, require_v2: false,
                });
                prop_assert!(!checks.all_passed());
            }
            Err(e) => prop_assert!(e.to_string().contains("envelope") || e.to_string().contains("protocol")),
        }
    }

    #[test]
    fn canonical_bytes_are_stable_and_parse_back(value in json_value()) {
        let text = canonical::canonical_json_value(&value);
        prop_assert!(text.is_ascii());
        let again = canonical::canonical_json(&text).expect("canonical text parses");
        prop_assert_eq!(&again, &text);
        // Whitespace and key order never change the canonical form.
        let pretty = serde_json::to_string_pretty(&value).unwrap();
        prop_assert_eq!(canonical::canonical_json(&pretty).unwrap(), text);
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed(depth in 1usize..5000) {
        let text = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let _ = canonical::parse(&text);
        let _ = Envelope::parse(&format!("{{\"payload\": {text}}}"));
    }

    #[test]
    fn only_the_holder_makes_a_valid_envelope(seed in any::<[u8; 16]>(), other in any::<[u8; 16]>(),
                                               path in "/[a-z/]{0,30}", body in ".{0,60}") {
        prop_assume!(seed != other);
        let signer = Signer::from_seed_bytes(&seed);
        let payload = json!({"bodySha256": canonical::sha256_hex(body.as_bytes())});
        let env = Envelope::mint_v2(&signer, "did:web:qg-server", "invoke", &path, &payload, "POST",
                                    "2026-01-01T00:00:00Z", "nonce-0123456789abcdef");
        let parsed = Envelope::parse(&env.to_header_json()).unwrap();
        prop_assert!(parsed.signature_valid());
        // Claiming the key of another signer fails the signature check.
        let mut forged = parsed.clone();
        forged.sender = Signer::from_seed_bytes(&other).did_key();
        forged.verification_method = Some(querylayer_envelope::didkey::verification_method(&forged.sender));
        prop_assert!(!forged.signature_valid());
    }

    #[test]
    fn a_binding_proof_verifies_for_its_key_site_and_challenge_only(
        seed in any::<[u8; 16]>(), site in "[a-z0-9-]{1,20}", challenge in "[0-9a-f]{64}", other_site in "[a-z0-9-]{1,20}")
    {
        let signer = Signer::from_seed_bytes(&seed);
        let proof = querylayer_envelope::binding_proof(&signer, &site, &challenge);
        let sig = proof["signature"].as_str().unwrap();
        prop_assert!(verify_signature(&signer.did_key(), binding_message(&signer.did_key(), &site, &challenge).as_bytes(), sig));
        if other_site != site {
            prop_assert!(!verify_signature(&signer.did_key(), binding_message(&signer.did_key(), &other_site, &challenge).as_bytes(), sig));
        }
    }
}

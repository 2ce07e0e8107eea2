//! The shared vectors: W3C did:key Ed25519 vectors, and docs/envelope-vectors.json, which the
//! Python test (tests/python/test_envelope_vectors.py) reads too. Canonical and v1 vectors come
//! from the published QueryGraph client; v2 vectors from this crate (and are verified in Python).

use querylayer_envelope::{canonical, didkey, Envelope, RequestFacts, Signer};
use serde_json::Value;

fn load(path: &str) -> Value {
    let full = format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))).unwrap()
}

fn vectors() -> Value {
    load("docs/envelope-vectors.json")
}

fn facts<'a>(path: &'a str, body_sha256: &'a str, method: &'a str, now: i64) -> RequestFacts<'a> {
    RequestFacts {
        method,
        path,
        body_sha256,
        server_did: "did:web:qg-server",
        now,
        freshness_seconds: 300,
        require_v2: false,
    }
}

#[test]
fn reproduces_the_w3c_did_key_ed25519_vectors() {
    let vectors = load("tests/fixtures/vendor/did-key-ed25519-vectors.json");
    let vectors = vectors.as_object().unwrap();
    assert!(vectors.len() >= 5);
    for (did, v) in vectors {
        let secret: [u8; 32] = hex::decode(v["seed"].as_str().unwrap()).unwrap().try_into().unwrap();
        let signer = Signer::from_secret(secret);
        assert_eq!(&signer.did_key(), did);
        let vm = &v["didDocument"]["verificationMethod"][0];
        assert_eq!(signer.verification_method(), vm["id"].as_str().unwrap());
        assert_eq!(didkey::public_key(did).unwrap(), signer.public_key());
        assert!(didkey::is_ed25519_did_key(did));
    }
}

#[test]
fn canonical_bytes_match_python_for_every_vector() {
    for case in vectors()["canonical"].as_array().unwrap() {
        let text = case["json"].as_str().unwrap();
        let canonical = canonical::canonical_json(text).unwrap();
        assert_eq!(canonical, case["canonical"].as_str().unwrap(), "{text}");
        assert_eq!(canonical::sha256_hex(canonical.as_bytes()), case["sha256"].as_str().unwrap());
    }
}

#[test]
fn v1_headers_minted_by_the_python_client_verify_and_bind_path_and_body() {
    for v in vectors()["v1"].as_array().unwrap() {
        let env = Envelope::parse(v["header"].as_str().unwrap()).unwrap();
        let (path, body) = (v["path"].as_str().unwrap(), v["body_sha256"].as_str().unwrap());
        let checks = env.check(&facts(path, body, "POST", 0));
        assert!(checks.all_passed(), "{}: {checks:?}", v["name"]);
        assert_eq!(env.sender, v["did_key"].as_str().unwrap());
        // Another path or another body fails exactly that check.
        assert_eq!(
            env.check(&facts("/v1/other", body, "POST", 0)).first_failure(),
            Some("resourceBoundToPath")
        );
        assert_eq!(env.check(&facts(path, &"0".repeat(64), "POST", 0)).first_failure(), Some("bodyBound"));
        // The same key, minted here, signs the same bytes (created_at is not signed).
        let signer = Signer::from_seed_bytes(v["seed_utf8"].as_str().unwrap().as_bytes());
        let payload = serde_json::json!({"bodySha256": body});
        let ours =
            Envelope::mint_v1(&signer, "did:web:qg-server", "invoke", path, &payload, "2025-01-02T03:04:05Z");
        assert_eq!(ours.signature, v["signature"].as_str().unwrap());
        assert_eq!(ours.payload_sha256, v["payload_sha256"].as_str().unwrap());
    }
}

#[test]
fn a_tampered_v1_header_fails_the_signature_check() {
    let v = &vectors()["v1"][1];
    let header = v["header"].as_str().unwrap().replace("\"action\":\"invoke\"", "\"action\":\"invokf\"");
    let env = Envelope::parse(&header).unwrap();
    let checks =
        env.check(&facts(v["path"].as_str().unwrap(), v["body_sha256"].as_str().unwrap(), "POST", 0));
    assert_eq!(checks.first_failure(), Some("signatureValid"));
}

/// Validly signed envelopes that still must be refused, each by exactly the check that names
/// its fault: a key signing in another key's name, another recipient, another action.
#[test]
fn a_signature_does_not_make_a_wrong_sender_recipient_or_action_acceptable() {
    let (signer, other) =
        (Signer::from_seed_bytes(b"envelope-signer"), Signer::from_seed_bytes(b"bound-key"));
    let body = canonical::sha256_hex(b"{}");
    let payload = serde_json::json!({"bodySha256": body});
    let mint = |recipient: &str, action: &str| {
        Envelope::mint_v1(&signer, recipient, action, "/v1/answer", &payload, "2026-11-30T12:00:00Z")
    };
    let request = facts("/v1/answer", &body, "POST", 0);
    assert!(mint("did:web:qg-server", "invoke").check(&request).all_passed());

    // The signer claims to be another (bound) key and signs that claim with its own key.
    let mut impostor = mint("did:web:qg-server", "invoke");
    impostor.sender = other.did_key();
    impostor.signature = signer.sign(impostor.signing_payload().as_bytes());
    let impostor = Envelope::parse(&impostor.to_header_json()).unwrap();
    let checks = impostor.check(&request);
    assert!(impostor.signature_valid(), "the signature itself is valid");
    assert_eq!(checks.first_failure(), Some("senderMatchesVerificationMethod"));

    assert_eq!(
        mint("did:web:other-server", "invoke").check(&request).first_failure(),
        Some("recipientIsServer")
    );
    assert_eq!(mint("did:web:qg-server", "query").check(&request).first_failure(), Some("actionIsInvoke"));
}

#[test]
fn v2_vectors_verify_and_bind_method_and_time() {
    for v in vectors()["v2"].as_array().unwrap() {
        let env = Envelope::parse(v["header"].as_str().unwrap()).unwrap();
        assert_eq!(env.signing_payload(), v["signing_payload"].as_str().unwrap());
        let now = querylayer_envelope::envelope::unix_seconds(v["created_at"].as_str().unwrap()).unwrap();
        let (path, body, method) =
            (v["path"].as_str().unwrap(), v["body_sha256"].as_str().unwrap(), v["method"].as_str().unwrap());
        assert!(env.check(&facts(path, body, method, now + 10)).all_passed());
        assert_eq!(env.check(&facts(path, body, "PUT", now)).first_failure(), Some("methodBound"));
        assert_eq!(env.check(&facts(path, body, method, now + 301)).first_failure(), Some("fresh"));
        let mut strict = facts(path, body, method, now);
        strict.require_v2 = true;
        assert!(env.check(&strict).all_passed());
    }
}

#[test]
fn v1_is_refused_when_v2_is_required() {
    let v = &vectors()["v1"][0];
    let env = Envelope::parse(v["header"].as_str().unwrap()).unwrap();
    let mut strict = facts(v["path"].as_str().unwrap(), v["body_sha256"].as_str().unwrap(), "POST", 0);
    strict.require_v2 = true;
    assert_eq!(env.check(&strict).first_failure(), Some("profileAccepted"));
}

/// Prints the v2 vectors (`cargo test -p querylayer-envelope -- --ignored --nocapture print_v2`).
#[test]
#[ignore]
fn print_v2_vectors() {
    let mut out = Vec::new();
    for (seed, method, path, body, created, nonce) in [
        (
            "qg-vector-seed-0001",
            "POST",
            "/v1/answer",
            r#"{"question": "What is fiscal capacity?"}"#,
            "2026-11-30T12:00:00Z",
            "bm9uY2UtMDAwMDAwMDAwMQ",
        ),
        (
            "qg-vector-seed-0002",
            "POST",
            "/v1/models/import/osi",
            "",
            "2026-11-30T12:00:05.250000Z",
            "0123456789abcdef0123456789abcdef",
        ),
    ] {
        let signer = Signer::from_seed_bytes(seed.as_bytes());
        let body_sha = canonical::sha256_hex(body.as_bytes());
        let env = Envelope::mint_v2(
            &signer,
            "did:web:qg-server",
            "invoke",
            path,
            &serde_json::json!({"bodySha256": body_sha}),
            method,
            created,
            nonce,
        );
        out.push(serde_json::json!({
            "seed_utf8": seed, "did_key": signer.did_key(), "method": method, "path": path, "body_utf8": body,
            "body_sha256": body_sha, "created_at": created, "nonce": nonce,
            "signing_payload": env.signing_payload(), "signature": env.signature, "header": env.to_header_json(),
        }));
    }
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}

/// Prints a v1 header minted here, for the Python package's own verify
/// (`cargo test -p querylayer-envelope -- --ignored --nocapture print_v1_rust`).
#[test]
#[ignore]
fn print_v1_rust_vector() {
    let signer = Signer::from_secret([7u8; 32]);
    let body = r#"{"question": "Where is fiscal stress highest?"}"#;
    let body_sha = canonical::sha256_hex(body.as_bytes());
    let env = Envelope::mint_v1(
        &signer,
        "did:web:qg-server",
        "invoke",
        "/v1/answer",
        &serde_json::json!({"bodySha256": body_sha}),
        "2026-11-30T12:00:00Z",
    );
    println!(
        "{}",
        serde_json::json!({"secret_hex": hex::encode([7u8; 32]), "did_key": signer.did_key(), "path": "/v1/answer",
        "body_utf8": body, "body_sha256": body_sha, "header": env.to_header_json()})
    );
}

#[test]
fn the_rust_minted_v1_vector_is_reproducible() {
    let v = &vectors()["v1_rust"];
    let signer =
        Signer::from_secret(hex::decode(v["secret_hex"].as_str().unwrap()).unwrap().try_into().unwrap());
    let env = Envelope::mint_v1(
        &signer,
        "did:web:qg-server",
        "invoke",
        "/v1/answer",
        &serde_json::json!({"bodySha256": v["body_sha256"]}),
        "2026-11-30T12:00:00Z",
    );
    assert_eq!(env.to_header_json(), v["header"].as_str().unwrap());
}

#[test]
fn the_did_binding_proof_vector_is_reproduced() {
    let v = &vectors()["binding"];
    let signer = querylayer_envelope::Signer::from_seed_bytes(v["seed_utf8"].as_str().unwrap().as_bytes());
    assert_eq!(signer.did_key(), v["did_key"].as_str().unwrap());
    let message = querylayer_envelope::binding_message(
        &signer.did_key(),
        v["site"].as_str().unwrap(),
        v["challenge"].as_str().unwrap(),
    );
    assert_eq!(message, v["message"].as_str().unwrap());
    let proof = querylayer_envelope::binding_proof(
        &signer,
        v["site"].as_str().unwrap(),
        v["challenge"].as_str().unwrap(),
    );
    assert_eq!(proof["signature"], v["signature"]);
    assert!(querylayer_envelope::verify_signature(
        &signer.did_key(),
        message.as_bytes(),
        v["signature"].as_str().unwrap()
    ));
    // No envelope signing payload is a binding message: the domains differ.
    assert!(!message.starts_with("querygraph-typedid-signing"));
}

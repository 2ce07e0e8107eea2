//! The shared ledger vectors (docs/ledger-vectors.json): made here from fixed keys and records,
//! read by tests/python/test_ledger_vectors.py too. Every proof and checkpoint verifies, and each
//! one mutated in any single field does not. `QUERYLAYER_WRITE_VECTORS=1` rewrites the file.

use querylayer_envelope::Signer;
use querylayer_ledger::merkle::Tree;
use querylayer_ledger::{
    leaf_input, record_leaf, Checkpoint, InclusionProof, ProvenRecord, TrustedKeys, PROOF_FORMAT,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

const SITE: &str = "7d1b4a0e-0c39-4c7e-8a53-2f0f6c1e9b21";

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/ledger-vectors.json")
}

fn keys() -> (Signer, Signer) {
    (
        Signer::from_seed_bytes(b"querylayer ledger vectors: server key 1"),
        Signer::from_seed_bytes(b"querylayer ledger vectors: server key 2"),
    )
}

/// Five records of one site, in chain order, as the database prints canonical forms.
fn records() -> Vec<(&'static str, i32, String, String)> {
    let r = |table: &'static str, form: i32, id: &str, canonical: String| {
        (table, form, id.to_string(), canonical)
    };
    vec![
        r(
            "querylayer.runs",
            2,
            "0f5b8d6e-1111-4a2b-8c3d-000000000001",
            format!(
                r#"{{"id": "0f5b8d6e-1111-4a2b-8c3d-000000000001", "input": {{"topic": "pricing"}}, "harness": "hermes", "site_id": "{SITE}", "run_type": "article.draft", "agent_id": "0f5b8d6e-2222-4a2b-8c3d-000000000002", "started_at": "2026-01-02T03:04:05.000001+00:00", "connection_id": "0f5b8d6e-3333-4a2b-8c3d-000000000003", "organization_id": "0f5b8d6e-4444-4a2b-8c3d-000000000004", "required_outputs": ["draft_id"], "extension_version": "0.2.0", "completion_conditions": []}}"#
            ),
        ),
        r(
            "querylayer.content_revisions",
            1,
            "0f5b8d6e-5555-4a2b-8c3d-000000000005",
            format!(
                r#"{{"id": "0f5b8d6e-5555-4a2b-8c3d-000000000005", "fields": {{"body": "Prices — in € and ¥, \"quoted\"", "title": "Überblick"}}, "run_id": "0f5b8d6e-1111-4a2b-8c3d-000000000001", "site_id": "{SITE}", "agent_id": "0f5b8d6e-2222-4a2b-8c3d-000000000002", "member_id": null, "content_id": "0f5b8d6e-6666-4a2b-8c3d-000000000006", "created_at": "2026-01-02T03:04:06.5+00:00", "author_kind": "agent", "template_id": "0f5b8d6e-7777-4a2b-8c3d-000000000007", "connection_id": "0f5b8d6e-3333-4a2b-8c3d-000000000003", "revision_number": 1}}"#
            ),
        ),
        r(
            "querylayer.run_events",
            1,
            "0f5b8d6e-8888-4a2b-8c3d-000000000008",
            format!(
                r#"{{"id": "0f5b8d6e-8888-4a2b-8c3d-000000000008", "kind": "finished", "run_id": "0f5b8d6e-1111-4a2b-8c3d-000000000001", "harness": "hermes", "outcome": "completed", "reasons": [], "site_id": "{SITE}", "summary": null, "agent_id": "0f5b8d6e-2222-4a2b-8c3d-000000000002", "created_at": "2026-01-02T03:04:07+00:00", "reason_code": null, "connection_id": "0f5b8d6e-3333-4a2b-8c3d-000000000003", "missing_outputs": [], "requested_outcome": "completed"}}"#
            ),
        ),
        r(
            "querylayer.proposal_decisions",
            1,
            "0f5b8d6e-9999-4a2b-8c3d-000000000009",
            format!(
                r#"{{"id": "0f5b8d6e-9999-4a2b-8c3d-000000000009", "note": "ok", "site_id": "{SITE}", "decision": "approved", "member_id": "0f5b8d6e-aaaa-4a2b-8c3d-00000000000a", "decided_at": "2026-01-02T03:05:00.25+00:00", "member_role": "owner", "proposal_id": "0f5b8d6e-bbbb-4a2b-8c3d-00000000000b"}}"#
            ),
        ),
        r(
            "querylayer.state_events",
            1,
            "0f5b8d6e-cccc-4a2b-8c3d-00000000000c",
            format!(
                r#"{{"id": "0f5b8d6e-cccc-4a2b-8c3d-00000000000c", "cause": "decision", "actor": null, "state": {{"archived_at": null, "published_at": "2026-01-02T03:05:00.25+00:00", "published_revision_id": "0f5b8d6e-5555-4a2b-8c3d-000000000005"}}, "site_id": "{SITE}", "subject": "content_item", "subject_id": "0f5b8d6e-6666-4a2b-8c3d-000000000006", "decision_id": "0f5b8d6e-9999-4a2b-8c3d-000000000009", "recorded_at": "2026-01-02T03:05:00.250001+00:00"}}"#
            ),
        ),
    ]
}

/// The vectors, made from scratch.
fn generate() -> Value {
    let (k1, k2) = keys();
    let mut prev: [u8; 32] = Sha256::digest(format!("querylayer-ledger-genesis:{SITE}").as_bytes()).into();
    let mut rows = Vec::new();
    let mut leaves = Vec::new();
    let mut heads = Vec::new();
    for (i, (table, form, id, canonical)) in records().into_iter().enumerate() {
        let seq = i as u64 + 1;
        let content: [u8; 32] = Sha256::digest(canonical.as_bytes()).into();
        let record: [u8; 32] = Sha256::digest([prev, content].concat()).into();
        leaves.push(record_leaf(seq, table, form, &content));
        heads.push(record);
        rows.push(json!({
            "seq": seq, "table": table, "form": form, "id": id, "canonical": canonical,
            "content_sha256": hex::encode(content), "prev_sha256": hex::encode(prev),
            "record_sha256": hex::encode(record), "leaf_input": leaf_input(seq, table, form, &content),
            "leaf_hash": hex::encode(leaves[i]),
        }));
        prev = record;
    }
    let cp1 = Checkpoint::sign(
        &k1,
        SITE,
        3,
        &heads[2],
        &Tree::new(leaves[..3].to_vec()).root(),
        "2026-01-02T03:04:30.000000Z",
        None,
    );
    let cp2 = Checkpoint::sign(
        &k2,
        SITE,
        5,
        &heads[4],
        &Tree::new(leaves.clone()).root(),
        "2026-01-02T03:06:00.123456Z",
        Some(&cp1.hash()),
    );
    let proof = |seq: usize, cp: &Checkpoint| {
        let tree = Tree::new(leaves[..cp.seq as usize].to_vec());
        let (table, form, id, canonical) = records().swap_remove(seq - 1);
        InclusionProof {
            format: PROOF_FORMAT.to_string(),
            record: ProvenRecord { table: table.to_string(), id, seq: seq as u64, form, canonical },
            path: tree.path(seq as u64 - 1).unwrap().iter().map(hex::encode).collect(),
            checkpoint: cp.clone(),
        }
    };
    let mut proofs: Vec<InclusionProof> = (1..=5).map(|s| proof(s, &cp2)).collect();
    proofs.push(proof(2, &cp1));
    json!({
        "about": "Shared ledger vectors: records of one site with their canonical forms, content, chain and leaf hashes; two checkpoints (the second signed after a key rotation, naming the first); inclusion proofs against both. Made by ledger/tests/vectors.rs; read by it and by tests/python/test_ledger_vectors.py. The keys are test keys (seeds below), never a server's.",
        "site_id": SITE,
        "key_seeds": ["querylayer ledger vectors: server key 1", "querylayer ledger vectors: server key 2"],
        "trusted_keys": [k1.did_key(), k2.did_key()],
        "records": rows,
        "checkpoints": [cp1.clone(), cp2.clone()],
        "checkpoint_sha256": [hex::encode(cp1.hash()), hex::encode(cp2.hash())],
        "proofs": proofs,
    })
}

fn load() -> Value {
    serde_json::from_str(&std::fs::read_to_string(path()).expect("docs/ledger-vectors.json")).unwrap()
}

fn trusted(v: &Value) -> TrustedKeys {
    TrustedKeys::new(v["trusted_keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap().to_string()))
}

#[test]
fn the_committed_vectors_are_what_the_code_makes() {
    let made = serde_json::to_string_pretty(&generate()).unwrap() + "\n";
    if std::env::var("QUERYLAYER_WRITE_VECTORS").as_deref() == Ok("1") {
        std::fs::write(path(), &made).unwrap();
    }
    let committed = std::fs::read_to_string(path())
        .expect("docs/ledger-vectors.json (QUERYLAYER_WRITE_VECTORS=1 writes it)");
    assert_eq!(committed, made, "docs/ledger-vectors.json is stale: run with QUERYLAYER_WRITE_VECTORS=1");
}

#[test]
fn every_vector_verifies() {
    let v = load();
    let keys = trusted(&v);
    for (i, cp) in v["checkpoints"].as_array().unwrap().iter().enumerate() {
        let cp: Checkpoint = serde_json::from_value(cp.clone()).unwrap();
        cp.verify(&keys).unwrap();
        assert_eq!(hex::encode(cp.hash()), v["checkpoint_sha256"][i]);
    }
    for p in v["proofs"].as_array().unwrap() {
        let proof: InclusionProof = serde_json::from_value(p.clone()).unwrap();
        let verified = proof.verify(&keys).unwrap();
        assert_eq!(verified.id, proof.record.id);
    }
    // One key alone does not trust the other's checkpoint.
    let only_first = TrustedKeys::new([v["trusted_keys"][0].as_str().unwrap()]);
    let second: InclusionProof = serde_json::from_value(v["proofs"][0].clone()).unwrap();
    assert!(second.verify(&only_first).is_err());
}

/// Every way of changing one field of `value`: each string, number, null and array element, one
/// at a time (strings keep their alphabet so the change is not merely a syntax error); arrays
/// also lose their last element and gain one; objects lose each key and gain one.
fn mutations(value: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    walk(value, "", &mut |path, mutated| out.push((path, mutated)), &|v| v.clone());
    out
}

fn mutate_string(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chars: Vec<char> = s.chars().collect();
    let flip = |c: char| match c {
        '0'..='8' => char::from(c as u8 + 1),
        '9' => '0',
        'a'..='e' => char::from(c as u8 + 1),
        'f' => 'a',
        'g'..='y' | 'A'..='Y' => char::from(c as u8 + 1),
        'z' => 'g',
        'Z' => 'A',
        other => other,
    };
    for pick in
        [chars.iter().rposition(|c| c.is_ascii_alphanumeric()), chars.iter().position(|c| c.is_ascii_digit())]
            .into_iter()
            .flatten()
    {
        let mut c = chars.clone();
        c[pick] = flip(c[pick]);
        out.push(c.into_iter().collect());
    }
    out.push(format!("{s}x"));
    out.dedup();
    out
}

fn walk(value: &Value, at: &str, emit: &mut dyn FnMut(String, Value), rebuild: &dyn Fn(&Value) -> Value) {
    match value {
        Value::String(s) => {
            for m in mutate_string(s) {
                emit(at.to_string(), rebuild(&Value::String(m)));
            }
        }
        Value::Number(n) => {
            let n = n.as_i64().unwrap();
            emit(at.to_string(), rebuild(&json!(n + 1)));
            emit(at.to_string(), rebuild(&json!(n - 1)));
        }
        Value::Null => emit(at.to_string(), rebuild(&json!("00".repeat(32)))),
        Value::Bool(b) => emit(at.to_string(), rebuild(&json!(!b))),
        Value::Array(items) => {
            let mut shorter = items.clone();
            shorter.pop();
            emit(format!("{at}[-1]"), rebuild(&Value::Array(shorter)));
            let mut longer = items.clone();
            longer.push(items.first().cloned().unwrap_or(json!("00")));
            emit(format!("{at}[+]"), rebuild(&Value::Array(longer)));
            for (i, item) in items.iter().enumerate() {
                let sub = |v: &Value| {
                    let mut a = items.clone();
                    a[i] = v.clone();
                    rebuild(&Value::Array(a))
                };
                walk(item, &format!("{at}[{i}]"), emit, &sub);
            }
        }
        Value::Object(map) => {
            for key in map.keys() {
                let mut fewer = map.clone();
                fewer.remove(key);
                emit(format!("{at}.{key}(removed)"), rebuild(&Value::Object(fewer)));
            }
            let mut more = map.clone();
            more.insert("extra".to_string(), json!("x"));
            emit(format!("{at}.extra(added)"), rebuild(&Value::Object(more)));
            for (key, item) in map {
                let sub = |v: &Value| {
                    let mut m = map.clone();
                    m.insert(key.clone(), v.clone());
                    rebuild(&Value::Object(m))
                };
                walk(item, &format!("{at}.{key}"), emit, &sub);
            }
        }
    }
}

#[test]
fn every_field_of_a_checkpoint_mutated_alone_fails() {
    let v = load();
    let keys = trusted(&v);
    let mut tried = 0;
    for cp in v["checkpoints"].as_array().unwrap() {
        for (path, mutated) in mutations(cp) {
            tried += 1;
            let verdict = serde_json::from_value::<Checkpoint>(mutated.clone()).map(|c| c.verify(&keys));
            assert!(
                !matches!(verdict, Ok(Ok(()))),
                "a checkpoint with {path} mutated still verifies: {mutated}"
            );
        }
    }
    assert!(tried > 40, "{tried} mutations");
}

#[test]
fn every_field_of_a_proof_mutated_alone_fails() {
    let v = load();
    let keys = trusted(&v);
    let mut tried = 0;
    for p in v["proofs"].as_array().unwrap() {
        for (path, mutated) in mutations(p) {
            tried += 1;
            let verdict = serde_json::from_value::<InclusionProof>(mutated.clone()).map(|p| p.verify(&keys));
            assert!(!matches!(verdict, Ok(Ok(_))), "a proof with {path} mutated still verifies: {mutated}");
        }
    }
    assert!(tried > 300, "{tried} mutations");
}

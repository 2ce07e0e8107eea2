"""The shared envelope vectors, read from Python: canonical bytes as the standard library writes
them, v1 headers verified by the published QueryGraph package (including one minted in Rust),
and v2 headers verified and re-minted by querylayer_client."""

import hashlib
import json
import pathlib

import pytest
from querygraph.typedid import TypeDidEnvelope

from querylayer_client import Key, canonical_json, mint_envelope_header, signing_payload, verify_header

ROOT = pathlib.Path(__file__).resolve().parents[2]
VECTORS = json.loads((ROOT / "docs" / "envelope-vectors.json").read_text())


@pytest.mark.parametrize("case", VECTORS["canonical"], ids=lambda c: c["json"][:30])
def test_canonical_bytes(case):
    assert canonical_json(json.loads(case["json"])) == case["canonical"]
    assert hashlib.sha256(case["canonical"].encode()).hexdigest() == case["sha256"]


@pytest.mark.parametrize("vector", VECTORS["v1"], ids=lambda v: v["name"])
def test_v1_headers_verify_with_the_reference_package(vector):
    env = TypeDidEnvelope.model_validate_json(vector["header"])
    assert env.verify_signature()
    assert verify_header(vector["header"])


def test_a_rust_minted_envelope_verifies_with_the_reference_package():
    vector = VECTORS["v1_rust"]
    env = TypeDidEnvelope.model_validate_json(vector["header"])
    assert env.verify_signature()
    assert env.payload["bodySha256"] == hashlib.sha256(vector["body_utf8"].encode()).hexdigest()
    tampered = json.loads(vector["header"])
    tampered["resource"] = "/v1/models/import/osi"
    assert not TypeDidEnvelope.model_validate(tampered).verify_signature()


@pytest.mark.parametrize("vector", VECTORS["v2"], ids=lambda v: v["path"])
def test_v2_vectors_verify_and_remint_identically(vector):
    env = json.loads(vector["header"])
    assert signing_payload(env) == vector["signing_payload"]
    assert verify_header(vector["header"])
    key = Key.from_seed(vector["seed_utf8"])
    assert key.did == vector["did_key"]
    ours = mint_envelope_header(
        key, path=vector["path"], body=vector["body_utf8"], method=vector["method"],
        created_at=vector["created_at"], nonce=vector["nonce"],
    )
    assert json.loads(ours)["signature"] == vector["signature"]
    tampered = dict(env, method="PUT")
    assert not verify_header(json.dumps(tampered))


def test_the_did_binding_proof_is_the_rust_one():
    from querylayer_client import did_binding_message, prove_did_binding

    v = VECTORS["binding"]
    key = Key.from_seed(v["seed_utf8"])
    assert key.did == v["did_key"]
    assert did_binding_message(key.did, v["site"], v["challenge"]) == v["message"]
    assert prove_did_binding(key, v["site"], v["challenge"]) == {"challenge": v["challenge"], "signature": v["signature"]}

"""The shared ledger vectors (docs/ledger-vectors.json, made by ledger/tests/vectors.rs), read
from Python: every checkpoint and proof verifies with querylayer_client.proofs, and each one
with any single field changed does not."""

import copy
import hashlib
import json
import pathlib

import pytest

from querylayer_client.proofs import (ProofError, checkpoint_sha256, record_leaf, verify_checkpoint,
                                      verify_proof)

ROOT = pathlib.Path(__file__).resolve().parents[2]
VECTORS = json.loads((ROOT / "docs" / "ledger-vectors.json").read_text())
TRUSTED = set(VECTORS["trusted_keys"])


def test_leaves_and_checkpoint_hashes_match():
    for r in VECTORS["records"]:
        content = hashlib.sha256(r["canonical"].encode()).digest()
        assert content.hex() == r["content_sha256"]
        assert record_leaf(r["seq"], r["table"], r["form"], content).hex() == r["leaf_hash"]
    for cp, h in zip(VECTORS["checkpoints"], VECTORS["checkpoint_sha256"]):
        assert checkpoint_sha256(cp) == h
    assert VECTORS["checkpoints"][1]["prev_checkpoint_sha256"] == VECTORS["checkpoint_sha256"][0]


def test_every_vector_verifies_and_needs_a_trusted_key():
    for cp in VECTORS["checkpoints"]:
        verify_checkpoint(cp, TRUSTED)
    for proof in VECTORS["proofs"]:
        assert verify_proof(proof, TRUSTED)["id"] == proof["record"]["id"]
    with pytest.raises(ProofError, match="not trusted"):
        verify_proof(VECTORS["proofs"][0], {VECTORS["trusted_keys"][0]})


def _flip(c):
    if c.isdigit():
        return str((int(c) + 1) % 10)
    if "a" <= c <= "e" or "g" <= c <= "y" or "A" <= c <= "Y":
        return chr(ord(c) + 1)
    return {"f": "a", "z": "g", "Z": "A"}.get(c, c)


def _string_mutations(s):
    out = []
    alnum = [i for i, c in enumerate(s) if c.isascii() and c.isalnum()]
    digits = [i for i, c in enumerate(s) if c.isascii() and c.isdigit()]
    for pick in ([alnum[-1]] if alnum else []) + ([digits[0]] if digits else []):
        out.append(s[:pick] + _flip(s[pick]) + s[pick + 1:])
    out.append(s + "x")
    return out


def mutations(value):
    """(where, mutated value) for each single change of `value` (as the Rust test does)."""
    if isinstance(value, str):
        return [("", m) for m in _string_mutations(value)]
    if isinstance(value, bool):
        return [("", not value)]
    if isinstance(value, int):
        return [("", value + 1), ("", value - 1)]
    if value is None:
        return [("", "00" * 32)]
    out = []
    if isinstance(value, list):
        out += [("[-1]", value[:-1]), ("[+]", value + [value[0] if value else "00"])]
        for i, item in enumerate(value):
            for where, m in mutations(item):
                changed = list(value)
                changed[i] = m
                out.append((f"[{i}]{where}", changed))
    if isinstance(value, dict):
        for key in value:
            out.append((f".{key}(removed)", {k: v for k, v in value.items() if k != key}))
        out.append((".extra(added)", {**value, "extra": "x"}))
        for key, item in value.items():
            for where, m in mutations(item):
                out.append((f".{key}{where}", {**value, key: m}))
    return out


def refused_mutations(value: dict, verify, what: str) -> int:
    """Checks that `verify` refuses every single mutation of `value`; returns how many it tried."""
    tried = 0
    for where, mutated in mutations(copy.deepcopy(value)):
        tried += 1
        with pytest.raises(ProofError):
            verify(mutated, TRUSTED)
            pytest.fail(f"a {what} with {where} mutated still verifies")
    return tried


@pytest.mark.parametrize("index", range(len(VECTORS["checkpoints"])))
def test_every_field_of_a_checkpoint_mutated_alone_fails(index):
    assert refused_mutations(VECTORS["checkpoints"][index], verify_checkpoint, "checkpoint") > 20


@pytest.mark.parametrize("index", range(len(VECTORS["proofs"])))
def test_every_field_of_a_proof_mutated_alone_fails(index):
    assert refused_mutations(VECTORS["proofs"][index], verify_proof, "proof") > 50

"""Verify QueryLayer's signed checkpoints and inclusion proofs without the database.

A checkpoint signs a site's ledger as of a number of records: the chain's head hash and the RFC
9162 Merkle root over one leaf per record. An inclusion proof carries a record's canonical form,
its audit path and a checkpoint. Byte-compatible with the Rust verifier (`querylayer ledger
verify-proof`): both read docs/ledger-vectors.json in their tests. docs/ledger.md has the formats.

    from querylayer_client.proofs import verify_proof, ProofError
    record = verify_proof(json.load(open("proof.json")), trusted_keys={"did:key:z6Mk…"})

Only the standard library and `cryptography` (Ed25519).
"""

from __future__ import annotations

import hashlib
import json
import re

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from . import _b58decode, _b58encode

__all__ = ["CHECKPOINT_FORMAT", "PROOF_FORMAT", "ProofError", "checkpoint_body", "checkpoint_sha256",
           "leaf_hash", "record_leaf", "verify_checkpoint", "verify_inclusion", "verify_proof"]

CHECKPOINT_FORMAT = "querylayer-checkpoint-v1"
PROOF_FORMAT = "querylayer-inclusion-proof-v1"
_CHECKPOINT_FIELDS = {"format", "site_id", "seq", "head_sha256", "tree_root", "checkpointed_at",
                      "prev_checkpoint_sha256", "key", "signature"}
_PROOF_FIELDS = {"format", "record", "path", "checkpoint"}
_RECORD_FIELDS = {"table", "id", "seq", "form", "canonical"}
_HEX64 = re.compile(r"[0-9a-f]{64}")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
_IDENT = r"[a-z_][a-z0-9_]{0,62}"
_TABLE = re.compile(_IDENT + r"\." + _IDENT)


class ProofError(ValueError):
    """A checkpoint or proof that does not verify; the message says why."""


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def record_leaf(seq: int, table: str, form: int, content_sha256: bytes) -> bytes:
    """The leaf of a record: `querylayer-ledger-leaf-v1 <seq> <table> <form> <content hex>`."""
    return leaf_hash(f"querylayer-ledger-leaf-v1 {seq} {table} {form} {content_sha256.hex()}".encode())


def verify_inclusion(leaf: bytes, index: int, size: int, path: list[bytes], root: bytes) -> bool:
    """RFC 9162 section 2.1.3.2."""
    if index >= size:
        return False
    f, s, r = index, size - 1, leaf
    for p in path:
        if s == 0:
            return False
        if f & 1 or f == s:
            r = _node(p, r)
            if not f & 1:
                while not f & 1 and f != 0:
                    f >>= 1
                    s >>= 1
        else:
            r = _node(r, p)
        f >>= 1
        s >>= 1
    return s == 0 and r == root


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _public_key(did: str) -> bytes:
    if not isinstance(did, str) or not did.startswith("did:key:z") or "#" in did:
        raise ProofError("key is not an Ed25519 did:key")
    try:
        raw = _b58decode(did[len("did:key:z"):])
    except ValueError:
        raise ProofError("key is not an Ed25519 did:key") from None
    if len(raw) != 34 or raw[:2] != b"\xed\x01" or "did:key:z" + _b58encode(raw) != did:
        raise ProofError("key is not an Ed25519 did:key")
    return raw[2:]


def checkpoint_body(cp: dict) -> str:
    """The text a checkpoint's signature covers."""
    prev = cp["prev_checkpoint_sha256"]
    return (f"{cp['format']}\nsite {cp['site_id']}\nseq {cp['seq']}\nhead {cp['head_sha256']}\n"
            f"root {cp['tree_root']}\ntime {cp['checkpointed_at']}\nprev {'none' if prev is None else prev}\n"
            f"key {cp['key']}\n")


def checkpoint_sha256(cp: dict) -> str:
    """A checkpoint's hash (what the next one names as prev_checkpoint_sha256), hex."""
    return hashlib.sha256(checkpoint_body(cp).encode()).hexdigest()


def verify_checkpoint(cp: dict, trusted_keys) -> dict:
    """Checks a checkpoint's fields and signature, and that its key is trusted; returns it."""
    if not isinstance(cp, dict) or set(cp) != _CHECKPOINT_FIELDS:
        raise ProofError("malformed checkpoint: its fields are " + ", ".join(sorted(_CHECKPOINT_FIELDS)))
    if cp["format"] != CHECKPOINT_FORMAT:
        raise ProofError(f"malformed checkpoint: format is {cp['format']!r}")
    if not isinstance(cp["site_id"], str) or not _UUID.fullmatch(cp["site_id"]):
        raise ProofError("malformed checkpoint: site_id is not a lowercase UUID")
    if not _is_int(cp["seq"]) or cp["seq"] < 1:
        raise ProofError("malformed checkpoint: seq must be an integer of at least 1")
    for name in ("head_sha256", "tree_root"):
        if not isinstance(cp[name], str) or not _HEX64.fullmatch(cp[name]):
            raise ProofError(f"malformed checkpoint: {name} is not 64 lowercase hex characters")
    if not isinstance(cp["checkpointed_at"], str) or not _TIME.fullmatch(cp["checkpointed_at"]):
        raise ProofError("malformed checkpoint: checkpointed_at is not YYYY-MM-DDTHH:MM:SS.ffffffZ")
    prev = cp["prev_checkpoint_sha256"]
    if prev is not None and (not isinstance(prev, str) or not _HEX64.fullmatch(prev)):
        raise ProofError("malformed checkpoint: prev_checkpoint_sha256 is not 64 lowercase hex characters")
    key = _public_key(cp["key"])
    signature = cp["signature"]
    if not isinstance(signature, str) or not re.fullmatch(r"ed25519:[0-9a-f]{128}", signature):
        raise ProofError("the checkpoint's signature does not verify")
    try:
        Ed25519PublicKey.from_public_bytes(key).verify(bytes.fromhex(signature[8:]), checkpoint_body(cp).encode())
    except (InvalidSignature, ValueError):
        raise ProofError("the checkpoint's signature does not verify") from None
    if cp["key"] not in set(trusted_keys):
        raise ProofError(f"the checkpoint is signed by {cp['key']}, which is not trusted")
    return cp


def verify_proof(proof: dict, trusted_keys) -> dict:
    """Checks an inclusion proof; returns the proven record's canonical form, parsed."""
    if not isinstance(proof, dict) or set(proof) != _PROOF_FIELDS:
        raise ProofError("malformed proof: its fields are " + ", ".join(sorted(_PROOF_FIELDS)))
    if proof["format"] != PROOF_FORMAT:
        raise ProofError(f"malformed proof: format is {proof['format']!r}")
    cp = verify_checkpoint(proof["checkpoint"], trusted_keys)
    rec = proof["record"]
    if not isinstance(rec, dict) or set(rec) != _RECORD_FIELDS:
        raise ProofError("malformed proof: record's fields are " + ", ".join(sorted(_RECORD_FIELDS)))
    if not isinstance(rec["table"], str) or not _TABLE.fullmatch(rec["table"]):
        raise ProofError("malformed proof: record.table is not a schema-qualified table name")
    if not _is_int(rec["form"]) or not 1 <= rec["form"] <= 32767:
        raise ProofError("malformed proof: record.form must be an integer of at least 1")
    if not _is_int(rec["seq"]) or not 1 <= rec["seq"] <= cp["seq"]:
        raise ProofError("malformed proof: record.seq is not within the checkpoint")
    if not isinstance(rec["id"], str) or not isinstance(rec["canonical"], str):
        raise ProofError("malformed proof: record.id and record.canonical are strings")
    path = proof["path"]
    if not isinstance(path, list) or not all(isinstance(h, str) and _HEX64.fullmatch(h) for h in path):
        raise ProofError("malformed proof: a path element is not 64 lowercase hex characters")
    try:
        record = json.loads(rec["canonical"])
    except ValueError as e:
        raise ProofError(f"malformed proof: record.canonical is not JSON: {e}") from None
    if not isinstance(record, dict):
        raise ProofError("malformed proof: record.canonical is not a JSON object")
    if record.get("id") != rec["id"]:
        raise ProofError(f"the record's canonical form has another id than {rec['id']}")
    if record.get("site_id") != cp["site_id"]:
        raise ProofError(f"the record's canonical form is not of site {cp['site_id']}")
    content = hashlib.sha256(rec["canonical"].encode()).digest()
    leaf = record_leaf(rec["seq"], rec["table"], rec["form"], content)
    if not verify_inclusion(leaf, rec["seq"] - 1, cp["seq"], [bytes.fromhex(h) for h in path],
                            bytes.fromhex(cp["tree_root"])):
        raise ProofError("the audit path does not lead from the record's leaf to the checkpoint's tree root")
    return record

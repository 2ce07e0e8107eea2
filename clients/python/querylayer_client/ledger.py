"""QueryLayer's ledger, recomputed outside the database from exported records.

Each chained record carries `content_sha256`, the SHA-256 of its canonical form: the JSON object
holding exactly the fields its form names (`ledger_forms`), printed as PostgreSQL prints jsonb —
keys ordered by their UTF-8 length, then bytewise; `", "` and `": "` between items; strings
escaped as JSON with non-ASCII kept; numbers as written; timestamps as the database exported them
(UTC). Its `record_sha256` is SHA-256(prev_sha256 || content_sha256), and a site's first record
follows SHA-256("querylayer-ledger-genesis:" + site id). docs/operations.md has the rules.

    from querylayer_client.ledger import content_sha256, verify_chain
    content_sha256(record, fields)                  # bytes
    verify_chain(site_id, records)                  # the head, hex; raises ValueError on a break

`record` is a record as `to_jsonb(row)` exports it, parsed with `json.loads(text,
parse_float=decimal.Decimal)` so that numbers keep their digits; `records` are dicts with keys
`record` and `fields`.
"""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal

__all__ = ["canonical_text", "content_sha256", "genesis", "verify_chain"]


def _string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def canonical_text(value) -> str:
    """A JSON value as PostgreSQL's jsonb prints it."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, float):
        raise TypeError("parse exported records with parse_float=decimal.Decimal")
    if isinstance(value, list):
        return "[" + ", ".join(canonical_text(v) for v in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return "{" + ", ".join(f"{_string(k)}: {canonical_text(value[k])}" for k in keys) + "}"
    raise TypeError(f"not a JSON value: {value!r}")


def content_sha256(record: dict, fields) -> bytes:
    """The content hash of `record` in the canonical form that hashes `fields`."""
    form = {k: v for k, v in record.items() if k in set(fields)}
    return hashlib.sha256(canonical_text(form).encode()).digest()


def genesis(site_id: str) -> bytes:
    return hashlib.sha256(f"querylayer-ledger-genesis:{site_id}".encode()).digest()


def _bytea(value: str) -> bytes:
    if not value.startswith("\\x"):
        raise ValueError(f"not a bytea in hex: {value!r}")
    return bytes.fromhex(value[2:])


def verify_chain(site_id: str, records) -> str:
    """Walks a site's records in chain order; returns the head (hex) or raises ValueError."""
    prev = genesis(site_id)
    ordered = sorted(records, key=lambda r: int(r["record"]["chain_seq"]))
    for seq, entry in enumerate(ordered, start=1):
        record = entry["record"]
        where = f"record {record['chain_seq']} ({record.get('id')})"
        if int(record["chain_seq"]) != seq:
            raise ValueError(f"record {seq} is missing")
        if _bytea(record["prev_sha256"]) != prev:
            raise ValueError(f"{where}: prev_sha256 does not match the previous record")
        content = content_sha256(record, entry["fields"])
        if content != _bytea(record["content_sha256"]):
            raise ValueError(f"{where}: content does not match content_sha256")
        prev = hashlib.sha256(prev + content).digest()
        if prev != _bytea(record["record_sha256"]):
            raise ValueError(f"{where}: record_sha256 does not match")
    return prev.hex()

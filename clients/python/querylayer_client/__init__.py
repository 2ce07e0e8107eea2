"""A small QueryLayer client for Python users: mints `x-qg-envelope` headers.

v1 headers are what QueryGraph's own client mints (`querygraph.api_auth.mint_envelope_header`);
v2 headers also bind the HTTP method, a creation time and a nonce, so a server can refuse
replays (docs/envelope.md). Byte-compatible with the Rust side: both read
docs/envelope-vectors.json in their tests.

    from querylayer_client import Key, mint_envelope_header
    key = Key.from_seed("querygraph-agent:ApiClient")      # or Key.from_secret(bytes32)
    header = mint_envelope_header(key, method="POST", path="/v1/answer", body=b"{...}")
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from datetime import datetime, timezone

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

__all__ = [
    "Key",
    "canonical_json",
    "did_binding_message",
    "mint_envelope_header",
    "prove_did_binding",
    "signing_payload",
    "verify_header",
]

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_ED25519_PUB = b"\xed\x01"
DEFAULT_RECIPIENT = "did:web:qg-server"
BINDING_DOMAIN = "querylayer-did-binding-v1"


def _b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def _b58decode(text: str) -> bytes:
    n = 0
    for c in text:
        n = n * 58 + _B58.index(c)
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return b"\0" * (len(text) - len(text.lstrip("1"))) + body


def canonical_json(value) -> str:
    """The canonical payload text: sorted keys, no spaces, ASCII only (as QueryGraph hashes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class Key:
    """An Ed25519 key and its did:key."""

    def __init__(self, private: Ed25519PrivateKey):
        self._private = private
        raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.did = "did:key:z" + _b58encode(_ED25519_PUB + raw)

    @classmethod
    def from_secret(cls, secret: bytes) -> "Key":
        return cls(Ed25519PrivateKey.from_private_bytes(secret))

    @classmethod
    def from_seed(cls, seed: str | bytes) -> "Key":
        """As QueryGraph derives keys: the secret is SHA-256 of the seed."""
        data = seed.encode() if isinstance(seed, str) else seed
        return cls.from_secret(hashlib.sha256(data).digest())

    @property
    def verification_method(self) -> str:
        return f"{self.did}#{self.did.removeprefix('did:key:')}"

    def sign(self, message: bytes) -> str:
        return "ed25519:" + self._private.sign(message).hex()


def signing_payload(env: dict) -> str:
    """The bytes an envelope's signature covers, for its protocol (v1 or v2)."""
    v2 = env.get("protocol") == "querygraph.typedid.v2"
    lines = [
        "querygraph-typedid-signing-v2" if v2 else "querygraph-typedid-signing-v1",
        env["sender"], env["recipient"], env["action"], env["resource"], env["payload_sha256"],
    ]
    if v2:
        lines += [env.get("method", ""), env.get("created_at", ""), env.get("nonce", "")]
    return "\n".join(lines)


def _public_key(did_or_method: str) -> Ed25519PublicKey:
    encoded = did_or_method.split("#", 1)[0].removeprefix("did:key:z")
    raw = _b58decode(encoded)
    if not raw.startswith(_ED25519_PUB) or len(raw) != 34:
        raise ValueError("not an Ed25519 did:key")
    return Ed25519PublicKey.from_public_bytes(raw[2:])


def verify_header(header: str) -> bool:
    """Checks the payload hash and the signature against the envelope's verification method."""
    env = json.loads(header)
    payload_hash = hashlib.sha256(canonical_json(env["payload"]).encode()).hexdigest()
    if payload_hash != env["payload_sha256"] or not env["signature"].startswith("ed25519:"):
        return False
    try:
        _public_key(env["verification_method"]).verify(
            bytes.fromhex(env["signature"].removeprefix("ed25519:")), signing_payload(env).encode()
        )
        return True
    except Exception:
        return False


def mint_envelope_header(
    key: Key,
    *,
    path: str,
    body: bytes | str = b"",
    method: str = "POST",
    recipient: str = DEFAULT_RECIPIENT,
    version: int = 2,
    created_at: str | None = None,
    nonce: str | None = None,
) -> str:
    """The `x-qg-envelope` header for one request (v2 by default)."""
    data = body.encode() if isinstance(body, str) else body
    payload = {"bodySha256": hashlib.sha256(data).hexdigest()}
    payload_sha256 = hashlib.sha256(canonical_json(payload).encode()).hexdigest()
    env = {
        "protocol": "querygraph.typedid.v2" if version == 2 else "querygraph.typedid.v1",
        "conversation_id": "qg:" + payload_sha256[:16],
        "sender": key.did,
        "recipient": recipient,
        "action": "invoke",
        "resource": path,
        "privacy": "secret",
        "profile": "ed25519-x25519-chacha20",
        "content_type": "application/json",
        "payload": payload,
        "payload_sha256": payload_sha256,
        "signature": "",
        "verification_method": key.verification_method,
        "envelope_digest": "",
        "created_at": created_at
        or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    if version == 2:
        env["method"] = method.upper()
        env["nonce"] = nonce or base64.urlsafe_b64encode(os.urandom(18)).decode().rstrip("=")
    env["signature"] = key.sign(signing_payload(env).encode())
    digest_input = "\n".join(
        ["querygraph-typedid-envelope-digest-v1", env["conversation_id"], env["privacy"], env["profile"], env["signature"]]
    )
    env["envelope_digest"] = "sha256:" + hashlib.sha256(digest_input.encode()).hexdigest()
    return json.dumps(env, separators=(",", ":"))


def did_binding_message(did: str, site: str, challenge: str) -> str:
    """The exact text a key's holder signs to bind the key to a connection of `site`: four lines
    (the domain, the did:key, the site's slug, the server's challenge). No envelope signs this
    domain, so an envelope's signature is never a binding proof."""
    return "\n".join([BINDING_DOMAIN, did, site, challenge])


def prove_did_binding(key: Key, site: str, challenge: str) -> dict:
    """The proof of possession a binding needs: `{"challenge", "signature"}` over a challenge the
    server issued (`querylayer admin create-did-challenge`, `POST /api/console/did-challenges`)."""
    return {"challenge": challenge, "signature": key.sign(did_binding_message(key.did, site, challenge).encode())}

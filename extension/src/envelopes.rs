//! Envelope authentication for the governed `/v1` routes, where authority lives: the edge hands
//! over the `x-qg-envelope` header, the method, the path and the SHA-256 of the body; the checks,
//! the replay record, the binding of the key to a connection and the receipt all happen here.
//! The format and the checks are the `querylayer-envelope` crate's (docs/envelope.md).

use crate::context::{self, Credential, Resolution};
use crate::jsonb::Jsonb;
use pgrx::prelude::*;

use querylayer_envelope::{canonical, didkey, Envelope, Profile, RequestFacts};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The contract a refusal teaches, as the seed shows it.
fn contract(server_did: &str) -> Value {
    json!({
        "header": "x-qg-envelope",
        "recipient": server_did,
        "action": "invoke",
        "resource": "<request path>",
        "payload": {"bodySha256": "<sha256 hex of request body>"},
        "signature": "ed25519 over querygraph-typedid-signing-v1 (or -v2, which also binds method, created_at and nonce)",
    })
}

struct Settings {
    server_did: String,
    require_v2: bool,
    freshness_seconds: i64,
    now: i64,
}

fn settings() -> Settings {
    let v = Spi::get_one::<Jsonb>("SELECT querylayer.envelope_settings()")
        .unwrap_or_else(|e| error!("querylayer: cannot read envelope settings: {e}"))
        .map(|j| j.0)
        .unwrap_or(Value::Null);
    Settings {
        server_did: v["server_did"].as_str().unwrap_or("did:web:qg-server").to_string(),
        require_v2: v["require_v2"].as_bool().unwrap_or(false),
        freshness_seconds: v["freshness_seconds"].as_i64().unwrap_or(300),
        now: v["now"].as_i64().unwrap_or(0),
    }
}

fn did_sha256(did: &str) -> Vec<u8> {
    Sha256::digest(did.as_bytes()).to_vec()
}

/// Records the receipt (append-only) and returns it.
fn receipt(mut body: Value) -> Jsonb {
    Spi::run_with_args("SELECT querylayer.record_envelope_receipt($1)", &[Jsonb(body.clone()).into()])
        .unwrap_or_else(|e| error!("querylayer: could not record the envelope receipt: {e}"));
    if let Some(obj) = body.as_object_mut() {
        obj.remove("connection_id");
    }
    Jsonb(body)
}

/// The longest `x-qg-envelope` header read: a real envelope is well under 2 KiB.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// The longest request path recorded; longer ones are refused before anything is read.
pub const MAX_PATH_CHARS: usize = 512;
/// The longest error text recorded in a receipt (a parse error may quote the input).
const MAX_ERROR_CHARS: usize = 200;

fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The method and path are the edge's facts about the request: an HTTP method token and an
/// absolute path of visible ASCII, bounded, before anything is decided or recorded.
fn check_request_facts(method: &str, path: &str, body_sha256: &[u8]) {
    if method.is_empty() || method.len() > 16 || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "method: an HTTP method in upper case (1 to 16 letters) is required"
        );
    }
    if !path.starts_with('/') || path.len() > MAX_PATH_CHARS || !path.bytes().all(|b| b.is_ascii_graphic()) {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("path: an absolute request path of at most {MAX_PATH_CHARS} visible ASCII characters is required")
        );
    }
    if body_sha256.len() != 32 {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "body_sha256: the 32-byte SHA-256 of the request body is required"
        );
    }
}

/// Verifies an envelope for one request. Allowed: the transaction now acts as the connection the
/// sender's key is bound to, for this route only (querylayer.envelope_routes), and the receipt
/// carries that context. Denied: nothing is held, and the receipt says which checks failed.
/// Either way the decision is recorded. Whether a key is bound to anything is looked at only
/// once its signature verifies: before that, the answer is the same for every key. Everything a
/// receipt stores is bounded (docs/security.md): the sender only when it is a did:key, the
/// path and method as checked above, errors cut to 200 characters.
pub fn authenticate(header: Option<&str>, method: &str, path: &str, body_sha256: &[u8]) -> Jsonb {
    context::refuse_if_established();
    check_request_facts(method, path, body_sha256);
    let s = settings();
    let denied = |error: String, checks: Value, profile: Value, sender: Value, connection: Value| {
        context::clear();
        receipt(json!({
            "error": truncate(&error, MAX_ERROR_CHARS), "allowed": false, "path": path, "method": method,
            "profile": profile, "sender": sender, "checks": checks, "contract": contract(&s.server_did),
            "connection_id": connection,
        }))
    };
    let header = match header.map(str::trim) {
        Some(h) if h.len() > MAX_HEADER_BYTES => {
            return denied(
                format!("the envelope is larger than {MAX_HEADER_BYTES} bytes"),
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
            )
        }
        Some(h) if !h.is_empty() => h,
        _ => {
            return denied(
                "missing x-qg-envelope header".into(),
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
            )
        }
    };
    let envelope = match Envelope::parse(header) {
        Ok(e) => e,
        Err(e) => {
            return denied(
                format!("unparseable envelope: {e}"),
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
            )
        }
    };
    let body_hex = hex::encode(body_sha256);
    let facts = RequestFacts {
        method,
        path,
        body_sha256: &body_hex,
        server_did: &s.server_did,
        now: s.now,
        freshness_seconds: s.freshness_seconds,
        require_v2: s.require_v2,
    };
    let mut checks = envelope.check(&facts);
    let v2 = envelope.signing_profile() == Profile::V2;
    let signed = checks.0.iter().take(2).all(|(_, ok)| *ok);

    // Only a verified signer learns whether its key is bound: the key's holder made this
    // envelope. Resolution leaves a provisional context, and holds the connection's lock when
    // everything else passed (the context may be established).
    let (verdict, connection) = if signed {
        match context::resolve(Credential::DidKey, &did_sha256(&envelope.sender), checks.all_passed()) {
            Resolution::Live(v) => {
                let id = v["connection_id"].clone();
                (Some(v), id)
            }
            Resolution::Dead { subject, .. } => {
                (None, subject.map(|u| Value::String(u.to_string())).unwrap_or(Value::Null))
            }
        }
    } else {
        (None, Value::Null)
    };
    if signed {
        checks.push("keyBound", verdict.is_some());
    }

    // A nonce is spent only by an envelope that passed everything else.
    if v2 {
        let unused = signed
            && checks.all_passed()
            && Spi::get_one_with_args::<bool>(
                "SELECT querylayer.spend_nonce($1, $2, $3)",
                &[
                    envelope.sender.as_str().into(),
                    envelope.nonce.as_deref().unwrap_or("").into(),
                    s.freshness_seconds.into(),
                ],
            )
            .unwrap_or_else(|e| error!("querylayer: nonce check failed: {e}"))
            .unwrap_or(false);
        checks.push("nonceUnused", unused);
    }

    let profile = Value::String(envelope.signing_profile().as_str().into());
    // The sender is recorded only when it is a did:key (bounded); anything else was refused.
    let sender = if didkey::is_ed25519_did_key(&envelope.sender) {
        Value::String(envelope.sender.clone())
    } else {
        Value::Null
    };
    match verdict {
        Some(verdict) if checks.all_passed() => {
            let route = context::Route {
                method: method.to_string(),
                path: path.to_string(),
                body_sha256: body_sha256.to_vec(),
            };
            let held = context::establish(Credential::DidKey, verdict, Some(route)).0;
            receipt(json!({
                "allowed": true, "path": path, "method": method, "profile": profile, "sender": sender,
                "checks": checks.to_json(), "connection_id": connection, "context": held,
            }))
        }
        _ => denied("envelope auth failed".into(), checks.to_json(), profile, sender, connection),
    }
}

/// True for a well-formed Ed25519 did:key.
#[pg_extern(immutable, parallel_safe)]
fn did_key_valid(did: &str) -> bool {
    didkey::is_ed25519_did_key(did)
}

/// The lookup key of a did:key binding.
#[pg_extern(immutable, parallel_safe)]
fn did_key_sha256(did: &str) -> Vec<u8> {
    did_sha256(did)
}

/// True when the did:key is bound to a connection that is live now (on any site).
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn did_key_in_use(did: &str) -> bool {
    context::did_key_is_live(&did_sha256(did))
}

/// The organizations whose connections were ever bound to the did:key.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn did_key_organizations(did: &str) -> Vec<pgrx::Uuid> {
    context::did_key_organizations(&did_sha256(did))
}

/// True when `signature` (`ed25519:` + hex) is the did:key's signature over `message`: the
/// proof of possession a binding requires (querylayer.did_binding_message).
#[pg_extern(immutable, parallel_safe)]
fn did_key_signature_valid(did: &str, message: &str, signature: &str) -> bool {
    didkey::is_ed25519_did_key(did)
        && querylayer_envelope::verify_signature(did, message.as_bytes(), signature)
}

/// The exact text a key's holder signs to bind it to a connection of `site` (docs/envelope.md).
#[pg_extern(immutable, parallel_safe)]
fn did_binding_message(did: &str, site: &str, challenge: &str) -> String {
    querylayer_envelope::binding_message(did, site, challenge)
}

/// The canonical JSON text of a jsonb value and its SHA-256, as envelopes hash payloads.
#[pg_extern(immutable, parallel_safe)]
fn canonical_sha256(value: Jsonb) -> String {
    canonical::sha256_hex(canonical::canonical_json_value(&value.0).as_bytes())
}

/// Checks an envelope on its own (no request, no binding): its payload hash and its signature
/// against its own verification method.
pub fn verify_standalone(text: &str) -> Jsonb {
    match Envelope::parse(text) {
        Err(e) => Jsonb(json!({"parsed": false, "error": e.to_string(), "payload_hash_valid": false,
                               "signed": false, "signature_valid": false})),
        Ok(env) => Jsonb(json!({
            "parsed": true,
            "profile": env.signing_profile().as_str(),
            "sender": env.sender,
            "verification_method": env.verification_method,
            "payload_hash_valid": env.recomputed_payload_sha256() == env.payload_sha256,
            "signed": env.signature.starts_with("ed25519:"),
            "signature_valid": env.signature_valid(),
            "sender_matches_verification_method": env.verification_method.as_deref()
                .and_then(|vm| vm.split('#').next()) == Some(env.sender.as_str()),
        })),
    }
}

#[pg_schema]
mod querylayer_api {
    use crate::jsonb::Jsonb;
    use pgrx::prelude::*;

    /// Verifies a TypeDID envelope (JSON text) on its own: the payload hash and the signature
    /// against the envelope's verification method. Decides nothing about access.
    /// SECURITY DEFINER only for uniformity of the surface; it reads nothing.
    #[pg_extern(security_definer, immutable, parallel_safe)]
    #[search_path(pg_catalog, pg_temp)]
    fn verify_envelope(p_envelope: &str) -> Jsonb {
        super::verify_standalone(p_envelope)
    }

    /// Verifies the `x-qg-envelope` header of one `/v1` request (method, exact path, SHA-256 of
    /// the exact body) and, when every check passes, holds the bound connection's context for
    /// this transaction. Never raises for a bad envelope: it returns (and records) the receipt.
    /// SECURITY DEFINER: reads the private bindings, nonces and settings; writes receipts.
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn authenticate_envelope(header: Option<&str>, method: &str, path: &str, body_sha256: &[u8]) -> Jsonb {
        super::authenticate(header, method, path, body_sha256)
    }
}

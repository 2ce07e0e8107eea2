//! The TypeDID envelope carried in `x-qg-envelope`: parsing, minting and the server's checks.
//!
//! v1 (`querygraph.typedid.v1`) signs six lines: the domain `querygraph-typedid-signing-v1`,
//! sender, recipient, action, resource and the payload hash. It signs no time and no nonce, so a
//! captured header can be replayed to the same path with the same body for ever. v2
//! (`querygraph.typedid.v2`, domain `querygraph-typedid-signing-v2`) appends three lines — the
//! HTTP method, `created_at` exactly as sent, and a nonce — so the server can refuse stale
//! envelopes and envelopes whose nonce it has already seen (docs/envelope.md).

use crate::canonical::{self, Node};
use crate::{didkey, keys};

pub const PROTOCOL_V1: &str = "querygraph.typedid.v1";
pub const PROTOCOL_V2: &str = "querygraph.typedid.v2";
pub const DOMAIN_V1: &str = "querygraph-typedid-signing-v1";
pub const DOMAIN_V2: &str = "querygraph-typedid-signing-v2";
const DIGEST_DOMAIN: &str = "querygraph-typedid-envelope-digest-v1";
const DEFAULT_PRIVACY: &str = "secret";
const DEFAULT_PROFILE: &str = "ed25519-x25519-chacha20";
const DEFAULT_CONTENT_TYPE: &str = "application/json";

/// The signing profile an envelope declares through its `protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    V1,
    V2,
}

impl Profile {
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::V1 => "v1",
            Profile::V2 => "v2",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

/// An envelope as sent. Unknown fields are ignored when parsing.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub protocol: String,
    pub conversation_id: String,
    pub sender: String,
    pub recipient: String,
    pub action: String,
    pub resource: String,
    pub privacy: String,
    pub profile: String,
    pub content_type: String,
    pub payload: Node,
    pub payload_sha256: String,
    pub signature: String,
    pub verification_method: Option<String>,
    pub envelope_digest: Option<String>,
    pub created_at: Option<String>,
    /// v2 only: the HTTP method the envelope is for.
    pub method: Option<String>,
    /// v2 only: a value the sender never reuses.
    pub nonce: Option<String>,
}

/// What the server knows about the request an envelope arrived with.
#[derive(Debug, Clone)]
pub struct RequestFacts<'a> {
    pub method: &'a str,
    pub path: &'a str,
    /// Lowercase hex SHA-256 of the exact request body.
    pub body_sha256: &'a str,
    /// This server's DID, which `recipient` must name.
    pub server_did: &'a str,
    /// Now, in Unix seconds.
    pub now: i64,
    /// How far `created_at` may be from now, in seconds (v2).
    pub freshness_seconds: i64,
    /// Refuse v1 envelopes.
    pub require_v2: bool,
}

/// The named results of the checks, in the order they are made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checks(pub Vec<(&'static str, bool)>);

impl Checks {
    pub fn all_passed(&self) -> bool {
        self.0.iter().all(|(_, ok)| *ok)
    }

    pub fn push(&mut self, name: &'static str, ok: bool) {
        self.0.push((name, ok));
    }

    /// The first failed check, if any.
    pub fn first_failure(&self) -> Option<&'static str> {
        self.0.iter().find(|(_, ok)| !ok).map(|(n, _)| *n)
    }

    /// `{"signatureValid": true, …}` in check order.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.0.iter().map(|(n, ok)| (n.to_string(), serde_json::Value::Bool(*ok))).collect(),
        )
    }
}

fn field<'a>(obj: &'a Node, key: &str) -> Result<&'a str, ParseError> {
    obj.get(key)
        .and_then(Node::as_str)
        .ok_or_else(|| ParseError(format!("the envelope needs a string {key:?}")))
}

fn optional(obj: &Node, key: &str) -> Option<String> {
    obj.get(key).and_then(Node::as_str).map(str::to_string)
}

impl Envelope {
    /// Parses the header value (compact or pretty JSON).
    pub fn parse(header: &str) -> Result<Envelope, ParseError> {
        let node =
            canonical::parse(header).map_err(|e| ParseError(format!("the envelope is not JSON: {e}")))?;
        if !matches!(node, Node::Object(_)) {
            return Err(ParseError("the envelope must be a JSON object".into()));
        }
        let payload = node
            .get("payload")
            .cloned()
            .ok_or_else(|| ParseError("the envelope needs a \"payload\"".into()))?;
        if !matches!(payload, Node::Object(_)) {
            return Err(ParseError("the envelope's \"payload\" must be an object".into()));
        }
        let protocol = optional(&node, "protocol").unwrap_or_else(|| PROTOCOL_V1.to_string());
        if protocol != PROTOCOL_V1 && protocol != PROTOCOL_V2 {
            return Err(ParseError(format!("unsupported protocol {protocol:?}")));
        }
        let payload_sha256 = field(&node, "payload_sha256")?.to_string();
        Ok(Envelope {
            conversation_id: optional(&node, "conversation_id").unwrap_or_default(),
            sender: field(&node, "sender")?.to_string(),
            recipient: field(&node, "recipient")?.to_string(),
            action: field(&node, "action")?.to_string(),
            resource: field(&node, "resource")?.to_string(),
            privacy: optional(&node, "privacy").unwrap_or_else(|| DEFAULT_PRIVACY.into()),
            profile: optional(&node, "profile").unwrap_or_else(|| DEFAULT_PROFILE.into()),
            content_type: optional(&node, "content_type").unwrap_or_else(|| DEFAULT_CONTENT_TYPE.into()),
            signature: field(&node, "signature")?.to_string(),
            verification_method: optional(&node, "verification_method"),
            envelope_digest: optional(&node, "envelope_digest"),
            created_at: optional(&node, "created_at"),
            method: optional(&node, "method"),
            nonce: optional(&node, "nonce"),
            protocol,
            payload,
            payload_sha256,
        })
    }

    pub fn signing_profile(&self) -> Profile {
        if self.protocol == PROTOCOL_V2 {
            Profile::V2
        } else {
            Profile::V1
        }
    }

    /// The hash of the canonical payload, recomputed from the parsed values.
    pub fn recomputed_payload_sha256(&self) -> String {
        canonical::sha256_hex(canonical::canonical_node(&self.payload).as_bytes())
    }

    /// The bytes the signature covers, for this envelope's profile.
    pub fn signing_payload(&self) -> String {
        let mut lines = vec![
            if self.signing_profile() == Profile::V2 { DOMAIN_V2 } else { DOMAIN_V1 },
            &self.sender,
            &self.recipient,
            &self.action,
            &self.resource,
            &self.payload_sha256,
        ];
        if self.signing_profile() == Profile::V2 {
            lines.push(self.method.as_deref().unwrap_or(""));
            lines.push(self.created_at.as_deref().unwrap_or(""));
            lines.push(self.nonce.as_deref().unwrap_or(""));
        }
        lines.join("\n")
    }

    /// The payload hash recomputes and the signature verifies against the envelope's own
    /// verification method.
    pub fn signature_valid(&self) -> bool {
        let Some(vm) = &self.verification_method else {
            return false;
        };
        self.recomputed_payload_sha256() == self.payload_sha256
            && keys::verify_signature(vm, self.signing_payload().as_bytes(), &self.signature)
    }

    /// The checks a server makes, in the seed's order (signature, action, resource, body), with
    /// the sender and recipient bindings, and for v2 the method and freshness. The nonce and
    /// the key's binding to a connection are checked where state lives (the database).
    pub fn check(&self, facts: &RequestFacts<'_>) -> Checks {
        let mut checks = Checks::default();
        checks.push("signatureValid", self.signature_valid());
        checks.push(
            "senderMatchesVerificationMethod",
            didkey::is_ed25519_did_key(&self.sender)
                && self.verification_method.as_deref().and_then(|vm| vm.split('#').next())
                    == Some(self.sender.as_str()),
        );
        checks.push("recipientIsServer", self.recipient == facts.server_did);
        checks.push("actionIsInvoke", self.action == "invoke");
        checks.push("resourceBoundToPath", self.resource == facts.path);
        checks.push(
            "bodyBound",
            self.payload.get("bodySha256").and_then(Node::as_str) == Some(facts.body_sha256),
        );
        match self.signing_profile() {
            Profile::V1 => checks.push("profileAccepted", !facts.require_v2),
            Profile::V2 => {
                checks.push("profileAccepted", true);
                checks.push(
                    "methodBound",
                    self.method.as_deref().is_some_and(|m| m.eq_ignore_ascii_case(facts.method)),
                );
                let fresh = self
                    .created_at
                    .as_deref()
                    .and_then(unix_seconds)
                    .is_some_and(|t| (facts.now - t).abs() <= facts.freshness_seconds);
                checks.push("fresh", fresh);
                checks.push("nonceWellFormed", self.nonce.as_deref().is_some_and(nonce_well_formed));
            }
        }
        checks
    }

    /// Mints a v1 envelope (what `querygraph.api_auth.mint_envelope_header` makes).
    pub fn mint_v1(
        signer: &keys::Signer,
        recipient: &str,
        action: &str,
        resource: &str,
        payload: &serde_json::Value,
        created_at: &str,
    ) -> Envelope {
        Envelope::mint(signer, PROTOCOL_V1, recipient, action, resource, payload, created_at, None, None)
    }

    /// Mints a v2 envelope, bound to `method`, `created_at` and `nonce`.
    pub fn mint_v2(
        signer: &keys::Signer,
        recipient: &str,
        action: &str,
        resource: &str,
        payload: &serde_json::Value,
        method: &str,
        created_at: &str,
        nonce: &str,
    ) -> Envelope {
        Envelope::mint(
            signer,
            PROTOCOL_V2,
            recipient,
            action,
            resource,
            payload,
            created_at,
            Some(method.to_ascii_uppercase()),
            Some(nonce.to_string()),
        )
    }

    fn mint(
        signer: &keys::Signer,
        protocol: &str,
        recipient: &str,
        action: &str,
        resource: &str,
        payload: &serde_json::Value,
        created_at: &str,
        method: Option<String>,
        nonce: Option<String>,
    ) -> Envelope {
        let canonical_payload = canonical::canonical_json_value(payload);
        let payload_sha256 = canonical::sha256_hex(canonical_payload.as_bytes());
        let mut env = Envelope {
            protocol: protocol.to_string(),
            conversation_id: format!("qg:{}", &payload_sha256[..16]),
            sender: signer.did_key(),
            recipient: recipient.to_string(),
            action: action.to_string(),
            resource: resource.to_string(),
            privacy: DEFAULT_PRIVACY.into(),
            profile: DEFAULT_PROFILE.into(),
            content_type: DEFAULT_CONTENT_TYPE.into(),
            payload: canonical::parse(&canonical_payload).expect("canonical JSON parses"),
            payload_sha256,
            signature: String::new(),
            verification_method: Some(signer.verification_method()),
            envelope_digest: None,
            created_at: Some(created_at.to_string()),
            method,
            nonce,
        };
        env.signature = signer.sign(env.signing_payload().as_bytes());
        env.envelope_digest = Some(format!(
            "sha256:{}",
            canonical::sha256_hex(
                [DIGEST_DOMAIN, &env.conversation_id, &env.privacy, &env.profile, &env.signature]
                    .join("\n")
                    .as_bytes()
            )
        ));
        env
    }

    /// The header value: compact JSON in the reference field order (v2 adds method and nonce).
    pub fn to_header_json(&self) -> String {
        let s = |v: &str| serde_json::Value::String(v.to_string()).to_string();
        let mut parts = vec![
            format!("\"protocol\":{}", s(&self.protocol)),
            format!("\"conversation_id\":{}", s(&self.conversation_id)),
            format!("\"sender\":{}", s(&self.sender)),
            format!("\"recipient\":{}", s(&self.recipient)),
            format!("\"action\":{}", s(&self.action)),
            format!("\"resource\":{}", s(&self.resource)),
            format!("\"privacy\":{}", s(&self.privacy)),
            format!("\"profile\":{}", s(&self.profile)),
            format!("\"content_type\":{}", s(&self.content_type)),
            format!("\"payload\":{}", canonical::canonical_node(&self.payload)),
            format!("\"payload_sha256\":{}", s(&self.payload_sha256)),
            format!("\"signature\":{}", s(&self.signature)),
        ];
        if let Some(vm) = &self.verification_method {
            parts.push(format!("\"verification_method\":{}", s(vm)));
        }
        if let Some(d) = &self.envelope_digest {
            parts.push(format!("\"envelope_digest\":{}", s(d)));
        }
        if let Some(c) = &self.created_at {
            parts.push(format!("\"created_at\":{}", s(c)));
        }
        if let Some(m) = &self.method {
            parts.push(format!("\"method\":{}", s(m)));
        }
        if let Some(n) = &self.nonce {
            parts.push(format!("\"nonce\":{}", s(n)));
        }
        format!("{{{}}}", parts.join(","))
    }
}

/// 16 to 128 characters of base64url or hex: enough entropy, nothing that needs escaping.
fn nonce_well_formed(nonce: &str) -> bool {
    (16..=128).contains(&nonce.len())
        && nonce.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Unix seconds of an RFC 3339 UTC timestamp (`…Z` or `…+00:00`, optional fraction).
pub fn unix_seconds(ts: &str) -> Option<i64> {
    let body = ts.strip_suffix('Z').or_else(|| ts.strip_suffix("+00:00"))?;
    let (date, time) = body.split_once('T')?;
    let mut d = date.split('-');
    let (y, m, day): (i64, i64, i64) =
        (d.next()?.parse().ok()?, d.next()?.parse().ok()?, d.next()?.parse().ok()?);
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let time = time.split('.').next()?;
    let mut t = time.split(':');
    let (hh, mm, ss): (i64, i64, i64) =
        (t.next()?.parse().ok()?, t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    if t.next().is_some() || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Days from the civil date (proleptic Gregorian), after H. Hinnant's algorithm.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    Some(days * 86400 + hh * 3600 + mm * 60 + ss)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_seconds_parses_rfc3339_utc() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(unix_seconds("2025-01-02T03:04:05.678901Z"), Some(1735787045));
        assert_eq!(unix_seconds("2000-02-29T12:00:00+00:00"), Some(951825600));
        assert_eq!(unix_seconds("2025-01-02 03:04:05Z"), None);
        assert_eq!(unix_seconds("2025-01-02T03:04:05+02:00"), None);
    }
}

//! Commands that need no running server: the A2A agent card, the tools' function-calling
//! schemas (generated from the same parameter structs the MCP tools use), and minting and
//! verifying `x-qg-envelope` headers for operators and scripts.

use std::io::Read;

use clap::{Args, Subcommand, ValueEnum};
use querylayer_envelope::{canonical, Envelope, RequestFacts, Signer};
use serde_json::{json, Value};

use crate::db::Db;
use crate::mcp::QueryLayerMcp;

#[derive(Args, Debug)]
pub struct AgentCardArgs {
    /// The URL clients use to reach the edge (as `serve --public-url`).
    #[arg(long, env = "QUERYLAYER_PUBLIC_URL", default_value = "http://127.0.0.1:8080")]
    pub public_url: String,
    /// A `querylayer_edge` (or operator) login, to read the server's public key; the card the
    /// running edge serves carries it too.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
}

/// Prints the agent card the edge serves at `/.well-known/agent-card.json`.
pub async fn agent_card(args: AgentCardArgs) -> Result<(), String> {
    let db = Db::connect(&args.database_url, 1, std::time::Duration::from_secs(10))?;
    let keys =
        db.server_keys().await.map_err(|e| format!("cannot read the server key: {}", e.with_cause()))?;
    let card = crate::card::agent_card(
        args.public_url.trim_end_matches('/'),
        keys["current"].as_str(),
        keys["envelope_recipient"].as_str().unwrap_or("did:web:qg-server"),
    );
    println!("{}", serde_json::to_string_pretty(&card).expect("JSON"));
    Ok(())
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Flavor {
    Openai,
    Anthropic,
}

#[derive(Args, Debug)]
pub struct ToolSchemasArgs {
    #[arg(long, value_enum, default_value = "openai")]
    pub flavor: Flavor,
}

/// Every MCP tool as a function-calling schema: OpenAI `{"type": "function", "function":
/// {name, description, parameters}}` or Anthropic `{name, description, input_schema}`. The
/// parameters are exactly the tool's MCP `inputSchema`.
pub fn tool_schemas(flavor: Flavor) -> Value {
    let tools: Vec<Value> = QueryLayerMcp::all_tools()
        .into_iter()
        .map(|tool| {
            let parameters = Value::Object((*tool.input_schema).clone());
            let description = tool.description.as_deref().unwrap_or_default().to_string();
            match flavor {
                Flavor::Openai => json!({"type": "function", "function": {
                    "name": tool.name, "description": description, "parameters": parameters}}),
                Flavor::Anthropic => {
                    json!({"name": tool.name, "description": description, "input_schema": parameters})
                }
            }
        })
        .collect();
    Value::Array(tools)
}

#[derive(Subcommand, Debug)]
pub enum EnvelopeCommand {
    /// Mint an `x-qg-envelope` header for one request (v2 by default).
    Mint(MintArgs),
    /// Check a header against a request, as the server does (minus the key binding and the
    /// nonce ledger, which live in the database). Exit status 1 when a check fails.
    Verify(VerifyArgs),
    /// Prove possession of a key for binding it to a connection: sign a server challenge (from
    /// `querylayer admin create-did-challenge` or `POST /api/console/did-challenges`) and print
    /// the `{"challenge", "signature"}` that `create-connection --did-proof` and the console take.
    Prove(ProveArgs),
}

#[derive(Args, Debug)]
pub struct ProveArgs {
    #[command(flatten)]
    pub key: KeyArgs,
    /// The slug of the site the connection is for (part of what is signed).
    #[arg(long)]
    pub site: String,
    /// The challenge the server issued (`qlch_…`).
    #[arg(long)]
    pub challenge: String,
}

#[derive(Args, Debug)]
pub struct KeyArgs {
    /// A QueryGraph-style seed: the secret is SHA-256 of it (`querygraph-agent:<name>` is what
    /// QueryGraph's `TypeDidAgent.new(name)` uses).
    #[arg(long, conflicts_with_all = ["secret_hex", "key_file"])]
    pub seed: Option<String>,
    /// The 32-byte Ed25519 secret, hex (visible in the process list: prefer --key-file).
    #[arg(long, conflicts_with = "key_file")]
    pub secret_hex: Option<String>,
    /// A file holding the 32-byte Ed25519 secret as hex.
    #[arg(long)]
    pub key_file: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
pub struct BodyArgs {
    /// The request path, exactly as requested (`/v1/answer`).
    #[arg(long)]
    pub path: String,
    /// The exact request body.
    #[arg(long, conflicts_with = "body_file")]
    pub body: Option<String>,
    /// A file holding the exact request body (`-` for stdin).
    #[arg(long)]
    pub body_file: Option<std::path::PathBuf>,
    #[arg(long, default_value = "POST")]
    pub method: String,
    /// The server's DID (the envelope's recipient).
    #[arg(long, default_value = "did:web:qg-server")]
    pub recipient: String,
}

#[derive(Args, Debug)]
pub struct MintArgs {
    #[command(flatten)]
    pub key: KeyArgs,
    #[command(flatten)]
    pub request: BodyArgs,
    /// Mint a v1 envelope (no time, no nonce: replayable; what QueryGraph's clients mint).
    #[arg(long)]
    pub v1: bool,
    /// The nonce (default: random).
    #[arg(long)]
    pub nonce: Option<String>,
    /// The creation time, RFC 3339 UTC (default: now).
    #[arg(long)]
    pub created_at: Option<String>,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The header value (default: read from stdin).
    #[arg(long)]
    pub header: Option<String>,
    #[command(flatten)]
    pub request: BodyArgs,
    /// Refuse v1 envelopes.
    #[arg(long)]
    pub require_v2: bool,
    /// How far created_at may be from now (v2), in seconds.
    #[arg(long, default_value_t = 300)]
    pub freshness_seconds: i64,
}

fn signer(key: &KeyArgs) -> Result<Signer, String> {
    let from_hex = |hex_text: &str| -> Result<Signer, String> {
        let bytes = hex::decode(hex_text.trim()).map_err(|e| format!("the secret is not hex: {e}"))?;
        let secret: [u8; 32] = bytes.try_into().map_err(|_| "the secret must be 32 bytes".to_string())?;
        Ok(Signer::from_secret(secret))
    };
    match (&key.seed, &key.secret_hex, &key.key_file) {
        (Some(seed), _, _) => Ok(Signer::from_seed_bytes(seed.as_bytes())),
        (_, Some(hex_text), _) => from_hex(hex_text),
        (_, _, Some(path)) => {
            from_hex(&std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?)
        }
        _ => Err("give the key: --seed, --secret-hex or --key-file".into()),
    }
}

fn body(request: &BodyArgs) -> Result<Vec<u8>, String> {
    match (&request.body, &request.body_file) {
        (Some(text), _) => Ok(text.as_bytes().to_vec()),
        (_, Some(path)) if path.as_os_str() == "-" => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).map_err(|e| e.to_string())?;
            Ok(buf)
        }
        (_, Some(path)) => std::fs::read(path).map_err(|e| format!("{}: {e}", path.display())),
        _ => Ok(Vec::new()),
    }
}

fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

pub fn envelope(command: EnvelopeCommand) -> Result<bool, String> {
    match command {
        EnvelopeCommand::Mint(args) => {
            let signer = signer(&args.key)?;
            let body = body(&args.request)?;
            let payload = json!({"bodySha256": canonical::sha256_hex(&body)});
            let created_at = args.created_at.unwrap_or_else(now_rfc3339);
            let envelope = if args.v1 {
                Envelope::mint_v1(
                    &signer,
                    &args.request.recipient,
                    "invoke",
                    &args.request.path,
                    &payload,
                    &created_at,
                )
            } else {
                let nonce = args.nonce.unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
                Envelope::mint_v2(
                    &signer,
                    &args.request.recipient,
                    "invoke",
                    &args.request.path,
                    &payload,
                    &args.request.method,
                    &created_at,
                    &nonce,
                )
            };
            println!("{}", envelope.to_header_json());
            Ok(true)
        }
        EnvelopeCommand::Prove(args) => {
            let signer = signer(&args.key)?;
            let proof = querylayer_envelope::binding_proof(&signer, &args.site, &args.challenge);
            println!(
                "{}",
                json!({"did": signer.did_key(), "challenge": proof["challenge"], "signature": proof["signature"]})
            );
            Ok(true)
        }
        EnvelopeCommand::Verify(args) => {
            let header = match args.header {
                Some(h) => h,
                None => {
                    let mut text = String::new();
                    std::io::stdin().read_to_string(&mut text).map_err(|e| e.to_string())?;
                    text.trim().to_string()
                }
            };
            let envelope = Envelope::parse(&header).map_err(|e| format!("unparseable envelope: {e}"))?;
            let body = body(&args.request)?;
            let body_sha = canonical::sha256_hex(&body);
            let checks = envelope.check(&RequestFacts {
                method: &args.request.method,
                path: &args.request.path,
                body_sha256: &body_sha,
                server_did: &args.request.recipient,
                now: chrono::Utc::now().timestamp(),
                freshness_seconds: args.freshness_seconds,
                require_v2: args.require_v2,
            });
            let passed = checks.all_passed();
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({
                    "valid": passed,
                    "profile": envelope.signing_profile().as_str(),
                    "sender": envelope.sender,
                    "checks": checks.to_json(),
                    "not_checked_here": ["keyBound", "nonceUnused"],
                }))
                .expect("JSON")
            );
            Ok(passed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_schemas_are_the_mcp_input_schemas_in_both_flavors() {
        let tools = QueryLayerMcp::all_tools();
        let openai = tool_schemas(Flavor::Openai);
        let anthropic = tool_schemas(Flavor::Anthropic);
        assert_eq!(openai.as_array().unwrap().len(), tools.len());
        for ((tool, o), a) in tools.iter().zip(openai.as_array().unwrap()).zip(anthropic.as_array().unwrap())
        {
            let input = Value::Object((*tool.input_schema).clone());
            assert_eq!(o["type"], "function");
            assert_eq!(o["function"]["name"], tool.name.as_ref());
            assert_eq!(o["function"]["parameters"], input);
            assert_eq!(a["name"], tool.name.as_ref());
            assert_eq!(a["input_schema"], input);
            // Each is a valid JSON Schema (2020-12, as rmcp writes them).
            assert!(jsonschema::draft202012::meta::is_valid(&input), "{}", tool.name);
        }
    }
}

//! The A2A (v0.3.0) agent card, served at `/.well-known/agent-card.json` and printed by
//! `querylayer agent-card`: one skill per governed capability, and security schemes documenting
//! both the bearer connection and the signed-envelope contract. The server's did:key comes from
//! the database (`querylayer_api.server_keys`), so both places print the same card.

use serde_json::{json, Value};

/// Where the edge serves its own documentation (docs/edge.md, as Markdown): what the card's
/// `documentationUrl` names.
pub const DOCUMENTATION_PATH: &str = "/docs/edge.md";

/// `GET /docs/edge.md`: the edge's reference (commands, MCP tools, console API, faults).
pub async fn documentation() -> impl axum::response::IntoResponse {
    ([(http::header::CONTENT_TYPE, "text/markdown; charset=utf-8")], include_str!("../../docs/edge.md"))
}

/// The card for an edge reachable at `public_url` whose server key is `server_did`.
pub fn agent_card(public_url: &str, server_did: Option<&str>, recipient_did: &str) -> Value {
    let base = public_url.trim_end_matches('/');
    let mut card = json!({
        "protocolVersion": "0.3.0",
        "name": "QueryLayer",
        "description": "The governed plane through which AI agents read and change a site's content and query its \
    governed semantic model: RBAC+ODRL-gated answers in signed TypeDID envelopes with OpenLineage events and \
    Ed25519 attestations, immutable revisions, append-only runs, and publishing only through human approval.",
        "url": format!("{base}/v1"),
        "preferredTransport": "HTTP+JSON",
        "additionalInterfaces": [
            {"url": format!("{base}/v1"), "transport": "HTTP+JSON"}
        ],
        "provider": {"organization": "QueryLayer", "url": base},
        "version": env!("CARGO_PKG_VERSION"),
        "documentationUrl": format!("{base}{DOCUMENTATION_PATH}"),
        "capabilities": {"streaming": false, "pushNotifications": false, "stateTransitionHistory": false},
        "defaultInputModes": ["application/json"],
        "defaultOutputModes": ["application/json"],
        "skills": skills(),
        "securitySchemes": {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": format!(
                    "A QueryLayer connection secret (qlc_…), issued by an operator or a site owner for one agent, one \
    site, explicit scopes and an expiry; sent as `Authorization: Bearer <secret>` to {base}/mcp (MCP Streamable HTTP)."
                ),
            },
            "typedid": {
                "type": "apiKey",
                "in": "header",
                "name": "x-qg-envelope",
                "description": format!(
                    "A compact-JSON TypeDID envelope signed with Ed25519 by a did:key bound to a connection. Checks, in \
    order: signature (querygraph-typedid-signing-v1, or -v2 which also binds the HTTP method, created_at and a nonce) \
    against the envelope's own did:key verification method; action == \"invoke\"; resource == the request path; \
    payload.bodySha256 == SHA-256 of the exact body; sender == the signing did:key; recipient == {recipient_did}; \
    v2 only: fresh and never replayed. A refusal is a 401 whose receipt lists every check."
                ),
            },
        },
        "security": [{"typedid": []}, {"bearer": []}],
    });
    if let Some(did) = server_did {
        card["provider"]["serverDid"] = json!(did);
        card["signingKey"] = json!({"did": did, "use": "answer envelopes and lineage attestations"});
    }
    card
}

fn skill(id: &str, name: &str, description: &str, tags: &[&str], examples: &[&str]) -> Value {
    json!({"id": id, "name": name, "description": description, "tags": tags, "examples": examples,
           "inputModes": ["application/json"], "outputModes": ["application/json"]})
}

/// One skill per governed capability.
fn skills() -> Vec<Value> {
    vec![
        skill("answer-question", "Governed answer",
            "Answer a question over the site's semantic model: search, RBAC+ODRL gate (denied sources never planned or \
touched), SQL plans over allowed sources, and a signed envelope with OpenLineage event and attestation (POST /v1/answer, \
MCP answer_question).",
            &["semantics", "rbac", "odrl", "typedid", "openlineage"],
            &["Where do fiscal capacity and energy burden overlap with health risk?"]),
        skill("import-semantic-model", "Import a semantic model",
            "Import an OSI semantic model (JSON or YAML) as the site's new immutable version, validated with errors \
naming the offending path (POST /v1/models/import/osi, MCP import_semantic_model).",
            &["osi", "semantic-layer"], &["Import the resilience-desk model."]),
        skill("semantic-search", "Search the semantic model",
            "Search datasets, fields and metrics by names, synonyms, descriptions and ai_context; resolve metrics with \
dialect fallback (MCP search_semantic_model, resolve_metric).",
            &["semantic-layer", "search", "metrics"], &["budget headroom"]),
        skill("navigator-bundle", "Navigator bundle",
            "The governed, per-principal view of the model: every dataset, field and metric with its access decision \
(MCP build_navigator_bundle, check_access).",
            &["semantic-layer", "rbac", "odrl"], &["What may I read?"]),
        skill("qglake-story", "Governed multi-agent run",
            "Run the resilience-desk specialist roster as registered agents gated by the rights engine, with receipts, \
OpenLineage events and attestations (MCP run_qglake_story).",
            &["governance", "openlineage", "typedid"],
            &["Where do fiscal capacity, energy burden, mobility disruption, and climate-health risk overlap?"]),
        skill("verify-envelope", "Verify TypeDID envelope",
            "Verify a TypeDID envelope's payload hash and Ed25519 signature against its did:key verification method \
(MCP verify_envelope).",
            &["audit", "ed25519", "typedid"], &["Verify this x-qg-envelope header."]),
        skill("governed-content", "Governed content work",
            "Draft content inside governed runs with required outputs, propose changes as typed cards, and request \
publishing through human approval (MCP querylayer_* tools at /mcp).",
            &["content", "runs", "proposals", "human-approval"], &["Draft a pricing page and request publishing."]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The card validates against the A2A v0.3.0 JSON Schema (`#/definitions/AgentCard`).
    #[test]
    fn the_card_validates_against_the_a2a_schema() {
        let schema: Value =
            serde_json::from_str(include_str!("../../tests/fixtures/vendor/a2a-v0.3.0.json")).unwrap();
        let mut agent_card = schema["definitions"]["AgentCard"].clone();
        agent_card["definitions"] = schema["definitions"].clone();
        agent_card["$schema"] = json!("http://json-schema.org/draft-07/schema#");
        let validator = jsonschema::draft7::new(&agent_card).expect("the A2A schema compiles");
        for did in [None, Some("did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp")] {
            let card = agent_card_for_test(did);
            let errors: Vec<String> =
                validator.iter_errors(&card).map(|e| format!("{e} at {}", e.instance_path())).collect();
            assert!(errors.is_empty(), "{errors:?}");
        }
        let broken = json!({"name": "x"});
        assert!(!validator.is_valid(&broken), "the validator rejects an incomplete card");
    }

    fn agent_card_for_test(did: Option<&str>) -> Value {
        agent_card("http://127.0.0.1:8080/", did, "did:web:qg-server")
    }

    #[test]
    fn one_skill_per_governed_capability() {
        let card = agent_card("http://h", None, "did:web:qg-server");
        let ids: Vec<&str> =
            card["skills"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
        assert_eq!(
            ids,
            [
                "answer-question",
                "import-semantic-model",
                "semantic-search",
                "navigator-bundle",
                "qglake-story",
                "verify-envelope",
                "governed-content"
            ]
        );
        assert_eq!(card["url"], "http://h/v1");
    }

    #[tokio::test]
    async fn the_documentation_url_serves_documentation_not_oauth_metadata() {
        use axum::response::IntoResponse;
        let card = agent_card("http://h", None, "did:web:qg-server");
        assert_eq!(card["documentationUrl"], "http://h/docs/edge.md");
        let response = documentation().await.into_response();
        assert_eq!(response.headers()[http::header::CONTENT_TYPE], "text/markdown; charset=utf-8");
        let body = axum::body::to_bytes(response.into_body(), 1 << 22).await.unwrap();
        assert!(String::from_utf8_lossy(&body).starts_with("# The edge: `querylayer`"));
    }
}

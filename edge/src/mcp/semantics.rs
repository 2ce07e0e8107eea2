//! Semantics tools (QueryGraph): the site's semantic model, RBAC + ODRL decisions with
//! receipts, the governed navigator loop with signed answers, and the resilience-desk story.
//! Names follow QueryGraph's MCP surface (the seed lists `search_semantic_model` and
//! `search_semantic_models`; the singular is the one kept). Every decision is the database's.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::output::Json;
use super::QueryLayerMcp;
use crate::answer::{answer, question_call};
use crate::db::Call;

/// Text to search the site's current semantic model for.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchParams {
    /// Words or a question; names, synonyms (multi-word ones too), descriptions and
    /// `ai_context` are searched, results ranked deterministically.
    pub text: String,
}

/// Ranked matches in the current model.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SearchResult {
    pub model: String,
    pub version: i64,
    pub text: String,
    /// `[{kind: dataset|field|metric, name, dataset?, rank, term, via}]`, best first.
    #[schemars(schema_with = "super::any_array")]
    pub matches: Value,
}

/// A metric and the dialect wanted.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveMetricParams {
    /// The metric's name in the model.
    pub name: String,
    /// The SQL dialect wanted (default `SAIL_SQL`); falls back to `ANSI_SQL`, then to the
    /// first dialect the metric lists — the result says which was used.
    pub dialect: Option<String>,
}

/// A metric's expression and the dialect it is written in.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct MetricResolution {
    pub metric: String,
    pub requested_dialect: String,
    /// The dialect of `expression`.
    pub dialect: String,
    /// `requested`, `ansi_sql` or `first_listed`.
    #[schemars(schema_with = "super::any_json")]
    pub fallback: Value,
    pub expression: String,
}

/// One access question for this connection's agent (the principal is never an argument).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckAccessParams {
    /// The governed resource, for example a dataset source `sail.qg_lakehouse.government_finance__countydata`.
    pub resource: String,
    /// The ODRL action: `read` (default), `use`, `derive`, … (`odrl:` prefix optional; `read ⊂ use`).
    pub action: Option<String>,
    /// The purpose stated for ODRL `purpose` constraints.
    pub purpose: Option<String>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// RBAC AND ODRL, both halves shown, with the receipt that was recorded.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct AccessDecision {
    pub principal: String,
    pub resource: String,
    pub action: String,
    pub rbac_allowed: bool,
    pub odrl_allowed: bool,
    pub allowed: bool,
    pub rbac_reason: String,
    pub odrl_reason: String,
    pub policy_id: Option<String>,
    /// `{principal, resource, action, allowed, reason, policy_id, issued_at}`.
    #[schemars(schema_with = "super::any_object")]
    pub receipt: Value,
}

/// The purpose the bundle is built for.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BundleParams {
    /// The purpose stated for ODRL `purpose` constraints.
    pub purpose: Option<String>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// The per-principal view of the model: each dataset and metric with its access decision.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct NavigatorBundle {
    pub model: String,
    pub model_version: i64,
    pub principal: String,
    pub purpose: Option<String>,
    /// `[{name, description, source, fields, access: {allowed, reason, policy_id}}]`; a denied
    /// dataset lists no fields.
    #[schemars(schema_with = "super::any_array")]
    pub datasets: Value,
    /// `[{name, description, dialects, access}]`.
    #[schemars(schema_with = "super::any_array")]
    pub metrics: Value,
    /// One recorded receipt per dataset.
    #[schemars(schema_with = "super::any_array")]
    pub receipts: Value,
}

/// An OSI semantic model to import as the site's new current version.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportModelParams {
    /// The OSI document: a JSON object, or JSON or YAML text. `semantic_model` may be an
    /// object or a one-item list; `ai_context` a string or an object.
    #[schemars(schema_with = "super::any_json")]
    pub document: Value,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// The imported version.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ImportedModel {
    pub model_id: Uuid,
    pub name: String,
    pub version: i64,
    pub source_sha256: String,
    pub datasets: i64,
    pub metrics: i64,
    pub imported_at: String,
}

/// A question for the governed navigator loop.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerParams {
    /// The question, in natural language.
    pub question: String,
    /// The purpose stated for ODRL `purpose` constraints.
    pub purpose: Option<String>,
    /// The SQL dialect to plan in (default `SAIL_SQL`).
    pub dialect: Option<String>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// A governed, signed, lineage-anchored answer.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SignedAnswer {
    pub answer_id: Uuid,
    pub question: String,
    pub answer: String,
    /// `deterministic`, or `openai-compatible:<model>`.
    pub synthesized_by: String,
    #[schemars(schema_with = "super::any_array")]
    pub matches: Value,
    /// `[{dataset, source, sql, metric}]` over allowed sources only.
    #[schemars(schema_with = "super::any_array")]
    pub plans: Value,
    /// One recorded receipt per gated dataset.
    #[schemars(schema_with = "super::any_array")]
    pub receipts: Value,
    pub denied_sources: Vec<String>,
    /// The TypeDID envelope (signed by the server key) carrying answer, plans and receipts.
    #[schemars(schema_with = "super::any_object")]
    pub envelope: Value,
    /// The OpenLineage RunEvent (spec 2-0-2).
    #[schemars(schema_with = "super::any_object")]
    pub openlineage: Value,
    /// The exact event bytes the attestation's hash covers.
    pub openlineage_text: String,
    pub event_sha256: String,
    /// The Ed25519 attestation over the event hash.
    #[schemars(schema_with = "super::any_object")]
    pub attestation: Value,
    /// The server's did:key that signed the envelope and the attestation.
    pub server_did: String,
    pub model_version: i64,
    pub lineage_event_id: Uuid,
}

/// No arguments but the idempotency key.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StoryParams {
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// The story: each specialist gated by the site's rights, with its receipt, COMMIT event and
/// attestation.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct StoryRun {
    #[schemars(schema_with = "super::any_object")]
    pub prompt: Value,
    /// The did:key that signed every envelope and attestation.
    pub signer: String,
    pub server_did: String,
    #[schemars(schema_with = "super::any_array")]
    pub agents: Value,
    /// `[{agent, principal, resource, status: allowed|denied, summary, receipt, envelope, openlineage, attestation}]`.
    #[schemars(schema_with = "super::any_array")]
    pub responses: Value,
    #[schemars(schema_with = "super::any_object")]
    pub synthesis: Value,
}

/// A TypeDID envelope to check.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerifyEnvelopeParams {
    /// The envelope: a JSON object, or its JSON text (for example an `x-qg-envelope` header value).
    #[schemars(schema_with = "super::any_json")]
    pub envelope: Value,
}

/// What the envelope proves on its own.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct EnvelopeVerification {
    pub parsed: bool,
    pub error: Option<String>,
    /// `v1` or `v2`.
    pub profile: Option<String>,
    pub sender: Option<String>,
    pub verification_method: Option<String>,
    pub payload_hash_valid: bool,
    pub signed: bool,
    pub signature_valid: bool,
    pub sender_matches_verification_method: Option<bool>,
}

/// A JSON value given either as text or as JSON, as the text the database parses.
fn as_text(value: Value) -> String {
    match value {
        Value::String(text) => text,
        other => other.to_string(),
    }
}

#[tool_router(router = semantics_router, vis = "pub(super)")]
impl QueryLayerMcp {
    /// Search the site's current semantic model (OSI) by names, synonyms, descriptions and
    /// ai_context; results are ranked deterministically.
    #[tool(name = "search_semantic_model")]
    async fn search_semantic_model(
        &self,
        Parameters(p): Parameters<SearchParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SearchResult>, CallToolResult> {
        self.call(&ctx, Call::new("search_semantic_model").arg("p_text", p.text)).await
    }

    /// Resolve a metric to its SQL expression for a dialect, with fallback (requested →
    /// ANSI_SQL → first listed); says which dialect was used.
    #[tool(name = "resolve_metric")]
    async fn resolve_metric(
        &self,
        Parameters(p): Parameters<ResolveMetricParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<MetricResolution>, CallToolResult> {
        self.call(&ctx, Call::new("resolve_metric").arg("p_name", p.name).opt("p_dialect", p.dialect)).await
    }

    /// Ask whether this connection's agent may act on a resource: RBAC AND ODRL (action
    /// hierarchy, purpose constraints, conflict strategies). A denial is an answer, not an
    /// error; every decision is recorded as an append-only receipt.
    #[tool(name = "check_access")]
    async fn check_access(
        &self,
        Parameters(p): Parameters<CheckAccessParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<AccessDecision>, CallToolResult> {
        self.call(
            &ctx,
            Call::new("check_access")
                .arg("p_resource", p.resource)
                .opt("p_action", p.action)
                .opt("p_purpose", p.purpose)
                .idempotent(p.idempotency_key),
        )
        .await
    }

    /// Build the governed view of the semantic model this agent may navigate: every dataset,
    /// field and metric with its access decision (receipts recorded).
    #[tool(name = "build_navigator_bundle")]
    async fn build_navigator_bundle(
        &self,
        Parameters(p): Parameters<BundleParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<NavigatorBundle>, CallToolResult> {
        self.call(
            &ctx,
            Call::new("build_navigator_bundle").opt("p_purpose", p.purpose).idempotent(p.idempotency_key),
        )
        .await
    }

    /// Import an OSI semantic model (JSON or YAML) as the site's new current version; an
    /// invalid document is refused with errors naming each offending path.
    #[tool(name = "import_semantic_model")]
    async fn import_semantic_model(
        &self,
        Parameters(p): Parameters<ImportModelParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ImportedModel>, CallToolResult> {
        self.call(
            &ctx,
            Call::new("import_semantic_model")
                .arg("p_document", as_text(p.document))
                .idempotent(p.idempotency_key),
        )
        .await
    }

    /// Answer a question through the governed navigator loop: search, gate every matched
    /// dataset (denied sources are never planned or touched), plan SQL over allowed sources,
    /// synthesize, and return the answer in a signed envelope with its OpenLineage event and
    /// attestation.
    #[tool(name = "answer_question")]
    async fn answer_question(
        &self,
        Parameters(p): Parameters<AnswerParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SignedAnswer>, CallToolResult> {
        let Some(llm) = self.llm.clone() else {
            // Without an LLM the answer is one governed call: one statement, as any other tool.
            let call = question_call(false, p.question, p.purpose, p.dialect);
            return self.call(&ctx, call.idempotent(p.idempotency_key)).await;
        };
        self.steps(&ctx, p.idempotency_key, async move |tx| {
            answer(tx, Some(&llm), p.question, p.purpose, p.dialect).await
        })
        .await
    }

    /// Run the resilience-desk story: the specialist roster, each a registered agent gated by
    /// the site's rights (the restricted broker is denied), with one receipt, one COMPLETE
    /// OpenLineage event and one attestation per specialist.
    #[tool(name = "run_qglake_story")]
    async fn run_qglake_story(
        &self,
        Parameters(p): Parameters<StoryParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<StoryRun>, CallToolResult> {
        self.call(&ctx, Call::new("run_qglake_story").idempotent(p.idempotency_key)).await
    }

    /// Verify a TypeDID envelope on its own: its payload hash and its Ed25519 signature against
    /// its own did:key verification method. Grants nothing.
    #[tool(name = "verify_envelope")]
    async fn verify_envelope(
        &self,
        Parameters(p): Parameters<VerifyEnvelopeParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<EnvelopeVerification>, CallToolResult> {
        self.call(&ctx, Call::new("verify_envelope").arg("p_envelope", as_text(p.envelope))).await
    }
}

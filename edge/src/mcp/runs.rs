//! Run tools: the governed run lifecycle (begin → immutable artifacts → one terminal outcome) and
//! the site's runs.

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
use crate::db::Call;

/// A new governed run.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BeginRunParams {
    /// A stable identifier of the kind of work (lowercase letters, digits and `_.:-`), for
    /// example `article.draft`.
    pub run_type: String,
    /// Structured input of the run (a JSON object), for example `{"topic": "pricing"}`.
    #[serde(default)]
    #[schemars(schema_with = "super::any_object")]
    pub input: Option<Value>,
    /// Artifact keys that must be recorded before the run may finish as `completed`, for
    /// example `["draft_id"]`. Finishing as completed without them stores the run as `blocked`.
    pub required_outputs: Option<Vec<String>>,
    /// Human-readable conditions that define done, for example `["a draft exists"]`.
    pub completion_conditions: Option<Vec<String>>,
    /// Seconds the run may stay open; past it the worker closes it as `cancelled`
    /// (`deadline_exceeded`). At most the operator's `run_deadline_max_seconds`; by default
    /// `run_deadline_default_seconds` (24 hours).
    pub deadline_seconds: Option<i32>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// A governed run.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Run {
    pub run_id: Uuid,
    pub run_type: String,
    pub harness: String,
    pub agent_id: Uuid,
    pub connection_id: Uuid,
    #[schemars(schema_with = "super::any_object")]
    pub input: Value,
    pub required_outputs: Vec<String>,
    pub completion_conditions: Vec<String>,
    pub started_at: String,
    /// `open` or `finished`.
    pub state: String,
    /// The stored terminal outcome: `completed`, `completed_with_warnings`,
    /// `needs_human_input`, `blocked`, `failed` or `cancelled`.
    pub outcome: Option<String>,
    /// The outcome the client asked for (differs from `outcome` when the run was blocked).
    pub requested_outcome: Option<String>,
    /// Why the stored outcome differs, for example `missing_required_outputs`.
    pub reason_code: Option<String>,
    #[schemars(schema_with = "super::any_json")]
    pub reasons: Option<Value>,
    /// Required outputs that were missing at finish.
    pub missing_outputs: Option<Vec<String>>,
    pub summary: Option<String>,
    pub finished_at: Option<String>,
    /// When the worker closes the run if it is still open (runs begun before deadlines existed
    /// may have none).
    pub deadline_at: Option<String>,
    /// Keys of the artifacts recorded so far.
    pub artifact_keys: Vec<String>,
    /// The handle of the run's agent (in lists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// A page of the site's runs, newest first.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListRunsParams {
    /// Only runs in this status: `open`, or the outcome a run finished with (`completed`,
    /// `completed_with_warnings`, `needs_human_input`, `blocked`, `failed`, `cancelled`).
    pub status: Option<String>,
    /// Only the runs of the agent with this handle, for example `demo-agent`.
    pub agent: Option<String>,
    /// At most this many runs (1 to 500; default 50).
    pub limit: Option<i32>,
    /// The previous page's `next_cursor`, unchanged.
    pub cursor: Option<String>,
}

/// The site's runs, newest first.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RunList {
    pub runs: Vec<Run>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// An affected content object of an artifact. Schema only: the value goes to SQL as given.
#[derive(JsonSchema)]
#[allow(dead_code)]
pub struct AffectedObject {
    /// The kind of object, for example `content_item` or `content_revision`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its id.
    pub id: String,
}

/// One immutable result of a run.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordArtifactParams {
    /// The open run (of this connection).
    pub run_id: Uuid,
    /// The artifact's key (letters, digits and `_.:/-`), unique within the run, for example `draft_id`.
    pub key: String,
    /// The artifact's value: any JSON (at most 1 MiB; store a reference for larger results).
    #[schemars(schema_with = "super::any_json")]
    pub value: Value,
    /// The content objects this result touches.
    #[schemars(with = "Option<Vec<AffectedObject>>")]
    pub affected_objects: Option<Value>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// The recorded artifact.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Artifact {
    pub run_id: Uuid,
    pub artifact_id: Uuid,
    pub key: String,
    pub recorded_at: String,
    /// The record's hash in the site's append-only chain; null while the record waits to be
    /// sealed into it (a moment, when other writers of the site held its head: docs/ledger.md).
    pub record_sha256: Option<String>,
}

/// The run's one terminal outcome.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FinishRunParams {
    /// The open run (of this agent: any of its connections may finish it).
    pub run_id: Uuid,
    /// One of `completed`, `completed_with_warnings`, `needs_human_input`, `blocked`,
    /// `failed`, `cancelled`. A completion with required outputs missing is stored as `blocked`.
    pub outcome: String,
    /// A short human-readable summary.
    pub summary: Option<String>,
    /// Reasons for the outcome (a JSON array, for example of strings or `{code, message}` objects).
    #[serde(default)]
    #[schemars(schema_with = "super::any_array")]
    pub reasons: Option<Vec<Value>>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

#[tool_router(router = runs_router, vis = "pub(super)")]
impl QueryLayerMcp {
    /// Begin a governed run: a stable run type, structured input, the artifact keys that must
    /// exist before it can complete, and the conditions that define done. Every material
    /// workflow starts here. Needs runs:write.
    #[tool(name = "querylayer_begin_run")]
    async fn begin_run(
        &self,
        Parameters(p): Parameters<BeginRunParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Run>, CallToolResult> {
        let call = Call::new("begin_run")
            .arg("p_run_type", p.run_type)
            .opt("p_input", p.input)
            .opt("p_required_outputs", p.required_outputs)
            .opt("p_completion_conditions", p.completion_conditions)
            .opt("p_deadline_seconds", p.deadline_seconds);
        self.call(&ctx, call.idempotent(p.idempotency_key)).await
    }

    /// Record one material result of an open run as an immutable artifact under a key (one
    /// value per key). Needs runs:write.
    #[tool(name = "querylayer_record_artifact")]
    async fn record_artifact(
        &self,
        Parameters(p): Parameters<RecordArtifactParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Artifact>, CallToolResult> {
        let call = Call::new("record_artifact")
            .arg("p_run_id", p.run_id)
            .arg("p_key", p.key)
            .arg("p_value", p.value)
            .opt("p_affected_objects", p.affected_objects);
        self.call(&ctx, call.idempotent(p.idempotency_key)).await
    }

    /// Finish an open run with one terminal outcome. A run finished as completed while a
    /// required output is missing is stored as blocked (reason missing_required_outputs); a
    /// finished run accepts nothing more. Needs runs:write.
    #[tool(name = "querylayer_finish_run")]
    async fn finish_run(
        &self,
        Parameters(p): Parameters<FinishRunParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Run>, CallToolResult> {
        let call = Call::new("finish_run")
            .arg("p_run_id", p.run_id)
            .arg("p_outcome", p.outcome)
            .opt("p_summary", p.summary)
            .opt("p_reasons", p.reasons.map(Value::Array));
        self.call(&ctx, call.idempotent(p.idempotency_key)).await
    }

    /// List the site's runs, newest first, of every agent or of one (`agent`), open or by the
    /// outcome they finished with (`status`); page with `cursor`. Needs runs:read.
    #[tool(name = "querylayer_list_runs")]
    async fn list_runs(
        &self,
        Parameters(p): Parameters<ListRunsParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RunList>, CallToolResult> {
        let call = Call::new("list_runs")
            .opt("p_status", p.status)
            .opt("p_agent", p.agent)
            .opt("p_limit", p.limit)
            .opt("p_cursor", p.cursor);
        self.call(&ctx, call).await
    }
}

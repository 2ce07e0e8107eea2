//! Run tools: the governed run lifecycle (begin → immutable artifacts → one terminal outcome) and
//! reading the site's runs (a page of them, or one with its events and artifacts).

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

/// Which run to read.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetRunParams {
    /// The run (a `run_id` from querylayer_begin_run or querylayer_list_runs): any run of this
    /// site, of any agent.
    pub run_id: Uuid,
}

/// One event of a run: its start, and its finish with the stored outcome.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RunEvent {
    pub event_id: Uuid,
    /// `started` or `finished`.
    pub kind: String,
    /// The stored outcome (on `finished` only).
    pub outcome: Option<String>,
    /// Why the stored outcome differs from the requested one, for example
    /// `missing_required_outputs`.
    pub reason_code: Option<String>,
    pub at: String,
    /// The record's hash in the site's append-only chain; null while the record waits to be
    /// sealed into it (a moment, when other writers of the site held its head: docs/ledger.md).
    pub record_sha256: Option<String>,
}

/// One immutable artifact of a run, with its value.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RunArtifact {
    pub artifact_id: Uuid,
    pub key: String,
    /// The value as recorded: any JSON.
    #[schemars(schema_with = "super::any_json")]
    pub value: Value,
    /// The content objects this result touches (empty when none were given).
    #[schemars(with = "Vec<AffectedObject>")]
    pub affected_objects: Value,
    pub recorded_at: String,
    /// The record's hash in the site's append-only chain; null while the record waits to be
    /// sealed into it (a moment, when other writers of the site held its head: docs/ledger.md).
    pub record_sha256: Option<String>,
}

/// A run with its events and artifacts, in the order they were recorded.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: Run,
    pub events: Vec<RunEvent>,
    pub artifacts: Vec<RunArtifact>,
}

/// An affected content object of an artifact. Schema only: the value goes to SQL, and comes back
/// from it, as given.
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
        self.call_as_written(&ctx, call.idempotent(p.idempotency_key)).await
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
        self.call_as_written(&ctx, call.idempotent(p.idempotency_key)).await
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
        self.call_as_written(&ctx, call.idempotent(p.idempotency_key)).await
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

    /// Read one of the site's runs, of any agent: its fields and outcome, its events (started,
    /// finished) and its artifacts with their values, in the order they were recorded. Needs
    /// runs:read.
    #[tool(name = "querylayer_get_run")]
    async fn get_run(
        &self,
        Parameters(p): Parameters<GetRunParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RunDetail>, CallToolResult> {
        let call = Call::new("get_run").arg("p_run_id", p.run_id);
        self.call(&ctx, call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What `get_run` answers (`querylayer.run_json` with its `events` and `artifacts`, as
    /// sql/060_runs.sql builds it) comes through the tool's output type whole: the edge reads the
    /// answer into `RunDetail` and writes it out again, so a member the type lacked would be lost.
    #[test]
    fn a_read_run_keeps_every_member_get_run_answers() {
        let answer = json!({
            "run_id": "00000000-0000-4000-8000-000000000001",
            "run_type": "article.draft",
            "harness": "pytest",
            "agent_id": "00000000-0000-4000-8000-000000000002",
            "connection_id": "00000000-0000-4000-8000-000000000003",
            "input": {"topic": "pricing"},
            "required_outputs": ["draft_id"],
            "completion_conditions": ["a draft exists"],
            "started_at": "2026-01-02T03:04:05.678901+00:00",
            "state": "finished",
            "outcome": "blocked",
            "requested_outcome": "completed",
            "reason_code": "missing_required_outputs",
            "reasons": [],
            "missing_outputs": ["draft_id"],
            "summary": "partial",
            "finished_at": "2026-01-02T03:05:00+00:00",
            "deadline_at": "2026-01-03T03:04:05.678901+00:00",
            "artifact_keys": ["notes"],
            "events": [
                {"event_id": "00000000-0000-4000-8000-000000000004", "kind": "started", "outcome": null,
                 "reason_code": null, "at": "2026-01-02T03:04:05.678901+00:00", "record_sha256": "ab"},
                {"event_id": "00000000-0000-4000-8000-000000000005", "kind": "finished", "outcome": "blocked",
                 "reason_code": "missing_required_outputs", "at": "2026-01-02T03:05:00+00:00", "record_sha256": null}
            ],
            "artifacts": [
                {"artifact_id": "00000000-0000-4000-8000-000000000006", "key": "notes",
                 "value": {"text": "so far", "n": [1, 2.5, null]},
                 "affected_objects": [{"type": "content_item", "id": "x", "note": "kept"}],
                 "recorded_at": "2026-01-02T03:04:30+00:00", "record_sha256": "cd"}
            ]
        });
        let read: RunDetail = serde_json::from_value(answer.clone()).unwrap();
        assert_eq!(read.run.agent, None, "get_run names no agent handle");
        assert_eq!(serde_json::to_value(&read).unwrap(), answer);
    }
}

//! Agent Console tools: a harness claims a member's turn, turns a multi-step goal into a
//! versioned task plan, and receives and reports one dependency-ready step at a time
//! (docs/console.md). The scheduling, retries and fail-closed checks are the database's.

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

/// What to claim: the next queued turn, or the next step of a turn this connection holds.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimConsoleTaskParams {
    /// The Hermes session this harness runs in. Without `turn_id`: claim only turns of that
    /// session's conversation. With `turn_id`: required when the turn has a plan (steps are
    /// handed out only through the plan's own session).
    pub session_id: Option<String>,
    /// A turn this connection already claimed: answers with the next step of its current plan
    /// version. Omit to claim the next queued turn of this agent's conversations on the site.
    pub turn_id: Option<Uuid>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// The kind of work a step does. The server assigns the risk and the scope it needs from it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepOperation {
    /// Read content, briefs, evidence or the topical map (low risk; content:read).
    Research,
    /// Record findings as run artifacts (low risk; runs:write).
    Analysis,
    /// Create a draft revision, never published (medium risk; content:write).
    Draft,
    /// Propose a new content item: finish by naming one `create_content` proposal (medium; content:write).
    CreateContent,
    /// Propose a revision of an item: finish by naming one `revision` proposal (medium; content:write).
    Revision,
    /// Propose topical map changes: finish by naming one `topical_map` proposal (medium; topical-map:write).
    TopicalMap,
    /// Propose an internal link: finish by naming one `internal_link` proposal (low; content:write).
    InternalLink,
    /// Request publishing or unpublishing: finish by naming one `publish_lifecycle` proposal
    /// (high; publish:request). A plan never publishes by itself.
    Publish,
    /// Request archiving or restoring: finish by naming one `content_lifecycle` proposal (high; publish:request).
    Archive,
}

/// One step of a plan.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanStepInput {
    /// The step's key, unique in the plan (lowercase letters, digits, `_` and `-`), for example `draft`.
    pub key: String,
    /// What kind of work the step does.
    pub operation: StepOperation,
    /// What the harness should do in this step (1 to 4000 characters).
    pub instructions: String,
    /// Keys of the steps that must succeed before this one starts. Unknown keys and cycles are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
}

/// A new version of a claimed turn's plan.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTaskPlanParams {
    /// The turn this connection claimed.
    pub turn_id: Uuid,
    /// The Hermes session of the turn's conversation (the plan is bound to it).
    pub session_id: String,
    /// The multi-step goal (1 to 4000 characters).
    pub goal: String,
    /// The steps, 1 to 50, in the order they should run when their dependencies allow.
    pub steps: Vec<PlanStepInput>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// How the reported work ended.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskOutcome {
    /// The step succeeded (with `step_id`).
    Succeeded,
    /// The step failed (with `step_id`: retried automatically at most twice), or the turn failed.
    Failed,
    /// The turn is done (without `step_id`; its plan, if any, must have completed).
    Completed,
}

impl TaskOutcome {
    fn as_str(self) -> &'static str {
        match self {
            TaskOutcome::Succeeded => "succeeded",
            TaskOutcome::Failed => "failed",
            TaskOutcome::Completed => "completed",
        }
    }
}

/// A report on the running step, or the end of the turn.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteConsoleTaskParams {
    /// The turn this connection claimed.
    pub turn_id: Uuid,
    /// For a step: `succeeded` or `failed`. For the turn (no `step_id`): `completed` or `failed`.
    pub outcome: TaskOutcome,
    /// The Hermes session of the turn's plan (required when reporting a step).
    pub session_id: Option<String>,
    /// The running step being reported. Omit to complete the turn itself.
    pub step_id: Option<Uuid>,
    /// A short summary of what was done or why it failed (at most 4000 characters).
    pub summary: Option<String>,
    /// Runs of this connection the work produced.
    pub run_ids: Option<Vec<Uuid>>,
    /// Proposals of this connection the work produced. A step whose operation produces a
    /// proposal must name exactly that one proposal; the step then waits for a member's decision.
    pub proposal_ids: Option<Vec<Uuid>>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// A member's request in a conversation.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ConsoleTurn {
    pub turn_id: Uuid,
    pub conversation_id: Uuid,
    /// What the member asked for.
    pub request: String,
    /// `queued`, `claimed`, `completed`, `failed` or `cancelled`.
    pub state: String,
    pub created_at: String,
    pub claimed_at: Option<String>,
    pub ended_at: Option<String>,
    pub outcome: Option<String>,
    /// Why the turn failed (for example a missing session), when it did.
    pub failure_reason: Option<String>,
    /// The completed turn's result: `{summary, run_ids, proposal_ids}`.
    #[schemars(schema_with = "super::any_json")]
    pub result: Option<Value>,
    /// Automatic retries the turn has left (two in all, across its steps and plan versions;
    /// a member's re-open restores them).
    pub retries_left: Option<i32>,
    /// The Hermes-owned session of the conversation.
    pub session_id: String,
    /// The agent's immutable Hermes profile id.
    pub profile_id: String,
    pub conversation_title: String,
}

/// One step of a plan version, with its progress.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TaskStep {
    pub step_id: Uuid,
    pub key: String,
    pub operation: String,
    /// Server-assigned from the operation: `low`, `medium` or `high`.
    pub risk: String,
    pub depends_on: Vec<String>,
    pub instructions: String,
    /// `pending`, `running`, `awaiting_approval`, `succeeded`, `failed`, `cancelled` or `superseded`.
    pub state: String,
    /// This step's automatic retries so far (the turn allows two in all).
    pub retry_count: i32,
    pub run_id: Option<Uuid>,
    /// The proposal the step produced and waits on.
    pub proposal_id: Option<Uuid>,
    #[schemars(schema_with = "super::any_json")]
    pub result: Option<Value>,
    pub failure_reason: Option<String>,
}

/// One version of a turn's plan.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TaskPlan {
    pub plan_id: Uuid,
    pub turn_id: Uuid,
    pub version: i32,
    pub goal: String,
    /// `active`, `completed`, `failed`, `cancelled` or `superseded`.
    pub state: String,
    pub profile_id: String,
    pub session_id: String,
    pub created_at: String,
    /// Why the plan failed or was cancelled.
    pub failure_reason: Option<String>,
    pub steps: Vec<TaskStep>,
}

/// A queued turn that was failed closed while claiming (its profile or session no longer holds).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ClosedTurn {
    pub turn_id: Uuid,
    pub reason: String,
}

/// Where the harness stands: the turn, and for a planned turn the one step to run now.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ConsoleTask {
    /// `claimed` (a new turn: plan it or complete it), `idle` (nothing queued), `needs_plan`, or
    /// for a planned turn: `running` (`step` is the one step to run now), `awaiting_approval`
    /// (a step waits on a member's decision: claim again later), `completed`, `failed` or
    /// `cancelled` (the turn ended with its plan: nothing more is accepted for it until a
    /// member re-opens it). Absent when the turn itself was just completed.
    pub status: Option<String>,
    pub turn: Option<ConsoleTurn>,
    /// The one step to run now, when `status` is `running`.
    pub step: Option<TaskStep>,
    /// The current plan version with every step's progress.
    pub plan: Option<TaskPlan>,
    /// Turns failed closed while claiming (their profile, session or connection no longer
    /// holds), with their reasons.
    pub closed: Option<Vec<ClosedTurn>>,
    /// Why the plan or turn ended, when it did.
    pub reason: Option<String>,
    /// What to do next.
    pub hint: Option<String>,
}

#[tool_router(router = console_tasks_router, vis = "pub(super)")]
impl QueryLayerMcp {
    /// Claim Agent Console work. Without turn_id: atomically claim the next queued turn of this
    /// agent's conversations on the site (two harnesses never get the same turn); turns whose
    /// profile or session no longer holds are failed closed and listed under `closed`. With
    /// turn_id (and session_id): the next dependency-ready step of that turn's plan, or why
    /// there is none. Needs runs:write.
    #[tool(name = "querylayer_claim_console_task")]
    async fn claim_console_task(
        &self,
        Parameters(p): Parameters<ClaimConsoleTaskParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ConsoleTask>, CallToolResult> {
        let call =
            Call::new("claim_console_task").opt("p_session_id", p.session_id).opt("p_turn_id", p.turn_id);
        self.call(&ctx, call.idempotent(p.idempotency_key)).await
    }

    /// Turn a multi-step goal for a claimed turn into a new version of its task plan, bound to
    /// the turn's Hermes session and profile (a previous version is superseded, not rewritten).
    /// The server assigns each step's risk from its operation and answers with the first step
    /// to run. Proposal-producing steps wait for a member's decision; a plan never publishes by
    /// itself. Needs runs:write.
    #[tool(name = "querylayer_create_task_plan")]
    async fn create_task_plan(
        &self,
        Parameters(p): Parameters<CreateTaskPlanParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ConsoleTask>, CallToolResult> {
        let steps = serde_json::to_value(&p.steps).unwrap_or(Value::Null);
        let call = Call::new("create_task_plan")
            .arg("p_turn_id", p.turn_id)
            .arg("p_session_id", p.session_id)
            .arg("p_goal", p.goal)
            .arg("p_steps", steps);
        self.call(&ctx, call.idempotent(p.idempotency_key)).await
    }

    /// Report the running step (succeeded, naming the one proposal a proposal-producing step
    /// made; or failed: retried automatically while the turn has retries left — two in all,
    /// across steps and plan versions — then the step, the plan and the turn fail and dependents
    /// never start) and receive the next step. A report whose session ended or whose binding
    /// went is refused. Without step_id: complete the claimed turn, referencing the runs and
    /// proposals it produced. Needs runs:write.
    #[tool(name = "querylayer_complete_console_task")]
    async fn complete_console_task(
        &self,
        Parameters(p): Parameters<CompleteConsoleTaskParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ConsoleTask>, CallToolResult> {
        let call = Call::new("complete_console_task")
            .arg("p_turn_id", p.turn_id)
            .arg("p_outcome", p.outcome.as_str().to_string())
            .opt("p_session_id", p.session_id)
            .opt("p_step_id", p.step_id)
            .opt("p_summary", p.summary)
            .opt("p_run_ids", p.run_ids)
            .opt("p_proposal_ids", p.proposal_ids);
        self.call(&ctx, call.idempotent(p.idempotency_key)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_schema_teaches_typed_steps() {
        let schema = serde_json::to_value(schemars::schema_for!(CreateTaskPlanParams)).unwrap();
        let text = schema.to_string();
        for operation in [
            "research",
            "analysis",
            "draft",
            "create_content",
            "revision",
            "topical_map",
            "internal_link",
            "publish",
            "archive",
        ] {
            assert!(text.contains(&format!("\"{operation}\"")), "{operation} missing from {text}");
        }
        let step = &schema["$defs"]["PlanStepInput"];
        assert_eq!(step["additionalProperties"], serde_json::json!(false));
        let mut required: Vec<&str> =
            step["required"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        required.sort();
        assert_eq!(required, ["instructions", "key", "operation"]);
        let steps: Vec<PlanStepInput> = serde_json::from_value(serde_json::json!([
            {"key": "draft", "operation": "draft", "instructions": "write it"},
            {"key": "publish", "operation": "publish", "instructions": "ask", "depends_on": ["draft"]}
        ]))
        .unwrap();
        assert_eq!(
            serde_json::to_value(&steps).unwrap(),
            serde_json::json!([
                {"key": "draft", "operation": "draft", "instructions": "write it"},
                {"key": "publish", "operation": "publish", "instructions": "ask", "depends_on": ["draft"]}
            ])
        );
        assert!(serde_json::from_value::<PlanStepInput>(
            serde_json::json!({"key": "x", "operation": "deploy", "instructions": "y"})
        )
        .is_err());
    }
}

//! Proposal tools: typed proposals that only a human decides, publishing included.

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

/// A typed proposal for a human to decide.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProposalParams {
    /// The open run (of this connection) the proposal comes from.
    pub run_id: Uuid,
    /// `create_content` or `revision` (payload `{content_id, revision_id}`, needs content:write),
    /// `internal_link` (`{from_content_id, to_content_id, anchor_text}`, content:write),
    /// `topical_map` (`{changes: [...]}`, topical-map:write), `publish_lifecycle`
    /// (`{items: [...]}`, publish:request) or `content_lifecycle`
    /// (`{items: [{content_id, action: archive|restore, archived_at}]}`, publish:request).
    /// The server assigns the risk.
    #[serde(rename = "type")]
    pub proposal_type: String,
    /// The type's payload (see `type`).
    #[schemars(schema_with = "super::any_object")]
    pub payload: Value,
    /// A short summary for the human who decides (at most 2000 characters).
    pub summary: Option<String>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// Filters for the site's proposals.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListProposalsParams {
    /// Only proposals in this state: `pending`, `approved`, `applied`, `failed` or `rejected`.
    /// Omit for all.
    pub state: Option<String>,
    /// At most this many proposals, newest first (1 to 500; default 50).
    pub limit: Option<i32>,
    /// The `next_cursor` of the previous page, unchanged; omit for the first page.
    pub cursor: Option<String>,
}

/// One item of a publish request.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishItem {
    /// The content item.
    pub content_id: Uuid,
    /// `publish` (give the item's current draft `revision_id`) or `unpublish` (no
    /// `revision_id`: the server takes down whatever is live).
    pub action: String,
    /// For `publish`: the exact current draft revision to make live.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision_id: Option<Uuid>,
}

/// A request that a human approve publishing or unpublishing.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestPublishApprovalParams {
    /// The open run (of this connection) the request comes from.
    pub run_id: Uuid,
    /// What to publish or unpublish.
    pub items: Vec<PublishItem>,
    /// A short summary for the human who decides.
    pub summary: Option<String>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// One lifecycle item of a proposal.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ProposalItem {
    pub content_id: Uuid,
    pub action: String,
    pub revision_id: Option<Uuid>,
    /// For archive and restore: the `archived_at` snapshot the proposal was made against.
    pub archived_at: Option<String>,
}

/// Who made a proposal.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Author {
    /// `agent` or `member`.
    pub kind: String,
    pub agent_id: Option<Uuid>,
    pub connection_id: Option<Uuid>,
    pub run_id: Option<Uuid>,
    pub member_id: Option<Uuid>,
}

/// A human's decision.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Decision {
    /// `approved` or `rejected`.
    pub decision: String,
    pub member_id: Uuid,
    pub member_role: Option<String>,
    pub note: Option<String>,
    pub decided_at: String,
}

/// What executing an approved proposal did.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Execution {
    /// `applied` or `failed`.
    pub status: String,
    #[schemars(schema_with = "super::any_json")]
    pub detail: Value,
    pub executed_at: String,
}

/// A proposal.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Proposal {
    pub proposal_id: Uuid,
    #[serde(rename = "type")]
    pub proposal_type: String,
    /// Server-assigned: `low`, `medium` or `high`.
    pub risk: String,
    /// `pending`, `approved`, `applied`, `failed` or `rejected`.
    pub state: String,
    pub summary: Option<String>,
    #[schemars(schema_with = "super::any_json")]
    pub payload: Value,
    pub items: Vec<ProposalItem>,
    pub author: Author,
    pub created_at: String,
    pub decision: Option<Decision>,
    pub execution: Option<Execution>,
    /// A pending lifecycle request whose items moved since it was made (the draft changed, the
    /// live page changed, the item was archived): approving it would change nothing.
    pub stale: bool,
    /// What moved, one entry an item (empty unless `stale`).
    #[schemars(schema_with = "super::any_json")]
    pub stale_problems: Value,
}

/// The site's proposals.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ProposalList {
    pub proposals: Vec<Proposal>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

#[tool_router(router = proposals_router, vis = "pub(super)")]
impl QueryLayerMcp {
    /// Propose a typed change for a human to approve or reject (create_content, revision,
    /// internal_link, topical_map, publish_lifecycle, content_lifecycle). The server assigns
    /// the risk; agents never decide. Needs the type's scope.
    #[tool(name = "querylayer_create_proposal")]
    async fn create_proposal(
        &self,
        Parameters(p): Parameters<CreateProposalParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Proposal>, CallToolResult> {
        let call = Call::new("create_proposal")
            .arg("p_run_id", p.run_id)
            .arg("p_type", p.proposal_type)
            .arg("p_payload", p.payload)
            .opt("p_summary", p.summary);
        self.call(&ctx, call.idempotent(p.idempotency_key)).await
    }

    /// List the site's proposals with their items, decision and execution, newest first, a
    /// page at a time (`limit`, `cursor`). Needs content:read.
    #[tool(name = "querylayer_list_proposals")]
    async fn list_proposals(
        &self,
        Parameters(p): Parameters<ListProposalsParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ProposalList>, CallToolResult> {
        let call = Call::new("list_proposals")
            .opt("p_state", p.state)
            .opt("p_limit", p.limit)
            .opt("p_cursor", p.cursor);
        self.call(&ctx, call).await
    }

    /// Ask a human to approve publishing (the exact current draft revision) or unpublishing
    /// content items. Creates a high-risk publish_lifecycle proposal; nothing goes live until
    /// a member approves it. Needs publish:request.
    #[tool(name = "querylayer_request_publish_approval")]
    async fn request_publish_approval(
        &self,
        Parameters(p): Parameters<RequestPublishApprovalParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Proposal>, CallToolResult> {
        let items = serde_json::to_value(&p.items).unwrap_or(Value::Null);
        let call = Call::new("request_publish_approval")
            .arg("p_run_id", p.run_id)
            .arg("p_items", items)
            .opt("p_summary", p.summary);
        self.call(&ctx, call.idempotent(p.idempotency_key)).await
    }
}

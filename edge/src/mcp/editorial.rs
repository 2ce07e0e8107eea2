//! Editorial planning tools: the topical map, the imported topical strategy queue, and content
//! briefs. Agents read them and propose; the map changes, and a brief is commissioned, only when
//! a member approves a typed proposal.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::output::Json;
use super::proposals::Proposal;
use super::QueryLayerMcp;
use crate::db::Call;

/// Paging for topics (the connection already names its site).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTopicalMapParams {
    /// At most this many topics, by slug (1 to 500; default 100).
    pub limit: Option<i32>,
    /// The `next_cursor` of the previous page, unchanged; omit for the first page.
    pub cursor: Option<String>,
}

/// A page that serves a topic.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TopicPage {
    pub content_id: Uuid,
    pub slug: String,
    /// `pillar` or `supporting`.
    pub role: String,
    /// The item's state: `draft`, `published` or `archived`.
    pub state: String,
}

/// One topic of the map.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Topic {
    pub topic_id: Uuid,
    pub slug: String,
    pub title: String,
    /// The parent topic's slug.
    pub parent: Option<String>,
    pub pages: Vec<TopicPage>,
}

/// The site's topical map.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TopicalMap {
    pub topics: Vec<Topic>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// Filters for the opportunity queue.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListOpportunitiesParams {
    /// Only opportunities in this reconciliation state: `new` (no such topic), `matched` (the
    /// topic exists), `proposed` (in a pending proposal), `accepted` or `rejected`. Omit for all.
    pub state: Option<String>,
    /// At most this many (1 to 500; default 100), oldest import first.
    pub limit: Option<i32>,
    /// The `next_cursor` of the previous page, unchanged; omit for the first page.
    pub cursor: Option<String>,
}

/// Where an opportunity came from.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Provenance {
    /// The source an operator named at import (a tool export, a strategist).
    pub source: String,
    pub import_batch_id: Uuid,
    pub imported_at: String,
}

/// One imported topical strategy opportunity: a planning input, not measured performance.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Opportunity {
    pub opportunity_id: Uuid,
    /// The id the source gave it.
    pub external_id: String,
    /// The topic slug it belongs to.
    pub topic: String,
    pub title: String,
    pub rationale: Option<String>,
    /// The source's own estimates, as imported; never measured search performance.
    #[schemars(schema_with = "super::any_object")]
    pub planning_signals: Value,
    pub provenance: Provenance,
    pub imported_at: String,
    /// `new`, `matched`, `proposed`, `accepted` or `rejected`.
    pub reconciliation_state: String,
    /// The newest topical_map proposal that names it.
    pub proposal_id: Option<Uuid>,
}

/// The opportunity queue.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct OpportunityList {
    /// What these records are (and are not).
    pub note: String,
    pub opportunities: Vec<Opportunity>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// Selected opportunities to turn into one topical_map proposal.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProposeOpportunitiesParams {
    /// The open run (of this connection) the proposal comes from.
    pub run_id: Uuid,
    /// 1 to 100 opportunities of this site's queue.
    pub opportunity_ids: Vec<Uuid>,
    /// A short summary for the member who decides (at most 2000 characters).
    pub summary: Option<String>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// Paging for briefs.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListBriefsParams {
    /// At most this many briefs, newest first (1 to 500; default 50).
    pub limit: Option<i32>,
    /// The `next_cursor` of the previous page, unchanged; omit for the first page.
    pub cursor: Option<String>,
}

/// An immutable content brief, commissioned by a member's approval of page-oriented topical work.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ContentBrief {
    pub brief_id: Uuid,
    /// The topic slug of its first planned page.
    pub topic: String,
    pub title: String,
    /// The planned pages (`pages`), the proposal's summary and the opportunities it came from.
    #[schemars(schema_with = "super::any_object")]
    pub brief: Value,
    /// The topical_map proposal whose approval commissioned it.
    pub commissioned_by_proposal: Uuid,
    pub created_at: String,
    /// The record's hash in the site's append-only chain; null while the record waits to be
    /// sealed into it (a moment, when other writers of the site held its head: docs/ledger.md).
    pub record_sha256: Option<String>,
}

/// The site's content briefs.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct BriefList {
    pub briefs: Vec<ContentBrief>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// Contributor output for a brief: a draft revision written in a run.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProposeBriefDraftParams {
    /// The open run (of this connection) the proposal comes from.
    pub run_id: Uuid,
    /// The brief the draft answers.
    pub brief_id: Uuid,
    /// The content item the draft belongs to.
    pub content_id: Uuid,
    /// The draft revision (its first revision makes a create_content card, later ones a revision card).
    pub revision_id: Uuid,
    /// A short summary for the member who decides (at most 2000 characters).
    pub summary: Option<String>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

#[tool_router(router = editorial_router, vis = "pub(super)")]
impl QueryLayerMcp {
    /// Read the site's topical map: topics, their hierarchy, and the pages that serve them
    /// (pillar or supporting), by slug, a page at a time (`limit`, `cursor`). Agents never change
    /// the map directly; propose changes with querylayer_propose_topical_strategy_opportunities
    /// or querylayer_create_proposal (topical_map). Needs topical-map:read.
    #[tool(name = "querylayer_list_topical_map")]
    async fn list_topical_map(
        &self,
        Parameters(p): Parameters<ListTopicalMapParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<TopicalMap>, CallToolResult> {
        let call = Call::new("list_topical_map").opt("p_limit", p.limit).opt("p_cursor", p.cursor);
        self.call(&ctx, call).await
    }

    /// Read the queue of imported topical strategy opportunities with their provenance (source,
    /// import batch, time) and reconciliation state against the map. They are planning inputs;
    /// their signals are the source's estimates, never measured search performance. Needs
    /// topical-map:read.
    #[tool(name = "querylayer_list_topical_strategy_opportunities")]
    async fn list_topical_strategy_opportunities(
        &self,
        Parameters(p): Parameters<ListOpportunitiesParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<OpportunityList>, CallToolResult> {
        let call = Call::new("list_topical_strategy_opportunities")
            .opt("p_state", p.state)
            .opt("p_limit", p.limit)
            .opt("p_cursor", p.cursor);
        self.call(&ctx, call).await
    }

    /// Turn selected strategy opportunities into one typed topical_map proposal (new topics and
    /// planned pages). Nothing changes until a member approves; an approval of planned pages
    /// commissions exactly one content brief. Needs topical-map:write.
    #[tool(name = "querylayer_propose_topical_strategy_opportunities")]
    async fn propose_topical_strategy_opportunities(
        &self,
        Parameters(p): Parameters<ProposeOpportunitiesParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Proposal>, CallToolResult> {
        let call = Call::new("propose_topical_strategy_opportunities")
            .arg("p_run_id", p.run_id)
            .arg("p_opportunity_ids", p.opportunity_ids)
            .opt("p_summary", p.summary);
        self.call(&ctx, call.idempotent(p.idempotency_key)).await
    }

    /// List the site's immutable content briefs, newest first, a page at a time (`limit`,
    /// `cursor`): the planned pages a member's approval commissioned. Needs content:read.
    #[tool(name = "querylayer_list_content_briefs")]
    async fn list_content_briefs(
        &self,
        Parameters(p): Parameters<ListBriefsParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<BriefList>, CallToolResult> {
        let call = Call::new("list_content_briefs").opt("p_limit", p.limit).opt("p_cursor", p.cursor);
        self.call(&ctx, call).await
    }

    /// Submit contributor output for a content brief (a draft revision written in a run of this
    /// connection: a card cites only its own work) as an inert, attributable create_content or
    /// revision proposal card. It cannot publish: only a member's approval of a publish request
    /// can. Needs content:write.
    #[tool(name = "querylayer_propose_content_brief_draft")]
    async fn propose_content_brief_draft(
        &self,
        Parameters(p): Parameters<ProposeBriefDraftParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Proposal>, CallToolResult> {
        let call = Call::new("propose_content_brief_draft")
            .arg("p_run_id", p.run_id)
            .arg("p_brief_id", p.brief_id)
            .arg("p_content_id", p.content_id)
            .arg("p_revision_id", p.revision_id)
            .opt("p_summary", p.summary);
        self.call(&ctx, call.idempotent(p.idempotency_key)).await
    }
}

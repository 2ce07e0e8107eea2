//! Content tools: read the site's items, write draft revisions (which never publish).

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

/// Filters for the site's content items.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListContentParams {
    /// Only items in this state: `draft`, `published` or `archived`. Omit for all.
    pub state: Option<String>,
    /// At most this many items, newest first (1 to 500; default 50).
    pub limit: Option<i32>,
    /// The `next_cursor` of the previous page, unchanged; omit for the first page.
    pub cursor: Option<String>,
}

/// One content item and its pointers.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ContentItem {
    pub content_id: Uuid,
    pub slug: String,
    /// The template its revisions follow.
    pub template: String,
    /// The draft revision's `title` field, if it has one.
    pub title: Option<String>,
    /// `draft`, `published` or `archived`.
    pub state: String,
    /// The newest draft revision.
    pub draft_revision_id: Option<Uuid>,
    pub draft_revision_number: Option<i64>,
    /// The live revision; moved only by an approved publish proposal.
    pub published_revision_id: Option<Uuid>,
    pub published_at: Option<String>,
    pub archived_at: Option<String>,
    /// True when the draft differs from what is live.
    pub has_unpublished_changes: bool,
    pub updated_at: String,
}

/// The site's content items.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ContentList {
    pub items: Vec<ContentItem>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// A new draft revision: of a new item (give `slug` and `template`) or of an existing one
/// (give `content_id`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDraftParams {
    /// The open run (of this connection) this draft belongs to.
    pub run_id: Uuid,
    /// The template of a new item (for example `article`). For a new revision of an existing
    /// item it may be omitted; if given it must be the item's template.
    pub template: Option<String>,
    /// The revision's fields, as the template defines them (for example `{"title": "…", "body": "…"}`).
    #[schemars(schema_with = "super::any_object")]
    pub fields: Value,
    /// The existing item to revise. Omit to create a new item.
    pub content_id: Option<Uuid>,
    /// The new item's slug (lowercase letters, digits and `/_-`). Required for a new item; an
    /// existing item's slug cannot change.
    pub slug: Option<String>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// The item after the draft, with the new revision.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Draft {
    #[serde(flatten)]
    pub item: ContentItem,
    /// The revision just created (immutable).
    pub revision_id: Uuid,
    pub revision_number: i64,
}

#[tool_router(router = content_router, vis = "pub(super)")]
impl QueryLayerMcp {
    /// List the site's content items with their draft and live revision pointers, newest
    /// first, a page at a time (`limit`, `cursor`). Needs content:read.
    #[tool(name = "querylayer_list_content")]
    async fn list_content(
        &self,
        Parameters(p): Parameters<ListContentParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ContentList>, CallToolResult> {
        let call = Call::new("list_content")
            .opt("p_state", p.state)
            .opt("p_limit", p.limit)
            .opt("p_cursor", p.cursor);
        self.call_as_written(&ctx, call).await
    }

    /// Write a draft revision inside an open run: a new item (slug and template) or a new
    /// revision of an existing item (content_id). Revisions are immutable and attributed to
    /// this agent, connection and run. A draft never publishes; use
    /// querylayer_request_publish_approval. Needs content:write.
    #[tool(name = "querylayer_create_draft")]
    async fn create_draft(
        &self,
        Parameters(p): Parameters<CreateDraftParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Draft>, CallToolResult> {
        let call = Call::new("create_draft")
            .arg("p_run_id", p.run_id)
            .arg("p_template", p.template)
            .arg("p_fields", p.fields)
            .opt("p_content_id", p.content_id)
            .opt("p_slug", p.slug);
        self.call_as_written(&ctx, call.idempotent(p.idempotency_key)).await
    }
}

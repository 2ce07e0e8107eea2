//! Reading content: an item with its draft and live revisions, a revision with its fields, an
//! item's revision history, and the site's templates with their fields, so an agent can read
//! what it drafts against and what is live.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::content::ContentItem;
use super::output::Json;
use super::QueryLayerMcp;
use crate::db::Call;

/// Which item to read.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetContentParams {
    /// The item (a `content_id` from querylayer_list_content or querylayer_create_draft).
    pub content_id: Uuid,
}

/// One item with both revisions a writer cares about and the fields its next draft must fill.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ContentDetail {
    #[serde(flatten)]
    pub item: ContentItem,
    pub created_at: String,
    /// The current draft revision, with its fields: what the next publish would put live.
    pub draft: Option<Revision>,
    /// The live revision, with its fields; null until a publish is approved.
    pub live: Option<Revision>,
    /// The fields of the newest version of the item's template: the contract of its next draft.
    pub template_fields: Vec<TemplateField>,
}

/// Which revision to read.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetRevisionParams {
    /// The revision (a `draft_revision_id`, `published_revision_id` or `revision_id` from another tool).
    pub revision_id: Uuid,
}

/// Who wrote a revision: an agent through a connection inside a run, or a member.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RevisionAuthor {
    /// `agent` or `member`.
    pub kind: String,
    pub agent: Option<String>,
    pub agent_id: Option<Uuid>,
    pub connection_id: Option<Uuid>,
    pub run_id: Option<Uuid>,
    pub run_type: Option<String>,
    pub member: Option<String>,
    pub member_id: Option<Uuid>,
}

/// One immutable revision.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Revision {
    pub revision_id: Uuid,
    pub content_id: Uuid,
    pub slug: String,
    pub revision_number: i64,
    /// The template and the exact version the revision satisfied.
    pub template: String,
    pub template_version: i64,
    /// The revision's fields, keyed by the template's field names.
    #[schemars(schema_with = "super::any_object")]
    pub fields: Value,
    pub author: RevisionAuthor,
    pub created_at: String,
    /// Whether it is the item's current draft, and whether it is live.
    pub is_draft: bool,
    pub is_live: bool,
    /// The record's hash in the site's append-only chain; null while the record waits to be
    /// sealed into it (a moment, when other writers of the site held its head: docs/ledger.md).
    pub record_sha256: Option<String>,
}

/// An item's history, newest first.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListRevisionsParams {
    pub content_id: Uuid,
    /// At most this many revisions (1 to 500; default 50).
    pub limit: Option<i32>,
    /// The previous page's `next_cursor`, unchanged.
    pub cursor: Option<String>,
}

/// A revision in a history (its fields are read with querylayer_get_revision).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RevisionSummary {
    pub revision_id: Uuid,
    pub revision_number: i64,
    pub template_version: i64,
    /// The revision's `title` field, if it has one.
    pub title: Option<String>,
    pub author: RevisionAuthor,
    pub created_at: String,
    pub is_draft: bool,
    pub is_live: bool,
}

/// An item and a page of its revisions.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RevisionHistory {
    pub content: ContentItem,
    pub revisions: Vec<RevisionSummary>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// A page of the site's templates, by name.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTemplatesParams {
    /// At most this many templates (1 to 500; default 100).
    pub limit: Option<i32>,
    /// The previous page's `next_cursor`, unchanged.
    pub cursor: Option<String>,
}

/// One field a template declares.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TemplateField {
    pub name: String,
    /// `text`, `markdown`, `url` or `list` (of strings).
    #[serde(rename = "type")]
    pub kind: String,
    pub required: bool,
    pub max_length: Option<i64>,
}

/// The newest version of one template.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Template {
    pub name: String,
    pub version: i64,
    pub fields: Vec<TemplateField>,
    /// How many versions exist (a revision names the one it satisfied).
    pub versions: i64,
    pub created_at: String,
}

/// The site's templates.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TemplateList {
    pub templates: Vec<Template>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

#[tool_router(router = reading_router, vis = "pub(super)")]
impl QueryLayerMcp {
    /// Read one content item: its state and pointers, its draft and live revisions with their
    /// fields, and the fields its template asks of the next draft. Needs content:read.
    #[tool(name = "querylayer_get_content")]
    async fn get_content(
        &self,
        Parameters(p): Parameters<GetContentParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ContentDetail>, CallToolResult> {
        let call = Call::new("get_content").arg("p_content_id", p.content_id);
        self.call(&ctx, call).await
    }

    /// Read one revision: its fields, the template and version it satisfied, its author (agent,
    /// connection and run, or member), and whether it is the draft or live. Needs content:read.
    #[tool(name = "querylayer_get_revision")]
    async fn get_revision(
        &self,
        Parameters(p): Parameters<GetRevisionParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Revision>, CallToolResult> {
        let call = Call::new("get_revision").arg("p_revision_id", p.revision_id);
        self.call(&ctx, call).await
    }

    /// List an item's revisions, newest first, with authors and which is draft or live; page
    /// with `cursor`. Read a revision's fields with querylayer_get_revision. Needs content:read.
    #[tool(name = "querylayer_list_revisions")]
    async fn list_revisions(
        &self,
        Parameters(p): Parameters<ListRevisionsParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RevisionHistory>, CallToolResult> {
        let call = Call::new("list_revisions")
            .arg("p_content_id", p.content_id)
            .opt("p_limit", p.limit)
            .opt("p_cursor", p.cursor);
        self.call(&ctx, call).await
    }

    /// List the site's templates with their fields (name, type, required, max_length): the
    /// contract every draft must satisfy. Needs content:read.
    #[tool(name = "querylayer_list_templates")]
    async fn list_templates(
        &self,
        Parameters(p): Parameters<ListTemplatesParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<TemplateList>, CallToolResult> {
        let call = Call::new("list_templates").opt("p_limit", p.limit).opt("p_cursor", p.cursor);
        self.call(&ctx, call).await
    }
}

//! Claim evidence tools: attach evidence to a claim in a draft revision, read it, and read its
//! re-verification state. Agents see target, due-job, attempt-status and open-review metadata
//! only; what the re-verification worker observed stays with the members who review it.

use chrono::{DateTime, Utc};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::output::Json;
use super::QueryLayerMcp;
use crate::db::Call;

/// Evidence for one claim of a draft revision.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordEvidenceParams {
    /// The open run (of this connection) the evidence is recorded in.
    pub run_id: Uuid,
    /// The draft revision that states the claim: the item's current draft, not yet live.
    pub revision_id: Uuid,
    /// The claim, exactly as the revision states it (1 to 2000 characters).
    pub claim: String,
    /// The http(s) URL of the source.
    pub source_url: String,
    /// The span of the source that supports the claim (1 to 4000 characters).
    pub quoted_span: String,
    /// When the source was retrieved (RFC 3339, not in the future).
    pub retrieved_at: DateTime<Utc>,
    /// The SHA-256 (64 hex characters) of the source content as retrieved; re-verification
    /// compares against it.
    pub source_sha256: String,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// The recorded evidence (an immutable, hash-chained record).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RecordedEvidence {
    pub evidence_id: Uuid,
    pub revision_id: Uuid,
    pub content_id: Uuid,
    pub claim: String,
    pub source_url: String,
    pub retrieved_at: String,
    pub source_sha256: String,
    /// The record's hash in the site's append-only chain; null while the record waits to be
    /// sealed into it (a moment, when other writers of the site held its head: docs/ledger.md).
    pub record_sha256: Option<String>,
}

/// Which evidence to read.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListEvidenceParams {
    /// Only evidence for this content item.
    pub content_id: Option<Uuid>,
    /// Only evidence for this revision.
    pub revision_id: Option<Uuid>,
    /// At most this many, oldest first (1 to 500; default 100).
    pub limit: Option<i32>,
    /// The `next_cursor` of the previous page, unchanged; omit for the first page.
    pub cursor: Option<String>,
}

/// One piece of claim evidence.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct EvidenceItem {
    pub evidence_id: Uuid,
    pub content_id: Uuid,
    pub revision_id: Uuid,
    pub claim: String,
    pub source_url: String,
    pub quoted_span: String,
    pub retrieved_at: String,
    pub source_sha256: String,
    pub run_id: Option<Uuid>,
    pub created_at: String,
}

/// The site's claim evidence.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct EvidenceList {
    pub evidence: Vec<EvidenceItem>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// Which evidence's re-verification state to read.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListReverificationParams {
    /// Only evidence for this content item.
    pub content_id: Option<Uuid>,
    /// At most this many, oldest evidence first (1 to 500; default 100).
    pub limit: Option<i32>,
    /// The `next_cursor` of the previous page, unchanged; omit for the first page.
    pub cursor: Option<String>,
}

/// What is being re-verified.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReverificationTarget {
    pub evidence_id: Uuid,
    pub content_id: Uuid,
    pub revision_id: Uuid,
    pub source_url: String,
}

/// The job waiting or running for it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct DueJob {
    pub job_id: Uuid,
    pub due_at: String,
    /// `due` or `running`.
    pub state: String,
}

/// The newest attempt's status (never what was observed).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct AttemptStatus {
    pub attempted_at: String,
    /// `unchanged`, `changed`, `vanished` or `error`.
    pub status: String,
}

/// A human review opened because the source changed or vanished.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct OpenReview {
    pub review_id: Uuid,
    /// `changed` or `vanished`.
    pub reason: String,
    pub opened_at: String,
}

/// The re-verification state of one piece of evidence: metadata only.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Reverification {
    pub target: ReverificationTarget,
    pub due_job: Option<DueJob>,
    pub last_attempt: Option<AttemptStatus>,
    /// How many attempts were made.
    pub attempts: i64,
    pub open_review: Option<OpenReview>,
}

/// Re-verification state of the site's evidence.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReverificationList {
    pub evidence: Vec<Reverification>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

#[tool_router(router = evidence_router, vis = "pub(super)")]
impl QueryLayerMcp {
    /// Attach evidence (source URL, quoted span, retrieval time, SHA-256 of the source) to a
    /// claim that a draft revision states, inside an open run. The evidence is immutable and
    /// gets scheduled re-verification. Needs content:write.
    #[tool(name = "querylayer_record_claim_evidence")]
    async fn record_claim_evidence(
        &self,
        Parameters(p): Parameters<RecordEvidenceParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RecordedEvidence>, CallToolResult> {
        let call = Call::new("record_claim_evidence")
            .arg("p_run_id", p.run_id)
            .arg("p_revision_id", p.revision_id)
            .arg("p_claim", p.claim)
            .arg("p_source_url", p.source_url)
            .arg("p_quoted_span", p.quoted_span)
            .arg("p_retrieved_at", p.retrieved_at)
            .arg("p_source_sha256", p.source_sha256);
        self.call(&ctx, call.idempotent(p.idempotency_key)).await
    }

    /// List the site's claim evidence (claim, source URL, quoted span, retrieval time, hash),
    /// optionally for one content item or revision, oldest first, a page at a time (`limit`,
    /// `cursor`). Needs content:read.
    #[tool(name = "querylayer_list_evidence")]
    async fn list_evidence(
        &self,
        Parameters(p): Parameters<ListEvidenceParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<EvidenceList>, CallToolResult> {
        let call = Call::new("list_evidence")
            .opt("p_content_id", p.content_id)
            .opt("p_revision_id", p.revision_id)
            .opt("p_limit", p.limit)
            .opt("p_cursor", p.cursor);
        self.call(&ctx, call).await
    }

    /// Read the re-verification state of the site's evidence: target, due job, the newest
    /// attempt's status and any open human review, a bounded page at a time (`limit`,
    /// `cursor`). Never observed bodies, excerpts or reviewer notes. Needs content:read.
    #[tool(name = "querylayer_list_evidence_reverification")]
    async fn list_evidence_reverification(
        &self,
        Parameters(p): Parameters<ListReverificationParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ReverificationList>, CallToolResult> {
        let call = Call::new("list_evidence_reverification")
            .opt("p_content_id", p.content_id)
            .opt("p_limit", p.limit)
            .opt("p_cursor", p.cursor);
        self.call(&ctx, call).await
    }
}

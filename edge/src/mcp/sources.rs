//! Source package tools: stage packages of source records into the immutable, checksummed
//! staging ledger, read it, and turn valid staged records into an inert proposal. Staging
//! creates no content, revision, proposal or publishing job.

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

/// A package of source records to stage.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StagePackageParams {
    /// The open run (of this connection) the package belongs to.
    pub run_id: Uuid,
    /// A name for the package (1 to 200 characters).
    pub name: String,
    /// 1 to 1000 records, each an object such as `{"title", "url", "body", "author",
    /// "published_at"}`. `title` and an http(s) `url` are required for a record to be valid;
    /// invalid records are kept, with their problems, for a human to dispose of.
    #[schemars(schema_with = "super::any_array")]
    pub records: Vec<Value>,
    /// Where the records come from (free text).
    pub source: Option<String>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

/// Validation of one staged record (deterministic: the same record always gets the same result).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct StagedRecordCheck {
    pub record_id: Uuid,
    /// Its position in the package, from 0.
    pub ordinal: i32,
    /// SHA-256 of the record's canonical JSON.
    pub record_sha256: String,
    pub valid: bool,
    /// Why it is invalid.
    pub problems: Vec<String>,
    pub warnings: Vec<String>,
}

/// A staged package with its checksums and validation.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct StagedPackage {
    pub package_id: Uuid,
    pub name: String,
    pub source: Option<String>,
    /// SHA-256 over the records' hashes, in order: an identical package has the same checksum.
    pub package_sha256: String,
    pub record_count: i32,
    pub invalid_count: i32,
    /// Package-level warnings (invalid records, duplicate URLs), in record order.
    pub warnings: Vec<String>,
    pub staged_at: String,
    pub run_id: Option<Uuid>,
    pub records: Vec<StagedRecordCheck>,
    /// True when an identical package was already staged on this site (it is not stored twice).
    pub resubmitted: bool,
}

/// Paging for packages.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListPackagesParams {
    /// At most this many packages, newest first (1 to 500; default 50).
    pub limit: Option<i32>,
    /// The `next_cursor` of the previous page, unchanged; omit for the first page.
    pub cursor: Option<String>,
}

/// A staged package, without its records.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct PackageSummary {
    pub package_id: Uuid,
    pub name: String,
    pub source: Option<String>,
    pub package_sha256: String,
    pub record_count: i32,
    pub invalid_count: i32,
    pub warnings: Vec<String>,
    pub staged_at: String,
}

/// The site's staged packages.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct PackageList {
    pub packages: Vec<PackageSummary>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// Which records of a package to read.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListRecordsParams {
    /// The staged package.
    pub package_id: Uuid,
    /// Only valid (`true`) or only invalid (`false`) records. Omit for all.
    pub valid: Option<bool>,
    /// At most this many records, in staged order (1 to 1000; default 100).
    pub limit: Option<i32>,
    /// The `next_cursor` of the previous page, unchanged; omit for the first page.
    pub cursor: Option<String>,
}

/// One staged record as submitted, with its validation.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SourceRecord {
    pub record_id: Uuid,
    pub package_id: Uuid,
    pub ordinal: i32,
    pub record_sha256: String,
    /// The record exactly as staged.
    #[schemars(schema_with = "super::any_json")]
    pub record: Value,
    pub valid: bool,
    pub problems: Vec<String>,
    pub warnings: Vec<String>,
}

/// A package's records.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RecordList {
    pub records: Vec<SourceRecord>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// Staged records and the draft written from them.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProposeSourceDraftParams {
    /// The open run (of this connection) the proposal comes from.
    pub run_id: Uuid,
    /// The staged package the records belong to.
    pub package_id: Uuid,
    /// 1 to 100 valid records of that package.
    pub record_ids: Vec<Uuid>,
    /// The content item of the draft written from them.
    pub content_id: Uuid,
    /// The draft revision (its first revision makes a create_content card, later ones a revision card).
    pub revision_id: Uuid,
    /// A short summary for the member who decides (at most 2000 characters).
    pub summary: Option<String>,
    #[serde(default)]
    #[schemars(schema_with = "super::idempotency_key")]
    pub idempotency_key: Option<String>,
}

#[tool_router(router = sources_router, vis = "pub(super)")]
impl QueryLayerMcp {
    /// Stage a package of source records into the immutable staging ledger: a SHA-256 per
    /// record and per package (an identical resubmission is recognised, not stored twice) and
    /// deterministic validation; invalid records are kept, with their problems, for a human.
    /// Staging creates no content item, revision, proposal or publishing job. Needs content:write.
    #[tool(name = "querylayer_stage_content_source_package")]
    async fn stage_content_source_package(
        &self,
        Parameters(p): Parameters<StagePackageParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<StagedPackage>, CallToolResult> {
        let call = Call::new("stage_content_source_package")
            .arg("p_run_id", p.run_id)
            .arg("p_name", p.name)
            .arg("p_records", Value::Array(p.records))
            .opt("p_source", p.source);
        self.call(&ctx, call.idempotent(p.idempotency_key)).await
    }

    /// List the site's staged source packages, newest first, with checksums, counts and
    /// warnings, a page at a time (`limit`, `cursor`). Needs content:read.
    #[tool(name = "querylayer_list_content_source_packages")]
    async fn list_content_source_packages(
        &self,
        Parameters(p): Parameters<ListPackagesParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<PackageList>, CallToolResult> {
        let call =
            Call::new("list_content_source_packages").opt("p_limit", p.limit).opt("p_cursor", p.cursor);
        self.call(&ctx, call).await
    }

    /// List a staged package's records as submitted, with their hashes and validation (valid
    /// or invalid with problems), in staged order, a page at a time (`limit`, `cursor`). Needs
    /// content:read.
    #[tool(name = "querylayer_list_content_source_records")]
    async fn list_content_source_records(
        &self,
        Parameters(p): Parameters<ListRecordsParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RecordList>, CallToolResult> {
        let call = Call::new("list_content_source_records")
            .arg("p_package_id", p.package_id)
            .opt("p_valid", p.valid)
            .opt("p_limit", p.limit)
            .opt("p_cursor", p.cursor);
        self.call(&ctx, call).await
    }

    /// Turn valid staged records, and the draft revision written from them, into an inert
    /// create_content or revision proposal for a member to decide. It cannot publish. Needs
    /// content:write.
    #[tool(name = "querylayer_propose_content_source_draft")]
    async fn propose_content_source_draft(
        &self,
        Parameters(p): Parameters<ProposeSourceDraftParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Proposal>, CallToolResult> {
        let call = Call::new("propose_content_source_draft")
            .arg("p_run_id", p.run_id)
            .arg("p_package_id", p.package_id)
            .arg("p_record_ids", p.record_ids)
            .arg("p_content_id", p.content_id)
            .arg("p_revision_id", p.revision_id)
            .opt("p_summary", p.summary);
        self.call(&ctx, call.idempotent(p.idempotency_key)).await
    }
}

//! The tool registry: one entry per MCP tool, the one place where a tool's name, the scopes
//! that show it in `tools/list`, whether it only reads, its required arguments, the
//! `querylayer_api` function it calls and its purpose are written. `tools/list` filtering, the
//! write budget and idempotency (`read_only`) and `querylayer tools --json` (what the edge-tier
//! harness reads) are derived from it; the tool definitions themselves, the README and
//! docs/edge.md tables and each SQL function's scope check are tested against it.

use serde::Serialize;

/// One MCP tool. `scopes`: any one of them shows the tool (discovery only: the database checks
/// the scope again at every call and refuses with `forbidden`).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ToolEntry {
    pub name: &'static str,
    /// The human-readable title of its annotations.
    pub title: &'static str,
    pub scopes: &'static [&'static str],
    pub read_only: bool,
    pub required: &'static [&'static str],
    /// The `querylayer_api` function the tool calls (with `--llm-url`, `answer_question` calls
    /// `prepare_answer` and `complete_answer` instead, under the same scope).
    pub function: &'static str,
    pub purpose: &'static str,
}

const fn tool(
    name: &'static str,
    title: &'static str,
    scopes: &'static [&'static str],
    read_only: bool,
    required: &'static [&'static str],
    function: &'static str,
    purpose: &'static str,
) -> ToolEntry {
    ToolEntry { name, title, scopes, read_only, required, function, purpose }
}

impl ToolEntry {
    /// The tool's annotations (MCP `ToolAnnotations`), all derived from the entry: its title; a
    /// read-only tool is idempotent, a writing one is not; no tool destroys anything (history is
    /// append-only) or reaches outside the site.
    pub fn annotations(&self) -> rmcp::model::ToolAnnotations {
        rmcp::model::ToolAnnotations::with_title(self.title)
            .read_only(self.read_only)
            .destructive(false)
            .idempotent(self.read_only)
            .open_world(false)
    }
}

const READ: bool = true;
const WRITE: bool = false;

/// Every tool of the MCP server, in the order of the README table.
pub const TOOLS: &[ToolEntry] = &[
    tool(
        "querylayer_site_context",
        "Site context",
        &["site:read"],
        READ,
        &[],
        "site_context",
        "organization, site, agent, connection and scopes in force",
    ),
    tool(
        "querylayer_list_content",
        "List content",
        &["content:read"],
        READ,
        &[],
        "list_content",
        "content items with draft and live pointers",
    ),
    // Reading content (an item, revisions, history, templates).
    tool(
        "querylayer_get_content",
        "Read a content item",
        &["content:read"],
        READ,
        &["content_id"],
        "get_content",
        "one item with its draft and live revisions and its template's fields",
    ),
    tool(
        "querylayer_get_revision",
        "Read a revision",
        &["content:read"],
        READ,
        &["revision_id"],
        "get_revision",
        "one revision's fields, template, author and run",
    ),
    tool(
        "querylayer_list_revisions",
        "List an item's revisions",
        &["content:read"],
        READ,
        &["content_id"],
        "list_revisions",
        "an item's revisions, newest first",
    ),
    tool(
        "querylayer_list_templates",
        "List templates",
        &["content:read"],
        READ,
        &[],
        "list_templates",
        "the templates and their fields",
    ),
    tool(
        "querylayer_create_draft",
        "Create a draft",
        &["content:write"],
        WRITE,
        &["fields", "run_id"],
        "create_draft",
        "an immutable draft revision in an open run",
    ),
    tool(
        "querylayer_begin_run",
        "Begin a run",
        &["runs:write"],
        WRITE,
        &["run_type"],
        "begin_run",
        "a governed run with its required outputs",
    ),
    tool(
        "querylayer_record_artifact",
        "Record an artifact",
        &["runs:write"],
        WRITE,
        &["key", "run_id", "value"],
        "record_artifact",
        "one immutable result of a run under a key",
    ),
    tool(
        "querylayer_finish_run",
        "Finish a run",
        &["runs:write"],
        WRITE,
        &["outcome", "run_id"],
        "finish_run",
        "the run's one terminal outcome",
    ),
    tool(
        "querylayer_list_runs",
        "List runs",
        &["runs:read"],
        READ,
        &[],
        "list_runs",
        "the site's runs, newest first, by status and agent",
    ),
    tool(
        "querylayer_get_run",
        "Read a run",
        &["runs:read"],
        READ,
        &["run_id"],
        "get_run",
        "one run's fields, events and artifacts",
    ),
    tool(
        "querylayer_list_proposals",
        "List proposals",
        &["content:read"],
        READ,
        &[],
        "list_proposals",
        "proposals with items, decision and execution",
    ),
    tool(
        "querylayer_create_proposal",
        "Create a proposal",
        &["content:write", "topical-map:write", "publish:request"],
        WRITE,
        &["payload", "run_id", "type"],
        "create_proposal",
        "a typed proposal a human decides (the type names the scope)",
    ),
    tool(
        "querylayer_request_publish_approval",
        "Request publish approval",
        &["publish:request"],
        WRITE,
        &["items", "run_id"],
        "request_publish_approval",
        "a publish_lifecycle proposal a member approves",
    ),
    // The Agent Console (docs/console.md).
    tool(
        "querylayer_claim_console_task",
        "Claim a console task",
        &["runs:write"],
        WRITE,
        &[],
        "claim_console_task",
        "claim the next queued console turn or ready step",
    ),
    tool(
        "querylayer_create_task_plan",
        "Create a task plan",
        &["runs:write"],
        WRITE,
        &["goal", "session_id", "steps", "turn_id"],
        "create_task_plan",
        "a new plan version of a claimed turn",
    ),
    tool(
        "querylayer_complete_console_task",
        "Complete a console task",
        &["runs:write"],
        WRITE,
        &["outcome", "turn_id"],
        "complete_console_task",
        "report the running step, get the next one",
    ),
    // Editorial planning.
    tool(
        "querylayer_list_topical_map",
        "List the topical map",
        &["topical-map:read"],
        READ,
        &[],
        "list_topical_map",
        "topics, their hierarchy and the pages that serve them",
    ),
    tool(
        "querylayer_list_topical_strategy_opportunities",
        "List topical strategy opportunities",
        &["topical-map:read"],
        READ,
        &[],
        "list_topical_strategy_opportunities",
        "imported strategy opportunities and their state",
    ),
    tool(
        "querylayer_propose_topical_strategy_opportunities",
        "Propose strategy opportunities",
        &["topical-map:write"],
        WRITE,
        &["opportunity_ids", "run_id"],
        "propose_topical_strategy_opportunities",
        "one topical_map proposal from opportunities",
    ),
    tool(
        "querylayer_list_content_briefs",
        "List content briefs",
        &["content:read"],
        READ,
        &[],
        "list_content_briefs",
        "immutable content briefs, newest first",
    ),
    tool(
        "querylayer_propose_content_brief_draft",
        "Propose a draft for a brief",
        &["content:write"],
        WRITE,
        &["brief_id", "content_id", "revision_id", "run_id"],
        "propose_content_brief_draft",
        "an inert card citing a brief and a revision",
    ),
    tool(
        "querylayer_stage_content_source_package",
        "Stage a source package",
        &["content:write"],
        WRITE,
        &["name", "records", "run_id"],
        "stage_content_source_package",
        "a checksummed staged source package",
    ),
    tool(
        "querylayer_list_content_source_packages",
        "List source packages",
        &["content:read"],
        READ,
        &[],
        "list_content_source_packages",
        "staged source packages, newest first",
    ),
    tool(
        "querylayer_list_content_source_records",
        "List source records",
        &["content:read"],
        READ,
        &["package_id"],
        "list_content_source_records",
        "a package's staged records with problems",
    ),
    tool(
        "querylayer_propose_content_source_draft",
        "Propose a draft from sources",
        &["content:write"],
        WRITE,
        &["content_id", "package_id", "record_ids", "revision_id", "run_id"],
        "propose_content_source_draft",
        "an inert card from valid staged records",
    ),
    tool(
        "querylayer_record_claim_evidence",
        "Record claim evidence",
        &["content:write"],
        WRITE,
        &["claim", "quoted_span", "retrieved_at", "revision_id", "run_id", "source_sha256", "source_url"],
        "record_claim_evidence",
        "immutable evidence for a claim of a draft",
    ),
    tool(
        "querylayer_list_evidence",
        "List evidence",
        &["content:read"],
        READ,
        &[],
        "list_evidence",
        "claim evidence, oldest first",
    ),
    tool(
        "querylayer_list_evidence_reverification",
        "List evidence re-verification",
        &["content:read"],
        READ,
        &[],
        "list_evidence_reverification",
        "re-verification state of evidence",
    ),
    tool(
        "querylayer_form_screening_metrics",
        "Form screening metrics",
        &["site:read"],
        READ,
        &[],
        "form_screening_metrics",
        "form screening counts by day, form and decision",
    ),
    // QueryGraph's semantic surface (the plane of sql/140_semantics.sql).
    tool(
        "search_semantic_model",
        "Search the semantic model",
        &["content:read"],
        READ,
        &["text"],
        "search_semantic_model",
        "ranked matches in the current semantic model",
    ),
    tool(
        "resolve_metric",
        "Resolve a metric",
        &["content:read"],
        READ,
        &["name"],
        "resolve_metric",
        "a metric's SQL for a dialect",
    ),
    tool(
        "check_access",
        "Check access",
        &["content:read"],
        WRITE,
        &["resource"],
        "check_access",
        "RBAC and ODRL decision, recorded as a receipt",
    ),
    tool(
        "build_navigator_bundle",
        "Navigator bundle",
        &["content:read"],
        WRITE,
        &[],
        "build_navigator_bundle",
        "the per-principal view of the model",
    ),
    tool(
        "answer_question",
        "Answer a question (governed)",
        &["content:read"],
        WRITE,
        &["question"],
        "answer_question",
        "the governed navigator loop, signed and attested",
    ),
    tool(
        "run_qglake_story",
        "Run the resilience-desk story",
        &["content:read"],
        WRITE,
        &[],
        "run_qglake_story",
        "the resilience-desk story, one receipt per specialist",
    ),
    tool(
        "import_semantic_model",
        "Import a semantic model",
        &["content:write"],
        WRITE,
        &["document"],
        "import_semantic_model",
        "a new immutable semantic model version",
    ),
    tool(
        "verify_envelope",
        "Verify an envelope",
        &["site:read"],
        READ,
        &["envelope"],
        "verify_envelope",
        "an envelope's hash and signature against its did:key",
    ),
];

/// The registry entry of `name`.
pub fn entry(name: &str) -> Option<&'static ToolEntry> {
    TOOLS.iter().find(|t| t.name == name)
}

/// Whether a connection holding `scopes` sees `tool` in `tools/list`.
pub fn visible(tool: &str, scopes: &[String]) -> bool {
    entry(tool).is_some_and(|t| t.scopes.iter().any(|need| scopes.iter().any(|s| s == need)))
}

/// `querylayer tools`: the scope catalogue and the registry, as the edge-tier harness
/// and the client-side tier read them.
pub fn to_json() -> serde_json::Value {
    serde_json::json!({ "scopes": crate::auth::SCOPES, "tools": TOOLS })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// The rows of the first Markdown table after the line `heading`, as cells (header and
    /// separator rows left out).
    fn table_after(doc: &str, heading: &str, first_column: &str) -> Vec<Vec<String>> {
        let at = doc.find(&format!("\n{heading}\n")).unwrap_or_else(|| panic!("no heading {heading}"));
        let header = format!("| {first_column} |");
        doc[at..]
            .lines()
            .skip_while(|l| !l.starts_with(&header))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| l.trim().trim_matches('|').split(" | ").map(|c| c.trim().to_string()).collect())
            .collect()
    }

    /// The `code` spans of a Markdown cell.
    fn spans(cell: &str) -> Vec<&str> {
        cell.split('`').skip(1).step_by(2).collect()
    }

    fn registry_scopes() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
        TOOLS.iter().map(|t| (t.name, t.scopes.iter().copied().collect())).collect()
    }

    #[test]
    fn every_tool_is_named_once_with_known_scopes() {
        let names: BTreeSet<&str> = TOOLS.iter().map(|t| t.name).collect();
        assert_eq!(names.len(), TOOLS.len(), "a tool is listed twice");
        for tool in TOOLS {
            assert!(!tool.scopes.is_empty(), "{} names no scope", tool.name);
            for scope in tool.scopes {
                assert!(crate::auth::SCOPES.contains(scope), "{}: unknown scope {scope}", tool.name);
            }
            assert!(!tool.purpose.is_empty() && !tool.function.is_empty(), "{}", tool.name);
        }
    }

    #[test]
    fn the_readme_tool_table_lists_exactly_the_registry() {
        let readme = include_str!("../../../README.md");
        let mut documented: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        let rows = table_after(readme, "### Tools and scopes", "tool");
        for row in &rows {
            let scopes: BTreeSet<&str> = spans(&row[1]).into_iter().collect();
            for name in spans(&row[0]) {
                assert!(documented.insert(name, scopes.clone()).is_none(), "README names {name} twice");
            }
        }
        assert_eq!(documented, registry_scopes(), "README.md \"Tools and scopes\" and the registry disagree");
    }

    #[test]
    fn the_edge_doc_tool_table_lists_exactly_the_registry() {
        let doc = include_str!("../../../docs/edge.md");
        let rows = table_after(doc, "### Tools", "tool");
        let mut documented: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for row in &rows {
            let name = spans(&row[0])[0];
            let entry = entry(name).unwrap_or_else(|| panic!("docs/edge.md lists {name}, which is no tool"));
            let function = spans(&row[2])[0].split('(').next().unwrap_or_default();
            assert_eq!(function, entry.function, "docs/edge.md: the function of {name}");
            assert_eq!(row[3] == "read", entry.read_only, "docs/edge.md: the kind of {name}");
            assert!(documented.insert(name, spans(&row[1]).into_iter().collect()).is_none(), "{name} twice");
        }
        assert_eq!(documented, registry_scopes(), "docs/edge.md \"Tools\" and the registry disagree");
    }

    /// One scope catalogue: `auth::SCOPES` is what the README lists (the client-side tier checks
    /// it against the `querylayer.scopes` table through `querylayer tools`).
    #[test]
    fn the_readme_lists_exactly_the_scopes() {
        let readme = include_str!("../../../README.md");
        let rows = table_after(readme, "### Tools and scopes", "scope");
        let listed: Vec<&str> = rows.iter().map(|row| spans(&row[0])[0]).collect();
        assert_eq!(listed, crate::auth::SCOPES, "README.md's scope table and auth::SCOPES disagree");
    }
}

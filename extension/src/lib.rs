//! QueryLayer's governed core inside PostgreSQL. This file is the table of contents: the Rust
//! modules that own what SQL cannot express, and the data model loaded from `sql/` in order.

use pgrx::prelude::*;

mod catalogs;
mod chain;
mod context;
mod delivery;
mod drafts;
mod envelopes;
mod health;
mod jsonb;
mod ledger;
mod lifecycle;
mod limits;
mod oauth;
mod partitions;
mod retention;
mod secrets;
mod semantic;
mod sessions;
mod spi;

::pgrx::pg_module_magic!(name, version);

/// Runs once per backend, when the library is first loaded. Registers the transaction callback
/// that drops the request context at commit or abort.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    context::init();
}

// The data model, in load order. Each file names the one before it, so pgrx keeps the order.
extension_sql_file!("../../sql/000_bootstrap.sql", name = "bootstrap", bootstrap);
extension_sql_file!(
    "../../sql/010_context.sql",
    name = "context",
    requires = [
        "bootstrap",
        context::ctx_site_id,
        context::ctx_kind,
        context::ctx_scopes,
        context::ctx_is_operator,
        context::ctx_organization_id,
        context::ctx_agent_id,
        context::ctx_connection_id,
        context::ctx_member_id,
        context::ctx_member_role,
        context::ctx_harness,
        context::ctx_member_session_id,
        context::ctx_has_budgets,
        context::ctx_connection_holds,
        context::ctx_presented_fingerprint,
        context::outer_user,
        context::enter_operator,
        context::ctx_envelope_route,
        context::end_credential_sessions,
        secrets::new_secret,
        lifecycle::lifecycle_mark,
        lifecycle::execute_decision,
        envelopes::did_key_valid,
        envelopes::did_key_sha256,
        envelopes::did_key_in_use,
        envelopes::did_key_organizations,
        envelopes::canonical_sha256,
        envelopes::did_key_signature_valid,
        envelopes::did_binding_message
    ]
);
extension_sql_file!("../../sql/015_settings.sql", name = "settings", requires = ["context"]);
extension_sql_file!(
    "../../sql/020_ledger.sql",
    name = "ledger",
    requires = ["settings", partitions::create_time_partition, ledger::ledger_sealing, ledger::ledger_seal]
);
extension_sql_file!("../../sql/030_identity.sql", name = "identity", requires = ["ledger"]);
extension_sql_file!("../../sql/040_credentials.sql", name = "credentials", requires = ["identity"]);
extension_sql_file!("../../sql/050_audit.sql", name = "audit", requires = ["credentials"]);
extension_sql_file!("../../sql/060_runs.sql", name = "runs", requires = ["audit"]);
extension_sql_file!(
    "../../sql/070_content.sql",
    name = "content",
    requires = ["runs", drafts::draft_fields_fit]
);
extension_sql_file!("../../sql/080_proposals.sql", name = "proposals", requires = ["content"]);
extension_sql_file!("../../sql/090_operators.sql", name = "operators", requires = ["proposals"]);
extension_sql_file!("../../sql/095_envelopes.sql", name = "envelopes", requires = ["operators"]);
extension_sql_file!("../../sql/110_console_tasks.sql", name = "console_tasks", requires = ["envelopes"]);
extension_sql_file!("../../sql/120_editorial.sql", name = "editorial", requires = ["console_tasks"]);
extension_sql_file!("../../sql/125_source_packages.sql", name = "source_packages", requires = ["editorial"]);
extension_sql_file!("../../sql/130_evidence.sql", name = "evidence", requires = ["source_packages"]);
extension_sql_file!("../../sql/135_forms.sql", name = "forms", requires = ["evidence"]);
extension_sql_file!(
    "../../sql/140_semantics.sql",
    name = "semantics",
    requires = [
        "forms",
        semantic::key_did,
        semantic::new_key_secret,
        semantic::story_roster,
        semantic::demo_documents
    ]
);
extension_sql_file!("../../sql/150_limits.sql", name = "limits", requires = ["semantics"]);
extension_sql_file!("../../sql/155_idempotency.sql", name = "idempotency", requires = ["limits"]);
extension_sql_file!("../../sql/157_rate.sql", name = "rate", requires = ["idempotency"]);
extension_sql_file!(
    "../../sql/160_retention.sql",
    name = "retention",
    requires = ["rate", retention::sign_statement, retention::statement_signature_valid]
);
extension_sql_file!("../../sql/165_health.sql", name = "health", requires = ["retention", health::disk_free]);
extension_sql_file!("../../sql/170_reading.sql", name = "reading", requires = ["health"]);
extension_sql_file!(
    "../../sql/175_dashboard.sql",
    name = "dashboard",
    requires = ["reading", sessions::session_authenticate]
);
extension_sql_file!("../../sql/180_delivery.sql", name = "delivery", requires = ["dashboard"]);
extension_sql_file!(
    "../../sql/185_checkpoints.sql",
    name = "checkpoints",
    requires = [
        "delivery",
        ledger::ledger_leaf,
        ledger::ledger_extend,
        ledger::ledger_tree_root,
        ledger::ledger_sign_checkpoint
    ]
);
extension_sql_file!("../../sql/190_oauth.sql", name = "oauth", requires = ["checkpoints"]);
extension_sql_file!("../../sql/990_privileges.sql", name = "privileges", finalize);

#[cfg(any(test, feature = "pg_test"))]
mod durability_tests;
#[cfg(any(test, feature = "pg_test"))]
mod ledger_tests;
#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;

/// Hooks for `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}

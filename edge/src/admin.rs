//! `querylayer admin …`: the operator functions of `querylayer_api`, one command each, against
//! an operator login (`DATABASE_URL`, a role in `querylayer_admin`). Text for people by
//! default, `--json` for scripts. Secrets are printed once, to stdout, and nowhere else.

use std::time::Duration;

use chrono::Utc;
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::db::{Call, Db};

#[derive(Args, Debug)]
pub struct AdminArgs {
    /// PostgreSQL connection string of an operator (a role holding querylayer_admin).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub database_url: Option<String>,

    /// Print the function's JSON result instead of text; an error is then one JSON object
    /// `{"error": {"code", "message", "hint"}}` on stderr (the exit status is 1 or 2 as without it).
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Create an organization.
    CreateOrganization {
        /// The organization's slug (lowercase letters, digits and dashes), used by every other command.
        #[arg(long)]
        slug: String,
        /// Its display name (defaults to the slug).
        #[arg(long)]
        name: Option<String>,
    },
    /// Create a site in an organization.
    CreateSite {
        /// The organization's slug.
        #[arg(long)]
        organization: String,
        /// The site's slug (lowercase letters, digits and dashes), unique on this server.
        #[arg(long)]
        slug: String,
        /// Its display name (defaults to the slug).
        #[arg(long)]
        name: Option<String>,
    },
    /// Create a member (a person) in an organization.
    CreateMember {
        /// The organization's slug.
        #[arg(long)]
        organization: String,
        /// The member's handle in the organization (their sign-in name).
        #[arg(long)]
        handle: String,
        /// The name shown for them (defaults to the handle).
        #[arg(long)]
        display_name: Option<String>,
    },
    /// Give a member a role on a site (owner, admin, editor, viewer), or `none` to remove it.
    SetMemberRole {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// The member's handle.
        #[arg(long)]
        member: String,
        /// owner, admin, editor, viewer, or none.
        #[arg(long)]
        role: String,
    },
    /// Issue a console token for a member on a site (the token is printed once).
    CreateMemberToken {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// The member's handle (they need a role on the site).
        #[arg(long)]
        member: String,
        /// A name for the token, to recognise it later (defaults to "<member> <timestamp>").
        #[arg(long)]
        name: Option<String>,
        /// How long it lives (a PostgreSQL interval: 8h, 30 days, …); at most 366 days: a
        /// credential lives at most a year (a longer one is refused, 22023).
        #[arg(long, default_value = "8 hours")]
        expires_in: String,
    },
    /// Revoke a member token.
    RevokeMemberToken {
        /// The token's id (`token_id` when it was issued).
        #[arg(long)]
        id: uuid::Uuid,
        /// Why, for the audit trail.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Register an agent identity in an organization.
    CreateAgent {
        /// The organization's slug.
        #[arg(long)]
        organization: String,
        /// The agent's handle in the organization.
        #[arg(long)]
        handle: String,
        /// generic or hermes.
        #[arg(long)]
        kind: Option<String>,
        /// A Hermes profile's immutable id.
        #[arg(long)]
        profile_id: Option<String>,
        /// A Hermes profile's current name.
        #[arg(long)]
        profile_name: Option<String>,
        /// The subject this agent is in rights documents (RBAC grants, ODRL assignees), a DID
        /// say (defaults to the handle).
        #[arg(long)]
        principal: Option<String>,
    },
    /// Rename a Hermes profile: its route changes, the agent (and all bound to it) does not.
    RenameAgentProfile {
        /// The profile's immutable id.
        #[arg(long)]
        profile_id: String,
        /// Its new name (1 to 200 characters).
        #[arg(long)]
        new_name: String,
    },
    /// Find the agent a Hermes profile routes to, by its id or by its name (a name must be
    /// carried by exactly one agent; nothing resolves to a similar name).
    ResolveAgentProfile {
        /// The profile's immutable id.
        #[arg(long, required_unless_present = "profile_name", conflicts_with = "profile_name")]
        profile_id: Option<String>,
        /// The profile's current name.
        #[arg(long)]
        profile_name: Option<String>,
    },
    /// List the members of an organization, or those holding a role on a site (with the role).
    /// Never a password, token or session.
    ListMembers {
        /// The organization's slug.
        #[arg(long, required_unless_present = "site", conflicts_with = "site")]
        organization: Option<String>,
        /// The site's slug: only the members with a role on it.
        #[arg(long)]
        site: Option<String>,
        /// How many, by handle (1 to 500).
        #[arg(long, default_value_t = 100)]
        limit: i32,
        /// The next page: the `next_cursor` the previous page printed.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// List the agents of an organization, or those holding a permission on a site (with their
    /// scopes there and their active connections). Never a secret.
    ListAgents {
        /// The organization's slug.
        #[arg(long, required_unless_present = "site", conflicts_with = "site")]
        organization: Option<String>,
        /// The site's slug: only the agents with a permission on it.
        #[arg(long)]
        site: Option<String>,
        /// How many, by handle (1 to 500).
        #[arg(long, default_value_t = 100)]
        limit: i32,
        /// The next page: the `next_cursor` the previous page printed.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Grant an agent permissions (scopes) on a site.
    GrantScopes {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// The agent's handle.
        #[arg(long)]
        agent: String,
        /// Comma-separated, e.g. content:read,runs:write.
        #[arg(long, value_delimiter = ',', required = true)]
        scopes: Vec<String>,
    },
    /// Withdraw an agent's permissions on a site (its connections lose them at once).
    RevokeScopes {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// The agent's handle.
        #[arg(long)]
        agent: String,
        /// Comma-separated, e.g. runs:write.
        #[arg(long, value_delimiter = ',', required = true)]
        scopes: Vec<String>,
    },
    /// Issue a connection for an agent on a site (the secret is printed once).
    CreateConnection {
        /// The site's slug (a connection acts on one site only).
        #[arg(long)]
        site: String,
        /// The agent's handle (it needs the scopes granted on the site).
        #[arg(long)]
        agent: String,
        /// Comma-separated, e.g. content:read,runs:write.
        #[arg(long, value_delimiter = ',', required = true)]
        scopes: Vec<String>,
        /// How long it lives (a PostgreSQL interval: 1h, 30 days, …); at most 366 days: a
        /// credential lives at most a year (a longer one is refused, 22023).
        #[arg(long)]
        expires_in: String,
        /// A name for the connection, to recognise it later (defaults to "<agent> <timestamp>").
        #[arg(long)]
        name: Option<String>,
        /// The harness the agent runs in (hermes, codex, generic, …).
        #[arg(long)]
        harness: Option<String>,
        /// Also bind this Ed25519 did:key: signed envelopes from it act as the connection. Needs
        /// its holder's proof of possession: `--did-proof`, or the key itself (`--did-seed`,
        /// `--did-key-file`), with which this command gets a challenge and signs it.
        #[arg(long)]
        did: Option<String>,
        /// The key holder's proof, `{"challenge", "signature"}` (from `create-did-challenge` and
        /// `querylayer envelope prove`).
        #[arg(long, requires = "did")]
        did_proof: Option<String>,
        /// The key to bind, as a QueryGraph-style seed (its did:key is `--did`, which may be left out).
        #[arg(long, conflicts_with_all = ["did_key_file", "did_proof"])]
        did_seed: Option<String>,
        /// The key to bind, as a file holding its 32-byte Ed25519 secret in hex.
        #[arg(long, conflicts_with = "did_proof")]
        did_key_file: Option<std::path::PathBuf>,
        /// Issue no secret: only envelopes signed by the bound did:key act as the connection.
        #[arg(long)]
        no_secret: bool,
    },
    /// Issue a challenge for binding a did:key to a connection of a site: the key's holder signs
    /// it (`querylayer envelope prove`) and `create-connection --did-proof` takes the result.
    CreateDidChallenge {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// The Ed25519 did:key to bind (did:key:z6Mk…).
        #[arg(long)]
        did: String,
    },
    /// Revoke a connection at once.
    RevokeConnection {
        /// The connection's id (`connection_id`, or the first column of list-connections).
        #[arg(long)]
        id: uuid::Uuid,
        /// Why, for the audit trail.
        #[arg(long)]
        reason: Option<String>,
    },
    /// List a site's connections (prefix, scopes, expiry, state; never a secret).
    ListConnections {
        /// The site's slug.
        #[arg(long)]
        site: String,
    },
    /// Walk a site's hash chain and report the first broken link, if any.
    VerifyLedger {
        /// The site's slug.
        #[arg(long)]
        site: String,
    },
    /// Set a budget of a connection: at most --max-calls calls per hour or day among those that
    /// need --scope (or every write, with --scope '*write'); without --max-calls, remove it.
    /// Every edge refuses the calls past it (429, until the window ends).
    SetConnectionBudget {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// The connection's id.
        #[arg(long)]
        connection: uuid::Uuid,
        /// A scope of the catalogue, or '*write' for every call that needs a write scope.
        #[arg(long)]
        scope: String,
        /// hour or day (windows from the hour's or day's start, UTC).
        #[arg(long)]
        period: String,
        /// The most calls in one window; leave out to remove the budget.
        #[arg(long)]
        max_calls: Option<i32>,
    },
    /// The budgets of a site's connections, with what their current windows used.
    ListBudgets {
        /// The site's slug.
        #[arg(long)]
        site: String,
    },
    /// Seal the records that writers left pending while another transaction held their site's
    /// head (the worker does it every second; a checkpoint seals first by itself).
    SealLedger {
        /// The site's slug; without it, every site that has pending records.
        #[arg(long)]
        site: Option<String>,
    },
    /// The newest audit records of a site, or without --site those of no site (failed
    /// authentications). Never a secret, a fingerprint or argument values.
    ListAudit {
        /// The site's slug; without it, the records of no site.
        #[arg(long)]
        site: Option<String>,
        /// How many records, newest first (1 to 500).
        #[arg(long, default_value_t = 50)]
        limit: i32,
    },
    /// Create (or complete) the demo and issue a fresh connection secret and member token.
    SeedDemo,
    /// Import topical strategy opportunities for a site, with provenance (source, batch, time).
    ImportStrategy {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// Where the opportunities come from (a tool export, a strategist, …).
        #[arg(long)]
        source: String,
        /// A JSON file (`-` for stdin): an array of `{"id", "topic", "title", "rationale"?, "signals"?}`.
        #[arg(long, value_parser = json_file)]
        file: Value,
    },
    /// Add a topic to a site's topical map (operators seed the map; agents only propose).
    AddTopic {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// The topic's slug, unique on the site.
        #[arg(long)]
        slug: String,
        /// The topic's title.
        #[arg(long)]
        title: String,
        /// The parent topic's slug.
        #[arg(long)]
        parent: Option<String>,
    },
    /// Report form screening decisions for a site.
    ReportFormScreening {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// A JSON file (`-` for stdin): an array of `{"form", "decision": accepted|rejected|review,
        /// "reason", "occurred_at"?, …}`.
        #[arg(long, value_parser = json_file)]
        file: Value,
    },
    /// Delete raw rejected form screening events older than the retention window (all sites;
    /// the aggregates stay). `querylayer worker` runs this on a schedule.
    PurgeFormScreening,
    /// Change a server setting (evidence_reverify_after_days, form_rejected_retention_days, …).
    SetSetting {
        /// The setting's key (get-settings lists them; docs/api.md says what each means).
        #[arg(long)]
        key: String,
        /// Its new value, as text (`true`, `30`, …).
        #[arg(long)]
        value: String,
    },
    /// Make a site's waiting evidence re-verification jobs due now.
    MakeEvidenceDue {
        /// The site's slug.
        #[arg(long)]
        site: String,
    },
    /// Cancel an open run (its history records that an operator closed it, and why).
    CancelRun {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// The run's id.
        #[arg(long)]
        run: uuid::Uuid,
        /// Why, for the run's history.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Apply retention now: keep month partitions ready, drop every month older than
    /// audit_retention_days (leaving a signed summary in each site's chain), delete expired
    /// idempotency keys and spent nonces. `querylayer worker` runs this on a schedule.
    ApplyRetention,
    /// The month partitions of the tables that age out, with their sizes.
    ListPartitions,
    /// What retention dropped, with the signed summaries and whether each signature verifies.
    ListRetentionDrops {
        /// How many drops, newest first (1 to 500).
        #[arg(long, default_value_t = 50)]
        limit: i32,
    },
    /// Invite a member to a site's dashboard: a one-time link to set their password (printed
    /// once). Creates the member when the handle is new; sets the role when one is given.
    InviteMember {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// The member's handle (a new handle creates the member in the site's organization).
        #[arg(long)]
        member: String,
        /// owner, admin, editor or viewer (required for a member without a role on the site).
        #[arg(long)]
        role: Option<String>,
        /// The name shown for a new member.
        #[arg(long)]
        display_name: Option<String>,
        /// How long the link works (a PostgreSQL interval, at most 30 days).
        #[arg(long, default_value = "72 hours")]
        expires_in: String,
        /// The edge's public URL, to print the whole link (`serve --public-url`).
        #[arg(long, env = "QUERYLAYER_PUBLIC_URL")]
        public_url: Option<String>,
    },
    /// End a member's dashboard session at once.
    RevokeMemberSession {
        /// The session's id.
        #[arg(long)]
        id: uuid::Uuid,
        /// Why, for the audit trail.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Issue a site's delivery token for its website (read-only, published content only; printed once).
    CreateDeliveryToken {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// A name for the token (the website it serves, say).
        #[arg(long)]
        name: String,
        /// How long it lives (a PostgreSQL interval); at most 366 days: a credential lives at
        /// most a year (a longer one is refused, 22023).
        #[arg(long, default_value = "90 days")]
        expires_in: String,
    },
    /// Revoke a delivery token at once.
    RevokeDeliveryToken {
        /// The token's id.
        #[arg(long)]
        id: uuid::Uuid,
        /// Why, for the audit trail.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Serve a site's published content without a token (true) or only with one (false).
    SetDeliveryPublic {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// true or false.
        #[arg(long, action = clap::ArgAction::Set)]
        public: bool,
    },
    /// Define a content template on a site; a new definition of an existing name is its next
    /// version (drafts name the template they follow).
    CreateTemplate {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// The template's name (lowercase letters, digits, `_` and `-`).
        #[arg(long)]
        name: String,
        /// A JSON file (`-` for stdin): an array of fields `{"name", "type": text|markdown|url|list,
        /// "required": true|false, "max_length"?}` (`max_length`: a whole number of characters,
        /// 1 to 2147483647).
        #[arg(long, value_parser = json_file)]
        fields: Value,
    },
    /// Import a site's rights document (RBAC and ODRL, docs/semantics.md) as its next version. A
    /// document with problems is stored, listed in the answer, and makes every decision deny.
    ImportRights {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// The document's file (`-` for stdin), JSON.
        #[arg(long, value_parser = text_file)]
        file: String,
    },
    /// The server's settings and their current values (change one with set-setting).
    GetSettings,
    /// Retire the server's signing key and generate a new one; attestations and checkpoints
    /// signed earlier stay verifiable against the retired key. Prints the server's keys.
    RotateServerKey,
    /// The sites of this server, with the number of records in each one's history and its last
    /// signed checkpoint.
    ListSites,
    /// The newest envelope receipts (every `/v1` decision, allowed or denied, with its checks) of
    /// a site, or without --site those of no site.
    ListEnvelopeReceipts {
        /// The site's slug; without it, the receipts of no site (envelopes that named none).
        #[arg(long)]
        site: Option<String>,
        /// How many receipts, newest first (1 to 500).
        #[arg(long, default_value_t = 50)]
        limit: i32,
    },
    /// Import an OSI semantic model for a site as its next version (docs/semantics.md).
    ImportSemanticModel {
        /// The site's slug.
        #[arg(long)]
        site: String,
        /// The model's file (`-` for stdin), JSON or YAML.
        #[arg(long, value_parser = text_file)]
        file: String,
    },
    /// Replace the server's signing key with one you hold (a restore, a key kept in a vault):
    /// the current key is retired and stays listed. The secret is read from a file, never a flag;
    /// it reaches PostgreSQL as a statement parameter, which `log_statement = all` would log.
    SetServerKey {
        /// A file (`-` for stdin) holding the 32-byte Ed25519 secret as 64 hex digits.
        #[arg(long, value_parser = text_file)]
        secret_file: String,
    },
    /// Check that a site's live pointers and topical map equal the replay of its state events.
    VerifyLiveState {
        /// The site's slug.
        #[arg(long)]
        site: String,
    },
    /// The size limit of every column that takes text from outside (a longer value is refused,
    /// QL413).
    ListValueLimits,
}

/// Every operator function docs/api.md names, and the command that calls it: the one map, checked
/// both ways. The unit test `every_admin_command_calls_the_function_the_map_names` parses each
/// `admin` command and compares the function it calls; tier 3 (`tests/db/admin_cli.rs`, through
/// the hidden `querylayer operator-commands`) reads from the catalog every `querylayer_api`
/// function `querylayer_admin` may execute that docs/api.md lists for operators, and requires it
/// here (or in `WITHOUT_COMMAND`), with its command in `querylayer admin --help` (or `ledger`).
pub const OPERATOR_COMMANDS: &[(&str, &str)] = &[
    ("create_organization", "admin create-organization"),
    ("create_site", "admin create-site"),
    ("create_member", "admin create-member"),
    ("set_member_role", "admin set-member-role"),
    ("list_members", "admin list-members"),
    ("create_agent", "admin create-agent"),
    ("rename_agent_profile", "admin rename-agent-profile"),
    ("resolve_agent_profile", "admin resolve-agent-profile"),
    ("list_agents", "admin list-agents"),
    ("grant_agent_scopes", "admin grant-scopes"),
    ("revoke_agent_scopes", "admin revoke-scopes"),
    ("create_connection", "admin create-connection"),
    ("create_did_challenge", "admin create-did-challenge"),
    ("revoke_connection", "admin revoke-connection"),
    ("list_connections", "admin list-connections"),
    ("create_member_token", "admin create-member-token"),
    ("revoke_member_token", "admin revoke-member-token"),
    ("invite_member", "admin invite-member"),
    ("revoke_member_session", "admin revoke-member-session"),
    ("create_delivery_token", "admin create-delivery-token"),
    ("revoke_delivery_token", "admin revoke-delivery-token"),
    ("set_delivery_public", "admin set-delivery-public"),
    ("create_template", "admin create-template"),
    ("verify_ledger", "admin verify-ledger"),
    ("verify_live_state", "admin verify-live-state"),
    ("seal_ledger", "admin seal-ledger"),
    ("set_connection_budget", "admin set-connection-budget"),
    ("list_connection_budgets", "admin list-budgets"),
    ("list_audit", "admin list-audit"),
    ("list_envelope_receipts", "admin list-envelope-receipts"),
    ("set_setting", "admin set-setting"),
    ("get_settings", "admin get-settings"),
    ("seed_demo", "admin seed-demo"),
    ("import_topical_strategy", "admin import-strategy"),
    ("add_topic", "admin add-topic"),
    ("report_form_screening", "admin report-form-screening"),
    ("purge_form_screening", "admin purge-form-screening"),
    ("make_evidence_jobs_due", "admin make-evidence-due"),
    ("cancel_run", "admin cancel-run"),
    ("apply_retention", "admin apply-retention"),
    ("list_time_partitions", "admin list-partitions"),
    ("list_retention_drops", "admin list-retention-drops"),
    ("value_limits", "admin list-value-limits"),
    ("import_rights", "admin import-rights"),
    ("import_semantic_model_as_operator", "admin import-semantic-model"),
    ("rotate_server_key", "admin rotate-server-key"),
    ("set_server_key", "admin set-server-key"),
    ("ledger_sites", "admin list-sites"),
    ("create_checkpoints", "ledger checkpoint"),
    ("ledger_checkpoints", "ledger checkpoint"),
    ("ledger_leaves", "ledger prove"),
    ("ledger_record", "ledger prove"),
    ("ledger_records", "ledger export"),
];

/// Operator functions of docs/api.md deliberately without a command, and why (none today).
pub const WITHOUT_COMMAND: &[(&str, &str)] = &[];

/// `OPERATOR_COMMANDS` and `WITHOUT_COMMAND` as JSON (the hidden `querylayer operator-commands`).
pub fn operator_commands_json() -> Value {
    serde_json::json!({
        "commands": OPERATOR_COMMANDS.iter().map(|(f, c)| serde_json::json!({"function": f, "command": c})).collect::<Vec<_>>(),
        "without_command": WITHOUT_COMMAND.iter().map(|(f, why)| serde_json::json!({"function": f, "reason": why})).collect::<Vec<_>>(),
    })
}

/// Reads a file, or stdin for `-`.
fn text_file(path: &str) -> Result<String, String> {
    if path == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| format!("cannot read stdin: {e}"))
    } else {
        std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))
    }
}

/// Reads a JSON document from a file, or from stdin for `-`.
fn json_file(path: &str) -> Result<Value, String> {
    let text = text_file(path)?;
    serde_json::from_str(&text).map_err(|e| format!("{path} is not JSON: {e}"))
}

fn default_name(who: &str) -> String {
    format!("{who} {}", Utc::now().format("%Y%m%dT%H%M%S%.6fZ"))
}

const IN: &str = "now() + {}::text::interval";

impl AdminCommand {
    fn call(self) -> Call {
        match self {
            AdminCommand::CreateOrganization { slug, name } => {
                Call::new("create_organization").arg("p_slug", slug).opt("p_name", name)
            }
            AdminCommand::CreateSite { organization, slug, name } => Call::new("create_site")
                .arg("p_organization", organization)
                .arg("p_slug", slug)
                .opt("p_name", name),
            AdminCommand::CreateMember { organization, handle, display_name } => Call::new("create_member")
                .arg("p_organization", organization)
                .arg("p_handle", handle)
                .opt("p_display_name", display_name),
            AdminCommand::SetMemberRole { site, member, role } => Call::new("set_member_role")
                .arg("p_site", site)
                .arg("p_member", member)
                .arg("p_role", (role != "none").then_some(role)),
            AdminCommand::CreateMemberToken { site, member, name, expires_in } => {
                let name = name.unwrap_or_else(|| default_name(&member));
                Call::new("create_member_token")
                    .arg("p_site", site)
                    .arg("p_member", member)
                    .arg("p_name", name)
                    .arg_as("p_expires_at", IN, expires_in)
            }
            AdminCommand::RevokeMemberToken { id, reason } => {
                Call::new("revoke_member_token").arg("p_token_id", id).opt("p_reason", reason)
            }
            AdminCommand::CreateAgent { organization, handle, kind, profile_id, profile_name, principal } => {
                Call::new("create_agent")
                    .arg("p_organization", organization)
                    .arg("p_handle", handle)
                    .opt("p_kind", kind)
                    .opt("p_profile_id", profile_id)
                    .opt("p_profile_name", profile_name)
                    .opt("p_principal", principal)
            }
            AdminCommand::RenameAgentProfile { profile_id, new_name } => {
                Call::new("rename_agent_profile").arg("p_profile_id", profile_id).arg("p_new_name", new_name)
            }
            AdminCommand::ResolveAgentProfile { profile_id, profile_name } => {
                Call::new("resolve_agent_profile")
                    .opt("p_profile_id", profile_id)
                    .opt("p_profile_name", profile_name)
            }
            AdminCommand::ListMembers { organization, site, limit, cursor } => Call::new("list_members")
                .opt("p_organization", organization)
                .opt("p_site", site)
                .arg("p_limit", limit)
                .opt("p_cursor", cursor),
            AdminCommand::ListAgents { organization, site, limit, cursor } => Call::new("list_agents")
                .opt("p_organization", organization)
                .opt("p_site", site)
                .arg("p_limit", limit)
                .opt("p_cursor", cursor),
            AdminCommand::GrantScopes { site, agent, scopes } => Call::new("grant_agent_scopes")
                .arg("p_site", site)
                .arg("p_agent", agent)
                .arg("p_scopes", scopes),
            AdminCommand::RevokeScopes { site, agent, scopes } => Call::new("revoke_agent_scopes")
                .arg("p_site", site)
                .arg("p_agent", agent)
                .arg("p_scopes", scopes),
            AdminCommand::CreateConnection {
                site,
                agent,
                scopes,
                expires_in,
                name,
                harness,
                did,
                did_proof,
                no_secret,
                ..
            } => {
                let name = name.unwrap_or_else(|| default_name(&agent));
                Call::new("create_connection")
                    .arg("p_site", site)
                    .arg("p_agent", agent)
                    .arg("p_name", name)
                    .arg("p_scopes", scopes)
                    .arg_as("p_expires_at", IN, expires_in)
                    .opt("p_harness", harness)
                    .opt("p_did", did)
                    .opt("p_secret", no_secret.then_some(false))
                    .opt(
                        "p_did_proof",
                        did_proof.map(|p| serde_json::from_str::<Value>(&p).unwrap_or(Value::String(p))),
                    )
            }
            AdminCommand::CreateDidChallenge { site, did } => {
                Call::new("create_did_challenge").arg("p_site", site).arg("p_did", did)
            }
            AdminCommand::RevokeConnection { id, reason } => {
                Call::new("revoke_connection").arg("p_connection_id", id).opt("p_reason", reason)
            }
            AdminCommand::ListConnections { site } => Call::rows("list_connections").arg("p_site", site),
            AdminCommand::ListAudit { site, limit } => {
                Call::rows("list_audit").arg("p_site", site).arg("p_limit", limit)
            }
            AdminCommand::VerifyLedger { site } => Call::new("verify_ledger").arg("p_site", site),
            AdminCommand::SealLedger { site } => Call::new("seal_ledger").opt("p_site", site),
            AdminCommand::SetConnectionBudget { site, connection, scope, period, max_calls } => {
                Call::new("set_connection_budget")
                    .arg("p_site", site)
                    .arg("p_connection", connection)
                    .arg("p_scope", scope)
                    .arg("p_period", period)
                    .arg("p_max_calls", max_calls)
            }
            AdminCommand::ListBudgets { site } => Call::new("list_connection_budgets").arg("p_site", site),
            AdminCommand::SeedDemo => Call::new("seed_demo"),
            AdminCommand::ImportStrategy { site, source, file } => Call::new("import_topical_strategy")
                .arg("p_site", site)
                .arg("p_source", source)
                .arg("p_opportunities", file),
            AdminCommand::AddTopic { site, slug, title, parent } => Call::new("add_topic")
                .arg("p_site", site)
                .arg("p_slug", slug)
                .arg("p_title", title)
                .opt("p_parent", parent),
            AdminCommand::ReportFormScreening { site, file } => {
                Call::new("report_form_screening").arg("p_site", site).arg("p_events", file)
            }
            AdminCommand::PurgeFormScreening => Call::new("purge_form_screening"),
            AdminCommand::SetSetting { key, value } => {
                Call::new("set_setting").arg("p_key", key).arg("p_value", value)
            }
            AdminCommand::MakeEvidenceDue { site } => Call::new("make_evidence_jobs_due").arg("p_site", site),
            AdminCommand::CancelRun { site, run, reason } => {
                Call::new("cancel_run").arg("p_site", site).arg("p_run_id", run).opt("p_reason", reason)
            }
            AdminCommand::ApplyRetention => Call::new("apply_retention"),
            AdminCommand::ListPartitions => Call::rows("list_time_partitions"),
            AdminCommand::ListRetentionDrops { limit } => {
                Call::rows("list_retention_drops").arg("p_limit", limit)
            }
            AdminCommand::InviteMember { site, member, role, display_name, expires_in, .. } => {
                Call::new("invite_member")
                    .arg("p_site", site)
                    .arg("p_member", member)
                    .arg("p_role", role)
                    .arg("p_display_name", display_name)
                    .arg_as("p_expires_at", IN, expires_in)
            }
            AdminCommand::RevokeMemberSession { id, reason } => {
                Call::new("revoke_member_session").arg("p_session_id", id).opt("p_reason", reason)
            }
            AdminCommand::CreateDeliveryToken { site, name, expires_in } => Call::new(
                "create_delivery_token",
            )
            .arg("p_site", site)
            .arg("p_name", name)
            .arg_as("p_expires_at", IN, expires_in),
            AdminCommand::RevokeDeliveryToken { id, reason } => {
                Call::new("revoke_delivery_token").arg("p_token_id", id).opt("p_reason", reason)
            }
            AdminCommand::SetDeliveryPublic { site, public } => {
                Call::new("set_delivery_public").arg("p_site", site).arg("p_public", public)
            }
            AdminCommand::CreateTemplate { site, name, fields } => {
                Call::new("create_template").arg("p_site", site).arg("p_name", name).arg("p_fields", fields)
            }
            AdminCommand::ImportRights { site, file } => {
                Call::new("import_rights").arg("p_site", site).arg("p_document", file)
            }
            AdminCommand::GetSettings => Call::new("get_settings"),
            AdminCommand::RotateServerKey => Call::new("rotate_server_key"),
            AdminCommand::ListSites => Call::new("ledger_sites"),
            AdminCommand::ListEnvelopeReceipts { site, limit } => {
                Call::rows("list_envelope_receipts").arg("p_site", site).arg("p_limit", limit)
            }
            AdminCommand::ImportSemanticModel { site, file } => {
                Call::new("import_semantic_model_as_operator").arg("p_site", site).arg("p_document", file)
            }
            AdminCommand::SetServerKey { secret_file } => {
                Call::new("set_server_key").arg("p_secret_hex", secret_file.trim().to_string())
            }
            AdminCommand::VerifyLiveState { site } => Call::new("verify_live_state").arg("p_site", site),
            AdminCommand::ListValueLimits => Call::rows("value_limits"),
        }
    }
}

/// Reports a failure on stderr: a line (and a hint) for people, or with `--json` one JSON object
/// `{"error": {"code", "message", "hint"}}`.
/// `refused`: the database refused the call (its code goes in the line); otherwise the command
/// failed before it (no database, bad input: `usage`, `invalid_argument`, `unavailable`).
pub fn report_error(json: bool, code: &str, message: &str, hint: Option<&str>, refused: bool) {
    if json {
        let error = serde_json::json!({"error": {"code": code, "message": message, "hint": hint}});
        eprintln!("{error}");
    } else if !refused {
        eprintln!("querylayer admin: {message}");
    } else {
        eprintln!("querylayer admin: {message} ({code})");
        if let Some(hint) = hint {
            eprintln!("hint: {hint}");
        }
    }
}

/// Runs one admin command; returns the process exit code.
pub async fn run(args: AdminArgs) -> i32 {
    let Some(url) = args.database_url else {
        report_error(
            args.json,
            "usage",
            "set DATABASE_URL (or --database-url) to an operator login",
            None,
            false,
        );
        return 2;
    };
    let db = match Db::connect(&url, 1, Duration::from_secs(60)) {
        Ok(db) => db,
        Err(e) => {
            report_error(args.json, "usage", &e, None, false);
            return 2;
        }
    };
    let kind = CommandKind::of(&args.command);
    let public_url = match &args.command {
        AdminCommand::InviteMember { public_url, .. } => public_url.clone(),
        _ => None,
    };
    let command = match prove_binding(&db, args.command).await {
        Ok(command) => command,
        Err(e) => {
            report_error(args.json, "invalid_argument", &e, None, false);
            return 1;
        }
    };
    match db.call_as_operator(&command.call()).await {
        Ok(mut value) => {
            // An invitation's link, whole when the edge's public URL is known.
            if let (Some(url), Some(path)) = (public_url, value.get("path").and_then(Value::as_str)) {
                value["link"] = Value::String(format!("{}{path}", url.trim_end_matches('/')));
            }
            if args.json {
                println!("{}", serde_json::to_string_pretty(&value).unwrap_or_default());
            } else {
                print_text(kind, &value);
            }
            0
        }
        Err(e) => {
            // A connection that could not be made says why: TLS, authentication, refused, unreachable.
            report_error(args.json, e.code.as_str(), &e.with_cause(), e.hint.as_deref(), true);
            1
        }
    }
}

/// For `create-connection` given the key itself (`--did-seed`, `--did-key-file`): gets a
/// challenge for that key on the site, signs it, and fills in `--did` and `--did-proof`.
async fn prove_binding(db: &Db, command: AdminCommand) -> Result<AdminCommand, String> {
    let AdminCommand::CreateConnection {
        site,
        agent,
        scopes,
        expires_in,
        name,
        harness,
        did,
        did_proof,
        did_seed,
        did_key_file,
        no_secret,
    } = command
    else {
        return Ok(command);
    };
    if no_secret && did.is_none() && did_seed.is_none() && did_key_file.is_none() {
        return Err(
            "--no-secret needs a did:key to bind (--did with --did-proof, --did-seed or --did-key-file)"
                .into(),
        );
    }
    let signer = match (&did_seed, &did_key_file) {
        (Some(seed), _) => Some(querylayer_envelope::Signer::from_seed_bytes(seed.as_bytes())),
        (_, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let bytes = hex::decode(text.trim()).map_err(|e| format!("{}: not hex: {e}", path.display()))?;
            let secret: [u8; 32] =
                bytes.try_into().map_err(|_| format!("{}: not a 32-byte secret", path.display()))?;
            Some(querylayer_envelope::Signer::from_secret(secret))
        }
        _ => None,
    };
    let (did, did_proof) = match signer {
        None => (did, did_proof),
        Some(signer) => {
            if did.as_deref().is_some_and(|d| d != signer.did_key()) {
                return Err(format!("--did is not the did:key of the given key ({})", signer.did_key()));
            }
            let challenge = db
                .call_as_operator(
                    &Call::new("create_did_challenge")
                        .arg("p_site", site.clone())
                        .arg("p_did", signer.did_key()),
                )
                .await
                .map_err(|e| format!("{} ({})", e.with_cause(), e.code))?;
            let challenge = challenge["challenge"].as_str().ok_or("the challenge has no challenge")?;
            let proof = querylayer_envelope::binding_proof(&signer, &site, challenge);
            (Some(signer.did_key()), Some(proof.to_string()))
        }
    };
    Ok(AdminCommand::CreateConnection {
        site,
        agent,
        scopes,
        expires_in,
        name,
        harness,
        did,
        did_proof,
        did_seed: None,
        did_key_file: None,
        no_secret,
    })
}

#[derive(Clone, Copy)]
enum CommandKind {
    Connection,
    Invitation,
    DeliveryToken,
    List,
    Audit,
    Demo,
    Rows,
    Sites,
    Members,
    Agents,
    Limits,
    Other,
}

impl CommandKind {
    fn of(command: &AdminCommand) -> Self {
        match command {
            AdminCommand::CreateConnection { .. } => CommandKind::Connection,
            AdminCommand::InviteMember { .. } => CommandKind::Invitation,
            AdminCommand::CreateDeliveryToken { .. } => CommandKind::DeliveryToken,
            AdminCommand::ListConnections { .. } => CommandKind::List,
            AdminCommand::ListAudit { .. } => CommandKind::Audit,
            AdminCommand::SeedDemo => CommandKind::Demo,
            AdminCommand::ListPartitions
            | AdminCommand::ListRetentionDrops { .. }
            | AdminCommand::ListEnvelopeReceipts { .. } => CommandKind::Rows,
            AdminCommand::ListSites => CommandKind::Sites,
            AdminCommand::ListMembers { .. } => CommandKind::Members,
            AdminCommand::ListAgents { .. } => CommandKind::Agents,
            AdminCommand::ListValueLimits => CommandKind::Limits,
            _ => CommandKind::Other,
        }
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

fn print_fields(value: &Value, indent: &str) {
    if let Value::Object(map) = value {
        for (key, v) in map {
            if v.is_object() {
                println!("{indent}{key}:");
                print_fields(v, &format!("{indent}  "));
            } else {
                println!("{indent}{key}: {}", text(v));
            }
        }
    } else {
        println!("{indent}{}", text(value));
    }
}

fn print_text(kind: CommandKind, value: &Value) {
    use Align::{Left as L, Right as R};
    match kind {
        CommandKind::List => print_table(
            value,
            &[
                Column("id", "connection_id", 36, L),
                Column("state", "state", 8, L),
                Column("agent", "agent", 16, L),
                Column("prefix", "prefix", 14, L),
                Column("expires_at", "expires_at", 25, L),
                Column("name", "name", 32, L),
                Column("scopes", "effective_scopes", 0, L),
            ],
        ),
        CommandKind::Audit => {
            for r in value.as_array().cloned().unwrap_or_default() {
                println!(
                    "{}  {:<10}  {:<20}  {:<7}  {:<36}  {}",
                    text(&r["at"]),
                    text(&r["principal_kind"]),
                    text(&r["action"]),
                    text(&r["outcome"]),
                    text(&r["target"]),
                    r["detail"]
                );
            }
        }
        CommandKind::Connection => {
            print_fields(value, "");
            println!("\nThe secret is shown once; store it now. Clients send it as `Authorization: Bearer <secret>`.");
        }
        CommandKind::Invitation => {
            print_fields(value, "");
            println!("\nThe link works once; send it to the member privately. It is shown once.");
        }
        CommandKind::DeliveryToken => {
            print_fields(value, "");
            println!("\nThe token is shown once; the website sends it as `Authorization: Bearer <token>`.");
        }
        CommandKind::Demo => {
            print_fields(value, "");
            println!("\nThe connection secret and the member token are shown once; store them now.");
        }
        CommandKind::Rows => {
            for (i, row) in value.as_array().cloned().unwrap_or_default().iter().enumerate() {
                if i > 0 {
                    println!();
                }
                print_fields(row, "");
            }
        }
        CommandKind::Sites => print_table(
            value,
            &[
                Column("site", "site", 32, L),
                Column("id", "site_id", 36, L),
                Column("records", "records", 10, R),
                Column("checkpoint", "checkpoint_seq", 0, L),
            ],
        ),
        CommandKind::Members => {
            print_table(
                &value["members"],
                &[
                    Column("handle", "handle", 24, L),
                    Column("role", "role", 8, L),
                    Column("id", "member_id", 36, L),
                    Column("display name", "display_name", 0, L),
                ],
            );
            print_next_page(value);
        }
        CommandKind::Agents => {
            print_table(
                &value["agents"],
                &[
                    Column("handle", "handle", 24, L),
                    Column("kind", "kind", 8, L),
                    Column("id", "agent_id", 36, L),
                    Column("active", "active_connections", 6, R),
                    Column("scopes", "scopes", 0, L),
                ],
            );
            print_next_page(value);
        }
        CommandKind::Limits => print_table(
            value,
            &[
                Column("table", "table_name", 32, L),
                Column("column", "column_name", 24, L),
                Column("max bytes", "max_bytes", 10, R),
                Column("argument", "argument", 0, L),
            ],
        ),
        CommandKind::Other => print_fields(value, ""),
    }
}

/// A column of a printed table: its title, the key of the row's value, its width (the last
/// column's is not used) and its alignment.
struct Column(&'static str, &'static str, usize, Align);

#[derive(Clone, Copy, PartialEq)]
enum Align {
    Left,
    Right,
}

/// `rows` (a JSON array) as a table: the titles, then a line a row, columns two spaces apart.
fn print_table(rows: &Value, columns: &[Column]) {
    let line = |cell: &dyn Fn(&Column) -> String| {
        let last = columns.len().saturating_sub(1);
        let cells: Vec<String> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| match (i == last, c.3) {
                (true, _) => cell(c),
                (false, Align::Left) => format!("{:<w$}", cell(c), w = c.2),
                (false, Align::Right) => format!("{:>w$}", cell(c), w = c.2),
            })
            .collect();
        cells.join("  ")
    };
    println!("{}", line(&|c| c.0.to_string()));
    for r in rows.as_array().cloned().unwrap_or_default() {
        println!("{}", line(&|c| text(&r[c.1])));
    }
}

/// After a page: how to ask for the next one, when there is one.
fn print_next_page(value: &Value) {
    if let Some(cursor) = value["next_cursor"].as_str() {
        println!("\nmore: add --cursor {cursor}");
    }
}

#[cfg(test)]
mod tests {
    use clap::{Args, Command};

    use super::{AdminArgs, OPERATOR_COMMANDS};

    /// Every flag of every `querylayer admin` command says what it is.
    #[test]
    fn every_admin_flag_has_help() {
        let admin = AdminArgs::augment_args(Command::new("admin"));
        let mut missing = Vec::new();
        for command in std::iter::once(&admin).chain(admin.get_subcommands()) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id != "help"
                    && id != "version"
                    && arg.get_help().is_none()
                    && arg.get_long_help().is_none()
                {
                    missing.push(format!("{} --{id}", command.get_name()));
                }
            }
            if command.get_name() != "admin" && command.get_about().is_none() {
                missing.push(command.get_name().to_string());
            }
        }
        assert!(missing.is_empty(), "without help: {missing:?}");
        assert!(admin.get_subcommands().count() >= 36);
    }

    /// Every `admin` command calls the function the map names for it, and every command is in
    /// the map; every `ledger` entry names a function its module calls.
    #[test]
    fn every_admin_command_calls_the_function_the_map_names() {
        let file = std::env::temp_dir().join(format!("querylayer-admin-map-{}.json", std::process::id()));
        std::fs::write(&file, "[]").unwrap();
        let admin = AdminArgs::augment_args(Command::new("admin"));
        let mut wrong = Vec::new();
        for command in admin.get_subcommands() {
            let name = command.get_name();
            // Every required flag gets a value of its kind; the call is built, never sent.
            let mut argv = vec!["admin".to_string(), name.to_string()];
            for arg in command.get_arguments().filter(|a| a.is_required_set()) {
                let id = arg.get_id().as_str();
                argv.push(format!("--{}", arg.get_long().unwrap_or(id)));
                argv.push(match id {
                    "id" | "run" | "connection" => uuid::Uuid::nil().to_string(),
                    "file" | "fields" | "secret_file" => file.display().to_string(),
                    "public" => "true".into(),
                    _ => "x".into(),
                });
            }
            for (flag, other) in [("profile-id", "profile-name"), ("organization", "site")] {
                if command.get_arguments().any(|a| a.get_long() == Some(flag))
                    && command.get_arguments().any(|a| a.get_long() == Some(other))
                    && !argv.iter().any(|a| a == &format!("--{flag}"))
                {
                    argv.extend([format!("--{flag}"), "x".into()]);
                }
            }
            let parsed = AdminArgs::augment_args(Command::new("admin"))
                .no_binary_name(true)
                .try_get_matches_from(&argv[1..])
                .and_then(|m| <AdminArgs as clap::FromArgMatches>::from_arg_matches(&m));
            let called = match parsed {
                Ok(args) => args.command.call().function(),
                Err(e) => panic!("admin {name}: {e}"),
            };
            let mapped: Vec<_> = OPERATOR_COMMANDS
                .iter()
                .filter(|(_, c)| *c == format!("admin {name}"))
                .map(|(f, _)| *f)
                .collect();
            if mapped != [called] {
                wrong.push(format!("admin {name} calls {called}, the map says {mapped:?}"));
            }
        }
        std::fs::remove_file(&file).unwrap();
        let ledger = include_str!("ledger/operator.rs");
        for (function, command) in OPERATOR_COMMANDS.iter().filter(|(_, c)| c.starts_with("ledger ")) {
            if !ledger.contains(&format!("querylayer_api.{function}(")) {
                wrong.push(format!("{command}: edge/src/ledger/operator.rs never calls {function}"));
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}

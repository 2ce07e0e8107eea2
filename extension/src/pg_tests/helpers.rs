//! Helpers shared by the in-database tests: queries, the demo site, authentication as each kind of
//! principal, and the ways a test expects a refusal.

use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::Value;

pub(crate) fn json(sql: &str) -> Value {
    Spi::get_one::<JsonB>(sql).expect("query failed").expect("NULL result").0
}

pub(crate) fn text(sql: &str) -> String {
    Spi::get_one::<String>(sql).expect("query failed").expect("NULL result")
}

/// Seeds the demo (as the superuser, an operator) and returns its connection secret.
pub(crate) fn demo_secret() -> String {
    let seeded = json("SELECT querylayer_api.seed_demo()");
    seeded["connection"]["secret"].as_str().unwrap().to_string()
}

pub(crate) fn authenticate(secret: &str) -> Value {
    json(&format!("SELECT querylayer_api.authenticate(sha256(convert_to('{secret}', 'UTF8')))"))
}

/// Runs `sql` and requires it to fail with `sqlstate` (a subtransaction catches the error, so
/// the test can go on).
pub(crate) fn expect_sqlstate(sql: &str, sqlstate: &str) {
    Spi::run(&format!(
        "DO $t$ BEGIN EXECUTE $q${sql}$q$;
           RAISE EXCEPTION 'expected SQLSTATE {sqlstate}, but the statement succeeded' USING ERRCODE = 'XX000';
         EXCEPTION WHEN SQLSTATE '{sqlstate}' THEN NULL; END $t$"
    ))
    .unwrap();
}

pub(crate) fn as_edge() {
    Spi::run("SET LOCAL ROLE querylayer_edge").unwrap();
}

pub(crate) fn as_owner() {
    Spi::run("SET LOCAL ROLE querylayer_owner").unwrap();
}

pub(crate) struct Site {
    pub(crate) secret: String,
    pub(crate) owner_token: String,
}

/// The demo plus an editor; returns the agent's secret and the owner's token.
pub(crate) fn content_site() -> Site {
    let seeded = json("SELECT querylayer_api.seed_demo()");
    Site {
        secret: seeded["connection"]["secret"].as_str().unwrap().to_string(),
        owner_token: seeded["member_token"]["token"].as_str().unwrap().to_string(),
    }
}

pub(crate) fn member_token(handle: &str, role: &str) -> String {
    Spi::run(&format!("SELECT querylayer_api.create_member('demo', '{handle}')")).unwrap();
    Spi::run(&format!("SELECT querylayer_api.set_member_role('demo', '{handle}', '{role}')")).unwrap();
    let t = json(&format!(
        "SELECT querylayer_api.create_member_token('demo', '{handle}', 't', now() + interval '1 hour')"
    ));
    t["token"].as_str().unwrap().to_string()
}

pub(crate) fn as_member(token: &str) -> Value {
    json(&format!("SELECT querylayer_api.authenticate_member(sha256(convert_to('{token}', 'UTF8')))"))
}

/// As the agent: begins a run and drafts an article. Returns (run_id, content_id, revision_id).
pub(crate) fn draft(secret: &str, slug: &str) -> (String, String, String) {
    authenticate(secret);
    let run = json("SELECT querylayer_api.begin_run('article.draft')");
    let run_id = run["run_id"].as_str().unwrap().to_string();
    let d = json(&format!(
        "SELECT querylayer_api.create_draft('{run_id}', 'article', '{{\"title\": \"T\", \"body\": \"B\"}}', NULL, '{slug}')"
    ));
    (run_id, d["content_id"].as_str().unwrap().to_string(), d["revision_id"].as_str().unwrap().to_string())
}

pub(crate) fn redraft(run_id: &str, content_id: &str) -> String {
    let d = json(&format!(
        "SELECT querylayer_api.create_draft('{run_id}', 'article', '{{\"title\": \"T2\", \"body\": \"B2\"}}', '{content_id}')"
    ));
    d["revision_id"].as_str().unwrap().to_string()
}

pub(crate) fn request_publish(run_id: &str, content_id: &str, revision_id: &str) -> String {
    let p = json(&format!(
        "SELECT querylayer_api.request_publish_approval('{run_id}',
           '[{{\"content_id\": \"{content_id}\", \"action\": \"publish\", \"revision_id\": \"{revision_id}\"}}]')"
    ));
    p["proposal_id"].as_str().unwrap().to_string()
}

/// An agent's proposal to `archive` or `restore` an item; `archived_at` is the snapshot a restore
/// names. Returns its id.
pub(crate) fn lifecycle_proposal(
    run_id: &str,
    content_id: &str,
    action: &str,
    archived_at: Option<&str>,
) -> String {
    let snapshot = archived_at.map_or("null".to_string(), |a| format!("\"{a}\""));
    json(&format!(
        "SELECT querylayer_api.create_proposal('{run_id}', 'content_lifecycle',
           '{{\"items\": [{{\"content_id\": \"{content_id}\", \"action\": \"{action}\", \"archived_at\": {snapshot}}}]}}')"
    ))["proposal_id"]
        .as_str()
        .unwrap()
        .to_string()
}

pub(crate) fn live_pointer(content_id: &str) -> Option<String> {
    Spi::get_one::<String>(&format!(
        "SELECT published_revision_id::text FROM querylayer.content_items WHERE id = '{content_id}'"
    ))
    .unwrap()
}

pub(crate) fn count(table: &str) -> i64 {
    Spi::get_one::<i64>(&format!("SELECT count(*) FROM querylayer.{table}")).unwrap().unwrap()
}

/// The message of the error `sql` raises with `sqlstate` (which it must raise).
pub(crate) fn error_message(sql: &str, sqlstate: &str) -> String {
    Spi::get_one::<String>(&format!(
        "DO $t$ BEGIN EXECUTE $q${sql}$q$;
           RAISE EXCEPTION 'expected SQLSTATE {sqlstate}, but the statement succeeded' USING ERRCODE = 'XX000';
         EXCEPTION WHEN SQLSTATE '{sqlstate}' THEN PERFORM set_config('ql.test', SQLERRM, true); END $t$;
         SELECT current_setting('ql.test')"
    ))
    .unwrap()
    .unwrap()
}

pub(crate) fn fingerprint(secret: &str) -> String {
    format!("sha256(convert_to('{secret}', 'UTF8'))")
}

/// Seeds the demo (as the superuser, an operator) and returns (connection secret, owner token).
pub(crate) fn demo() -> (String, String) {
    let seeded = json("SELECT querylayer_api.seed_demo()");
    (
        seeded["connection"]["secret"].as_str().unwrap().to_string(),
        seeded["member_token"]["token"].as_str().unwrap().to_string(),
    )
}

/// The SQLSTATE and message `sql` fails with (a subtransaction catches it).
pub(crate) fn failure(sql: &str) -> (String, String) {
    let caught = Spi::get_one::<String>(&format!(
        "DO $t$ BEGIN EXECUTE $q${sql}$q$;
           PERFORM set_config('ql.failure', 'none|no error', true);
         EXCEPTION WHEN OTHERS THEN PERFORM set_config('ql.failure', SQLSTATE || '|' || SQLERRM, true); END $t$;
         SELECT current_setting('ql.failure')"
    ))
    .unwrap()
    .unwrap();
    let (state, message) = caught.split_once('|').unwrap();
    (state.to_string(), message.to_string())
}

/// A second agent on the demo site with its own connection; returns its secret.
pub(crate) fn other_agent() -> String {
    Spi::run("SELECT querylayer_api.create_agent('demo', 'other-agent')").unwrap();
    Spi::run("SELECT querylayer_api.grant_agent_scopes('demo', 'other-agent', '{runs:write,runs:read}')")
        .unwrap();
    json("SELECT querylayer_api.create_connection('demo', 'other-agent', 'o1', '{runs:write,runs:read}', now() + interval '1 hour')")
        ["secret"]
        .as_str()
        .unwrap()
        .to_string()
}

//! Credentials cannot outlive revocation, a narrowed permission or role, or their expiry inside
//! an open transaction: authentication decides on the wall clock and the newest committed state,
//! a snapshot that cannot see the present is refused, and changing a credential ends the
//! backends still acting with it. Each test performs the attack with real concurrent logins.

use std::time::{Duration, Instant};

use postgres::Client;
use querylayer_e2e::{authenticate, fingerprint, issued, json, sql_error, Demo, TestDb};
use serde_json::Value;

fn connection(dba: &mut Client, name: &str, scopes: &str, expires_in: &str) -> (String, String) {
    let v: Value = json(
        dba,
        "SELECT querylayer_api.create_connection('demo', 'demo-agent', $1, $2::text::text[], now() + $3::text::interval)",
        &[&name, &scopes, &expires_in],
    );
    let secret = v["secret"].as_str().unwrap().to_string();
    issued(&secret);
    (secret, v["connection_id"].as_str().unwrap().to_string())
}

/// Waits until `pid` waits on a lock (or `limit` passes).
fn wait_for_lock_wait(observer: &mut Client, pid: i32) {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        let waiting: bool = observer
            .query_one(
                "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .map(|r| r.get(0))
            .unwrap_or(false);
        if waiting {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("backend {pid} never waited on a lock");
}

fn backend_pid(client: &mut Client) -> i32 {
    client.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)
}

/// Asserts that the next statement on `client` fails because its backend was ended.
fn assert_ended(client: &mut Client, sql: &str) {
    let err = client.batch_execute(sql).expect_err("the backend should have been ended");
    let ended = err.is_closed()
        || err.as_db_error().is_some_and(|db| db.code().code() == "57P01")
        || err.to_string().contains("connection closed")
        || err.to_string().contains("terminating connection")
        // The server closed the socket of the ended backend before the client read its notice.
        || std::error::Error::source(&err)
            .and_then(|e| e.downcast_ref::<std::io::Error>())
            .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset);
    assert!(ended, "expected the session to be ended, got: {err:?}");
}

#[test]
fn repeatable_read_opened_before_a_revocation_cannot_authenticate_after_it() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();
    edge.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
    db.dba()
        .execute(
            "SELECT querylayer_api.revoke_connection($1::text::uuid, 'laptop lost')",
            &[&demo.connection_id],
        )
        .unwrap();
    let err = authenticate(&mut edge, &demo.secret).unwrap_err();
    assert_eq!(sql_error(&err), ("28000".into(), "authentication failed".into()));
    edge.batch_execute("ROLLBACK").unwrap();
    // Nothing was written as the revoked connection.
    let runs: i64 = db.superuser().query_one("SELECT count(*) FROM querylayer.runs WHERE site_id = (SELECT id FROM querylayer.sites WHERE slug = 'demo')", &[]).unwrap().get(0);
    assert_eq!(runs, 0);
}

#[test]
fn a_snapshot_that_cannot_see_a_removed_scope_is_refused() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();
    edge.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
    db.dba()
        .batch_execute(
            "SELECT querylayer_api.revoke_agent_scopes('demo', 'demo-agent', '{runs:write}'::text[])",
        )
        .unwrap();
    let err = authenticate(&mut edge, &demo.secret).unwrap_err();
    let (code, message) = sql_error(&err);
    assert_eq!(code, "40001", "{message}");
    assert!(message.contains("cannot see the present"), "{message}");
    edge.batch_execute("ROLLBACK").unwrap();
    // In a new transaction the present is visible: the scope is gone.
    let mut tx = edge.transaction().unwrap();
    let ctx = authenticate(&mut tx, &demo.secret).unwrap();
    assert!(!ctx["scopes"].as_array().unwrap().iter().any(|s| s == "runs:write"), "{ctx}");
    let refused = tx.query_one("SELECT querylayer_api.begin_run('article.draft')", &[]).unwrap_err();
    assert_eq!(sql_error(&refused).0, "QL403");
}

#[test]
fn revoking_a_connection_ends_the_backends_acting_with_it() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();
    edge.batch_execute("BEGIN").unwrap();
    authenticate(&mut edge, &demo.secret).unwrap();
    edge.batch_execute("SELECT querylayer_api.begin_run('article.draft')").unwrap();
    let ended: Value = json(
        &mut db.dba(),
        "SELECT querylayer_api.revoke_connection($1::text::uuid, 'compromised')",
        &[&demo.connection_id],
    );
    assert_eq!(ended["already_revoked"], false);
    assert_ended(&mut edge, "SELECT querylayer_api.begin_run('article.draft')");
    // The run begun before the revocation was never committed either.
    let runs: i64 = db.superuser().query_one("SELECT count(*) FROM querylayer.runs WHERE site_id = (SELECT id FROM querylayer.sites WHERE slug = 'demo')", &[]).unwrap().get(0);
    assert_eq!(runs, 0);
}

#[test]
fn removing_a_scope_ends_the_backends_acting_with_it() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();
    edge.batch_execute("BEGIN").unwrap();
    authenticate(&mut edge, &demo.secret).unwrap();
    db.dba()
        .batch_execute(
            "SELECT querylayer_api.revoke_agent_scopes('demo', 'demo-agent', '{runs:write}'::text[])",
        )
        .unwrap();
    assert_ended(&mut edge, "SELECT querylayer_api.begin_run('article.draft')");
}

/// A revocation of the demo connection is under way (not committed) while `edge` authenticates
/// with its secret: the authentication waits for the revocation's lock, and once it commits, is
/// refused.
fn race_a_revocation(db: &TestDb, demo: &Demo, mut edge: Client) {
    let mut revoker = db.dba();
    revoker.batch_execute("BEGIN").unwrap();
    revoker
        .execute("SELECT querylayer_api.revoke_connection($1::text::uuid)", &[&demo.connection_id])
        .unwrap();
    let secret = demo.secret.clone();
    let pid = backend_pid(&mut edge);
    let racer = std::thread::spawn(move || {
        let mut tx = edge.transaction().unwrap();
        let outcome = authenticate(&mut tx, &secret).map_err(|e| sql_error(&e));
        (outcome.map(|_| ()), tx.rollback())
    });
    wait_for_lock_wait(&mut db.superuser(), pid);
    revoker.batch_execute("COMMIT").unwrap();
    let (outcome, _) = racer.join().unwrap();
    assert_eq!(outcome, Err(("28000".into(), "authentication failed".into())));
}

#[test]
fn an_authentication_racing_a_revocation_waits_for_it_and_sees_it() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    race_a_revocation(&db, &demo, db.edge());
}

/// The same race against a backend that keeps the connection's verdict (extension/src/context.rs,
/// "Kept verdicts"): it authenticated before, so its next authentication would take the kept
/// verdict up; it waits for the revocation's lock instead, and then sees it.
#[test]
fn a_kept_verdict_racing_a_revocation_waits_for_it_and_sees_it() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();
    for _ in 0..2 {
        let mut tx = edge.transaction().unwrap();
        authenticate(&mut tx, &demo.secret).unwrap();
        tx.commit().unwrap();
    }
    race_a_revocation(&db, &demo, edge);
}

/// A backend that keeps a connection's verdict sees, at its next authentication, what another
/// session committed in between: a withdrawn permission, a renamed profile, a budget.
#[test]
fn a_kept_verdict_gives_way_to_changes_committed_by_another_session() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();
    let authenticated = |edge: &mut Client| -> Value {
        let mut tx = edge.transaction().unwrap();
        let v = authenticate(&mut tx, &demo.secret).unwrap();
        tx.query_one("SELECT querylayer_api.list_content(p_limit => 1)", &[]).unwrap();
        tx.commit().unwrap();
        v
    };
    let first = authenticated(&mut edge);
    assert_eq!(authenticated(&mut edge), first);
    assert!(first["scopes"].as_array().unwrap().iter().any(|s| s == "runs:write"));

    db.dba()
        .batch_execute("SELECT querylayer_api.revoke_agent_scopes('demo', 'demo-agent', '{runs:write}')")
        .unwrap();
    let narrowed = authenticated(&mut edge);
    assert!(!narrowed["scopes"].as_array().unwrap().iter().any(|s| s == "runs:write"), "{narrowed}");

    db.dba()
        .batch_execute("SELECT querylayer_api.rename_agent_profile('demo-profile-0001', 'Renamed')")
        .unwrap();
    assert_eq!(authenticated(&mut edge)["profile_name"], "Renamed");

    // A budget of no calls: the next call that spends it is refused.
    db.dba()
        .execute(
            "SELECT querylayer_api.set_connection_budget('demo', $1::text::uuid, 'content:read', 'hour', 0)",
            &[&demo.connection_id],
        )
        .unwrap();
    let mut tx = edge.transaction().unwrap();
    authenticate(&mut tx, &demo.secret).unwrap();
    let err = tx.query_one("SELECT querylayer_api.list_content(p_limit => 1)", &[]).unwrap_err();
    assert_eq!(sql_error(&err).0, "QL429", "{err}");
}

fn member(db: &TestDb, handle: &str, role: &str) -> String {
    let mut dba = db.dba();
    dba.batch_execute(&format!(
        "SELECT querylayer_api.create_member('demo', '{handle}');
         SELECT querylayer_api.set_member_role('demo', '{handle}', '{role}');"
    ))
    .unwrap();
    let v: Value = json(
        &mut dba,
        "SELECT querylayer_api.create_member_token('demo', $1, 'console', now() + interval '1 hour')",
        &[&handle],
    );
    let token = v["token"].as_str().unwrap().to_string();
    issued(&token);
    token
}

/// A pending publish proposal of a fresh draft, made by the demo connection.
fn publish_proposal(db: &TestDb, demo: &Demo) -> String {
    let mut edge = db.edge();
    let mut tx = edge.transaction().unwrap();
    authenticate(&mut tx, &demo.secret).unwrap();
    let run: Value = tx.query_one("SELECT querylayer_api.begin_run('article.draft')", &[]).unwrap().get(0);
    let run_id = run["run_id"].as_str().unwrap().to_string();
    let draft: Value = tx
        .query_one(
            "SELECT querylayer_api.create_draft(p_run_id => $1::text::uuid, p_template => 'article',
                 p_slug => 'liveness', p_fields => '{\"title\": \"T\", \"body\": \"B\"}'::jsonb)",
            &[&run_id],
        )
        .unwrap()
        .get(0);
    let items = serde_json::json!([{"content_id": draft["content_id"], "action": "publish",
                                    "revision_id": draft["revision_id"]}]);
    let proposal: Value = tx
        .query_one(
            "SELECT querylayer_api.request_publish_approval($1::text::uuid, $2::jsonb)",
            &[&run_id, &items],
        )
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    proposal["proposal_id"].as_str().unwrap().to_string()
}

fn authenticate_member(
    client: &mut impl postgres::GenericClient,
    token: &str,
) -> Result<Value, postgres::Error> {
    client
        .query_one("SELECT querylayer_api.authenticate_member($1)", &[&fingerprint(token)])
        .map(|r| r.get(0))
}

#[test]
fn an_editor_demoted_to_viewer_cannot_go_on_approving() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let proposal = publish_proposal(&db, &demo);
    let token = member(&db, "eddie", "editor");
    let mut console = db.edge();
    console.batch_execute("BEGIN").unwrap();
    authenticate_member(&mut console, &token).unwrap();
    db.dba().batch_execute("SELECT querylayer_api.set_member_role('demo', 'eddie', 'viewer')").unwrap();
    assert_ended(&mut console, &format!("SELECT querylayer_api.decide_proposal('{proposal}', 'approve')"));
    // And a transaction opened before a demotion cannot authenticate with the old role.
    db.dba().batch_execute("SELECT querylayer_api.set_member_role('demo', 'eddie', 'editor')").unwrap();
    let mut fresh = db.edge();
    fresh.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
    db.dba().batch_execute("SELECT querylayer_api.set_member_role('demo', 'eddie', 'viewer')").unwrap();
    let err = authenticate_member(&mut fresh, &token).unwrap_err();
    assert_eq!(sql_error(&err).0, "40001");
    let state: String = db
        .superuser()
        .query_one("SELECT count(*)::text FROM querylayer.proposal_decisions WHERE site_id = (SELECT id FROM querylayer.sites WHERE slug = 'demo')", &[])
        .unwrap()
        .get(0);
    assert_eq!(state, "0", "no decision was recorded");
}

#[test]
fn a_revoked_owner_token_cannot_go_on_publishing() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let proposal = publish_proposal(&db, &demo);
    let mut console = db.edge();
    console.batch_execute("BEGIN").unwrap();
    let me = authenticate_member(&mut console, &demo.member_token).unwrap();
    let token_id = me["member_token_id"].as_str().unwrap().to_string();
    db.dba().execute("SELECT querylayer_api.revoke_member_token($1::text::uuid)", &[&token_id]).unwrap();
    assert_ended(&mut console, &format!("SELECT querylayer_api.decide_proposal('{proposal}', 'approve')"));
    let live: i64 = db
        .superuser()
        .query_one(
            "SELECT count(*) FROM querylayer.content_items
              WHERE site_id = (SELECT id FROM querylayer.sites WHERE slug = 'demo') AND published_revision_id IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(live, 0, "nothing was published");
}

#[test]
fn expiry_is_decided_on_the_wall_clock_inside_an_open_transaction() {
    let db = TestDb::new();
    db.seed_demo();
    let mut dba = db.dba();
    let (short, _) = connection(&mut dba, "short", "{runs:write}", "2 seconds");
    // READ COMMITTED, opened before the expiry: now() is the transaction's start, the clock is not.
    let mut edge = db.edge();
    edge.batch_execute("BEGIN; SELECT 1").unwrap();
    std::thread::sleep(Duration::from_millis(2300));
    let err = authenticate(&mut edge, &short).unwrap_err();
    assert_eq!(sql_error(&err).0, "28000");
    edge.batch_execute("ROLLBACK").unwrap();

    // A context made before the expiry does not outlive it.
    let (brief, _) = connection(&mut dba, "brief", "{runs:write}", "2 seconds");
    let mut tx = edge.transaction().unwrap();
    authenticate(&mut tx, &brief).unwrap();
    tx.query_one("SELECT querylayer_api.begin_run('article.draft')", &[]).unwrap();
    std::thread::sleep(Duration::from_millis(2300));
    let err = tx.query_one("SELECT querylayer_api.begin_run('article.draft')", &[]).unwrap_err();
    let (code, message) = sql_error(&err);
    assert_eq!(code, "28000");
    assert!(message.contains("expired"), "{message}");
}

#[test]
fn the_runtime_roles_time_out_idle_transactions_and_long_statements() {
    let db = TestDb::new();
    let mut edge = db.edge();
    let settings: Vec<(String, String)> = edge
        .query(
            "SELECT name, setting FROM pg_settings
              WHERE name IN ('idle_in_transaction_session_timeout', 'statement_timeout') ORDER BY name",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        settings,
        vec![
            ("idle_in_transaction_session_timeout".to_string(), "60000".to_string()),
            ("statement_timeout".to_string(), "30000".to_string())
        ]
    );
    let worker: i64 = db
        .superuser()
        .query_one(
            "SELECT count(*) FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole
              WHERE r.rolname = 'querylayer_worker' AND s.setconfig @> ARRAY['statement_timeout=60s', 'idle_in_transaction_session_timeout=60s']",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(worker, 1);
}

#[test]
fn a_transaction_carrying_a_context_cannot_be_prepared() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();
    edge.batch_execute("BEGIN").unwrap();
    authenticate(&mut edge, &demo.secret).unwrap();
    let err = edge.batch_execute("PREPARE TRANSACTION 'keep-it'").unwrap_err();
    assert!(err.to_string().contains("cannot be prepared") || sql_error(&err).0 == "25000", "{err}");
}

//! An agent's tool call as the edge sends it: one statement in autocommit (sql/050_audit.sql),
//! through the real edge login. The statement authenticates, runs the call, stores its answer
//! under the key and writes its audit row, or keeps nothing; a refusal is recorded by the one
//! rule of `record_refused_tool_call`; nothing outlives the statement.

use postgres::Client;
use querylayer_e2e::{fingerprint, sql_error, TestDb};
use serde_json::Value;

/// The statement the edge writes for `begin_run` (`Call::tool_call_sql`).
const BEGIN_RUN: &str =
    "SELECT o ? 'replay', querylayer_api.finish_tool_call(o, CASE WHEN o ? 'replay' THEN o->'replay' \
     ELSE to_jsonb(querylayer_api.begin_run(p_run_type => $5)) END, 0) \
     FROM querylayer_api.open_tool_call($1, $2, $3, $4) AS o";
const FINISH_RUN: &str = "SELECT o ? 'replay', querylayer_api.finish_tool_call(o, CASE WHEN o ? 'replay' THEN o->'replay' \
     ELSE to_jsonb(querylayer_api.finish_run(p_run_id => $5::text::uuid, p_outcome => 'completed'::text)) END, 0) \
     FROM querylayer_api.open_tool_call($1, $2, $3, $4) AS o";

fn begin_run(edge: &mut Client, secret: &str, key: Option<&str>) -> Result<Value, postgres::Error> {
    let sha256 = key.map(|_| vec![7u8; 32]);
    edge.query_one(BEGIN_RUN, &[&fingerprint(secret), &"querylayer_begin_run", &key, &sha256, &"tool.calls"])
        .map(|row| closed(&row))
}

/// The statement's row as {replayed, value}: whether the answer is the stored one, the answer.
fn closed(row: &postgres::Row) -> Value {
    serde_json::json!({"replayed": row.get::<_, bool>(0), "value": row.get::<_, Value>(1)})
}

/// `tool.call` rows of the connection: (target, outcome, error code).
fn tool_rows(db: &TestDb, connection_id: &str) -> Vec<(String, String, Option<String>)> {
    db.superuser()
        .query(
            "SELECT target, outcome, detail->>'error_code' FROM querylayer.audit_events
              WHERE action = 'tool.call' AND connection_id = $1::text::uuid ORDER BY id",
            &[&connection_id],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[test]
fn one_statement_authenticates_calls_and_audits_and_nothing_outlives_it() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();
    let closed = begin_run(&mut edge, &demo.secret, None).unwrap();
    assert_eq!(closed["replayed"], false);
    let run_id = closed["value"]["run_id"].as_str().unwrap().to_string();
    assert_eq!(tool_rows(&db, &demo.connection_id), [("querylayer_begin_run".into(), "ok".into(), None)]);
    // The function's own audit row is there too, in the same transaction.
    let begun: i64 = db
        .superuser()
        .query_one(
            "SELECT count(*) FROM querylayer.audit_events WHERE action = 'run.begin' AND target = $1",
            &[&run_id],
        )
        .unwrap()
        .get(0);
    assert_eq!(begun, 1);
    // The context died with the statement: the next one is no one.
    let err = edge.query_one("SELECT querylayer_api.list_content()", &[]).unwrap_err();
    assert_eq!(sql_error(&err).0, "QL401");
}

#[test]
fn a_key_replays_the_first_answer_and_runs_nothing_again() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();
    let first = begin_run(&mut edge, &demo.secret, Some("k-1")).unwrap();
    let again = begin_run(&mut edge, &demo.secret, Some("k-1")).unwrap();
    assert_eq!(
        (first["replayed"].clone(), again["replayed"].clone()),
        (Value::Bool(false), Value::Bool(true))
    );
    assert_eq!(first["value"], again["value"]);
    let runs: i64 = db
        .superuser()
        .query_one("SELECT count(*) FROM querylayer.runs WHERE run_type = 'tool.calls'", &[])
        .unwrap()
        .get(0);
    assert_eq!(runs, 1);
    // Both calls are audited, the replay included.
    assert_eq!(tool_rows(&db, &demo.connection_id).len(), 2);
}

#[test]
fn a_refused_call_keeps_nothing_and_its_refusal_is_recorded_by_the_one_rule() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();
    let missing = uuid::Uuid::new_v4().to_string();
    let err = edge
        .query_one(
            FINISH_RUN,
            &[
                &fingerprint(&demo.secret),
                &"querylayer_finish_run",
                &None::<&str>,
                &None::<Vec<u8>>,
                &missing,
            ],
        )
        .unwrap_err();
    assert_eq!(sql_error(&err).0, "QL404");
    assert!(tool_rows(&db, &demo.connection_id).is_empty(), "a refused statement keeps no audit row");
    let recorded: String = edge
        .query_one(
            "SELECT querylayer_api.record_refused_tool_call($1, 'querylayer_finish_run'::text, 4, 'not_found'::text)",
            &[&fingerprint(&demo.secret)],
        )
        .unwrap()
        .get(0);
    assert_eq!(recorded, "recorded");
    assert_eq!(
        tool_rows(&db, &demo.connection_id),
        [("querylayer_finish_run".into(), "error".into(), Some("not_found".into()))]
    );
}

#[test]
fn a_dead_credential_is_a_failed_authentication_never_a_tool_call() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    db.dba()
        .execute(
            "SELECT querylayer_api.revoke_connection($1::text::uuid, 'lost'::text)",
            &[&demo.connection_id],
        )
        .unwrap();
    let mut edge = db.edge();
    let err = begin_run(&mut edge, &demo.secret, None).unwrap_err();
    assert_eq!(sql_error(&err).0, "28000");
    let recorded: String = edge
        .query_one(
            "SELECT querylayer_api.record_refused_tool_call($1, 'querylayer_begin_run'::text, 1, 'unauthenticated'::text)",
            &[&fingerprint(&demo.secret)],
        )
        .unwrap()
        .get(0);
    assert_eq!(recorded, "unauthenticated");
    assert!(tool_rows(&db, &demo.connection_id).is_empty());
    let failed: i64 = db
        .superuser()
        .query_one(
            "SELECT count(*) FROM querylayer.audit_events WHERE action = 'authenticate' AND outcome = 'denied'
                AND detail->>'subject_id' = $1 AND detail->>'channel' = 'mcp'",
            &[&demo.connection_id],
        )
        .unwrap()
        .get(0);
    assert_eq!(failed, 1);
}

#[test]
fn the_edge_cannot_close_a_call_it_did_not_open() {
    // Writing an `ok` row for a call that never ran needs a live context: without one it is
    // refused like any governed function, by either function that ends a call.
    let db = TestDb::new();
    let mut edge = db.edge();
    for function in ["finish_tool_call", "close_tool_call"] {
        let err = edge
            .query_one(
                &format!(
                    "SELECT querylayer_api.{function}('{{\"tool\": \"querylayer_begin_run\", \"opened_at\": \"2026-01-01T00:00:00Z\"}}'::jsonb, '{{}}'::jsonb, 0)"
                ),
                &[],
            )
            .unwrap_err();
        assert_eq!(sql_error(&err).0, "QL401", "{function}");
    }
}

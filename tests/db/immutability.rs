//! Append-only records, for every role: the edge, the table owner, the superuser in replica mode.

use querylayer_e2e::{authenticate, sql_error, TestDb};
use serde_json::Value;

/// Seeds a run with one artifact; returns the connection secret.
fn seeded_run(db: &TestDb) -> String {
    let demo = db.seed_demo();
    let mut edge = db.edge();
    let mut tx = edge.transaction().unwrap();
    authenticate(&mut tx, &demo.secret).unwrap();
    let run: Value = tx.query_one("SELECT querylayer_api.begin_run('article.draft')", &[]).unwrap().get(0);
    tx.query_one(
        "SELECT querylayer_api.record_artifact($1::text::uuid, 'k', '1')",
        &[&run["run_id"].as_str().unwrap()],
    )
    .unwrap();
    tx.commit().unwrap();
    demo.secret
}

const MUTATIONS: [&str; 6] = [
    "UPDATE querylayer.run_events SET summary = 'x'",
    "DELETE FROM querylayer.run_events",
    "TRUNCATE querylayer.run_events CASCADE",
    "UPDATE querylayer.run_artifacts SET value = '2'",
    "DELETE FROM querylayer.run_artifacts",
    "TRUNCATE querylayer.run_artifacts CASCADE",
];

#[test]
fn the_edge_role_cannot_touch_run_records() {
    let db = TestDb::new();
    seeded_run(&db);
    let mut edge = db.edge();
    for stmt in MUTATIONS {
        let err = edge.batch_execute(stmt).unwrap_err();
        assert_eq!(sql_error(&err).0, "42501", "{stmt}");
    }
}

#[test]
fn the_table_owner_cannot_touch_run_records() {
    let db = TestDb::new();
    let secret = seeded_run(&db);
    let mut su = db.superuser();
    for stmt in MUTATIONS {
        let mut tx = su.transaction().unwrap();
        // With the site's context, so that row-level security shows the owner the rows.
        authenticate(&mut tx, &secret).unwrap();
        tx.batch_execute("SET LOCAL ROLE querylayer_owner").unwrap();
        let visible: i64 = tx.query_one("SELECT count(*) FROM querylayer.run_artifacts", &[]).unwrap().get(0);
        assert_eq!(visible, 1);
        let err = tx.batch_execute(stmt).unwrap_err();
        assert_eq!(sql_error(&err).0, "QL423", "{stmt}");
    }
}

#[test]
fn a_superuser_in_replica_mode_cannot_touch_run_records() {
    let db = TestDb::new();
    seeded_run(&db);
    let mut su = db.superuser();
    for stmt in MUTATIONS {
        let mut tx = su.transaction().unwrap();
        tx.batch_execute("SET LOCAL session_replication_role = replica").unwrap();
        let err = tx.batch_execute(stmt).unwrap_err();
        assert_eq!(sql_error(&err).0, "QL423", "{stmt}");
    }
}

#[test]
fn the_chain_check_finds_a_deleted_record() {
    let db = TestDb::new();
    seeded_run(&db);
    let mut su = db.superuser();
    // (The demo site's: a database upgraded from an earlier release has other sites' history.)
    let demo = "site_id = (SELECT id FROM querylayer.sites WHERE slug = 'demo')";
    let seq: i64 = su
        .query_one(
            &format!("SELECT chain_seq FROM querylayer.run_events WHERE kind = 'started' AND {demo}"),
            &[],
        )
        .unwrap()
        .get(0);
    su.batch_execute(&format!(
        "ALTER TABLE querylayer.run_events DISABLE TRIGGER append_only_row;
         DELETE FROM querylayer.run_events WHERE kind = 'started' AND {demo};
         ALTER TABLE querylayer.run_events ENABLE ALWAYS TRIGGER append_only_row;"
    ))
    .unwrap();
    let report: Value = su.query_one("SELECT querylayer_api.verify_ledger('demo')", &[]).unwrap().get(0);
    assert_eq!(report["ok"], false, "{report}");
    assert_eq!(report["checked"], seq - 1, "{report}");
    assert_eq!(report["broken"]["problem"], format!("record {seq} is missing or out of order"), "{report}");
}

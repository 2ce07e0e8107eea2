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

/// The tables whose rows a trigger guards against UPDATE or DELETE (append-only records,
/// credentials, identities, screening events, …): a row-level `BEFORE DELETE` trigger enabled
/// ALWAYS, read from the catalog, so a table guarded later is held to the same.
fn guarded_tables(db: &mut postgres::Client) -> Vec<String> {
    db.query(
        "SELECT DISTINCT t.tgrelid::regclass::text
           FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
          WHERE c.relnamespace = 'querylayer'::regnamespace AND c.relkind IN ('r', 'p')
            AND NOT t.tgisinternal AND t.tgenabled = 'A'
            AND t.tgtype & 1 = 1 AND t.tgtype & 2 = 2 AND t.tgtype & 8 = 8
          ORDER BY 1",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// A TRUNCATE runs no row trigger, so a table guarded row by row needs a TRUNCATE trigger of its
/// own, or its owner could empty it: before 0.11.0 the owner could truncate the form screening
/// events (which leave only through the retention purge), and the agents, the console's turns
/// and the task plans and steps had no TRUNCATE trigger either.
#[test]
fn every_guarded_table_refuses_truncate_to_its_owner_and_in_replica_mode() {
    let db = TestDb::new();
    seeded_run(&db);
    let mut su = db.superuser();
    let tables = guarded_tables(&mut su);
    for t in [
        "querylayer.run_events",
        "querylayer.connections",
        "querylayer.agents",
        "querylayer.form_screening_events",
    ] {
        assert!(tables.iter().any(|g| g == t), "{t} is among the guarded tables: {tables:?}");
    }
    for table in &tables {
        let own: i64 = su
            .query_one(
                "SELECT count(*) FROM pg_trigger
                  WHERE tgrelid = $1::text::regclass AND NOT tgisinternal AND tgenabled = 'A'
                    AND tgtype & 1 = 0 AND tgtype & 2 = 2 AND tgtype & 32 = 32",
                &[table],
            )
            .unwrap()
            .get(0);
        assert_eq!(own, 1, "{table} has one BEFORE TRUNCATE trigger of its own, enabled ALWAYS");
        for setting in ["ROLE querylayer_owner", "session_replication_role = replica"] {
            let mut tx = su.transaction().unwrap();
            tx.batch_execute(&format!("SET LOCAL {setting}")).unwrap();
            let err = tx.batch_execute(&format!("TRUNCATE {table} CASCADE")).unwrap_err();
            assert_eq!(sql_error(&err).0, "QL423", "TRUNCATE {table} with {setting}");
        }
    }
}

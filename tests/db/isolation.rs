//! Site isolation: a connection sees and writes its own site only, whatever ids it names.

use querylayer_e2e::{authenticate, sql_error, TestDb};
use serde_json::Value;

use crate::two_sites;

fn in_tx<T>(db: &TestDb, secret: &str, f: impl FnOnce(&mut postgres::Transaction) -> T) -> T {
    let mut edge = db.edge();
    let mut tx = edge.transaction().unwrap();
    authenticate(&mut tx, secret).unwrap();
    let out = f(&mut tx);
    tx.commit().unwrap();
    out
}

#[test]
fn cross_site_reads_return_nothing_and_cross_site_writes_fail() {
    let db = TestDb::new();
    let (a, b) = two_sites(&db);
    let run_b: String = in_tx(&db, &b, |tx| {
        let v: Value = tx.query_one("SELECT querylayer_api.begin_run('b.work')", &[]).unwrap().get(0);
        v["run_id"].as_str().unwrap().to_string()
    });

    let mut edge = db.edge();
    let mut tx = edge.transaction().unwrap();
    authenticate(&mut tx, &a).unwrap();
    let listed: Value = tx.query_one("SELECT querylayer_api.list_runs()", &[]).unwrap().get(0);
    assert_eq!(
        listed,
        serde_json::json!({"runs": [], "next_cursor": null}),
        "site A sees none of site B's runs"
    );
    tx.batch_execute("SAVEPOINT s").unwrap();
    let read = tx.query_one("SELECT querylayer_api.get_run($1::text::uuid)", &[&run_b]).unwrap_err();
    assert_eq!(sql_error(&read).0, "QL404");
    tx.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
    let write = tx
        .query_one("SELECT querylayer_api.record_artifact($1::text::uuid, 'k', '1')", &[&run_b])
        .unwrap_err();
    assert_eq!(sql_error(&write).0, "QL404");
    drop(tx);

    // Site B's run is untouched.
    let artifacts: Value = in_tx(&db, &b, |tx| {
        tx.query_one("SELECT querylayer_api.get_run($1::text::uuid)", &[&run_b]).unwrap().get(0)
    });
    assert_eq!(artifacts["artifacts"], serde_json::json!([]));
}

#[test]
fn arguments_naming_a_site_are_not_authority() {
    // The API has no site parameter for agents; the only way to name another site's rows is by
    // id, and row-level security hides them even from the owner role inside the functions.
    let db = TestDb::new();
    let (a, b) = two_sites(&db);
    in_tx(&db, &b, |tx| {
        tx.query_one("SELECT querylayer_api.begin_run('b.work')", &[]).unwrap();
    });
    let mut su = db.superuser();
    let site_b: uuid::Uuid =
        su.query_one("SELECT id FROM querylayer.sites WHERE slug = 'site-b'", &[]).unwrap().get(0);
    let mut tx = su.transaction().unwrap();
    authenticate(&mut tx, &a).unwrap();
    tx.batch_execute("SET LOCAL ROLE querylayer_owner").unwrap();
    let visible: i64 = tx.query_one("SELECT count(*) FROM querylayer.runs", &[]).unwrap().get(0);
    assert_eq!(visible, 0, "the owner role inside site A's context sees no run of site B");
    let insert = tx
        .execute(
            "INSERT INTO querylayer.audit_events (site_id, principal_kind, action) VALUES ($1, 'connection', 'forged')",
            &[&site_b],
        )
        .unwrap_err();
    assert_eq!(sql_error(&insert).0, "42501", "row-level security refuses writes outside the context's site");
}

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

#[test]
fn a_page_shows_no_item_of_another_site_whatever_ids_it_is_handed() {
    // The page helpers (content_json_list, run_json_list) build whatever ids their callers read;
    // handed another site's ids, they show nothing, even to the owner role that runs them inside
    // the API's functions: row-level security is forced on every table they read.
    let db = TestDb::new();
    let demo = db.seed_demo();
    let (a, _) = two_sites(&db);
    let (run, item): (String, String) = in_tx(&db, &demo.secret, |tx| {
        let run: Value =
            tx.query_one("SELECT querylayer_api.begin_run('article.draft')", &[]).unwrap().get(0);
        let run = run["run_id"].as_str().unwrap().to_string();
        let draft: Value = tx
            .query_one(
                "SELECT querylayer_api.create_draft($1::text::uuid, 'article', '{\"title\": \"T\", \"body\": \"B\"}', NULL, 'mine')",
                &[&run],
            )
            .unwrap()
            .get(0);
        (run, draft["content_id"].as_str().unwrap().to_string())
    });
    let pages = |secret: &str| -> (Value, Value) {
        let mut su = db.superuser();
        let mut tx = su.transaction().unwrap();
        authenticate(&mut tx, secret).unwrap();
        tx.batch_execute("SET LOCAL ROLE querylayer_owner").unwrap();
        let content: Value = tx
            .query_one("SELECT querylayer.content_json_list(ARRAY[$1::text::uuid])", &[&item])
            .unwrap()
            .get(0);
        let runs: Value =
            tx.query_one("SELECT querylayer.run_json_list(ARRAY[$1::text::uuid])", &[&run]).unwrap().get(0);
        (content, runs)
    };
    let (content, runs) = pages(&demo.secret);
    assert_eq!(
        (content[0]["content_id"].as_str(), runs[0]["run_id"].as_str()),
        (Some(item.as_str()), Some(run.as_str())),
        "in its own site's context the owner role pages the item and the run"
    );
    assert_eq!(
        pages(&a),
        (serde_json::json!([]), serde_json::json!([])),
        "in site A's context the same ids page nothing"
    );
}

//! Governed runs through real logins: outcomes, the required-output rule, concurrency.

use querylayer_e2e::{authenticate, sql_error, TestDb};
use serde_json::Value;

#[test]
fn a_completed_run_with_every_required_output_stays_completed() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();
    let mut tx = edge.transaction().unwrap();
    authenticate(&mut tx, &demo.secret).unwrap();
    let run: Value = tx
        .query_one(
            "SELECT querylayer_api.begin_run('article.draft', '{}', '{draft_id}', '{\"a draft exists\"}')",
            &[],
        )
        .unwrap()
        .get(0);
    let id = run["run_id"].as_str().unwrap();
    tx.query_one(
        "SELECT querylayer_api.record_artifact($1::text::uuid, 'draft_id', '\"d-1\"', '[{\"type\": \"content_item\", \"id\": \"d-1\"}]')",
        &[&id],
    )
    .unwrap();
    let done: Value =
        tx.query_one("SELECT querylayer_api.finish_run($1::text::uuid, 'completed')", &[&id]).unwrap().get(0);
    assert_eq!(done["outcome"], "completed");
    assert_eq!(done["reason_code"], Value::Null);
    tx.commit().unwrap();
}

#[test]
fn a_direct_insert_cannot_complete_a_run_missing_outputs() {
    // The rule is the table's, not only the function's: even the superuser cannot store it.
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut su = db.superuser();
    let mut tx = su.transaction().unwrap();
    authenticate(&mut tx, &demo.secret).unwrap();
    let run: Value =
        tx.query_one("SELECT querylayer_api.begin_run('x', '{}', '{must}')", &[]).unwrap().get(0);
    let err = tx
        .execute(
            "INSERT INTO querylayer.run_events (site_id, run_id, kind, agent_id, connection_id, harness, outcome)
             SELECT site_id, id, 'finished', agent_id, connection_id, harness, 'completed' FROM querylayer.runs WHERE id = $1::text::uuid",
            &[&run["run_id"].as_str().unwrap()],
        )
        .unwrap_err();
    assert_eq!(sql_error(&err).0, "QL422");
}

#[test]
fn two_writers_racing_for_one_artifact_key_get_exactly_one_record() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();
    let mut tx = edge.transaction().unwrap();
    authenticate(&mut tx, &demo.secret).unwrap();
    let run: Value = tx.query_one("SELECT querylayer_api.begin_run('race')", &[]).unwrap().get(0);
    tx.commit().unwrap();
    let id = run["run_id"].as_str().unwrap().to_string();

    let db = std::sync::Arc::new(db);
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|i| {
            let (secret, id, barrier, db) = (demo.secret.clone(), id.clone(), barrier.clone(), db.clone());
            std::thread::spawn(move || {
                let mut edge = db.edge();
                let mut tx = edge.transaction().unwrap();
                authenticate(&mut tx, &secret).unwrap();
                barrier.wait();
                let r = tx.query_one(
                    "SELECT querylayer_api.record_artifact($1::text::uuid, 'result', $2)",
                    &[&id, &Value::from(i)],
                );
                match r {
                    Ok(_) => tx.commit().map(|_| "ok".to_string()).unwrap_or_else(|e| sql_error(&e).0),
                    Err(e) => sql_error(&e).0,
                }
            })
        })
        .collect();
    let mut outcomes: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    outcomes.sort();
    assert_eq!(outcomes[1], "ok");
    assert!(["QL409", "23505"].contains(&outcomes[0].as_str()), "{outcomes:?}");
}

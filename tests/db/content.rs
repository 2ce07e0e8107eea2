//! Content governance across transactions and concurrent sessions.

use querylayer_e2e::{authenticate, fingerprint, sql_error, TestDb};
use serde_json::{json, Value};
use std::sync::{Arc, Barrier};

fn authenticate_member(tx: &mut postgres::Transaction, token: &str) {
    tx.query_one("SELECT querylayer_api.authenticate_member($1)", &[&fingerprint(token)]).unwrap();
}

/// As the demo agent: a run, a draft and `n` publish requests for that same draft.
fn draft_with_publish_requests(db: &TestDb, secret: &str, n: usize) -> (String, Vec<String>) {
    let mut edge = db.edge();
    let mut tx = edge.transaction().unwrap();
    authenticate(&mut tx, secret).unwrap();
    let run: Value = tx.query_one("SELECT querylayer_api.begin_run('article.publish')", &[]).unwrap().get(0);
    let run_id = run["run_id"].as_str().unwrap().to_string();
    let draft: Value = tx
        .query_one(
            "SELECT querylayer_api.create_draft($1::text::uuid, 'article', '{\"title\": \"Hello\", \"body\": \"World\"}', NULL, 'hello')",
            &[&run_id],
        )
        .unwrap()
        .get(0);
    let items = json!([{"content_id": draft["content_id"], "action": "publish", "revision_id": draft["revision_id"]}]);
    let proposals = (0..n)
        .map(|_| {
            let p: Value = tx
                .query_one(
                    "SELECT querylayer_api.request_publish_approval($1::text::uuid, $2)",
                    &[&run_id, &items],
                )
                .unwrap()
                .get(0);
            p["proposal_id"].as_str().unwrap().to_string()
        })
        .collect();
    tx.commit().unwrap();
    (draft["content_id"].as_str().unwrap().to_string(), proposals)
}

fn second_owner_token(db: &TestDb) -> String {
    let mut dba = db.dba();
    dba.batch_execute(
        "SELECT querylayer_api.create_member('demo', 'co-owner');
         SELECT querylayer_api.set_member_role('demo', 'co-owner', 'admin');",
    )
    .unwrap();
    let t: Value = dba
        .query_one(
            "SELECT querylayer_api.create_member_token('demo', 'co-owner', 'c', now() + interval '1 hour')",
            &[],
        )
        .unwrap()
        .get(0);
    let token = t["token"].as_str().unwrap().to_string();
    querylayer_e2e::issued(&token);
    token
}

#[test]
fn two_members_approving_conflicting_publish_requests_at_once_publish_exactly_once() {
    let db = Arc::new(TestDb::new());
    let demo = db.seed_demo();
    let (content_id, proposals) = draft_with_publish_requests(&db, &demo.secret, 2);
    let tokens = [demo.member_token.clone(), second_owner_token(&db)];
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = proposals
        .iter()
        .zip(tokens)
        .map(|(proposal, token)| {
            let (db, barrier, proposal) = (db.clone(), barrier.clone(), proposal.clone());
            std::thread::spawn(move || {
                let mut edge = db.edge();
                let mut tx = edge.transaction().unwrap();
                authenticate_member(&mut tx, &token);
                barrier.wait();
                let decided: Value = tx
                    .query_one(
                        "SELECT querylayer_api.decide_proposal($1::text::uuid, 'approve', 'go')",
                        &[&proposal],
                    )
                    .unwrap()
                    .get(0);
                tx.commit().unwrap();
                decided
            })
        })
        .collect();
    let results: Vec<Value> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut states: Vec<&str> = results.iter().map(|r| r["state"].as_str().unwrap()).collect();
    states.sort();
    assert_eq!(states, ["applied", "failed"], "{results:?}");
    let failed = results.iter().find(|r| r["state"] == "failed").unwrap();
    assert_eq!(failed["execution"]["detail"]["problems"][0]["reason"], "live_changed");

    // Both decisions are in the history, and the item is live exactly once.
    let mut su = db.superuser();
    let decisions: i64 =
        su.query_one("SELECT count(*) FROM querylayer.proposal_decisions", &[]).unwrap().get(0);
    assert_eq!(decisions, 2);
    let live: Option<uuid::Uuid> = su
        .query_one(
            "SELECT published_revision_id FROM querylayer.content_items WHERE id = $1::text::uuid",
            &[&content_id],
        )
        .unwrap()
        .get(0);
    assert!(live.is_some());
    let report: Value = su.query_one("SELECT querylayer_api.verify_ledger('demo')", &[]).unwrap().get(0);
    assert_eq!(report["ok"], true, "{report}");
}

#[test]
fn an_approval_from_an_earlier_transaction_cannot_be_executed_again() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let (_, proposals) = draft_with_publish_requests(&db, &demo.secret, 1);
    let mut edge = db.edge();
    let mut tx = edge.transaction().unwrap();
    authenticate_member(&mut tx, &demo.member_token);
    tx.query_one("SELECT querylayer_api.decide_proposal($1::text::uuid, 'reject')", &[&proposals[0]])
        .unwrap();
    tx.commit().unwrap();
    // A superuser replays the executor on the recorded decision in a new transaction.
    let mut su = db.superuser();
    let mut tx = su.transaction().unwrap();
    authenticate_member(&mut tx, &demo.member_token);
    let decision: uuid::Uuid =
        tx.query_one("SELECT id FROM querylayer.proposal_decisions", &[]).unwrap().get(0);
    let err = tx.query_one("SELECT querylayer.execute_decision($1)", &[&decision]).unwrap_err();
    assert_eq!(sql_error(&err).0, "42501");
}

#[test]
fn the_edge_role_cannot_write_content_tables_or_call_internals() {
    let db = TestDb::new();
    db.seed_demo();
    let mut edge = db.edge();
    for stmt in [
        "UPDATE querylayer.content_items SET published_revision_id = NULL",
        "INSERT INTO querylayer.proposal_decisions (site_id, proposal_id, decision, member_id, member_role) VALUES (gen_random_uuid(), gen_random_uuid(), 'approved', gen_random_uuid(), 'owner')",
        "SELECT querylayer.execute_decision(gen_random_uuid())",
        "SELECT querylayer.apply_lifecycle(gen_random_uuid())",
    ] {
        let err = edge.batch_execute(stmt).unwrap_err();
        assert_eq!(sql_error(&err).0, "42501", "{stmt}");
    }
}

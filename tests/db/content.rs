//! Content governance across transactions and concurrent sessions.

use postgres::GenericClient;
use querylayer_e2e::{authenticate, fingerprint, sql_error, TestDb};
use serde_json::{json, Value};
use std::sync::{Arc, Barrier};
use uuid::Uuid;

fn authenticate_member(tx: &mut postgres::Transaction, token: &str) {
    tx.query_one("SELECT querylayer_api.authenticate_member($1)", &[&fingerprint(token)]).unwrap();
}

/// As the demo agent: a run, a draft (a new item with `slug`) and `n` publish requests for that
/// same draft.
fn draft_with_publish_requests(db: &TestDb, secret: &str, slug: &str, n: usize) -> (String, Vec<String>) {
    let mut edge = db.edge();
    let mut tx = edge.transaction().unwrap();
    authenticate(&mut tx, secret).unwrap();
    let run: Value = tx.query_one("SELECT querylayer_api.begin_run('article.publish')", &[]).unwrap().get(0);
    let run_id = run["run_id"].as_str().unwrap().to_string();
    let draft: Value = tx
        .query_one(
            "SELECT querylayer_api.create_draft($1::text::uuid, 'article', '{\"title\": \"Hello\", \"body\": \"World\"}', NULL, $2)",
            &[&run_id, &slug],
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
    let (content_id, proposals) = draft_with_publish_requests(&db, &demo.secret, "hello", 2);
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
        su.query_one(
            "SELECT count(*) FROM querylayer.proposal_decisions d JOIN querylayer.sites s ON s.id = d.site_id WHERE s.slug = 'demo'",
            &[],
        )
        .unwrap()
        .get(0);
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

/// The item's live pointer and current draft, as the superuser sees them.
fn pointers(client: &mut impl GenericClient, content_id: &str) -> (Option<Uuid>, Option<Uuid>) {
    let row = client
        .query_one(
            "SELECT published_revision_id, draft_revision_id FROM querylayer.content_items WHERE id = $1::text::uuid",
            &[&content_id],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

fn executions_of(client: &mut impl GenericClient, decision: Uuid) -> i64 {
    client
        .query_one("SELECT count(*) FROM querylayer.proposal_executions WHERE decision_id = $1", &[&decision])
        .unwrap()
        .get(0)
}

/// As the superuser acting as the member, in the current transaction: an 'approved' decision of
/// `proposal` written straight into the table (the decision and chain triggers run as usual).
fn insert_approval_by_hand(tx: &mut postgres::Transaction, proposal: &str) -> Uuid {
    tx.query_one(
        "INSERT INTO querylayer.proposal_decisions (site_id, proposal_id, decision, member_id, member_role, note)
         SELECT p.site_id, p.id, 'approved', querylayer.ctx_member_id(), 'owner', 'by hand'
           FROM querylayer.proposals p WHERE p.id = $1::text::uuid
         RETURNING id",
        &[&proposal],
    )
    .unwrap()
    .get(0)
}

/// Replays the executor on `decision` as the superuser acting as the member who decided, in a new
/// transaction (rolled back); asserts the refusal.
fn replay_is_refused(su: &mut postgres::Client, token: &str, decision: Uuid) {
    let mut tx = su.transaction().unwrap();
    authenticate_member(&mut tx, token);
    let err = tx.query_one("SELECT querylayer.execute_decision($1)", &[&decision]).unwrap_err();
    assert_eq!(
        sql_error(&err),
        (
            "42501".to_string(),
            "only an approval made in this transaction by the member acting now can be executed".to_string()
        )
    );
}

#[test]
fn an_approval_from_an_earlier_transaction_cannot_be_executed_again() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let (first_item, first) = draft_with_publish_requests(&db, &demo.secret, "first", 1);
    let (second_item, second) = draft_with_publish_requests(&db, &demo.secret, "second", 1);
    let mut su = db.superuser();

    // 1. The member approves through the API: the approval executes at once and publishes.
    let mut edge = db.edge();
    let mut tx = edge.transaction().unwrap();
    authenticate_member(&mut tx, &demo.member_token);
    let decided: Value = tx
        .query_one("SELECT querylayer_api.decide_proposal($1::text::uuid, 'approve')", &[&first[0]])
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    assert_eq!(decided["state"], "applied", "{decided}");
    let (live, draft) = pointers(&mut su, &first_item);
    assert!(live.is_some() && live == draft, "{live:?} {draft:?}");
    let approval: Uuid = su
        .query_one(
            "SELECT id FROM querylayer.proposal_decisions WHERE proposal_id = $1::text::uuid AND decision = 'approved'",
            &[&first[0]],
        )
        .unwrap()
        .get(0);
    // Replayed later by the very member who approved it: refused (already executed, and not made
    // in this transaction); the execution record stays the only one and the item stays live.
    replay_is_refused(&mut su, &demo.member_token, approval);
    assert_eq!(executions_of(&mut su, approval), 1);
    assert_eq!(pointers(&mut su, &first_item).0, live);

    // 2. A committed approval that was never executed. The hand-written decision is well formed:
    // executed in the transaction that wrote it, it would publish the second item (rolled back).
    let mut tx = su.transaction().unwrap();
    authenticate_member(&mut tx, &demo.member_token);
    let decision = insert_approval_by_hand(&mut tx, &second[0]);
    let executed: Value =
        tx.query_one("SELECT querylayer.execute_decision($1)", &[&decision]).unwrap().get(0);
    assert_eq!(executed["status"], "applied", "{executed}");
    let (live, draft) = pointers(&mut tx, &second_item);
    assert!(live.is_some() && live == draft, "{live:?} {draft:?}");
    tx.rollback().unwrap();

    // Now written by hand and committed, with the decision, chain and append-only triggers of
    // proposal_decisions all enabled (ALWAYS), then executed in a new transaction.
    let enabled: Vec<String> = su
        .query(
            "SELECT tgname::text FROM pg_trigger
              WHERE tgrelid = 'querylayer.proposal_decisions'::regclass AND NOT tgisinternal AND tgenabled = 'A'
              ORDER BY tgname",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(enabled, ["aa_decision_guard", "append_only_row", "append_only_truncate", "zz_chain"]);
    let mut tx = su.transaction().unwrap();
    authenticate_member(&mut tx, &demo.member_token);
    let decision = insert_approval_by_hand(&mut tx, &second[0]);
    tx.commit().unwrap();
    // The only condition of decision_executable it misses: it was not made in this transaction
    // (an approval of a publish proposal, by the member acting now, not executed yet).
    replay_is_refused(&mut su, &demo.member_token, decision);
    assert_eq!(executions_of(&mut su, decision), 0);
    assert_eq!(pointers(&mut su, &second_item).0, None);
    let state: Value =
        su.query_one("SELECT querylayer.proposal_json($1::text::uuid)", &[&second[0]]).unwrap().get(0);
    assert_eq!(state["state"], "approved", "{state}");
    let report: Value = su.query_one("SELECT querylayer_api.verify_ledger('demo')", &[]).unwrap().get(0);
    assert_eq!(report["ok"], true, "{report}");
}

#[test]
fn the_edge_role_cannot_write_content_tables_or_call_internals() {
    let db = TestDb::new();
    db.seed_demo();
    let mut edge = db.edge();
    for stmt in [
        "UPDATE querylayer.content_items SET published_revision_id = NULL",
        "UPDATE querylayer.content_revisions SET fields = '{}'",
        "DELETE FROM querylayer.content_revisions",
        "TRUNCATE querylayer.content_revisions CASCADE",
        "UPDATE querylayer.proposals SET summary = 'x'",
        "DELETE FROM querylayer.proposals",
        "TRUNCATE querylayer.proposals CASCADE",
        "INSERT INTO querylayer.proposal_decisions (site_id, proposal_id, decision, member_id, member_role) VALUES (gen_random_uuid(), gen_random_uuid(), 'approved', gen_random_uuid(), 'owner')",
        "SELECT querylayer.execute_decision(gen_random_uuid())",
        "SELECT querylayer.apply_lifecycle(gen_random_uuid())",
    ] {
        let err = edge.batch_execute(stmt).unwrap_err();
        assert_eq!(sql_error(&err).0, "42501", "{stmt}");
    }
}

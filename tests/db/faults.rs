//! Faults through real logins and several sessions: a site's history held by another
//! transaction (writers go on, a seal that must wait is told busy), a duplicate racing its first call, a run abandoned past its deadline, the worker
//! reclaiming what may age out, and the upgrade fragments that turn 0.1.0's audit trail and
//! envelope receipts into month partitions without losing a row.

use std::time::{Duration, Instant};

use querylayer_e2e::{authenticate, json, sql_error, TestDb};
use serde_json::Value;

/// The two sites of `crate::two_sites`, with a short wait for a site's history.
fn two_sites(db: &TestDb) -> (String, String) {
    let sites = crate::two_sites(db);
    db.dba().batch_execute("SELECT querylayer_api.set_setting('ledger_lock_timeout_ms', '500')").unwrap();
    sites
}

/// One call as a connection, in a transaction of its own.
fn as_connection(db: &TestDb, secret: &str, sql: &str) -> Result<Value, postgres::Error> {
    let mut edge = db.edge();
    let mut tx = edge.transaction()?;
    authenticate(&mut tx, secret)?;
    let value: Value = tx.query_one(sql, &[])?.get(0);
    tx.commit()?;
    Ok(value)
}

#[test]
fn a_held_site_history_stalls_no_write_and_a_seal_that_must_wait_answers_busy_in_bounded_time() {
    let db = TestDb::new();
    let (a, b) = two_sites(&db);
    // A superuser transaction holds site-a's history (its ledger head row).
    let mut holder = db.superuser();
    let mut held = holder.transaction().unwrap();
    held.execute(
        "SELECT 1 FROM querylayer.ledger_heads h JOIN querylayer.sites s ON s.id = h.site_id
          WHERE s.slug = 'site-a' FOR NO KEY UPDATE OF h",
        &[],
    )
    .unwrap();

    // The held site's writes do not wait: their records wait to be sealed instead.
    let started = Instant::now();
    let run = as_connection(&db, &a, "SELECT querylayer_api.begin_run('a.work')").unwrap();
    assert_eq!(run["state"], "open", "{run}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a writer waited for the head: {:?}",
        started.elapsed()
    );
    // A seal that must happen now (as a checkpoint's) waits at most ledger_lock_timeout_ms.
    let started = Instant::now();
    let err = db.dba().query_one("SELECT querylayer_api.seal_ledger('site-a'::text)", &[]).unwrap_err();
    let waited = started.elapsed();
    assert_eq!(sql_error(&err).0, "QL503", "{err}");
    assert!(waited < Duration::from_secs(5), "the wait is bounded by ledger_lock_timeout_ms: {waited:?}");
    // Reads of the held site never wait on its history; the other site writes on.
    let runs = as_connection(&db, &a, "SELECT querylayer_api.list_runs(10)").unwrap();
    assert!(runs["runs"].is_array(), "{runs}");
    let run = as_connection(&db, &b, "SELECT querylayer_api.begin_run('b.work')").unwrap();
    assert_eq!(run["state"], "open");
    held.rollback().unwrap();
    // Once released, what waited is sealed and site-a's chain verifies whole.
    let sealed = json(&mut db.dba(), "SELECT querylayer_api.seal_ledger('site-a'::text)", &[]);
    assert_eq!(sealed[0]["sealed"], 2, "the run and its start event: {sealed}");
    let verified = json(&mut db.dba(), "SELECT querylayer_api.verify_ledger('site-a'::text)", &[]);
    assert_eq!((verified["ok"].clone(), verified["pending"].clone()), (true.into(), 0.into()), "{verified}");
}

#[test]
fn a_duplicate_racing_its_first_call_waits_and_gets_the_first_answer() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let key = "race-1";
    let mut first = db.edge();
    let mut t1 = first.transaction().unwrap();
    authenticate(&mut t1, &demo.secret).unwrap();
    let claimed: Option<Value> = t1
        .query_one(
            "SELECT querylayer_api.claim_idempotency_key($1, 'querylayer_begin_run', sha256('args'))",
            &[&key],
        )
        .unwrap()
        .get(0);
    assert!(claimed.is_none());
    let run: Value = t1.query_one("SELECT querylayer_api.begin_run('race')", &[]).unwrap().get(0);
    t1.execute("SELECT querylayer_api.store_idempotent_response($1, $2)", &[&key, &run]).unwrap();

    // The duplicate arrives while the first is still open: it waits on the key.
    let secret = demo.secret.clone();
    let edge_db = db.name.clone();
    let duplicate = std::thread::spawn(move || {
        let db = TestDb { name: edge_db };
        let mut second = db.edge();
        let mut t2 = second.transaction().unwrap();
        authenticate(&mut t2, &secret).unwrap();
        let answer: Option<Value> = t2
            .query_one(
                "SELECT querylayer_api.claim_idempotency_key($1, 'querylayer_begin_run', sha256('args'))",
                &[&key],
            )
            .unwrap()
            .get(0);
        t2.commit().unwrap();
        std::mem::forget(db); // the test's own TestDb drops the database
        answer
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!duplicate.is_finished(), "the duplicate waits for the first call's transaction");
    t1.commit().unwrap();
    let answer = duplicate.join().unwrap().expect("the stored answer");
    assert_eq!(answer["response"]["run_id"], run["run_id"]);
    let mut su = db.superuser();
    let runs: i64 =
        su.query_one("SELECT count(*) FROM querylayer.runs WHERE run_type = 'race'", &[]).unwrap().get(0);
    assert_eq!(runs, 1, "one effect");
}

#[test]
fn the_worker_closes_an_abandoned_run_past_its_deadline_and_nothing_else() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let abandoned =
        as_connection(&db, &demo.secret, "SELECT querylayer_api.begin_run('a', '{}', '{}', '{}', 1)")
            .unwrap();
    let kept =
        as_connection(&db, &demo.secret, "SELECT querylayer_api.begin_run('k', '{}', '{}', '{}', 3600)")
            .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mut su = db.superuser();
    su.batch_execute("CREATE ROLE ql_worker_test LOGIN PASSWORD 'w' IN ROLE querylayer_worker").ok();
    su.batch_execute("SET ROLE ql_worker_test").unwrap();
    let closed: Value =
        su.query_one("SELECT querylayer_api.worker_close_expired_runs()", &[]).unwrap().get(0);
    assert_eq!(closed["run_ids"], serde_json::json!([abandoned["run_id"]]));
    su.batch_execute("RESET ROLE").unwrap();
    let get = |id: &Value| {
        as_connection(
            &db,
            &demo.secret,
            &format!("SELECT querylayer_api.get_run('{}')", id.as_str().unwrap()),
        )
        .unwrap()
    };
    let run = get(&abandoned["run_id"]);
    assert_eq!(
        (run["outcome"].as_str(), run["reason_code"].as_str()),
        (Some("cancelled"), Some("deadline_exceeded"))
    );
    assert_eq!(run["reasons"][0]["closed_by"]["kind"], "worker");
    assert_eq!(run["events"].as_array().unwrap().len(), 2, "started, then the closing event");
    assert_eq!(get(&kept["run_id"])["state"], "open");
    // A second pass finds nothing more to close.
    su.batch_execute("SET ROLE ql_worker_test").unwrap();
    let again: Value = su.query_one("SELECT querylayer_api.worker_close_expired_runs()", &[]).unwrap().get(0);
    assert_eq!(again["closed"], 0);
}

/// The 0.1.0 definitions of the two tables that become partitioned.
const AUDIT_0_1_0: &str = "
CREATE TABLE querylayer.audit_events (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    site_id         uuid REFERENCES querylayer.sites ON DELETE RESTRICT,
    organization_id uuid,
    principal_kind  text NOT NULL CHECK (principal_kind IN ('connection', 'member', 'operator', 'anonymous')),
    agent_id        uuid,
    connection_id   uuid,
    member_id       uuid,
    operator_role   text,
    action          text NOT NULL,
    outcome         text NOT NULL DEFAULT 'ok',
    target          text,
    detail          jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_events_site_at ON querylayer.audit_events (site_id, at);
ALTER TABLE querylayer.audit_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE querylayer.audit_events FORCE ROW LEVEL SECURITY;
CREATE POLICY audit_read ON querylayer.audit_events FOR SELECT
    USING (site_id = querylayer.ctx_site_id() OR (site_id IS NULL AND querylayer.ctx_is_operator()));
CREATE POLICY audit_write ON querylayer.audit_events FOR INSERT
    WITH CHECK (site_id IS NULL OR site_id = querylayer.ctx_site_id());
SELECT querylayer.make_append_only('querylayer.audit_events');
ALTER TABLE querylayer.audit_events OWNER TO querylayer_owner;
CREATE TABLE querylayer.envelope_receipts (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    site_id       uuid REFERENCES querylayer.sites ON DELETE RESTRICT,
    connection_id uuid,
    allowed       boolean NOT NULL,
    path          text NOT NULL,
    method        text NOT NULL,
    profile       text,
    sender        text,
    error         text,
    checks        jsonb
);
ALTER TABLE querylayer.envelope_receipts ENABLE ROW LEVEL SECURITY;
ALTER TABLE querylayer.envelope_receipts FORCE ROW LEVEL SECURITY;
CREATE POLICY receipts_read ON querylayer.envelope_receipts FOR SELECT
    USING (site_id = querylayer.ctx_site_id() OR (site_id IS NULL AND querylayer.ctx_is_operator()));
CREATE POLICY receipts_write ON querylayer.envelope_receipts FOR INSERT
    WITH CHECK (site_id IS NULL OR site_id = querylayer.ctx_site_id());
SELECT querylayer.make_append_only('querylayer.envelope_receipts');
ALTER TABLE querylayer.envelope_receipts OWNER TO querylayer_owner;
";

#[test]
fn the_upgrade_fragments_partition_0_1_0_tables_keeping_every_row() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut su = db.superuser();
    // Put 0.1.0's tables back in place of 0.2.0's, with rows across three months.
    // Month partitions age out, so they never belong to the extension (only their parents do).
    let members: i64 = su
        .query_one(
            "SELECT count(*) FROM querylayer.time_partitions() p
               JOIN pg_depend d ON d.objid = p.partition_name::regclass AND d.deptype = 'e'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(members, 0);
    su.batch_execute(
        "ALTER EXTENSION querylayer DROP TABLE querylayer.audit_events;
         ALTER EXTENSION querylayer DROP TABLE querylayer.envelope_receipts;
         ALTER EXTENSION querylayer DROP SEQUENCE querylayer.audit_event_ids;
         ALTER EXTENSION querylayer DROP SEQUENCE querylayer.envelope_receipt_ids;
         DROP TABLE querylayer.audit_events, querylayer.envelope_receipts;
         DELETE FROM querylayer.aging_tables;",
    )
    .unwrap();
    su.batch_execute(AUDIT_0_1_0).unwrap();
    su.batch_execute(
        "INSERT INTO querylayer.audit_events (at, site_id, principal_kind, action)
         SELECT now() - make_interval(days => 40 * (n % 3)), CASE WHEN n % 2 = 0 THEN s.id END, 'anonymous', 'a' || n
           FROM generate_series(1, 30) n, querylayer.sites s WHERE s.slug = 'demo';
         INSERT INTO querylayer.envelope_receipts (at, allowed, path, method)
         SELECT now() - make_interval(days => 40 * (n % 3)), false, '/v1/answer', 'POST' FROM generate_series(1, 12) n;",
    )
    .unwrap();
    let before: Value = json(
        &mut su,
        "SELECT jsonb_build_object('audit', (SELECT jsonb_agg(to_jsonb(e) ORDER BY id) FROM querylayer.audit_events e),
                                   'receipts', (SELECT jsonb_agg(to_jsonb(r) ORDER BY id) FROM querylayer.envelope_receipts r))",
        &[],
    );
    for fragment in [
        include_str!("../../sql/upgrades/0.2.0/14-retention-2-audit-events.sql"),
        include_str!("../../sql/upgrades/0.2.0/14-retention-3-envelope-receipts.sql"),
    ] {
        su.batch_execute(fragment).unwrap();
    }
    let after: Value = json(
        &mut su,
        "SELECT jsonb_build_object('audit', (SELECT jsonb_agg(to_jsonb(e) ORDER BY id) FROM querylayer.audit_events e),
                                   'receipts', (SELECT jsonb_agg(to_jsonb(r) ORDER BY id) FROM querylayer.envelope_receipts r))",
        &[],
    );
    assert_eq!(before, after, "every row, with its id, moved");
    let shape: Value = json(
        &mut su,
        "SELECT jsonb_build_object(
           'partitioned', (SELECT array_agg(relname::text ORDER BY relname) FROM pg_class
                            WHERE relname IN ('audit_events', 'envelope_receipts') AND relkind = 'p'),
           'months', (SELECT count(*) FROM querylayer.time_partitions() WHERE NOT is_default),
           'policies', (SELECT array_agg(policyname::text ORDER BY policyname) FROM pg_policies
                         WHERE tablename IN ('audit_events', 'envelope_receipts')),
           'forced', (SELECT bool_and(relforcerowsecurity) FROM pg_class
                       WHERE relnamespace = 'querylayer'::regnamespace AND relkind IN ('r', 'p')
                         AND relname ~ '^(audit_events|envelope_receipts)'),
           'owners', (SELECT array_agg(DISTINCT relowner::regrole::text) FROM pg_class
                       WHERE relnamespace = 'querylayer'::regnamespace AND relname ~ '^(audit_event|envelope_receipt)'))",
        &[],
    );
    assert_eq!(shape["partitioned"], serde_json::json!(["audit_events", "envelope_receipts"]));
    assert!(shape["months"].as_i64().unwrap() >= 2 * 4, "{shape}");
    assert_eq!(
        shape["policies"],
        serde_json::json!(["audit_read", "audit_write", "receipts_read", "receipts_write"])
    );
    assert_eq!(shape["forced"], true);
    assert_eq!(shape["owners"], serde_json::json!(["querylayer_owner"]));
    // Still append-only, and still written by the governed functions (ids continue).
    let err = su.batch_execute("DELETE FROM querylayer.audit_events").unwrap_err();
    assert_eq!(sql_error(&err).0, "QL423");
    let run = as_connection(&db, &demo.secret, "SELECT querylayer_api.begin_run('after.upgrade')").unwrap();
    let newest: i64 = su
        .query_one(
            "SELECT max(id) FROM querylayer.audit_events WHERE target = $1",
            &[&run["run_id"].as_str().unwrap()],
        )
        .unwrap()
        .get(0);
    assert!(newest > 30);
}

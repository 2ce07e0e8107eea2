//! What operators (DBAs in querylayer_admin) may do, as the code and README say: seed the topical
//! map (and nothing else of it), and act as a connection from psql without a secret in SQL text.

use querylayer_e2e::{json, TestDb, DBA_PASSWORD};
use serde_json::Value;

#[test]
fn operators_may_add_topics_audited_and_nothing_else_of_the_map() {
    let db = TestDb::new();
    db.seed_demo();
    let mut dba = db.dba();
    let topic = json(&mut dba, "SELECT querylayer_api.add_topic('demo', 'pricing', 'Pricing')", &[]);
    let audited: Vec<(String, Option<String>)> = dba
        .query("SELECT action, operator_role FROM querylayer_api.list_audit('demo', 100) WHERE action = 'topic.add'", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(audited, vec![("topic.add".to_string(), Some("ql_dba".to_string()))]);
    let mut su = db.superuser();
    let decision: Option<String> = su
        .query_one(
            "SELECT decision_id::text FROM querylayer.topics WHERE id = $1::text::uuid",
            &[&topic["topic_id"].as_str().unwrap()],
        )
        .unwrap()
        .get(0);
    assert_eq!(decision, None, "an operator's topic is not presented as a member's decision");
    // No context at all (a superuser's own statement) changes nothing; an operator context may
    // add a topic and do nothing else to the map.
    let err = su
        .batch_execute(
            "INSERT INTO querylayer.topics (site_id, slug, title) SELECT id, 'x', 'X' FROM querylayer.sites",
        )
        .unwrap_err();
    assert_eq!(err.as_db_error().unwrap().code().code(), "QL423");
    let mut tx = su.transaction().unwrap();
    tx.batch_execute("SELECT querylayer.enter_operator(id) FROM querylayer.sites WHERE slug = 'demo'")
        .unwrap();
    for sql in [
        "UPDATE querylayer.topics SET title = 'Changed'",
        "DELETE FROM querylayer.topics",
        "INSERT INTO querylayer.topic_pages (site_id, topic_id, content_id, role)
         SELECT t.site_id, t.id, gen_random_uuid(), 'pillar' FROM querylayer.topics t",
    ] {
        let mut sp = tx.transaction().unwrap();
        let err = sp.batch_execute(sql).unwrap_err();
        assert_eq!(err.as_db_error().unwrap().code().code(), "QL423", "{sql}: {err}");
        sp.rollback().unwrap();
    }
}

/// The PostgreSQL server log of the test cluster, and psql, from scripts/test.
fn psql_and_log() -> Option<(String, String)> {
    Some((std::env::var("QUERYLAYER_TEST_PSQL").ok()?, std::env::var("QUERYLAYER_TEST_PG_LOG").ok()?))
}

fn run_psql(psql: &str, db: &TestDb, script: &str) -> String {
    let port = querylayer_e2e::admin_dsn()
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("port=").map(str::to_string))
        .unwrap();
    let out = std::process::Command::new(psql)
        .args(["-X", "-h", "127.0.0.1", "-p", &port, "-U", "ql_dba", "-d", &db.name, "-f", "-"])
        .env("PGPASSWORD", DBA_PASSWORD)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(script.as_bytes())?;
            child.wait_with_output()
        })
        .expect("psql runs");
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn a_dba_acts_as_a_connection_from_psql_without_the_secret_in_any_log_line() {
    let Some((psql, log)) = psql_and_log() else {
        panic!(
            "QUERYLAYER_TEST_PSQL and QUERYLAYER_TEST_PG_LOG are not set; run the tiers through scripts/test"
        );
    };
    let db = TestDb::new();
    let demo = db.seed_demo();
    let dir = std::env::temp_dir().join(format!("ql-psql-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret_file = dir.join("connection-secret");
    std::fs::write(&secret_file, format!("{}\n", demo.secret)).unwrap();
    let marker = format!("marker_{}", uuid::Uuid::new_v4().simple());
    // The documented recipe (README, docs/security.md): the secret travels by COPY, never in SQL
    // text; an error later in the same transaction logs only that statement.
    let script = format!(
        "BEGIN;
CREATE TEMP TABLE ql_credential (secret text) ON COMMIT DROP;
\\copy ql_credential FROM '{}'
SELECT querylayer_api.authenticate(sha256(convert_to(secret, 'UTF8'))) FROM ql_credential;
DROP TABLE ql_credential;
SELECT querylayer_api.begin_run('psql.check', '{{\"{marker}\": true}}');
SELECT 1/0;
ROLLBACK;
",
        secret_file.display()
    );
    let out = run_psql(&psql, &db, &script);
    assert!(out.contains("\"run_type\": \"psql.check\""), "{out}");
    assert!(out.contains("division by zero"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains(&marker), "the statements were logged (log_statement = all)");
    assert!(text.contains("STATEMENT:  SELECT 1/0;"), "the failed statement was logged");
    assert!(!text.contains(&demo.secret), "the secret reached the server log");
    assert!(!text.contains(&hex::encode(querylayer_e2e::fingerprint(&demo.secret))));

    // The pattern it replaces puts the secret in the failed statement's log line (shown with a
    // revoked secret).
    let mut dba = db.dba();
    let v: Value = json(
        &mut dba,
        "SELECT querylayer_api.create_connection('demo', 'demo-agent', 'doomed', '{site:read}'::text[], now() + '1 hour'::interval)",
        &[],
    );
    let doomed = v["secret"].as_str().unwrap().to_string();
    dba.execute(
        "SELECT querylayer_api.revoke_connection($1::text::uuid)",
        &[&v["connection_id"].as_str().unwrap()],
    )
    .unwrap();
    let out = run_psql(
        &psql,
        &db,
        &format!("BEGIN;\nSELECT 1/0;\nSELECT querylayer_api.authenticate(sha256(convert_to('{doomed}', 'UTF8')));\nROLLBACK;\n"),
    );
    assert!(out.contains("current transaction is aborted"), "{out}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains(&doomed), "the old pattern logs its secret; the check above would see it");
}

//! The request context: set only by authentication, held for one transaction, identical refusals.

use querylayer_e2e::{authenticate, fingerprint, issued, json, sql_error, TestDb};

#[test]
fn context_ends_with_the_transaction_commit_or_abort() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();

    let mut tx = edge.transaction().unwrap();
    authenticate(&mut tx, &demo.secret).unwrap();
    tx.query_one("SELECT querylayer_api.begin_run('article.draft')", &[]).unwrap();
    tx.commit().unwrap();
    let after_commit = edge.query_one("SELECT querylayer_api.begin_run('article.draft')", &[]).unwrap_err();
    assert_eq!(sql_error(&after_commit).0, "QL401");

    let mut tx = edge.transaction().unwrap();
    authenticate(&mut tx, &demo.secret).unwrap();
    tx.rollback().unwrap();
    let after_rollback = edge.query_one("SELECT querylayer_api.site_context()", &[]).unwrap_err();
    assert_eq!(sql_error(&after_rollback).0, "QL401");

    // Autocommit: the context dies with the single statement's own transaction.
    authenticate(&mut edge, &demo.secret).unwrap();
    let next = edge.query_one("SELECT querylayer_api.site_context()", &[]).unwrap_err();
    assert_eq!(sql_error(&next).0, "QL401");
}

#[test]
fn no_setting_the_edge_can_make_creates_a_context() {
    let db = TestDb::new();
    db.seed_demo();
    let mut edge = db.edge();
    let mut tx = edge.transaction().unwrap();
    for stmt in [
        "SELECT set_config('querylayer.site_id', gen_random_uuid()::text, true)",
        "SELECT set_config('querylayer.connection_id', gen_random_uuid()::text, false)",
        "SET LOCAL querylayer.scopes = 'runs:write'",
        "SET LOCAL application_name = 'querylayer'",
    ] {
        tx.batch_execute(stmt).unwrap();
    }
    let err = tx.query_one("SELECT querylayer_api.begin_run('article.draft')", &[]).unwrap_err();
    assert_eq!(sql_error(&err).0, "QL401");
}

#[test]
fn unknown_revoked_expired_and_malformed_credentials_fail_identically() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut dba = db.dba();
    let short: serde_json::Value = json(
        &mut dba,
        "SELECT querylayer_api.create_connection('demo', 'demo-agent', 'short', '{site:read}', now() + interval '1 second')",
        &[],
    );
    let expired = short["secret"].as_str().unwrap().to_string();
    issued(&expired);
    let revoked: serde_json::Value = json(
        &mut dba,
        "SELECT querylayer_api.create_connection('demo', 'demo-agent', 'to-revoke', '{site:read}', now() + interval '1 hour')",
        &[],
    );
    let revoked_secret = revoked["secret"].as_str().unwrap().to_string();
    issued(&revoked_secret);
    dba.execute(
        "SELECT querylayer_api.revoke_connection($1::text::uuid)",
        &[&revoked["connection_id"].as_str().unwrap()],
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1200));

    let mut edge = db.edge();
    let mut errors = Vec::new();
    for secret in
        ["qlc_unknownunknownunknownunknownunknownunknown0", expired.as_str(), revoked_secret.as_str()]
    {
        let err = authenticate(&mut edge, secret).unwrap_err();
        let db_err = err.as_db_error().unwrap();
        errors.push((
            db_err.code().code().to_string(),
            db_err.message().to_string(),
            db_err.detail().map(str::to_string),
            db_err.hint().map(str::to_string),
        ));
    }
    let malformed = edge.query_one("SELECT querylayer_api.authenticate('\\x00'::bytea)", &[]).unwrap_err();
    let m = malformed.as_db_error().unwrap();
    errors.push((
        m.code().code().to_string(),
        m.message().to_string(),
        m.detail().map(str::to_string),
        m.hint().map(str::to_string),
    ));
    for e in &errors {
        assert_eq!(e, &("28000".to_string(), "authentication failed".to_string(), None, None));
    }
    // The live credential still works, so the failures were about the credentials themselves.
    authenticate(&mut edge, &demo.secret).unwrap();
}

#[test]
fn failed_authentications_leave_an_audit_record_without_secrets() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();
    let bogus = "qlc_thisisnotarealsecretbutlooksalotlikeone0000";
    assert!(authenticate(&mut edge, bogus).is_err());
    let recorded: bool = edge
        .query_one("SELECT querylayer_api.record_failed_authentication($1, 'test')", &[&fingerprint(bogus)])
        .unwrap()
        .get(0);
    assert!(recorded);
    let live: bool = edge
        .query_one(
            "SELECT querylayer_api.record_failed_authentication($1, 'test')",
            &[&fingerprint(&demo.secret)],
        )
        .unwrap()
        .get(0);
    assert!(!live, "a live credential is not recorded as a failure");

    let mut dba = db.dba();
    let rows = dba
        .query("SELECT detail::text FROM querylayer_api.list_audit(NULL) WHERE action = 'authenticate'", &[])
        .unwrap();
    assert_eq!(rows.len(), 1);
    let detail: String = rows[0].get(0);
    assert!(detail.contains("\"reason\": \"unknown\""), "{detail}");
    let everything: String = dba
        .query_one(
            "SELECT string_agg(to_jsonb(a)::text, ' ') FROM querylayer_api.list_audit('demo', 500) a",
            &[],
        )
        .unwrap()
        .get(0);
    for needle in [bogus, &demo.secret, &hex::encode(fingerprint(&demo.secret)), &demo.member_token] {
        assert!(!everything.contains(needle) && !detail.contains(needle));
    }
}

#[test]
fn one_principal_per_transaction_for_the_edge() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    let mut edge = db.edge();
    let mut tx = edge.transaction().unwrap();
    authenticate(&mut tx, &demo.secret).unwrap();
    let again = authenticate(&mut tx, &demo.secret).unwrap_err();
    assert_eq!(sql_error(&again).0, "25000");
}

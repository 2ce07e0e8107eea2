//! Signed envelopes and did:key bindings, attacked as the edge role and as anonymous senders:
//! an envelope's context runs only its signed route, nothing about bindings leaks before a
//! signature verifies, a key is bound only with its holder's proof, and what anonymous requests
//! store is bounded.

use postgres::{Client, GenericClient};
use querylayer_e2e::{fingerprint, issued, json, sql_error, TestDb};
use querylayer_envelope::{binding_proof, canonical, Envelope, Signer};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn now_rfc3339(client: &mut Client) -> String {
    client
        .query_one(
            "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')",
            &[],
        )
        .unwrap()
        .get(0)
}

/// A v2 envelope for `method path` with `body`.
fn envelope(client: &mut Client, signer: &Signer, method: &str, path: &str, body: &str) -> String {
    let payload = json!({"bodySha256": canonical::sha256_hex(body.as_bytes())});
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let created_at = now_rfc3339(client);
    Envelope::mint_v2(signer, "did:web:qg-server", "invoke", path, &payload, method, &created_at, &nonce)
        .to_header_json()
}

/// As the operator: a key-only demo connection bound to `signer`'s did:key, with its proof.
fn bind(db: &TestDb, signer: &Signer, scopes: &str) -> Value {
    let mut dba = db.dba();
    let challenge =
        json(&mut dba, "SELECT querylayer_api.create_did_challenge('demo', $1)", &[&signer.did_key()]);
    let proof = binding_proof(signer, "demo", challenge["challenge"].as_str().unwrap());
    json(
        &mut dba,
        "SELECT querylayer_api.create_connection('demo', 'demo-agent', $1, $2::text::text[],
             now() + '1 hour'::interval, 'generic'::text, $3::text, false, $4::jsonb)",
        &[
            &format!("key {}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
            &scopes,
            &signer.did_key(),
            &proof,
        ],
    )
}

fn authenticate_envelope(
    client: &mut impl GenericClient,
    header: &str,
    method: &str,
    path: &str,
    body: &str,
) -> Value {
    client
        .query_one(
            "SELECT querylayer_api.authenticate_envelope($1, $2, $3, $4)",
            &[&header, &method, &path, &Sha256::digest(body.as_bytes()).to_vec()],
        )
        .unwrap()
        .get(0)
}

#[test]
fn an_envelope_for_one_route_runs_nothing_else_in_its_transaction() {
    let db = TestDb::new();
    db.seed_demo();
    let signer = Signer::from_seed_bytes(b"route-binding");
    bind(&db, &signer, "{site:read,content:read,content:write,runs:write}");
    let mut edge = db.edge();
    let body = r#"{"question": "Where is fiscal stress highest?"}"#;
    let header = envelope(&mut edge, &signer, "POST", "/v1/answer", body);
    let mut tx = edge.transaction().unwrap();
    let receipt = authenticate_envelope(&mut tx, &header, "POST", "/v1/answer", body);
    assert_eq!(receipt["allowed"], true, "{receipt}");
    for sql in [
        "SELECT querylayer_api.begin_run('article.draft')",
        "SELECT querylayer_api.create_draft(gen_random_uuid(), 'article', '{}'::jsonb)",
        "SELECT querylayer_api.answer_question('Something the sender never asked')",
        "SELECT querylayer_api.prepare_answer('Something the sender never asked')",
        "SELECT querylayer_api.site_context()",
        "SELECT querylayer_api.import_semantic_model('{}')",
        "SELECT querylayer_api.list_proposals()",
        "SELECT querylayer_api.record_tool_call('querylayer_begin_run', 'ok', 1)",
    ] {
        let mut sp = tx.transaction().unwrap();
        let err = sp.query_one(sql, &[]).unwrap_err();
        let (code, message) = sql_error(&err);
        assert_eq!(code, "QL403", "{sql}: {message}");
        assert!(message.contains("envelope signed for POST /v1/answer"), "{sql}: {message}");
        sp.rollback().unwrap();
    }
    // Its own route runs only what was signed: another body is refused, the signed one answers.
    let mut sp = tx.transaction().unwrap();
    let err = sp
        .query_one("SELECT querylayer_api.answer_signed_request($1)", &[&r#"{"question": "Another one"}"#])
        .unwrap_err();
    assert_eq!(sql_error(&err).0, "QL403");
    sp.rollback().unwrap();
    let answer: Value =
        tx.query_one("SELECT querylayer_api.answer_signed_request($1)", &[&body]).unwrap().get(0);
    assert_eq!(answer["question"], "Where is fiscal stress highest?");
    tx.commit().unwrap();

    // Every function the edge may call refuses a context signed for another route.
    let unmapped: Vec<String> = db
        .superuser()
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
              WHERE p.pronamespace = 'querylayer_api'::regnamespace
                AND has_function_privilege('querylayer_edge', p.oid, 'EXECUTE')
                AND p.proname NOT IN ('authenticate', 'authenticate_member', 'authenticate_envelope',
                                      'record_failed_authentication', 'record_failed_member_authentication',
                                      'verify_envelope', 'server_keys',
                                      -- The dashboard's and delivery's own authentications
                                      -- (strict: NULL arguments prove nothing; checked below).
                                      'sign_in', 'invitation', 'accept_invitation', 'authenticate_session',
                                      'authenticate_delivery', 'record_failed_delivery_authentication',
                                      -- The OAuth token endpoint's own authentications (checked
                                      -- below) and its registration and client lookup (no context).
                                      'oauth_redeem_code', 'oauth_refresh', 'oauth_revoke_refresh',
                                      'oauth_register_client', 'oauth_client', 'oauth_record_client_document',
                                      -- The limits every edge shares: an address's budget (no
                                      -- context), the edge's authentication (checked below) and
                                      -- a token of the acting connection's own rate.
                                      'peer_failure_wait', 'spend_peer_failure', 'authenticate_edge',
                                      'take_connection_token',
                                      -- An agent's tool call authenticates itself (checked below).
                                      'open_tool_call', 'record_refused_tool_call', 'open_replica_read',
                                      'record_replica_read',
                                      -- No context at all: readiness and the published limits.
                                      'health', 'value_limits')
                AND NOT EXISTS (SELECT 1 FROM querylayer.envelope_routes r
                                 WHERE r.method = 'POST' AND r.path = '/v1/answer'
                                   AND r.function_name = 'querylayer_api.' || p.proname)",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(unmapped.len() > 30, "{unmapped:?}");
    let header = envelope(&mut edge, &signer, "POST", "/v1/answer", body);
    let mut tx = edge.transaction().unwrap();
    assert_eq!(authenticate_envelope(&mut tx, &header, "POST", "/v1/answer", body)["allowed"], true);
    for signature in unmapped {
        // NULL for every argument: the guard comes first, whatever the arguments.
        let (name, args) = signature.split_once('(').unwrap();
        let n = args.trim_end_matches(')').split(',').filter(|a| !a.trim().is_empty()).count();
        let typed: Vec<String> = args
            .trim_end_matches(')')
            .split(',')
            .filter(|a| !a.trim().is_empty())
            .map(|t| format!("NULL::{t}"))
            .collect();
        assert_eq!(typed.len(), n);
        let sql = format!("SELECT {name}({})", typed.join(", "));
        let mut sp = tx.transaction().unwrap();
        let err = sp.query(&sql, &[]).expect_err(&sql);
        let (code, message) = sql_error(&err);
        assert!(
            (code == "QL403" && message.contains("envelope signed for")) || code == "QL401",
            "{sql}: {code} {message}"
        );
        sp.rollback().unwrap();
    }
    // Nor can such a transaction authenticate anew, as a member signing in or a website.
    for sql in [
        "SELECT querylayer_api.sign_in('demo'::text, 'nobody'::text, 'password'::text)",
        "SELECT querylayer_api.invitation(sha256('qli_x'::bytea))",
        "SELECT querylayer_api.accept_invitation(sha256('qli_x'::bytea), 'password'::text)",
        "SELECT querylayer_api.authenticate_delivery('demo'::text, sha256('qld_x'::bytea))",
        "SELECT querylayer_api.authenticate_session(sha256('qls_x'::bytea), NULL::text)",
        "SELECT querylayer_api.open_tool_call(sha256('qlc_x'::bytea), 'querylayer_begin_run'::text)",
        "SELECT querylayer_api.record_refused_tool_call(sha256('qlc_x'::bytea), 'querylayer_begin_run'::text, 1, 'forbidden'::text)",
        "SELECT querylayer_api.oauth_redeem_code(sha256('qla_x'::bytea), 'c'::text, 'r'::text, 'v'::text, 'x'::text)",
        "SELECT querylayer_api.oauth_refresh(sha256('qlr_x'::bytea), 'c'::text, NULL::text)",
        "SELECT querylayer_api.authenticate_edge(sha256('qlc_x'::bytea), '192.0.2.1'::text, 1::float8, 1::float8, 1::float8, 1::float8)",
        "SELECT querylayer_api.open_replica_read(sha256('qlc_x'::bytea), 'querylayer_site_context'::text, NULL::pg_lsn)",
        "SELECT querylayer_api.record_replica_read(sha256('qlc_x'::bytea), 'querylayer_site_context'::text, 1)",
    ] {
        let mut sp = tx.transaction().unwrap();
        let err = sp.query(sql, &[]).expect_err(sql);
        assert_eq!(sql_error(&err).0, "25000", "{sql}: {err}");
        sp.rollback().unwrap();
    }
}

#[test]
fn a_garbage_signature_learns_nothing_about_bindings() {
    let db = TestDb::new();
    db.seed_demo();
    let bound = Signer::from_seed_bytes(b"oracle-bound");
    let unbound = Signer::from_seed_bytes(b"oracle-unbound");
    bind(&db, &bound, "{content:read}");
    let mut edge = db.edge();
    let body = r#"{"question": "q"}"#;
    let mut answers = Vec::new();
    // The database may hold others' receipts (the tiers also run on an upgraded one).
    let before: i64 = db
        .superuser()
        .query_one("SELECT coalesce(max(id), 0) FROM querylayer.envelope_receipts", &[])
        .unwrap()
        .get(0);
    for signer in [&bound, &unbound] {
        let header = envelope(&mut edge, signer, "POST", "/v1/answer", body);
        let mut forged: Value = serde_json::from_str(&header).unwrap();
        forged["signature"] = json!(format!("ed25519:{}", "ab".repeat(64)));
        let receipt = authenticate_envelope(&mut edge, &forged.to_string(), "POST", "/v1/answer", body);
        assert_eq!(receipt["allowed"], false);
        assert!(receipt["checks"].get("keyBound").is_none(), "{receipt}");
        let mut shown = receipt.clone();
        shown.as_object_mut().unwrap().remove("sender");
        answers.push(shown);
    }
    assert_eq!(answers[0], answers[1], "a bound and an unbound key must be refused alike");
    // Nothing about the binding is stored with the refusal either.
    let stored: Vec<Option<String>> = db
        .superuser()
        .query(
            "SELECT connection_id::text FROM querylayer.envelope_receipts WHERE id > $1 ORDER BY id",
            &[&before],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(stored, vec![None, None]);
}

#[test]
fn a_site_owner_cannot_bind_another_organizations_agent_key_without_its_private_key() {
    let db = TestDb::new();
    db.seed_demo();
    // Another organization's agent uses this key and has not bound it yet.
    let victim = Signer::from_seed_bytes(b"other-organizations-agent");
    let mut dba = db.dba();
    dba.batch_execute(
        "SELECT querylayer_api.create_organization('squat');
         SELECT querylayer_api.create_site('squat', 'squat-site');
         SELECT querylayer_api.create_member('squat', 'owner');
         SELECT querylayer_api.set_member_role('squat-site', 'owner', 'owner');
         SELECT querylayer_api.create_agent('squat', 'bot');
         SELECT querylayer_api.grant_agent_scopes('squat-site', 'bot', '{site:read}'::text[]);",
    )
    .unwrap();
    let token = json(
        &mut dba,
        "SELECT querylayer_api.create_member_token('squat-site', 'owner', 'console', now() + '1 hour'::interval)",
        &[],
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    issued(&token);
    let console = |proof: Option<Value>| -> Result<Value, (String, String)> {
        let mut edge = db.edge();
        let mut tx = edge.transaction().unwrap();
        tx.query_one("SELECT querylayer_api.authenticate_member($1)", &[&fingerprint(&token)]).unwrap();
        let result = tx
            .query_one(
                "SELECT querylayer_api.console_create_connection('bot', $1, '{site:read}'::text[],
                     now() + '1 hour'::interval, 'generic'::text, $2::text, $3::jsonb)",
                &[
                    &format!("squat {}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
                    &victim.did_key(),
                    &proof,
                ],
            )
            .map(|r| r.get::<_, Value>(0))
            .map_err(|e| sql_error(&e));
        tx.commit().ok();
        result
    };
    let challenge = || -> String {
        let mut edge = db.edge();
        let mut tx = edge.transaction().unwrap();
        tx.query_one("SELECT querylayer_api.authenticate_member($1)", &[&fingerprint(&token)]).unwrap();
        let c: Value = tx
            .query_one("SELECT querylayer_api.console_create_did_challenge($1)", &[&victim.did_key()])
            .unwrap()
            .get(0);
        tx.commit().unwrap();
        c["challenge"].as_str().unwrap().to_string()
    };
    // No proof.
    assert_eq!(console(None).unwrap_err().0, "22023");
    // A proof signed by the squatter's own key, and one copied from a signature for another site.
    let squatter = Signer::from_seed_bytes(b"squatter");
    let c = challenge();
    let forged =
        json!({"challenge": c, "signature": binding_proof(&squatter, "squat-site", &c)["signature"]});
    assert_eq!(console(Some(forged)).unwrap_err().0, "QL403");
    let c = challenge();
    let elsewhere = binding_proof(&victim, "demo", &c);
    assert_eq!(console(Some(elsewhere)).unwrap_err().0, "QL403");
    // An envelope signature by the victim is no binding proof either (another signing domain).
    let mut edge = db.edge();
    let header = envelope(&mut edge, &victim, "POST", "/v1/answer", "{}");
    let sig = serde_json::from_str::<Value>(&header).unwrap()["signature"].clone();
    let c = challenge();
    assert_eq!(console(Some(json!({"challenge": c, "signature": sig}))).unwrap_err().0, "QL403");
    // Operators are held to the same proof.
    let err = dba
        .query_one(
            "SELECT querylayer_api.create_connection('squat-site', 'bot', 'op', '{site:read}'::text[],
                 now() + '1 hour'::interval, 'generic'::text, $1::text, false)",
            &[&victim.did_key()],
        )
        .unwrap_err();
    assert_eq!(sql_error(&err).0, "22023");
    // With the holder's signature it binds, once: the challenge cannot be used again.
    let c = challenge();
    let real = binding_proof(&victim, "squat-site", &c);
    let bound = console(Some(real.clone())).unwrap();
    assert_eq!(bound["did"], victim.did_key());
    let again = console(Some(real)).unwrap_err();
    assert!(again.0 == "QL403" || again.0 == "QL409", "{again:?}");
}

#[test]
fn anonymous_requests_store_at_most_their_bound() {
    let db = TestDb::new();
    db.seed_demo();
    let mut edge = db.edge();
    let mut su = db.superuser();
    let size = |su: &mut Client, table: &str| -> i64 {
        su.query_one(&format!("SELECT pg_total_relation_size('{table}')"), &[]).unwrap().get(0)
    };
    let receipts_before = size(&mut su, "querylayer.envelope_receipts");
    let audit_before = size(&mut su, "querylayer.audit_events");
    let huge = "x".repeat(60_000);
    let n = 40i64;
    let signer = Signer::from_seed_bytes(b"flood");
    for i in 0..n {
        // A 60 kB sender, a 60 kB protocol, a 60 kB header: each is refused and recorded bounded.
        let mut env: Value =
            serde_json::from_str(&envelope(&mut edge, &signer, "POST", "/v1/answer", "{}")).unwrap();
        match i % 3 {
            0 => env["sender"] = json!(huge),
            1 => env["protocol"] = json!(huge),
            _ => env["padding"] = json!(huge),
        }
        let receipt = authenticate_envelope(&mut edge, &env.to_string(), "POST", "/v1/answer", "{}");
        assert_eq!(receipt["allowed"], false);
        assert!(receipt.to_string().len() < 2_000, "{}", receipt.to_string().len());
        let _ = edge.query_one(
            "SELECT querylayer_api.record_failed_authentication($1, 'mcp')",
            &[&fingerprint(&format!("qlc_flood_{i}"))],
        );
    }
    // The edge's facts are bounded too: a huge channel or path is refused, not stored.
    let err = edge
        .query_one("SELECT querylayer_api.record_failed_authentication($1, $2)", &[&fingerprint("x"), &huge])
        .unwrap_err();
    assert_eq!(sql_error(&err).0, "22023");
    let err = edge
        .query_one(
            "SELECT querylayer_api.authenticate_envelope('{}', 'POST', $1, sha256(''::bytea))",
            &[&format!("/{huge}")],
        )
        .unwrap_err();
    assert_eq!(sql_error(&err).0, "22023");

    let widest: i32 = su
        .query_one("SELECT max(pg_column_size(r.*)) FROM querylayer.envelope_receipts r", &[])
        .unwrap()
        .get(0);
    assert!(widest <= 1_500, "a receipt row holds {widest} bytes");
    let widest_audit: i32 = su
        .query_one(
            "SELECT max(pg_column_size(a.*)) FROM querylayer.audit_events a WHERE a.action = 'authenticate'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(widest_audit <= 600, "a failed-authentication row holds {widest_audit} bytes");
    // On disk: at most the bound per request, plus a page or two of slack per relation.
    let receipts_growth = size(&mut su, "querylayer.envelope_receipts") - receipts_before;
    let audit_growth = size(&mut su, "querylayer.audit_events") - audit_before;
    assert!(
        receipts_growth <= n * 1_500 + 4 * 8192,
        "receipts grew {receipts_growth} bytes for {n} requests"
    );
    assert!(audit_growth <= n * 600 + 4 * 8192, "audit grew {audit_growth} bytes for {n} requests");
}

//! `querylayer-history`: writes history into a database through the governed API, as the real
//! roles over real logins, for the tests that prove history survives operations (the upgrade
//! test, the dump and restore test) and for the backup benchmark. It calls only what release
//! 0.1.0 already had, so it writes the same history into either version (binding a did:key
//! takes its holder's proof since 0.2.0: the one call that asks the installed version).
//!
//!   querylayer-history write <database> <tag>       an organization and two sites named after
//!       <tag>, and on them everything the API records: runs, events, artifacts, drafts,
//!       proposals, decisions, executions, credentials and their revocations, member tokens,
//!       evidence, source packages, briefs, the topical map, strategy imports, console
//!       conversations and task plans, form screening, semantic models, rights, access receipts,
//!       answers, lineage, attestations, envelope receipts and nonces, settings, a key rotation.
//!       Prints what later steps need (sites, a connection secret, a member token) as JSON.
//!   querylayer-history exercise <database> <json>    uses the credentials `write` printed: a run,
//!       a draft, a publish request decided by the member, an envelope, an answer, a ledger check.
//!   querylayer-history bulk <database> <tag> <runs> <artifacts per run> <revisions>
//!       the benchmark's volume (scripts/bench-backup): runs (two run events each), artifacts and
//!       revisions, through the same governed functions, many calls per transaction.
//!
//! QUERYLAYER_TEST_ADMIN_DSN names the cluster (a superuser over its socket), as for the db tier.

use postgres::{Client, GenericClient};
use querylayer_e2e::{
    admin_dsn, connect, ensure_logins, fingerprint, issued, tcp_dsn, DBA_PASSWORD, EDGE_PASSWORD,
};
use querylayer_envelope::{binding_proof, canonical, Envelope, Signer};
use serde_json::{json, Value};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_else(|| usage());
    match args.first().map(String::as_str) {
        Some("write") => {
            let summary = write(&arg(1), &arg(2));
            println!("{summary}");
        }
        Some("exercise") => {
            exercise(&arg(1), &serde_json::from_str(&arg(2)).expect("the JSON `write` printed"))
        }
        Some("bulk") => bulk(
            &arg(1),
            &arg(2),
            arg(3).parse().expect("runs"),
            arg(4).parse().expect("artifacts per run"),
            arg(5).parse().expect("revisions"),
        ),
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: querylayer-history write <database> <tag>\n       querylayer-history exercise <database> <json>\n       querylayer-history bulk <database> <tag> <runs> <artifacts per run> <revisions>"
    );
    std::process::exit(2)
}

struct Logins {
    db: String,
}

impl Logins {
    fn new(db: &str) -> Logins {
        ensure_logins(&mut connect(&admin_dsn()));
        Logins { db: db.to_string() }
    }
    fn superuser(&self) -> Client {
        connect(&format!("{} dbname={}", admin_dsn(), self.db))
    }
    fn dba(&self) -> Client {
        connect(&tcp_dsn("ql_dba", DBA_PASSWORD, &self.db))
    }
    fn edge(&self) -> Client {
        connect(&tcp_dsn("querylayer_edge", EDGE_PASSWORD, &self.db))
    }
}

fn one(client: &mut impl GenericClient, sql: &str, params: &[&(dyn postgres::types::ToSql + Sync)]) -> Value {
    client
        .query_one(sql, params)
        .unwrap_or_else(|e| match e.as_db_error() {
            Some(db) => panic!("{sql}: {} {} ({:?})", db.code().code(), db.message(), db.hint()),
            None => panic!("{sql}: {e}"),
        })
        .get(0)
}

fn text(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_else(|| panic!("no {key} in {v}")).to_string()
}

/// A transaction of `client` authenticated as the connection whose secret is `secret`.
fn as_agent<'a>(client: &'a mut Client, secret: &str) -> postgres::Transaction<'a> {
    let mut tx = client.transaction().unwrap();
    tx.query_one("SELECT querylayer_api.authenticate($1)", &[&fingerprint(secret)]).unwrap();
    tx
}

fn as_member<'a>(client: &'a mut Client, token: &str) -> postgres::Transaction<'a> {
    let mut tx = client.transaction().unwrap();
    tx.query_one("SELECT querylayer_api.authenticate_member($1)", &[&fingerprint(token)]).unwrap();
    tx
}

const ARTICLE_FIELDS: &str = r#"[{"name": "title", "type": "text", "required": true},
    {"name": "body", "type": "markdown", "required": true}]"#;

/// An organization `tag`, its sites `tag` and `tag-b`, a member owning both, an agent holding
/// every scope (the demo rights' principal, so that it may ask the demo questions), and its
/// connections. Returns (connection secret on `tag`, secret on `tag-b`, member token on `tag`).
fn identities(dba: &mut Client, tag: &str) -> (String, String, String) {
    let site_b = format!("{tag}-b");
    for sql in [
        "SELECT querylayer_api.create_organization($1, 'History')",
        "SELECT querylayer_api.create_site($1, $1, 'History site')",
        "SELECT querylayer_api.create_site($1, $1 || '-b', 'Second history site')",
        "SELECT querylayer_api.create_member($1, 'owner', 'Owner')",
        "SELECT querylayer_api.set_member_role($1, 'owner', 'owner')",
        "SELECT querylayer_api.set_member_role($1 || '-b', 'owner', 'owner')",
        "SELECT querylayer_api.create_agent($1, 'writer', 'hermes', $1 || '-profile', 'Writer', 'did:example:qg-navigator')",
        "SELECT querylayer_api.grant_agent_scopes($1, 'writer', ARRAY['site:read', 'content:read', 'content:write', 'topical-map:read', 'topical-map:write', 'runs:read', 'runs:write', 'publish:request'])",
        "SELECT querylayer_api.grant_agent_scopes($1 || '-b', 'writer', ARRAY['site:read', 'content:read', 'content:write', 'runs:write', 'publish:request'])",
        "SELECT querylayer_api.rename_agent_profile($1 || '-profile', 'Writer, renamed')",
    ] {
        one(dba, sql, &[&tag]);
    }
    for site in [tag, site_b.as_str()] {
        one(
            dba,
            "SELECT querylayer_api.create_template($1, 'article', $2::text::jsonb)",
            &[&site, &ARTICLE_FIELDS],
        );
    }
    let connect_to = |dba: &mut Client, site: &str, name: &str| {
        let c = one(
            dba,
            "SELECT querylayer_api.create_connection($1, 'writer', $2,
                 ARRAY(SELECT p.scope FROM unnest(ARRAY['site:read', 'content:read', 'content:write', 'topical-map:read',
                       'topical-map:write', 'runs:read', 'runs:write', 'publish:request']) AS p(scope)
                        WHERE p.scope IN ('site:read', 'content:read', 'content:write', 'runs:write', 'publish:request')
                           OR $1 NOT LIKE '%-b'),
                 now() + interval '30 days', 'hermes')",
            &[&site, &name],
        );
        let secret = text(&c, "secret");
        issued(&secret);
        secret
    };
    let secret = connect_to(dba, tag, "laptop");
    let secret_b = connect_to(dba, &site_b, "laptop");
    // A connection revoked, and a member token revoked: credentials change only by revocation.
    let lost = one(
        dba,
        "SELECT querylayer_api.create_connection($1, 'writer', 'lost', '{site:read}', now() + interval '1 day')",
        &[&tag],
    );
    issued(&text(&lost, "secret"));
    one(
        dba,
        "SELECT querylayer_api.revoke_connection($1::text::uuid, 'laptop lost')",
        &[&text(&lost, "connection_id")],
    );
    let token = one(
        dba,
        "SELECT querylayer_api.create_member_token($1, 'owner', 'console', now() + interval '30 days')",
        &[&tag],
    );
    let old_token = one(
        dba,
        "SELECT querylayer_api.create_member_token($1, 'owner', 'old console', now() + interval '1 day')",
        &[&tag],
    );
    issued(&text(&old_token, "token"));
    one(
        dba,
        "SELECT querylayer_api.revoke_member_token($1::text::uuid, 'rotated')",
        &[&text(&old_token, "member_token_id")],
    );
    let token = text(&token, "token");
    issued(&token);
    (secret, secret_b, token)
}

/// A run of the agent: a draft of a new item, artifacts, a publish request; finished completed.
/// Returns (run id, content id, revision id, proposal id).
fn draft_and_request(edge: &mut Client, secret: &str, slug: &str) -> (String, String, String, String) {
    let mut tx = as_agent(edge, secret);
    let run = one(
        &mut tx,
        "SELECT querylayer_api.begin_run('article.draft', '{\"topic\": \"history\"}', '{draft_id}', '{\"a draft exists\"}')",
        &[],
    );
    let run_id = text(&run, "run_id");
    let draft = one(
        &mut tx,
        "SELECT querylayer_api.create_draft($1::text::uuid, 'article', '{\"title\": \"Kept\", \"body\": \"Through every operation\"}', NULL, $2)",
        &[&run_id, &slug],
    );
    let (content_id, revision_id) = (text(&draft, "content_id"), text(&draft, "revision_id"));
    one(
        &mut tx,
        "SELECT querylayer_api.record_artifact($1::text::uuid, 'draft_id', to_jsonb($2::text), jsonb_build_array(jsonb_build_object('type', 'content_item', 'id', $2::text)))",
        &[&run_id, &content_id],
    );
    let items = json!([{"content_id": content_id, "action": "publish", "revision_id": revision_id}]);
    let proposal = one(
        &mut tx,
        "SELECT querylayer_api.request_publish_approval($1::text::uuid, $2, 'publish it')",
        &[&run_id, &items],
    );
    one(
        &mut tx,
        "SELECT querylayer_api.finish_run($1::text::uuid, 'completed', 'drafted and requested')",
        &[&run_id],
    );
    tx.commit().unwrap();
    (run_id, content_id, revision_id, text(&proposal, "proposal_id"))
}

fn decide(edge: &mut Client, token: &str, proposal: &str, decision: &str) -> Value {
    let mut tx = as_member(edge, token);
    let decided = one(
        &mut tx,
        "SELECT querylayer_api.decide_proposal($1::text::uuid, $2, 'decided')",
        &[&proposal, &decision],
    );
    tx.commit().unwrap();
    decided
}

/// A v2 envelope for POST /v1/answer with `body`, signed by `signer`.
fn envelope(signer: &Signer, created_at: &str, body: &str) -> String {
    let payload = json!({"bodySha256": canonical::sha256_hex(body.as_bytes())});
    let nonce = format!("nonce-{}", uuid::Uuid::new_v4().simple());
    Envelope::mint_v2(
        signer,
        "did:web:qg-server",
        "invoke",
        "/v1/answer",
        &payload,
        "POST",
        created_at,
        &nonce,
    )
    .to_header_json()
}

fn authenticate_envelope(edge: &mut Client, header: &str, body: &str) -> Value {
    let mut tx = edge.transaction().unwrap();
    let decided = one(
        &mut tx,
        "SELECT querylayer_api.authenticate_envelope($1, 'POST', '/v1/answer', sha256(convert_to($2, 'UTF8')))",
        &[&header, &body],
    );
    tx.commit().unwrap();
    decided
}

fn now_utc(client: &mut Client) -> String {
    client
        .query_one(
            "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')",
            &[],
        )
        .unwrap()
        .get(0)
}

fn write(db: &str, tag: &str) -> Value {
    let logins = Logins::new(db);
    let mut su = logins.superuser();
    let mut dba = logins.dba();
    let mut edge = logins.edge();
    let (secret, secret_b, token) = identities(&mut dba, tag);
    let site_b = format!("{tag}-b");

    // The site's semantics, as an operator imports them (the demo's documents).
    let docs = one(&mut su, "SELECT querylayer.demo_documents()", &[]);
    one(
        &mut dba,
        "SELECT querylayer_api.import_semantic_model_as_operator($1, $2)",
        &[&tag, &text(&docs, "model")],
    );
    one(&mut dba, "SELECT querylayer_api.import_rights($1, $2)", &[&tag, &text(&docs, "story_rights")]);
    one(&mut dba, "SELECT querylayer_api.import_rights($1, $2)", &[&tag, &text(&docs, "rights")]);
    // Editorial inputs, settings, the server key.
    one(&mut dba, "SELECT querylayer_api.add_topic($1, 'pricing', 'Pricing')", &[&tag]);
    one(
        &mut dba,
        r#"SELECT querylayer_api.import_topical_strategy($1, 'keyword-tool-export', '[
            {"id": "opp-1", "topic": "pricing", "title": "Pricing explained", "signals": {"estimated_volume": 1200}},
            {"id": "opp-2", "topic": "pricing", "title": "Pricing for teams"}]')"#,
        &[&tag],
    );
    one(
        &mut dba,
        r#"SELECT querylayer_api.report_form_screening($1, '[
            {"form": "contact", "decision": "rejected", "reason": "spam", "occurred_at": "2020-01-01T10:00:00Z", "contact": "a@b.example"},
            {"form": "contact", "decision": "accepted", "reason": "clean", "occurred_at": "2020-01-01T12:00:00Z"},
            {"form": "contact", "decision": "review", "reason": "unsure"}]')"#,
        &[&tag],
    );
    one(&mut dba, "SELECT querylayer_api.set_setting('evidence_reverify_after_days', '45')", &[]);
    one(&mut dba, "SELECT querylayer_api.rotate_server_key()", &[]);

    // The agent's work, the member's decisions, and what executing them records.
    let (_, _, _, publish_a) = draft_and_request(&mut edge, &secret, "kept-a");
    // kept-b's draft stays a draft (its request is rejected): evidence is for claims in a draft.
    let (_, _, revision_b, publish_b) = draft_and_request(&mut edge, &secret, "kept-b");
    // On the second site, a request left pending.
    draft_and_request(&mut edge, &secret_b, "kept-elsewhere");
    assert_eq!(decide(&mut edge, &token, &publish_a, "approve")["state"], "applied");
    assert_eq!(decide(&mut edge, &token, &publish_b, "reject")["state"], "rejected");
    {
        let mut tx = as_agent(&mut edge, &secret);
        let run = text(&one(&mut tx, "SELECT querylayer_api.begin_run('editorial.research')", &[]), "run_id");
        let retrieved = now_utc(&mut su);
        one(
            &mut tx,
            "SELECT querylayer_api.record_claim_evidence($1::text::uuid, $2::text::uuid, 'every operation',
                 'https://sources.example/history', 'every operation', $3::text::timestamptz, repeat('a', 64))",
            &[&run, &revision_b, &retrieved],
        );
        one(
            &mut tx,
            r#"SELECT querylayer_api.stage_content_source_package($1::text::uuid, 'history sources',
                 '[{"title": "A source", "url": "https://sources.example/a", "body": "b", "author": "x", "published_at": "2024-01-01"},
                   {"title": "", "url": "nope"}]', 'desk research')"#,
            &[&run],
        );
        let opportunities = one(&mut tx, "SELECT querylayer_api.list_topical_strategy_opportunities()", &[]);
        let first = text(&opportunities["opportunities"][0], "opportunity_id");
        let proposal = one(
            &mut tx,
            "SELECT querylayer_api.propose_topical_strategy_opportunities($1::text::uuid, ARRAY[$2::text::uuid], 'one page')",
            &[&run, &first],
        );
        one(&mut tx, "SELECT querylayer_api.answer_question('Where do fiscal capacity and energy burden overlap with health risk?')", &[]);
        one(
            &mut tx,
            "SELECT querylayer_api.check_access('sail.qg_lakehouse.haalsi_baseline__restricted_raw')",
            &[],
        );
        one(
            &mut tx,
            "SELECT querylayer_api.finish_run($1::text::uuid, 'blocked', 'waiting', '[\"a reason\"]')",
            &[&run],
        );
        tx.commit().unwrap();
        // The member approves the topical proposal: the map changes and a brief is commissioned.
        assert_eq!(decide(&mut edge, &token, &text(&proposal, "proposal_id"), "approve")["state"], "applied");
    }
    // The console: a session, a conversation, a turn, a claimed task with a plan, completed.
    {
        let profile = format!("{tag}-profile");
        let session = format!("{tag}-session");
        let mut tx = as_member(&mut edge, &token);
        one(&mut tx, "SELECT querylayer_api.console_register_session($1, $2)", &[&profile, &session]);
        let conversation = one(
            &mut tx,
            "SELECT querylayer_api.console_open_conversation($1, $2, 'History')",
            &[&profile, &session],
        );
        let turn = one(
            &mut tx,
            "SELECT querylayer_api.console_add_turn($1::text::uuid, 'Summarise the history')",
            &[&text(&conversation, "conversation_id")],
        );
        tx.commit().unwrap();
        let turn_id = text(&turn, "turn_id");
        let mut tx = as_agent(&mut edge, &secret);
        let claimed = one(&mut tx, "SELECT querylayer_api.claim_console_task($1)", &[&session]);
        assert_eq!(claimed["status"], "claimed", "{claimed}");
        let plan = one(
            &mut tx,
            r#"SELECT querylayer_api.create_task_plan($1::text::uuid, $2, 'Summarise',
                 '[{"key": "read", "operation": "research", "instructions": "Read the history"}]')"#,
            &[&turn_id, &session],
        );
        let step = text(&plan["step"], "step_id");
        one(
            &mut tx,
            "SELECT querylayer_api.complete_console_task($1::text::uuid, 'succeeded', $2, $3::text::uuid, 'read it')",
            &[&turn_id, &session, &step],
        );
        tx.commit().unwrap();
    }
    // Envelopes: one from a key bound to a connection (allowed, its nonce spent), one unbound.
    let signer = Signer::from_seed_bytes(format!("history-key-{tag}").as_bytes());
    let version: String =
        su.query_one("SELECT extversion FROM pg_extension WHERE extname = 'querylayer'", &[]).unwrap().get(0);
    if version == "0.1.0" {
        one(
            &mut dba,
            "SELECT querylayer_api.create_connection($1, 'writer', 'envelope key', '{content:read,site:read}',
                 now() + interval '30 days', 'generic', $2, false)",
            &[&tag, &signer.did_key()],
        );
    } else {
        // Since 0.2.0 a did:key is bound only with its holder's proof (a signed challenge).
        let challenge =
            one(&mut dba, "SELECT querylayer_api.create_did_challenge($1, $2)", &[&tag, &signer.did_key()]);
        let proof = binding_proof(&signer, tag, &text(&challenge, "challenge"));
        one(
            &mut dba,
            "SELECT querylayer_api.create_connection($1, 'writer', 'envelope key', '{content:read,site:read}',
                 now() + interval '30 days', 'generic', $2, false, $3::jsonb)",
            &[&tag, &signer.did_key(), &proof],
        );
    }
    let body = r#"{"question": "What is kept?"}"#;
    let created = now_utc(&mut su);
    let allowed = authenticate_envelope(&mut edge, &envelope(&signer, &created, body), body);
    assert_eq!(allowed["allowed"], true, "{allowed}");
    let stranger = Signer::from_seed_bytes(format!("history-stranger-{tag}").as_bytes());
    let refused = authenticate_envelope(&mut edge, &envelope(&stranger, &created, body), body);
    assert_eq!(refused["allowed"], false, "{refused}");

    let verified = one(&mut dba, "SELECT querylayer_api.verify_ledger($1)", &[&tag]);
    assert_eq!(verified["ok"], true, "{verified}");
    json!({"site": tag, "site_b": site_b, "secret": secret, "secret_b": secret_b, "member_token": token,
           "envelope_seed": format!("history-key-{tag}")})
}

fn exercise(db: &str, written: &Value) {
    let logins = Logins::new(db);
    let mut edge = logins.edge();
    let mut su = logins.superuser();
    let (secret, token) = (text(written, "secret"), text(written, "member_token"));
    let slug = format!("exercised-{}", uuid::Uuid::new_v4().simple());
    let (_, _, _, proposal) = draft_and_request(&mut edge, &secret, &slug);
    assert_eq!(decide(&mut edge, &token, &proposal, "approve")["state"], "applied");
    let signer = Signer::from_seed_bytes(text(written, "envelope_seed").as_bytes());
    let body = r#"{"question": "Still kept?"}"#;
    let created = now_utc(&mut su);
    let allowed = authenticate_envelope(&mut edge, &envelope(&signer, &created, body), body);
    assert_eq!(allowed["allowed"], true, "{allowed}");
    let mut tx = as_agent(&mut edge, &secret);
    let answer = one(
        &mut tx,
        "SELECT querylayer_api.answer_question('Where do fiscal capacity and energy burden overlap with health risk?')",
        &[],
    );
    assert!(answer["answer"].as_str().is_some(), "{answer}");
    tx.commit().unwrap();
    let mut dba = logins.dba();
    for site in [text(written, "site"), text(written, "site_b")] {
        let verified = one(&mut dba, "SELECT querylayer_api.verify_ledger($1)", &[&site]);
        assert_eq!(verified["ok"], true, "{verified}");
    }
}

/// `runs` runs (each a started and a finished event, with `artifacts` artifacts between) and
/// `revisions` revisions (a thousand per item), written by the governed functions as the agent,
/// hundreds of calls per transaction: the volume of the backup benchmark, governed all the way.
fn bulk(db: &str, tag: &str, runs: usize, artifacts: usize, revisions: usize) {
    let logins = Logins::new(db);
    let mut dba = logins.dba();
    let (secret, _, _) = identities(&mut dba, tag);
    let mut edge = logins.edge();
    let mut done = 0;
    while done < runs {
        let batch = (done + 2000).min(runs);
        let mut tx = as_agent(&mut edge, &secret);
        let begin = tx.prepare("SELECT querylayer_api.begin_run('bulk.load')").unwrap();
        let record = tx
            .prepare(
                "SELECT querylayer_api.record_artifact($1::text::uuid, 'k' || $2::int, to_jsonb($2::int))",
            )
            .unwrap();
        let finish = tx.prepare("SELECT querylayer_api.finish_run($1::text::uuid, 'completed')").unwrap();
        for _ in done..batch {
            let run: Value = tx.query_one(&begin, &[]).unwrap().get(0);
            let run_id = text(&run, "run_id");
            for i in 0..artifacts as i32 {
                tx.query_one(&record, &[&run_id, &i]).unwrap();
            }
            tx.query_one(&finish, &[&run_id]).unwrap();
        }
        tx.commit().unwrap();
        done = batch;
        eprintln!("runs: {done}/{runs}");
    }
    let mut done = 0;
    while done < revisions {
        let batch = (done + 1000).min(revisions);
        let mut tx = as_agent(&mut edge, &secret);
        let run = text(&one(&mut tx, "SELECT querylayer_api.begin_run('bulk.revisions')", &[]), "run_id");
        let slug = format!("bulk-{done}");
        let first = one(
            &mut tx,
            "SELECT querylayer_api.create_draft($1::text::uuid, 'article', '{\"title\": \"Bulk\", \"body\": \"0\"}', NULL, $2)",
            &[&run, &slug],
        );
        let content_id = text(&first, "content_id");
        let draft = tx
            .prepare(
                "SELECT querylayer_api.create_draft($1::text::uuid, 'article',
                     jsonb_build_object('title', 'Bulk', 'body', $3::int::text), $2::text::uuid)",
            )
            .unwrap();
        for i in (done + 1)..batch {
            tx.query_one(&draft, &[&run, &content_id, &(i as i32)]).unwrap();
        }
        one(&mut tx, "SELECT querylayer_api.finish_run($1::text::uuid, 'completed')", &[&run]);
        tx.commit().unwrap();
        done = batch;
        eprintln!("revisions: {done}/{revisions}");
    }
}

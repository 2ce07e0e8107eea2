//! Verifiable history against a real superuser: checkpoints witnessed outside the database, the
//! offline verifier (`querylayer ledger verify`, the real binary) catching both rewrites the
//! issue describes — an append-only revision rewritten by ALTER COLUMN … USING, with and without
//! the chain recomputed over it, and a draft published by ALTER COLUMN … USING — and an honestly
//! extended history verifying, through a directory witness and a PostgreSQL witness.

use postgres::types::ToSql;
use postgres::{Client, GenericClient};
use querylayer_e2e::{admin_dsn, authenticate, fingerprint, sql_error, tcp_dsn, TestDb, DBA_PASSWORD};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `querylayer` binary (scripts/test builds it before this tier).
fn bin() -> PathBuf {
    std::env::var_os("QUERYLAYER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/querylayer"))
}

fn scratch(name: &str) -> PathBuf {
    let base = std::env::var("QUERYLAYER_TMP").unwrap_or_else(|_| "/tmp".to_string());
    let dir = PathBuf::from(base).join(format!("querylayer-ledger-{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(args: &[&str]) -> Output {
    let out = Command::new(bin()).args(args).output().unwrap_or_else(|e| panic!("{}: {e}", bin().display()));
    eprintln!(
        "querylayer {}\n{}{}",
        args.first().copied().unwrap_or_default(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

struct Ledger {
    db: TestDb,
    /// The superuser, over the unix socket: the verifier reads the tables themselves.
    superuser_url: String,
    /// An operator (querylayer_admin) over TCP: checkpoints, proofs, exports.
    operator_url: String,
    witness: PathBuf,
    secret: String,
    member_token: String,
}

impl Ledger {
    fn new(name: &str) -> Ledger {
        let db = TestDb::new();
        let demo = db.seed_demo();
        Ledger {
            superuser_url: format!("{} dbname={}", admin_dsn(), db.name),
            operator_url: tcp_dsn("ql_dba", DBA_PASSWORD, &db.name),
            witness: scratch(name),
            secret: demo.secret,
            member_token: demo.member_token,
            db,
        }
    }

    fn su(&self) -> Client {
        self.db.superuser()
    }

    /// `ALTER TABLE table ALTER COLUMN column TYPE ty USING (using)` as the superuser: rows
    /// rewritten in place, with no trigger firing.
    fn alter_column_using(&self, table: &str, column: &str, ty: &str, using: &str) {
        self.su()
            .batch_execute(&format!("ALTER TABLE {table} ALTER COLUMN {column} TYPE {ty} USING ({using})"))
            .unwrap();
    }

    /// As the demo agent: a run, a draft of a new item, a publish request. Returns (content id,
    /// revision id, proposal id).
    fn draft(&self, slug: &str, title: &str) -> (String, String, String) {
        let mut edge = self.db.edge();
        let mut tx = edge.transaction().unwrap();
        authenticate(&mut tx, &self.secret).unwrap();
        let run: Value =
            tx.query_one("SELECT querylayer_api.begin_run('article.publish'::text)", &[]).unwrap().get(0);
        let run_id = run["run_id"].as_str().unwrap().to_string();
        let fields = json!({"title": title, "body": format!("The body of {title}.")});
        let draft = one(
            &mut tx,
            "SELECT querylayer_api.create_draft($1::text::uuid, 'article'::text, $2::jsonb, NULL::uuid, $3::text)",
            &[&run_id, &fields, &slug],
        );
        let items = json!([{"content_id": draft["content_id"], "action": "publish", "revision_id": draft["revision_id"]}]);
        let p = one(
            &mut tx,
            "SELECT querylayer_api.request_publish_approval($1::text::uuid, $2::jsonb)",
            &[&run_id, &items],
        );
        tx.query_one("SELECT querylayer_api.finish_run($1::text::uuid, 'completed'::text)", &[&run_id])
            .unwrap();
        tx.commit().unwrap();
        let s = |v: &Value| v.as_str().unwrap().to_string();
        (s(&draft["content_id"]), s(&draft["revision_id"]), s(&p["proposal_id"]))
    }

    /// As the demo owner: approves (and so executes) a proposal.
    fn approve(&self, proposal: &str) {
        let mut edge = self.db.edge();
        let mut tx = edge.transaction().unwrap();
        tx.query_one("SELECT querylayer_api.authenticate_member($1)", &[&fingerprint(&self.member_token)])
            .unwrap();
        let decided = one(
            &mut tx,
            "SELECT querylayer_api.decide_proposal($1::text::uuid, 'approve'::text, 'ok'::text)",
            &[&proposal],
        );
        assert_eq!(decided["state"], "applied", "{decided}");
        tx.commit().unwrap();
    }

    /// `querylayer ledger verify-proof` of the proof at `path`, against this ledger's witness.
    fn verify_proof(&self, path: &Path) -> Output {
        run(&["ledger", "verify-proof", path.to_str().unwrap(), "--witness", self.witness.to_str().unwrap()])
    }

    fn checkpoint(&self, extra_witness: Option<&str>) -> Output {
        let mut witnesses = self.witness.display().to_string();
        if let Some(w) = extra_witness {
            witnesses = format!("{witnesses},{w}");
        }
        run(&[
            "ledger",
            "checkpoint",
            "--database-url",
            &self.operator_url,
            "--witness",
            &witnesses,
            "--json",
        ])
    }

    fn verify(&self, extra_witness: Option<&str>) -> (bool, Value) {
        let mut args = vec!["ledger", "verify", "--database-url", &self.superuser_url, "--json"];
        let dir = self.witness.display().to_string();
        args.extend(["--witness", &dir]);
        if let Some(w) = extra_witness {
            args.extend(["--witness", w]);
        }
        let out = run(&args);
        assert!(matches!(out.status.code(), Some(0) | Some(1)), "verify could not run");
        (out.status.success(), serde_json::from_slice(&out.stdout).expect("a JSON report"))
    }

    /// The witness directory's folder of the demo site.
    fn demo_dir(&self) -> PathBuf {
        let id: String = self
            .su()
            .query_one("SELECT id::text FROM querylayer.sites WHERE slug = 'demo'", &[])
            .unwrap()
            .get(0);
        self.witness.join(id)
    }

    fn seq_of(&self, table: &str, id: &str) -> i64 {
        self.su()
            .query_one(&format!("SELECT chain_seq FROM {table} WHERE id = $1::text::uuid"), &[&id])
            .unwrap()
            .get(0)
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.witness);
    }
}

/// The one jsonb value `sql` returns.
fn one(client: &mut impl GenericClient, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Value {
    client.query_one(sql, params).unwrap().get(0)
}

fn assert_ok(ledger: &Ledger, extra: Option<&str>) {
    let (ok, report) = ledger.verify(extra);
    assert!(ok, "{report:#}");
    assert_eq!(report["ok"], true);
}

/// The first failure: its site, record and reason.
fn first_failure(ledger: &Ledger) -> Value {
    let (ok, report) = ledger.verify(None);
    assert!(!ok, "the verifier passed a rewritten history: {report:#}");
    let first = report["first_failure"].clone();
    assert_eq!(first["site"], "demo", "{report:#}");
    first
}

/// The first failure, which must name the record `id` of `table` and give a reason containing
/// `reason`.
fn first_failure_of(ledger: &Ledger, table: &str, id: &str, reason: &str) -> Value {
    let first = first_failure(ledger);
    assert_eq!(first["record"]["table"], table, "{first:#}");
    assert_eq!(first["record"]["id"], id);
    assert!(first["reason"].as_str().unwrap().contains(reason), "{first:#}");
    first
}

#[test]
fn an_honestly_extended_history_verifies_through_a_directory_and_a_postgres_witness() {
    let ledger = Ledger::new("honest");
    // A second database on the cluster stands for an operator's independent store.
    let witness_db = format!("{}_witness", ledger.db.name);
    ledger.su().batch_execute(&format!("CREATE DATABASE {witness_db}")).unwrap();
    let witness_url =
        format!("postgresql://postgres@{}:{}/{witness_db}", urlencode(&dsn_value("host")), dsn_value("port"));
    let init = run(&["ledger", "witness-init", "--witness", &witness_url]);
    assert!(init.status.success());

    let (item, _, proposal) = ledger.draft("ledger-honest", "First");
    ledger.approve(&proposal);
    ledger
        .su()
        .query_one("SELECT querylayer_api.add_topic('demo'::text, 'ledgers'::text, 'Ledgers'::text)", &[])
        .unwrap();
    let out = ledger.checkpoint(Some(&witness_url));
    assert!(out.status.success());
    let first: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(first["checkpoints"][0]["created"], true, "{first:#}");
    assert_ok(&ledger, Some(&witness_url));
    let inside = one(&mut ledger.db.dba(), "SELECT querylayer_api.verify_live_state('demo'::text)", &[]);
    assert_eq!(inside, json!({"ok": true, "problem": null}));

    // The publication and the topic are chained state events naming their cause.
    let events: Vec<(String, String, Option<String>)> = ledger
        .su()
        .query(
            "SELECT subject, cause, decision_id::text FROM querylayer.state_events e
               JOIN querylayer.sites s ON s.id = e.site_id WHERE s.slug = 'demo' ORDER BY chain_seq",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!((events[0].0.as_str(), events[0].1.as_str()), ("content_item", "decision"));
    assert!(events[0].2.is_some());
    assert_eq!((events[1].0.as_str(), events[1].1.as_str()), ("topic", "operator"));

    // More history after the checkpoint, then a second one naming the first; both verify.
    let (_, _, proposal) = ledger.draft("ledger-honest-2", "Second");
    ledger.approve(&proposal);
    assert_ok(&ledger, Some(&witness_url));
    assert!(ledger.checkpoint(Some(&witness_url)).status.success());
    assert_ok(&ledger, Some(&witness_url));
    let demo_id = ledger.demo_dir().file_name().unwrap().to_string_lossy().to_string();
    let count: i64 = Client::connect(&format!("{} dbname={witness_db}", admin_dsn()), postgres::NoTls)
        .unwrap()
        .query_one(
            "SELECT count(*) FROM querylayer_witness.checkpoints WHERE site_id = $1::text::uuid",
            &[&demo_id],
        )
        .unwrap()
        .get(0);
    assert_eq!(count, 2);
    let files = std::fs::read_dir(ledger.demo_dir()).unwrap().count();
    assert_eq!(files, 4, "two checkpoints and their leaves");

    // A proof of the first publication's revision verifies without the database; any change
    // to it does not.
    let revision: String = ledger
        .su()
        .query_one(
            "SELECT published_revision_id::text FROM querylayer.content_items WHERE id = $1::text::uuid",
            &[&item],
        )
        .unwrap()
        .get(0);
    let proved = run(&["ledger", "prove", &revision, "--database-url", &ledger.operator_url]);
    assert!(proved.status.success());
    let proof_path = ledger.witness.with_extension("proof.json");
    std::fs::write(&proof_path, &proved.stdout).unwrap();
    let checked = ledger.verify_proof(&proof_path);
    assert!(checked.status.success());
    let mut proof: Value = serde_json::from_slice(&proved.stdout).unwrap();
    assert_eq!(proof["record"]["table"], "querylayer.content_revisions");
    proof["record"]["canonical"] =
        json!(proof["record"]["canonical"].as_str().unwrap().replace("First", "Forged"));
    std::fs::write(&proof_path, proof.to_string()).unwrap();
    let forged = ledger.verify_proof(&proof_path);
    assert_eq!(forged.status.code(), Some(1));
    let _ = std::fs::remove_file(&proof_path);

    // An export of the site verifies against the witness too.
    let export_path = ledger.witness.with_extension("export.jsonl");
    let exported = run(&[
        "ledger",
        "export",
        "--database-url",
        &ledger.operator_url,
        "--site",
        "demo",
        "--out",
        export_path.to_str().unwrap(),
    ]);
    assert!(exported.status.success());
    let key = proof["checkpoint"]["key"].as_str().unwrap().to_string();
    let lines = std::fs::read_to_string(&export_path).unwrap().lines().count();
    assert!(lines > 5, "{lines} exported records");
    let verified = run(&[
        "ledger",
        "verify",
        "--export",
        export_path.to_str().unwrap(),
        "--witness",
        ledger.witness.to_str().unwrap(),
        "--trusted-key",
        &key,
    ]);
    assert!(verified.status.success());
    let _ = std::fs::remove_file(&export_path);
    ledger.su().batch_execute(&format!("DROP DATABASE {witness_db} WITH (FORCE)")).unwrap();
}

#[test]
fn the_worker_checkpoints_on_its_schedule_and_a_rotated_key_keeps_old_checkpoints_verifiable() {
    let ledger = Ledger::new("worker");
    let mut su = ledger.su();
    su.batch_execute(
        "DO $$ BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ql_ledger_worker') THEN
                CREATE ROLE ql_ledger_worker LOGIN PASSWORD 'ledger-worker-password' IN ROLE querylayer_worker;
            END IF;
         END $$;",
    )
    .unwrap();
    let worker_url = tcp_dsn("ql_ledger_worker", "ledger-worker-password", &ledger.db.name);
    let witness = ledger.witness.display().to_string();
    let once = |what: &str| {
        let out = run(&["worker", "--once", "--database-url", &worker_url, "--witness", &witness]);
        assert!(out.status.success(), "{what}");
    };
    once("first pass");
    let (_, _, proposal) = ledger.draft("ledger-worker", "Worker");
    su.query_one("SELECT querylayer_api.rotate_server_key()", &[]).unwrap();
    ledger.approve(&proposal);
    once("second pass");
    let keys: Vec<String> = std::fs::read_dir(ledger.demo_dir())
        .unwrap()
        .filter_map(|f| {
            let path = f.unwrap().path();
            (path.extension().unwrap() == "json").then(|| {
                let cp: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
                cp["key"].as_str().unwrap().to_string()
            })
        })
        .collect();
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0], keys[1], "the second checkpoint is signed with the rotated key");
    assert_ok(&ledger, None);
}

#[test]
fn a_revision_rewritten_by_alter_column_using_is_reported_after_it_was_witnessed() {
    let ledger = Ledger::new("alter-fields");
    let (_, revision, proposal) = ledger.draft("ledger-alter", "Original");
    ledger.approve(&proposal);
    assert!(ledger.checkpoint(None).status.success());
    assert_ok(&ledger, None);

    // The superuser rewrites an append-only revision in place: no trigger fires.
    let using = format!(
        "CASE WHEN id = '{revision}' THEN jsonb_set(fields, '{{title}}', '\"Rewritten\"') ELSE fields END"
    );
    ledger.alter_column_using("querylayer.content_revisions", "fields", "jsonb", &using);
    let first = first_failure_of(
        &ledger,
        "querylayer.content_revisions",
        &revision,
        "rewritten after it was witnessed",
    );
    assert_eq!(first["record"]["seq"], ledger.seq_of("querylayer.content_revisions", &revision));
}

#[test]
fn a_revision_rewritten_with_its_chain_recomputed_passes_verify_ledger_but_not_the_witness() {
    let ledger = Ledger::new("rehash");
    let (_, revision, proposal) = ledger.draft("ledger-rehash", "Original");
    ledger.approve(&proposal);
    ledger.draft("ledger-rehash-2", "Next");
    assert!(ledger.checkpoint(None).status.success());

    // Triggers off, the body rewritten, every content, link and record hash from there on and
    // the ledger head recomputed: the in-database check is satisfied.
    let mut su = ledger.su();
    su.batch_execute(&format!(
        "SET session_replication_role = replica;
         SET TimeZone = 'UTC';
         ALTER TABLE querylayer.content_revisions DISABLE TRIGGER ALL;
         UPDATE querylayer.content_revisions SET fields = jsonb_set(fields, '{{title}}', '\"Rewritten\"') WHERE id = '{revision}';
         ALTER TABLE querylayer.content_revisions ENABLE TRIGGER ALL;
         DO $$
         DECLARE
             v_site uuid := (SELECT site_id FROM querylayer.content_revisions WHERE id = '{revision}');
             v_from bigint := (SELECT chain_seq FROM querylayer.content_revisions WHERE id = '{revision}');
             v_prev bytea;
             v_content bytea;
             r record;
         BEGIN
             EXECUTE 'SELECT record_sha256 FROM (' || querylayer.ledger_records_sql() || ') x'
                INTO v_prev USING v_site, v_from - 2, v_from - 1;
             FOR r IN SELECT t.table_name FROM querylayer.ledger_tables t LOOP
                 EXECUTE format('ALTER TABLE %s DISABLE TRIGGER ALL', r.table_name);
             END LOOP;
             FOR r IN EXECUTE 'SELECT tbl, id, chain_seq FROM (' || querylayer.ledger_records_sql() || ') x ORDER BY chain_seq'
                      USING v_site, v_from - 1, 1000000::bigint LOOP
                 EXECUTE format('SELECT querylayer.ledger_content(to_jsonb(t), f.fields) FROM %s t
                                   JOIN querylayer.ledger_forms f ON f.table_name = %L AND f.form = t.ledger_form
                                  WHERE t.id = $1::uuid', r.tbl, r.tbl) INTO v_content USING r.id;
                 EXECUTE format('UPDATE %s SET prev_sha256 = $1, content_sha256 = $2, record_sha256 = sha256($1 || $2) WHERE id = $3::uuid', r.tbl)
                     USING v_prev, v_content, r.id;
                 v_prev := sha256(v_prev || v_content);
             END LOOP;
             FOR r IN SELECT t.table_name FROM querylayer.ledger_tables t LOOP
                 EXECUTE format('ALTER TABLE %s ENABLE TRIGGER ALL', r.table_name);
             END LOOP;
             UPDATE querylayer.ledger_heads SET head = v_prev WHERE site_id = v_site;
         END $$;
         SET session_replication_role = origin;"
    ))
    .unwrap();
    let inside: Value =
        su.query_one("SELECT querylayer_api.verify_ledger('demo'::text)", &[]).unwrap().get(0);
    assert_eq!(inside["ok"], true, "the rewrite should satisfy the in-database check: {inside}");

    first_failure_of(&ledger, "querylayer.content_revisions", &revision, "rewritten after it was witnessed");

    // A fresh history started over the rewrite is a fork: the witness refuses it.
    su.batch_execute(
        "ALTER TABLE querylayer.ledger_checkpoints DISABLE TRIGGER ALL;
         DELETE FROM querylayer.ledger_checkpoints;
         ALTER TABLE querylayer.ledger_checkpoints ENABLE TRIGGER ALL;",
    )
    .unwrap();
    ledger.draft("ledger-rehash-3", "After");
    let forked = ledger.checkpoint(None);
    assert!(!forked.status.success());
    assert!(String::from_utf8_lossy(&forked.stderr).contains("do not extend"), "the witness took a fork");
    assert!(!ledger.verify(None).0);
}

#[test]
fn a_draft_published_by_alter_column_using_is_reported() {
    let ledger = Ledger::new("alter-pointer");
    let (item, _, _) = ledger.draft("ledger-pointer", "Never approved");
    assert!(ledger.checkpoint(None).status.success());
    assert_ok(&ledger, None);
    // No proposal approved, no decision, no trigger: the live pointer moves.
    let using = format!("CASE WHEN id = '{item}' THEN draft_revision_id ELSE published_revision_id END");
    ledger.alter_column_using("querylayer.content_items", "published_revision_id", "uuid", &using);
    first_failure_of(&ledger, "querylayer.content_items", &item, "changed outside the governed path");
    // The database's own check sees it too.
    let inside = one(&mut ledger.db.dba(), "SELECT querylayer_api.verify_live_state('demo'::text)", &[]);
    assert_eq!(inside["ok"], false, "{inside}");
    assert_eq!(inside["problem"]["subject_id"], item, "{inside}");
}

#[test]
fn a_checkpoint_is_never_signed_over_a_broken_ledger_and_only_operators_make_them() {
    let ledger = Ledger::new("refused");
    let (_, revision, _) = ledger.draft("ledger-refused", "Original");
    let using = format!("CASE WHEN id = '{revision}' THEN '{{}}'::jsonb ELSE fields END");
    ledger.alter_column_using("querylayer.content_revisions", "fields", "jsonb", &using);
    let err =
        ledger.db.dba().query_one("SELECT querylayer_api.create_checkpoints('demo'::text)", &[]).unwrap_err();
    let (code, message) = sql_error(&err);
    assert_eq!(code, "QLL09", "{message}");
    assert!(message.contains(&revision) && message.contains("record edited"), "{message}");
    // The edge role may not make checkpoints or read leaves.
    let mut edge = ledger.db.edge();
    for sql in [
        "SELECT querylayer_api.create_checkpoints(NULL::text)",
        "SELECT querylayer_api.ledger_leaves('demo'::text, 0::bigint, 1::bigint)",
        "SELECT count(*) FROM querylayer.ledger_checkpoints",
        "SELECT count(*) FROM querylayer.state_events",
    ] {
        let err = edge.query_one(sql, &[]).unwrap_err();
        assert_eq!(sql_error(&err).0, "42501", "{sql}");
    }
    // Checkpoints and state events are append-only, for the table owner's functions too.
    let mut su = ledger.su();
    for sql in ["TRUNCATE querylayer.state_events", "TRUNCATE querylayer.ledger_checkpoints"] {
        let err = su.batch_execute(sql).unwrap_err();
        assert_eq!(sql_error(&err).0, "QL423", "{sql}");
    }
}

/// A governed write of the demo agent, an artifact of `run`, in a transaction left open: the
/// transaction and the answer.
fn open_artifact<'a>(
    client: &'a mut Client,
    secret: &str,
    run: &str,
    key: &str,
) -> (postgres::Transaction<'a>, Value) {
    let mut tx = client.transaction().unwrap();
    // A writer that waited for the head would run into this.
    tx.batch_execute("SET LOCAL statement_timeout = '3s'").unwrap();
    authenticate(&mut tx, secret).unwrap();
    let a = one(
        &mut tx,
        "SELECT querylayer_api.record_artifact($1::text::uuid, $2::text, '1'::jsonb)",
        &[&run, &key],
    );
    (tx, a)
}

/// The same in a transaction of its own. Returns (artifact id, record_sha256 as answered).
fn artifact(client: &mut Client, secret: &str, run: &str, key: &str) -> (String, Option<String>) {
    let (tx, a) = open_artifact(client, secret, run, key);
    tx.commit().unwrap();
    (a["artifact_id"].as_str().unwrap().to_string(), a["record_sha256"].as_str().map(str::to_string))
}

fn begin(client: &mut Client, secret: &str) -> String {
    let mut tx = client.transaction().unwrap();
    authenticate(&mut tx, secret).unwrap();
    let run: Value =
        tx.query_one("SELECT querylayer_api.begin_run('ledger.writers'::text)", &[]).unwrap().get(0);
    tx.commit().unwrap();
    run["run_id"].as_str().unwrap().to_string()
}

#[test]
fn writers_of_one_site_never_wait_for_its_head_and_each_record_is_sealed_after_what_committed_before_it() {
    let ledger = Ledger::new("writers");
    let mut a = ledger.db.edge();
    let mut b = ledger.db.edge();
    let run = begin(&mut b, &ledger.secret);

    // A holds the site's head: a write of its own, not committed yet.
    let (ta, held) = open_artifact(&mut a, &ledger.secret, &run, "held");
    let held_id = held["artifact_id"].as_str().unwrap().to_string();
    assert!(held["record_sha256"].is_string(), "the holder links its record at once: {held}");

    // B writes twice meanwhile: no wait (its statement timeout is 3 s), both records pending.
    let started = std::time::Instant::now();
    let (b1, b1_hash) = artifact(&mut b, &ledger.secret, &run, "b1");
    let (b2, b2_hash) = artifact(&mut b, &ledger.secret, &run, "b2");
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "B waited {:?}", started.elapsed());
    assert_eq!((b1_hash, b2_hash), (None, None), "B's records wait to be sealed");
    let pending: i64 =
        ledger.su().query_one("SELECT count(*) FROM querylayer.ledger_pending", &[]).unwrap().get(0);
    assert_eq!(pending, 2);

    // While they wait, every check passes and says so: in the database and outside it.
    let report: Value =
        ledger.db.dba().query_one("SELECT querylayer_api.verify_ledger('demo'::text)", &[]).unwrap().get(0);
    assert_eq!((report["ok"].clone(), report["pending"].clone()), (json!(true), json!(2)), "{report}");
    let (ok, offline) = ledger.verify(None);
    assert!(ok, "{offline:#}");
    let notes = offline["sites"][0]["notes"].to_string();
    assert!(notes.contains("2 record(s) wait to be sealed"), "{offline:#}");

    ta.commit().unwrap();
    // The next writer holds the head: what committed pending is sealed first, in written order.
    let mut c = ledger.db.edge();
    let (c1, c1_hash) = artifact(&mut c, &ledger.secret, &run, "c1");
    assert!(c1_hash.is_some());
    let seqs: Vec<i64> =
        [&held_id, &b1, &b2, &c1].iter().map(|id| ledger.seq_of("querylayer.run_artifacts", id)).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "held, b1, b2, c1 in the chain in that order: {seqs:?}"
    );
    let report: Value =
        ledger.db.dba().query_one("SELECT querylayer_api.verify_ledger('demo'::text)", &[]).unwrap().get(0);
    assert_eq!((report["ok"].clone(), report["pending"].clone()), (json!(true), json!(0)), "{report}");

    // A pending record rewritten behind the triggers (nobody has written since, so it still
    // waits) is named before it is ever sealed.
    let (ta, _) = open_artifact(&mut a, &ledger.secret, &run, "held2");
    let (b3, _) = artifact(&mut b, &ledger.secret, &run, "b3");
    ta.commit().unwrap();
    ledger
        .su()
        .batch_execute(&format!(
            "ALTER TABLE querylayer.run_artifacts DISABLE TRIGGER append_only_row;
             UPDATE querylayer.run_artifacts SET value = '2' WHERE id = '{b3}';
             ALTER TABLE querylayer.run_artifacts ENABLE ALWAYS TRIGGER append_only_row;"
        ))
        .unwrap();
    let first = first_failure(&ledger);
    assert_eq!(first["record"]["id"], b3.as_str(), "{first}");
    assert_eq!(first["reason"], "content does not match content_sha256 (record edited)", "{first}");
    // No checkpoint is signed over it: the checkpoint seals first, and its check refuses.
    let err =
        ledger.db.dba().query_one("SELECT querylayer_api.create_checkpoints('demo'::text)", &[]).unwrap_err();
    assert_eq!(sql_error(&err).0, "QLL09", "{err}");
}

/// The number of an artifact in its site's chain, if it has one yet.
fn artifact_seq(ledger: &Ledger, id: &str) -> Option<i64> {
    ledger
        .su()
        .query_one("SELECT chain_seq FROM querylayer.run_artifacts WHERE id = $1::text::uuid", &[&id])
        .unwrap()
        .get(0)
}

/// Where the demo site's pending queue begins, and whether that number is this cluster's.
fn queue_begins(ledger: &Ledger) -> (Option<i64>, Option<bool>) {
    let row = ledger
        .su()
        .query_one(
            "SELECT h.pending_from, h.pending_cluster = (SELECT system_identifier FROM pg_control_system())
               FROM querylayer.ledger_heads h JOIN querylayer.sites s ON s.id = h.site_id WHERE s.slug = 'demo'",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

/// One record left pending by a writer that commits while `holder` holds the head, which then
/// commits too: the record's id.
fn left_pending(ledger: &Ledger, holder: &mut Client, writer: &mut Client, run: &str, key: &str) -> String {
    let (held, _) = open_artifact(holder, &ledger.secret, run, &format!("{key}-holder"));
    let (id, hash) = artifact(writer, &ledger.secret, run, key);
    assert_eq!(hash, None, "{key} waits to be sealed");
    held.commit().unwrap();
    id
}

#[test]
fn the_queue_is_read_from_the_oldest_transaction_running_at_the_last_seal_so_no_entry_is_passed_over() {
    let ledger = Ledger::new("queue-begins");
    let (mut a, mut b, mut c, mut d) =
        (ledger.db.edge(), ledger.db.edge(), ledger.db.edge(), ledger.db.edge());
    let run = begin(&mut d, &ledger.secret);
    assert_eq!(queue_begins(&ledger), (None, None), "no seal yet: the queue is read from its start");

    // A holds the head; B writes and stays open (its entry pending, its transaction running); C
    // writes and commits (pending too); A commits.
    let (held, _) = open_artifact(&mut a, &ledger.secret, &run, "held");
    let (mut open, pending) = open_artifact(&mut b, &ledger.secret, &run, "open");
    let open_id = pending["artifact_id"].as_str().unwrap().to_string();
    let open_xact: i64 = open.query_one("SELECT pg_current_xact_id()::text::bigint", &[]).unwrap().get(0);
    let (committed, hash) = artifact(&mut c, &ledger.secret, &run, "committed");
    assert_eq!(hash, None);
    held.commit().unwrap();

    // The next holder seals what it sees (C's), and the queue now begins no later than B's
    // transaction, which was running: never past an entry that may still commit.
    let (first, hash) = artifact(&mut d, &ledger.secret, &run, "first");
    assert!(hash.is_some() && artifact_seq(&ledger, &committed).is_some());
    let (begins, here) = queue_begins(&ledger);
    assert_eq!(here, Some(true), "the beginning is this cluster's");
    let begins = begins.expect("a seal that saw the whole queue says where it begins");
    assert!(
        0 < begins && begins <= open_xact,
        "the queue begins at {begins}, after B's transaction {open_xact}"
    );

    // B commits; the next holder finds its entry from there, and seals it before its own record.
    open.commit().unwrap();
    let (second, _) = artifact(&mut d, &ledger.secret, &run, "second");
    let (open_seq, second_seq) = (artifact_seq(&ledger, &open_id), artifact_seq(&ledger, &second));
    assert!(open_seq.is_some() && open_seq < second_seq, "B's record {open_seq:?}, the next {second_seq:?}");
    assert!(artifact_seq(&ledger, &first) < open_seq);
    // (Whether it moves past B's depends on every transaction of the cluster: other tests run.)
    let (moved, _) = queue_begins(&ledger);
    assert!(moved.unwrap() >= begins, "the beginning never moves back: {moved:?}");

    // A beginning written in another cluster (a dump restored here) says nothing: the queue is
    // read from its start, and the entry is sealed.
    let far = "4611686018427387904";
    ledger
        .su()
        .batch_execute(&format!(
            "UPDATE querylayer.ledger_heads SET pending_from = {far},
                    pending_cluster = (SELECT system_identifier FROM pg_control_system()) # 1"
        ))
        .unwrap();
    let restored = left_pending(&ledger, &mut a, &mut c, &run, "restored");
    artifact(&mut d, &ledger.secret, &run, "after-restored");
    assert!(artifact_seq(&ledger, &restored).is_some(), "another cluster's beginning was trusted");
    assert_eq!(queue_begins(&ledger).1, Some(true), "the sealer wrote this cluster's");

    // This cluster's beginning is trusted (the sealer only ever moves it on): an entry before it
    // is not read. That is the control of the case above.
    ledger
        .su()
        .batch_execute(&format!(
            "UPDATE querylayer.ledger_heads SET pending_from = {far},
                    pending_cluster = (SELECT system_identifier FROM pg_control_system())"
        ))
        .unwrap();
    let skipped = left_pending(&ledger, &mut a, &mut c, &run, "skipped");
    artifact(&mut d, &ledger.secret, &run, "after-skipped");
    assert_eq!(artifact_seq(&ledger, &skipped), None, "an entry before this cluster's beginning was read");
    ledger.su().batch_execute("UPDATE querylayer.ledger_heads SET pending_from = NULL").unwrap();
    artifact(&mut d, &ledger.secret, &run, "last");
    assert!(artifact_seq(&ledger, &skipped).is_some());
    let report: Value =
        ledger.db.dba().query_one("SELECT querylayer_api.verify_ledger('demo'::text)", &[]).unwrap().get(0);
    assert_eq!((report["ok"].clone(), report["pending"].clone()), (json!(true), json!(0)), "{report}");
}

/// Sequential and index scans of the pending queue so far in `tx`'s transaction.
fn queue_scans(tx: &mut postgres::Transaction<'_>) -> (i64, i64) {
    let row = tx
        .query_one(
            "SELECT seq_scan, idx_scan FROM pg_catalog.pg_stat_xact_user_tables
              WHERE schemaname = 'querylayer' AND relname = 'ledger_pending'",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

#[test]
fn a_write_reads_the_pending_queue_by_its_index_and_never_page_by_page() {
    // The queue's heap keeps the pages of every entry sealed since the last vacuum, and a small
    // queue's statistics make a scan of all of them look cheap; a holder reads it by its index.
    let ledger = Ledger::new("queue-index");
    let (mut a, mut b, mut d) = (ledger.db.edge(), ledger.db.edge(), ledger.db.edge());
    let run = begin(&mut d, &ledger.secret);
    let waiting: Vec<String> =
        (0..3).map(|i| left_pending(&ledger, &mut a, &mut b, &run, &format!("w{i}"))).collect();
    let pending: i64 =
        ledger.su().query_one("SELECT count(*) FROM querylayer.ledger_pending", &[]).unwrap().get(0);
    assert!(pending >= 1, "records wait to be sealed");
    // Statistics as a busy queue has them between vacuums: a few live entries on pages of their own.
    ledger.su().batch_execute("ANALYZE querylayer.ledger_pending").unwrap();

    // The next holder seals them (the queue read, the batch read, the batch deleted), then writes
    // again in the same transaction (the queue read once more, the head already held).
    let mut tx = d.transaction().unwrap();
    authenticate(&mut tx, &ledger.secret).unwrap();
    let before = queue_scans(&mut tx);
    for key in ["sealer", "sealer-again"] {
        let a = one(
            &mut tx,
            "SELECT querylayer_api.record_artifact($1::text::uuid, $2::text, '1'::jsonb)",
            &[&run, &key],
        );
        assert!(a["record_sha256"].is_string(), "{a}");
    }
    let after = queue_scans(&mut tx);
    tx.commit().unwrap();
    assert!(waiting.iter().all(|id| artifact_seq(&ledger, id).is_some()), "the waiting records were sealed");
    assert_eq!(after.0 - before.0, 0, "the queue was scanned page by page: {before:?} -> {after:?}");
    assert!(after.1 - before.1 >= 3, "the queue was read by its index: {before:?} -> {after:?}");
}

fn dsn_value(key: &str) -> String {
    admin_dsn()
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(str::to_string))
        .unwrap_or_default()
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

//! Installing the extension: roles are cluster-wide, so a second database must work too.

use querylayer_e2e::{admin_dsn, connect, TestDb};

// Install-time schema adoption (issue 12): see the tenant tests below.

#[test]
fn extension_installs_in_two_databases_of_one_cluster() {
    let mut admin = connect(&admin_dsn());
    let names = [format!("ql_twice_a_{}", std::process::id()), format!("ql_twice_b_{}", std::process::id())];
    for name in &names {
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        let mut db = connect(&format!("{} dbname={name}", admin_dsn()));
        db.batch_execute("CREATE EXTENSION querylayer").unwrap();
        let n: i64 = db
            .query_one("SELECT count(*) FROM pg_tables WHERE schemaname = 'querylayer'", &[])
            .unwrap()
            .get(0);
        assert!(n > 10, "{name}: tables were created");
    }
    for name in &names {
        admin.batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)")).unwrap();
    }
}

#[test]
fn the_install_refuses_a_database_that_is_not_utf8() {
    let mut admin = connect(&admin_dsn());
    for encoding in ["SQL_ASCII", "LATIN1"] {
        let name = format!("ql_{}_{}", encoding.to_lowercase(), std::process::id());
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).unwrap();
        admin
            .batch_execute(&format!(
                "CREATE DATABASE {name} ENCODING '{encoding}' LOCALE 'C' TEMPLATE template0"
            ))
            .unwrap();
        let mut db = connect(&format!("{} dbname={name}", admin_dsn()));
        let err = db.batch_execute("CREATE EXTENSION querylayer").unwrap_err();
        let refused = err.as_db_error().unwrap_or_else(|| panic!("{err}"));
        assert_eq!(refused.code().code(), "0A000", "{}", refused.message());
        assert_eq!(
            refused.message(),
            format!("querylayer needs a UTF8 database; database {name} is encoded {encoding}")
        );
        assert!(refused.hint().is_some_and(|h| h.contains("ENCODING 'UTF8'")), "{refused:?}");
        // Nothing of it stays behind: no schema, no extension.
        let left: i64 = db
            .query_one(
                "SELECT (SELECT count(*) FROM pg_namespace WHERE nspname IN ('querylayer', 'querylayer_api'))
                      + (SELECT count(*) FROM pg_extension WHERE extname = 'querylayer')",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(left, 0, "{name}");
        drop(db);
        admin.batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)")).unwrap();
    }
}

#[test]
fn dba_runs_the_operator_functions_from_a_plain_login() {
    let db = TestDb::new();
    let mut dba = db.dba();
    dba.batch_execute(
        "SELECT querylayer_api.create_organization('acme', 'Acme');
         SELECT querylayer_api.create_site('acme', 'acme-blog', 'Acme blog');
         SELECT querylayer_api.create_agent('acme', 'writer');
         SELECT querylayer_api.grant_agent_scopes('acme-blog', 'writer', '{content:read,runs:write}');",
    )
    .unwrap();
    let created: serde_json::Value = dba
        .query_one(
            "SELECT querylayer_api.create_connection('acme-blog', 'writer', 'laptop', '{runs:write}', now() + interval '1 hour')",
            &[],
        )
        .unwrap()
        .get(0);
    let secret = created["secret"].as_str().unwrap();
    querylayer_e2e::issued(secret);
    assert!(secret.starts_with("qlc_") && secret.len() == 47);
    assert_eq!(created["prefix"].as_str().unwrap(), &secret[..12]);
    let rows = dba
        .query("SELECT name, state, scopes FROM querylayer_api.list_connections('acme-blog')", &[])
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, String>(1), "active");
}

/// Every function name of the installed extension with its argument count.
fn extension_functions(db: &TestDb) -> Vec<(String, i16)> {
    db.superuser()
        .query(
            "SELECT DISTINCT p.proname::text, p.pronargs FROM pg_proc p
              WHERE p.pronamespace IN ('querylayer'::regnamespace, 'querylayer_api'::regnamespace) ORDER BY 1, 2",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// A database owned by a tenant who is not a superuser, and the tenant's login.
struct TenantDb {
    name: String,
    tenant: String,
}

impl TenantDb {
    fn new() -> TenantDb {
        let id = std::process::id();
        let n = uuid::Uuid::new_v4().simple().to_string();
        let (name, tenant) = (format!("ql_tenant_{}", &n[..12]), format!("ql_tenant_{id}_{}", &n[..6]));
        let mut admin = connect(&admin_dsn());
        admin
            .batch_execute(&format!(
                "CREATE ROLE {tenant} LOGIN PASSWORD 'tenant-pw' NOSUPERUSER NOCREATEROLE"
            ))
            .unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {name} OWNER {tenant}")).unwrap();
        TenantDb { name, tenant }
    }

    fn superuser(&self) -> postgres::Client {
        connect(&format!("{} dbname={}", admin_dsn(), self.name))
    }

    fn tenant(&self) -> postgres::Client {
        let port = admin_dsn()
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("port=").map(str::to_string))
            .unwrap();
        connect(&format!(
            "host=127.0.0.1 port={port} user={} password=tenant-pw dbname={}",
            self.tenant, self.name
        ))
    }

    fn login(&self, user: &str, password: &str) -> postgres::Client {
        let port = admin_dsn()
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("port=").map(str::to_string))
            .unwrap();
        connect(&format!("host=127.0.0.1 port={port} user={user} password={password} dbname={}", self.name))
    }
}

impl Drop for TenantDb {
    fn drop(&mut self) {
        if let Ok(mut admin) = postgres::Client::connect(&admin_dsn(), postgres::NoTls) {
            let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
            let _ = admin.batch_execute(&format!("DROP ROLE IF EXISTS {}", self.tenant));
        }
    }
}

/// A planted function of `schema` named `name` taking `nargs` text arguments: if it ever runs,
/// it advances the tenant's (non-transactional) sequence and fails the call.
fn plant(schema: &str, name: &str, nargs: i16) -> String {
    let args = vec!["text"; nargs as usize].join(", ");
    format!(
        "CREATE FUNCTION {schema}.{name}({args}) RETURNS text LANGUAGE plpgsql AS $p$
         BEGIN PERFORM pg_catalog.nextval('tenant_evil.planted_ran'); RAISE EXCEPTION 'planted %.% ran', '{schema}', '{name}'; END $p$;"
    )
}

#[test]
fn the_install_refuses_a_schema_a_tenant_planted() {
    let tdb = TenantDb::new();
    let mut tenant = tdb.tenant();
    for (planted, expected) in [
        (
            "CREATE SCHEMA querylayer;
             CREATE FUNCTION querylayer.isolate_by_site(p text) RETURNS void LANGUAGE plpgsql
                 AS $p$ BEGIN RAISE EXCEPTION 'planted isolate_by_site ran'; END $p$;
             CREATE FUNCTION querylayer.enter_operator(p text) RETURNS void LANGUAGE plpgsql
                 AS $p$ BEGIN RAISE EXCEPTION 'planted enter_operator ran'; END $p$;",
            "schema querylayer already exists and belongs to role",
        ),
        ("CREATE SCHEMA querylayer", "schema querylayer already exists and belongs to role"),
        ("CREATE SCHEMA querylayer_api", "schema querylayer_api already exists"),
    ] {
        tenant.batch_execute(planted).unwrap();
        let err = tdb.superuser().batch_execute("CREATE EXTENSION querylayer").unwrap_err();
        let db = err.as_db_error().unwrap_or_else(|| panic!("{err}"));
        assert_eq!(db.code().code(), "42P06", "{}", db.message());
        assert!(db.message().contains(expected), "{}", db.message());
        tenant
            .batch_execute(
                "DROP SCHEMA IF EXISTS querylayer CASCADE; DROP SCHEMA IF EXISTS querylayer_api CASCADE",
            )
            .unwrap();
    }
    // A schema the installer made, but with something in it, is refused too.
    let mut su = tdb.superuser();
    su.batch_execute("CREATE SCHEMA querylayer; CREATE TABLE querylayer.leftover (x int)").unwrap();
    let err = su.batch_execute("CREATE EXTENSION querylayer").unwrap_err();
    assert!(err.as_db_error().unwrap().message().contains("is not empty"), "{err}");
    su.batch_execute("DROP SCHEMA querylayer CASCADE").unwrap();
    // And one with privileges granted on it.
    su.batch_execute(&format!(
        "CREATE SCHEMA querylayer; GRANT CREATE ON SCHEMA querylayer TO {}",
        tdb.tenant
    ))
    .unwrap();
    let err = su.batch_execute("CREATE EXTENSION querylayer").unwrap_err();
    assert!(err.as_db_error().unwrap().message().contains("privileges granted"), "{err}");
    su.batch_execute("DROP SCHEMA querylayer CASCADE; CREATE EXTENSION querylayer").unwrap();
}

#[test]
fn overloads_a_tenant_planted_on_every_search_path_never_run() {
    let reference = TestDb::new();
    let functions = extension_functions(&reference);
    assert!(functions.len() > 100, "{}", functions.len());
    drop(reference);

    let tdb = TenantDb::new();
    let mut tenant = tdb.tenant();
    // The tenant's own schema goes first on the database's default path, before pg_catalog,
    // and both it and public hold an overload of every function name, for every arity, plus
    // the comparison operators the extension's functions use most.
    let mut sql = format!(
        "CREATE SCHEMA tenant_evil;
         GRANT USAGE ON SCHEMA tenant_evil TO PUBLIC;
         CREATE SEQUENCE tenant_evil.planted_ran;
         GRANT USAGE, UPDATE, SELECT ON SEQUENCE tenant_evil.planted_ran TO PUBLIC;
         ALTER DATABASE {} SET search_path = tenant_evil, public, pg_catalog;
         CREATE FUNCTION tenant_evil.planted_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS $p$
             BEGIN PERFORM pg_catalog.nextval('tenant_evil.planted_ran'); RETURN $1 OPERATOR(pg_catalog.=) $2; END $p$;
         CREATE OPERATOR tenant_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = tenant_evil.planted_eq);
         CREATE FUNCTION tenant_evil.planted_name_eq(name, name) RETURNS boolean LANGUAGE plpgsql AS $p$
             BEGIN PERFORM pg_catalog.nextval('tenant_evil.planted_ran'); RETURN $1 OPERATOR(pg_catalog.=) $2; END $p$;
         CREATE OPERATOR tenant_evil.= (LEFTARG = name, RIGHTARG = name, FUNCTION = tenant_evil.planted_name_eq);",
        tdb.name
    );
    for (name, nargs) in &functions {
        for arity in 0..=*nargs {
            for schema in ["tenant_evil", "public"] {
                sql.push_str(&format!(
                    "DO $d$ BEGIN EXECUTE $s${}$s$; EXCEPTION WHEN duplicate_function THEN NULL; END $d$;\n",
                    plant(schema, name, arity)
                ));
            }
        }
    }
    tenant.batch_execute(&sql).unwrap();

    // A superuser installs, from a session that has the tenant's path.
    let mut su = tdb.superuser();
    let path: String = su.query_one("SHOW search_path", &[]).unwrap().get(0);
    assert!(path.starts_with("tenant_evil"), "{path}");
    su.batch_execute("CREATE EXTENSION querylayer").unwrap();

    // The API in use, every caller with the tenant's path: operators, an agent, a member, a
    // signed envelope, the semantics plane, the ledger, triggers fired by a superuser's own
    // statements and the event trigger.
    let mut dba = tdb.login("ql_dba", querylayer_e2e::DBA_PASSWORD);
    let demo: serde_json::Value = dba.query_one("SELECT querylayer_api.seed_demo()", &[]).unwrap().get(0);
    let secret = demo["connection"]["secret"].as_str().unwrap().to_string();
    let token = demo["member_token"]["token"].as_str().unwrap().to_string();
    querylayer_e2e::issued(&secret);
    querylayer_e2e::issued(&token);
    let signer = querylayer_envelope::Signer::from_seed_bytes(b"tenant-test-key");
    let challenge: serde_json::Value = dba
        .query_one("SELECT querylayer_api.create_did_challenge('demo', $1)", &[&signer.did_key()])
        .unwrap()
        .get(0);
    let proof = querylayer_envelope::binding_proof(&signer, "demo", challenge["challenge"].as_str().unwrap());
    dba.execute(
        "SELECT querylayer_api.create_connection('demo', 'demo-agent', 'key', '{content:read}'::text[],
             now() + '1 hour'::interval, 'generic'::text, $1::text, false, $2::jsonb)",
        &[&signer.did_key(), &proof],
    )
    .unwrap();

    let mut edge = tdb.login("querylayer_edge", querylayer_e2e::EDGE_PASSWORD);
    let mut tx = edge.transaction().unwrap();
    querylayer_e2e::authenticate(&mut tx, &secret).unwrap();
    let run: serde_json::Value = tx
        .query_one("SELECT querylayer_api.begin_run('article.draft', '{}'::jsonb, '{draft_id}'::text[])", &[])
        .unwrap()
        .get(0);
    let run_id = run["run_id"].as_str().unwrap().to_string();
    tx.execute(
        "SELECT querylayer_api.record_artifact($1::text::uuid, 'draft_id', '\"d\"'::jsonb)",
        &[&run_id],
    )
    .unwrap();
    let draft: serde_json::Value = tx
        .query_one(
            "SELECT querylayer_api.create_draft($1::text::uuid, 'article', '{\"title\": \"T\", \"body\": \"B\"}'::jsonb, NULL::uuid, 'planted')",
            &[&run_id],
        )
        .unwrap()
        .get(0);
    let items = serde_json::json!([{"content_id": draft["content_id"], "action": "publish", "revision_id": draft["revision_id"]}]);
    let proposal: serde_json::Value = tx
        .query_one(
            "SELECT querylayer_api.request_publish_approval($1::text::uuid, $2::jsonb)",
            &[&run_id, &items],
        )
        .unwrap()
        .get(0);
    tx.execute("SELECT querylayer_api.finish_run($1::text::uuid, 'completed')", &[&run_id]).unwrap();
    tx.execute("SELECT querylayer_api.answer_question('Where is fiscal stress highest?')", &[]).unwrap();
    tx.execute("SELECT querylayer_api.record_tool_call('querylayer_begin_run', 'ok', 3)", &[]).unwrap();
    tx.commit().unwrap();
    let mut tx = edge.transaction().unwrap();
    tx.query_one("SELECT querylayer_api.authenticate_member($1)", &[&querylayer_e2e::fingerprint(&token)])
        .unwrap();
    let decided: serde_json::Value = tx
        .query_one(
            "SELECT querylayer_api.decide_proposal($1::text::uuid, 'approve')",
            &[&proposal["proposal_id"].as_str().unwrap()],
        )
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    assert_eq!(decided["execution"]["status"], "applied", "{decided}");
    let receipt: serde_json::Value = edge
        .query_one(
            "SELECT querylayer_api.authenticate_envelope('{\"payload\": {}}', 'POST', '/v1/answer', sha256(''::bytea))",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(receipt["allowed"], false);
    let failed: bool = edge
        .query_one("SELECT querylayer_api.record_failed_authentication(sha256('nope'::bytea), 'mcp')", &[])
        .unwrap()
        .get(0);
    assert!(failed);
    let verified: serde_json::Value =
        dba.query_one("SELECT querylayer_api.verify_ledger('demo')", &[]).unwrap().get(0);
    assert_eq!(verified["ok"], true, "{verified}");
    // A superuser's own statements fire the extension's triggers and its event trigger.
    let refused = su.batch_execute("UPDATE querylayer.runs SET run_type = 'edited'").unwrap_err();
    assert_eq!(refused.as_db_error().unwrap().code().code(), "QL423");
    su.batch_execute("CREATE TABLE public.after_install (x int); DROP TABLE public.after_install").unwrap();

    let ran: bool = su.query_one("SELECT is_called FROM tenant_evil.planted_ran", &[]).unwrap().get(0);
    assert!(!ran, "a planted function or operator ran");

    // And the tenant can plant nothing in the extension's schemas now.
    for attempt in [
        "CREATE FUNCTION querylayer.enter_operator(p text) RETURNS void LANGUAGE sql AS 'SELECT NULL'",
        "CREATE FUNCTION querylayer_api.authenticate(p text) RETURNS void LANGUAGE sql AS 'SELECT NULL'",
        "CREATE TABLE querylayer.planted (x int)",
        "CREATE OPERATOR querylayer.= (LEFTARG = text, RIGHTARG = text, FUNCTION = tenant_evil.planted_eq)",
        "ALTER FUNCTION tenant_evil.planted_eq(text, text) SET SCHEMA querylayer",
        "CREATE EVENT TRIGGER planted ON ddl_command_start EXECUTE FUNCTION tenant_evil.planted_eq()",
        "ALTER EXTENSION querylayer ADD FUNCTION tenant_evil.planted_eq(text, text)",
        "DROP SCHEMA querylayer CASCADE",
    ] {
        let err = tenant.batch_execute(attempt).unwrap_err();
        let code = err.as_db_error().map(|d| d.code().code().to_string()).unwrap_or_default();
        assert!(code == "42501" || code == "42809", "{attempt}: {err}");
    }
}

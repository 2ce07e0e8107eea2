//! Installing the extension: roles are cluster-wide, so a second database must work too.

use querylayer_e2e::{admin_dsn, connect, TestDb};

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

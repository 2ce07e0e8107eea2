//! Fixtures for the end-to-end tiers: a fresh database per test, cloned from a template that has
//! the installed extension, and logins as the real roles (superuser, `querylayer_edge`, a DBA in
//! `querylayer_admin`). Every secret a test obtains is appended to `$QUERYLAYER_TEST_SECRETS`,
//! so the test script can prove afterwards that none reached a log.
//!
//! The template is a fresh install, or the database `$QUERYLAYER_TEST_TEMPLATE` names: the upgrade
//! test runs the tier against a database upgraded from the previous release, history included.

use postgres::{Client, NoTls};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::sync::{Mutex, OnceLock};

pub const EDGE_PASSWORD: &str = "edge-test-password";
pub const DBA_PASSWORD: &str = "dba-test-password";
const TEMPLATE: &str = "querylayer_template";

/// The template the test databases are cloned from.
fn template() -> String {
    std::env::var("QUERYLAYER_TEST_TEMPLATE").unwrap_or_else(|_| TEMPLATE.to_string())
}

/// The superuser DSN of the test cluster (unix socket, trust), from the test script.
pub fn admin_dsn() -> String {
    std::env::var("QUERYLAYER_TEST_ADMIN_DSN")
        .expect("QUERYLAYER_TEST_ADMIN_DSN is not set; run the tiers through scripts/test")
}

fn dsn_value(key: &str) -> String {
    admin_dsn()
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(str::to_string))
        .unwrap_or_default()
}

pub fn connect(dsn: &str) -> Client {
    Client::connect(dsn, NoTls).unwrap_or_else(|e| panic!("cannot connect ({}): {e}", redact(dsn)))
}

fn redact(dsn: &str) -> String {
    dsn.split_whitespace()
        .map(|kv| if kv.starts_with("password=") { "password=…" } else { kv })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The logins the tiers use: `querylayer_edge` with a password, and the DBA `ql_dba`. Roles are
/// cluster-wide; the extension makes `querylayer_edge` and `querylayer_admin`.
pub fn ensure_logins(admin: &mut Client) {
    admin
        .batch_execute(&format!(
            "ALTER ROLE querylayer_edge LOGIN PASSWORD '{EDGE_PASSWORD}';
             DO $$ BEGIN
                IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ql_dba') THEN
                    CREATE ROLE ql_dba LOGIN PASSWORD '{DBA_PASSWORD}' IN ROLE querylayer_admin;
                END IF;
             END $$;"
        ))
        .unwrap();
}

/// A login over TCP with a password, as the edge and operators connect.
pub fn tcp_dsn(user: &str, password: &str, dbname: &str) -> String {
    format!("host=127.0.0.1 port={} user={user} password={password} dbname={dbname}", dsn_value("port"))
}

/// Creates the logins and the template database once per test process.
fn prepare_cluster() {
    static READY: OnceLock<()> = OnceLock::new();
    static LOCK: Mutex<()> = Mutex::new(());
    READY.get_or_init(|| {
        let _guard = LOCK.lock().unwrap();
        let mut admin = connect(&admin_dsn());
        // Serialises concurrent test processes too.
        admin.execute("SELECT pg_advisory_lock(4242)", &[]).unwrap();
        let template = template();
        let exists: bool = admin
            .query_one("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", &[&template])
            .unwrap()
            .get(0);
        if !exists {
            admin.batch_execute(&format!("CREATE DATABASE {template}")).unwrap();
            let mut tpl = connect(&format!("{} dbname={template}", admin_dsn()));
            tpl.batch_execute("CREATE EXTENSION querylayer").unwrap();
        }
        ensure_logins(&mut admin);
        admin.execute("SELECT pg_advisory_unlock(4242)", &[]).unwrap();
    });
}

/// A fresh database with the extension installed, dropped at the end of the test.
pub struct TestDb {
    pub name: String,
}

impl TestDb {
    pub fn new() -> TestDb {
        prepare_cluster();
        let name = format!("ql_{}", uuid::Uuid::new_v4().simple());
        let mut admin = connect(&admin_dsn());
        admin.execute("SELECT pg_advisory_lock(4242)", &[]).unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {}", template())).unwrap();
        admin.execute("SELECT pg_advisory_unlock(4242)", &[]).unwrap();
        TestDb { name }
    }

    /// The superuser (also an operator: superusers pass the operator check).
    pub fn superuser(&self) -> Client {
        connect(&format!("{} dbname={}", admin_dsn(), self.name))
    }

    fn tcp(&self, user: &str, password: &str) -> Client {
        connect(&tcp_dsn(user, password, &self.name))
    }

    /// A login as `querylayer_edge`, over TCP with a password, as the edge connects.
    pub fn edge(&self) -> Client {
        self.tcp("querylayer_edge", EDGE_PASSWORD)
    }

    /// A login as a DBA who holds `querylayer_admin`.
    pub fn dba(&self) -> Client {
        self.tcp("ql_dba", DBA_PASSWORD)
    }

    /// Seeds the demo as the DBA and returns its result (connection secret, member token).
    pub fn seed_demo(&self) -> Demo {
        let value = json(&mut self.dba(), "SELECT querylayer_api.seed_demo()", &[]);
        let demo = Demo {
            secret: value["connection"]["secret"].as_str().unwrap().to_string(),
            connection_id: value["connection"]["connection_id"].as_str().unwrap().to_string(),
            member_token: value["member_token"]["token"].as_str().unwrap().to_string(),
        };
        issued(&demo.secret);
        issued(&demo.member_token);
        demo
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut admin) = Client::connect(&admin_dsn(), NoTls) {
            let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
        }
    }
}

impl Default for TestDb {
    fn default() -> Self {
        Self::new()
    }
}

pub struct Demo {
    pub secret: String,
    pub connection_id: String,
    pub member_token: String,
}

/// Records a secret so that the test script can search the logs for it afterwards.
pub fn issued(secret: &str) {
    if let Ok(path) = std::env::var("QUERYLAYER_TEST_SECRETS") {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        writeln!(f, "{secret}").unwrap();
    }
}

pub fn fingerprint(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// Runs a query returning one jsonb value.
pub fn json(client: &mut Client, sql: &str, params: &[&(dyn postgres::types::ToSql + Sync)]) -> Value {
    client.query_one(sql, params).unwrap_or_else(|e| panic!("{sql}: {e}")).get(0)
}

/// Authenticates in the current transaction of `client` (call inside BEGIN … COMMIT).
pub fn authenticate(
    client: &mut impl postgres::GenericClient,
    secret: &str,
) -> Result<Value, postgres::Error> {
    client.query_one("SELECT querylayer_api.authenticate($1)", &[&fingerprint(secret)]).map(|row| row.get(0))
}

/// The SQLSTATE and message of a failed statement.
pub fn sql_error(e: &postgres::Error) -> (String, String) {
    let db = e.as_db_error().unwrap_or_else(|| panic!("not a database error: {e}"));
    (db.code().code().to_string(), db.message().to_string())
}

//! The operator command line (`querylayer admin`, the real binary) against a real database: the
//! commands that call the operator functions of docs/api.md directly (create-template,
//! import-rights, get-settings, rotate-server-key, list-sites), errors as JSON with `--json`,
//! the credential expiry cap as the command reports it, shell completion, and `mcp-serve`
//! telling an MCP client why it could not start.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use querylayer_e2e::{issued, json, tcp_dsn, TestDb, DBA_PASSWORD, EDGE_PASSWORD};
use serde_json::Value;

fn bin() -> PathBuf {
    std::env::var_os("QUERYLAYER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/querylayer"))
}

/// `querylayer admin <args>` as the DBA of `db`, with `stdin` on its standard input.
fn admin(db: &TestDb, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(bin())
        .arg("admin")
        .args(args)
        .env("DATABASE_URL", tcp_dsn("ql_dba", DBA_PASSWORD, &db.name))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", bin().display()));
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// The JSON a successful `--json` command printed.
fn ok_json(db: &TestDb, args: &[&str], stdin: &str) -> Value {
    let mut args = args.to_vec();
    args.push("--json");
    let out = admin(db, &args, stdin);
    assert!(out.status.success(), "querylayer admin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e})"))
}

/// The `{"error": …}` object a failed `--json` command printed on stderr, and its exit code.
fn error_json(out: &Output) -> (Value, i32) {
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "a failure prints nothing on stdout");
    let error: Value = serde_json::from_slice(&out.stderr)
        .unwrap_or_else(|e| panic!("stderr is not JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    (error["error"].clone(), out.status.code().unwrap())
}

#[test]
fn the_operator_functions_have_commands() {
    let db = TestDb::new();
    db.seed_demo();

    let sites = ok_json(&db, &["list-sites"], "");
    assert!(sites.as_array().unwrap().iter().any(|s| s["site"] == "demo"), "{sites}");

    let settings = ok_json(&db, &["get-settings"], "");
    assert_eq!(settings["envelope_require_v2"], Value::Bool(false), "{settings}");
    ok_json(&db, &["set-setting", "--key", "envelope_require_v2", "--value", "true"], "");
    assert_eq!(ok_json(&db, &["get-settings"], "")["envelope_require_v2"], Value::Bool(true));

    // A template from stdin; a second definition is its next version, and agents see it.
    let fields = r#"[{"name": "title", "type": "text", "required": true}, {"name": "summary", "type": "markdown", "required": false}]"#;
    let first =
        ok_json(&db, &["create-template", "--site", "demo", "--name", "note", "--fields", "-"], fields);
    let second =
        ok_json(&db, &["create-template", "--site", "demo", "--name", "note", "--fields", "-"], fields);
    assert_eq!(first["name"], "note", "{first}");
    assert_eq!(second["version"].as_i64(), first["version"].as_i64().map(|v| v + 1), "{second}");
    let stored = json(
        &mut db.superuser(),
        "SELECT to_jsonb(count(*)) FROM querylayer.templates t JOIN querylayer.sites s ON s.id = t.site_id
          WHERE s.slug = 'demo' AND t.name = 'note'",
        &[],
    );
    assert_eq!(stored, Value::from(2));

    // The demo's rights document, from a file: the next version, without problems.
    let rights = json(&mut db.superuser(), "SELECT querylayer.demo_documents()->'rights'", &[]);
    let file = std::env::temp_dir().join(format!("querylayer-rights-{}.json", db.name));
    std::fs::write(&file, rights.as_str().map(str::to_string).unwrap_or_else(|| rights.to_string())).unwrap();
    let imported = ok_json(&db, &["import-rights", "--site", "demo", "--file", file.to_str().unwrap()], "");
    std::fs::remove_file(&file).unwrap();
    assert_eq!(imported["site"], "demo", "{imported}");
    assert_eq!(imported["problems"], Value::Array(vec![]), "{imported}");
    // A document that is not JSON is refused, in JSON.
    let (error, code) =
        error_json(&admin(&db, &["import-rights", "--site", "demo", "--file", "-", "--json"], "{"));
    assert_eq!((error["code"].as_str(), code), (Some("invalid_argument"), 1), "{error}");

    // The key rotates; the retired key stays listed, so what it signed stays verifiable.
    let before = json(&mut db.superuser(), "SELECT querylayer_api.server_keys()", &[]);
    let after = ok_json(&db, &["rotate-server-key"], "");
    assert_ne!(after["current"], before["current"]);
    let keys = after["keys"].as_array().unwrap();
    let old = keys.iter().find(|k| k["did_key"] == before["current"]).expect("the retired key is listed");
    assert!(!old["retired_at"].is_null());
}

#[test]
fn with_json_every_error_is_json() {
    let db = TestDb::new();
    db.seed_demo();

    // Refused by the database: its code, message and hint.
    let (error, code) =
        error_json(&admin(&db, &["list-connections", "--site", "no-such-site", "--json"], ""));
    assert_eq!(code, 1);
    assert_eq!(error["code"], "not_found", "{error}");
    assert!(error["message"].as_str().unwrap().contains("no-such-site"), "{error}");

    // The expiry cap, where it bites: a credential lives at most a year.
    let out = admin(
        &db,
        &[
            "create-connection",
            "--site",
            "demo",
            "--agent",
            "demo-agent",
            "--scopes",
            "site:read",
            "--expires-in",
            "2 years",
            "--json",
        ],
        "",
    );
    let (error, _) = error_json(&out);
    assert_eq!(error["code"], "invalid_argument", "{error}");
    assert!(error["message"].as_str().unwrap().contains("more than a year away"), "{error}");
    assert!(error["hint"].as_str().unwrap().contains("issue a new credential"), "{error}");
    let help = Command::new(bin()).args(["admin", "create-connection", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("at most 366 days"));

    // A usage error (a required flag missing) and no DATABASE_URL: JSON too, exit code 2.
    let (error, code) = error_json(&admin(&db, &["create-site", "--slug", "x", "--json"], ""));
    assert_eq!((error["code"].as_str(), code), (Some("usage"), 2), "{error}");
    assert!(error["message"].as_str().unwrap().contains("--organization"), "{error}");
    let out = Command::new(bin())
        .args(["admin", "get-settings", "--json"])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let (error, code) = error_json(&out);
    assert_eq!((error["code"].as_str(), code), (Some("usage"), 2), "{error}");

    // Without --json, the same refusal is a line for people.
    let out = admin(&db, &["list-connections", "--site", "no-such-site"], "");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.starts_with("querylayer admin: ") && text.contains("(not_found)"), "{text}");
}

#[test]
fn shell_completion_knows_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(bin()).args(["completion", shell]).output().unwrap();
        assert!(out.status.success(), "completion {shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        for word in ["querylayer", "create-template", "rotate-server-key", "expires-in"] {
            assert!(script.contains(word), "completion {shell} lacks {word}");
        }
    }
    let out = Command::new(bin()).args(["completion", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// `mcp-serve` whose secret is dead answers the client's `initialize` with an MCP error that
/// says why, instead of closing the connection.
#[test]
fn mcp_serve_tells_the_client_why_it_cannot_start() {
    let db = TestDb::new();
    let demo = db.seed_demo();
    json(&mut db.dba(), "SELECT querylayer_api.revoke_connection($1::text::uuid)", &[&demo.connection_id]);
    issued(&demo.secret);
    let mut child = Command::new(bin())
        .arg("mcp-serve")
        .env("DATABASE_URL", tcp_dsn("querylayer_edge", EDGE_PASSWORD, &db.name))
        .env("QUERYLAYER_TOKEN", &demo.secret)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}});
    writeln!(child.stdin.take().unwrap(), "{initialize}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("not one JSON-RPC message ({e}): {}", String::from_utf8_lossy(&out.stdout))
    });
    assert_eq!(reply["id"], 7);
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("could not start") && message.contains("authentication failed"), "{message}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&demo.secret));
}

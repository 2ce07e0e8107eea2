//! The operator command line (`querylayer admin`, the real binary) against a real database: every
//! operator function of docs/api.md reached by a command (read from the catalog and the doc,
//! checked against the binary's map and `--help`), the commands that call them (text and
//! `--json`), errors as JSON with `--json`, the credential expiry cap as the command reports it,
//! errors that name their cause (refused, authentication) in `admin`, `worker` and `mcp-serve`,
//! shell completion, output cut short by a closed pipe, and `mcp-serve` telling an MCP client
//! why it could not start.

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

/// `querylayer <args>` with no database, its output.
fn run(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().unwrap_or_else(|e| panic!("{}: {e}", bin().display()))
}

/// The text `querylayer admin <args>` printed on stdout, successfully.
fn ok_text(db: &TestDb, args: &[&str], stdin: &str) -> String {
    let out = admin(db, args, stdin);
    assert!(out.status.success(), "querylayer admin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The function names docs/api.md lists for operators: the "Operators" section's list, every
/// "Operators: …" sentence, and every table row whose "who" column names an operator.
fn api_md_operator_functions() -> std::collections::BTreeSet<String> {
    let doc =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/api.md")).unwrap();
    let mut texts: Vec<String> = Vec::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if line.starts_with('|') && cells.len() > 3 && cells[2].split(", ").any(|w| w.starts_with("operator"))
        {
            texts.push(cells[1].to_string());
        }
    }
    let mut rest = doc.as_str();
    while let Some(at) = rest.find("Operators:") {
        let sentence = &rest[at..];
        let end = sentence.find(".\n").into_iter().chain(sentence.find(". ")).min().unwrap_or(sentence.len());
        texts.push(sentence[..end].to_string());
        rest = &sentence[end..];
    }
    let section = doc.split("\n## Operators").nth(1).expect("docs/api.md has an Operators section");
    let list = section.split("\n\n").nth(1).expect("the Operators section lists the functions");
    texts.push(list.to_string());
    let mut names = std::collections::BTreeSet::new();
    for text in texts {
        for (i, quoted) in text.split('`').enumerate() {
            let name = quoted.split('(').next().unwrap_or_default();
            if i % 2 == 1
                && !name.starts_with("p_")
                && !name.is_empty()
                && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// Item 5 of the operator CLI: every operator function docs/api.md lists, which the catalog says
/// `querylayer_admin` may execute, is reached by a command the binary's `--help` shows (or is a
/// named exception with its reason).
#[test]
fn every_operator_function_in_api_md_has_a_command() {
    let db = TestDb::new();
    let executable: std::collections::BTreeSet<String> = serde_json::from_value(json(
        &mut db.superuser(),
        "SELECT to_jsonb(array_agg(DISTINCT p.proname::text)) FROM pg_catalog.pg_proc p
          WHERE p.pronamespace = 'querylayer_api'::regnamespace
            AND has_function_privilege('querylayer_admin', p.oid, 'EXECUTE')",
        &[],
    ))
    .unwrap();
    let documented = api_md_operator_functions();
    assert!(documented.len() >= 45, "{documented:?}");
    let not_in_catalog: Vec<_> = documented.iter().filter(|f| !executable.contains(*f)).collect();
    assert!(
        not_in_catalog.is_empty(),
        "docs/api.md lists for operators what they cannot execute: {not_in_catalog:?}"
    );

    let out = run(&["operator-commands"]);
    assert!(out.status.success());
    let map: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut reached = std::collections::BTreeMap::new();
    for entry in map["commands"].as_array().unwrap() {
        reached.insert(
            entry["function"].as_str().unwrap().to_string(),
            entry["command"].as_str().unwrap().to_string(),
        );
    }
    for entry in map["without_command"].as_array().unwrap() {
        let reason = entry["reason"].as_str().unwrap_or_default();
        assert!(reason.len() > 10, "an exception needs its reason: {entry}");
        reached.insert(entry["function"].as_str().unwrap().to_string(), String::new());
    }
    let missing: Vec<_> = documented.iter().filter(|f| !reached.contains_key(*f)).collect();
    assert!(missing.is_empty(), "operator functions of docs/api.md without a command: {missing:?}");
    let stale: Vec<_> = reached.keys().filter(|f| !executable.contains(*f)).collect();
    assert!(stale.is_empty(), "the map names functions the catalog lacks: {stale:?}");

    // Each command is one the binary offers.
    let mut helps = std::collections::HashMap::new();
    for command in reached.values().filter(|c| !c.is_empty()) {
        let (group, name) = command.split_once(' ').unwrap();
        let help = helps
            .entry(group.to_string())
            .or_insert_with(|| String::from_utf8(run(&[group, "--help"]).stdout).unwrap());
        let listed = help.lines().any(|l| l.trim_start().split_whitespace().next() == Some(name));
        assert!(listed, "`querylayer {group} --help` does not list {name}");
    }
}

/// The commands added for the operator functions that had none, against the real binary, as text
/// and as JSON.
#[test]
fn members_agents_profiles_receipts_keys_and_limits_have_commands() {
    let db = TestDb::new();
    db.seed_demo();

    // Members: of the organization, and of the site with their roles; pages by handle.
    for handle in ["amy", "bob"] {
        ok_json(&db, &["create-member", "--organization", "demo", "--handle", handle], "");
    }
    ok_json(&db, &["set-member-role", "--site", "demo", "--member", "bob", "--role", "editor"], "");
    let org = ok_json(&db, &["list-members", "--organization", "demo"], "");
    let handles: Vec<_> = org["members"].as_array().unwrap().iter().map(|m| m["handle"].clone()).collect();
    assert_eq!(handles, ["amy", "bob", "demo-owner"], "{org}");
    let keys: Vec<_> = org["members"][0].as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys, ["created_at", "display_name", "handle", "member_id"], "never a password or token");
    let site = ok_json(&db, &["list-members", "--site", "demo"], "");
    let roles: Vec<_> = site["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["handle"].clone(), m["role"].clone()))
        .collect();
    assert_eq!(
        roles,
        [
            (serde_json::json!("bob"), serde_json::json!("editor")),
            (serde_json::json!("demo-owner"), serde_json::json!("owner"))
        ],
        "{site}"
    );
    let first = ok_json(&db, &["list-members", "--organization", "demo", "--limit", "2"], "");
    assert_eq!(first["members"].as_array().unwrap().len(), 2);
    let cursor = first["next_cursor"].as_str().expect("a next page").to_string();
    let second =
        ok_json(&db, &["list-members", "--organization", "demo", "--limit", "2", "--cursor", &cursor], "");
    assert_eq!(second["members"][0]["handle"], "demo-owner", "{second}");
    assert!(second["next_cursor"].is_null());
    let text = ok_text(&db, &["list-members", "--organization", "demo", "--limit", "2"], "");
    assert!(text.contains("amy") && text.contains(&format!("--cursor {cursor}")), "{text}");
    let text = ok_text(&db, &["list-members", "--site", "demo"], "");
    assert!(text.lines().any(|l| l.starts_with("bob") && l.contains("editor")), "{text}");
    // The limit where it bites, and exactly one of organization or site.
    let (error, code) =
        error_json(&admin(&db, &["list-members", "--site", "demo", "--limit", "501", "--json"], ""));
    assert_eq!((error["code"].as_str(), code), (Some("invalid_argument"), 1), "{error}");
    assert!(error["message"].as_str().unwrap().contains("between 1 and 500"), "{error}");
    let (error, code) = error_json(&admin(&db, &["list-members", "--json"], ""));
    assert_eq!((error["code"].as_str(), code), (Some("usage"), 2), "{error}");

    // Agents: a principal given at registration; the site's agents with their scopes.
    let agent = ok_json(
        &db,
        &[
            "create-agent",
            "--organization",
            "demo",
            "--handle",
            "reader",
            "--principal",
            "did:example:reader",
        ],
        "",
    );
    assert_eq!(agent["principal"], "did:example:reader", "{agent}");
    ok_json(&db, &["grant-scopes", "--site", "demo", "--agent", "reader", "--scopes", "content:read"], "");
    let agents = ok_json(&db, &["list-agents", "--site", "demo"], "");
    let reader =
        agents["agents"].as_array().unwrap().iter().find(|a| a["handle"] == "reader").unwrap().clone();
    assert_eq!(reader["scopes"], serde_json::json!(["content:read"]), "{agents}");
    assert_eq!(reader["active_connections"], 0);
    let demo_agent =
        agents["agents"].as_array().unwrap().iter().find(|a| a["handle"] == "demo-agent").unwrap().clone();
    assert!(demo_agent["active_connections"].as_i64().unwrap() >= 1, "{agents}");
    assert!(!agents.to_string().contains("qlc_"), "never a secret");
    let all = ok_json(&db, &["list-agents", "--organization", "demo", "--limit", "500"], "");
    assert!(all["agents"].as_array().unwrap().iter().any(|a| a["handle"] == "reader"), "{all}");
    let text = ok_text(&db, &["list-agents", "--site", "demo"], "");
    assert!(text.lines().any(|l| l.starts_with("reader") && l.contains("content:read")), "{text}");

    // A Hermes profile: renamed, then resolved by its new name and by its id.
    let renamed = ok_json(
        &db,
        &["rename-agent-profile", "--profile-id", "demo-profile-0001", "--new-name", "navigator"],
        "",
    );
    assert_eq!(
        (renamed["old_name"].as_str(), renamed["profile_name"].as_str()),
        (Some("demo"), Some("navigator"))
    );
    let by_name = ok_json(&db, &["resolve-agent-profile", "--profile-name", "navigator"], "");
    assert_eq!(by_name["handle"], "demo-agent", "{by_name}");
    let text = ok_text(&db, &["resolve-agent-profile", "--profile-id", "demo-profile-0001"], "");
    assert!(text.contains("handle: demo-agent"), "{text}");
    let (error, _) =
        error_json(&admin(&db, &["resolve-agent-profile", "--profile-name", "demo", "--json"], ""));
    assert_eq!(error["code"], "not_found", "the old name no longer routes: {error}");

    // Envelope receipts (none of no site on a fresh database), live state, value limits.
    let receipts = ok_json(&db, &["list-envelope-receipts", "--site", "demo", "--limit", "5"], "");
    assert!(receipts.is_array(), "{receipts}");
    ok_text(&db, &["list-envelope-receipts"], "");
    let live = ok_json(&db, &["verify-live-state", "--site", "demo"], "");
    assert_eq!(live["ok"], true, "{live}");
    let limits = ok_json(&db, &["list-value-limits"], "");
    assert!(limits.as_array().unwrap().len() > 10, "{limits}");
    let text = ok_text(&db, &["list-value-limits"], "");
    assert!(text.starts_with("table") && text.lines().count() > 10, "{text}");

    // A semantic model, as the demo's own, from stdin: its next version.
    let model = json(&mut db.superuser(), "SELECT querylayer.demo_documents()->'model'", &[]);
    let model = model.as_str().map(str::to_string).unwrap_or_else(|| model.to_string());
    let imported = ok_json(&db, &["import-semantic-model", "--site", "demo", "--file", "-"], &model);
    assert_eq!(imported["site"], "demo", "{imported}");

    // The server key set from a file (never a flag): the previous key stays listed, retired.
    let before = json(&mut db.superuser(), "SELECT querylayer_api.server_keys()", &[]);
    let file = std::env::temp_dir().join(format!("querylayer-key-{}.hex", db.name));
    std::fs::write(&file, format!("{}\n", "07".repeat(32))).unwrap();
    let keys = ok_json(&db, &["set-server-key", "--secret-file", file.to_str().unwrap()], "");
    std::fs::remove_file(&file).unwrap();
    assert_ne!(keys["current"], before["current"]);
    assert!(keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["did_key"] == before["current"] && !k["retired_at"].is_null()));
    let (error, _) = error_json(&admin(&db, &["set-server-key", "--secret-file", "-", "--json"], "not hex"));
    assert_eq!(error["code"], "invalid_argument", "{error}");
}

/// A connection that cannot be made says why, in `admin` (text and JSON), `worker` and
/// `mcp-serve`: refused, authentication failed.
#[test]
fn errors_name_their_cause() {
    let db = TestDb::new();
    let refused = format!("host=127.0.0.1 port=1 user=ql_dba password=x dbname={}", db.name);
    let wrong_password = tcp_dsn("ql_dba", "not-the-password", &db.name);
    for (url, cause) in
        [(&refused, "refused: nothing accepts connections"), (&wrong_password, "authentication failed")]
    {
        let out =
            Command::new(bin()).args(["admin", "get-settings"]).env("DATABASE_URL", url).output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(text.contains("the database is unavailable: ") && text.contains(cause), "{text}");
        let out = Command::new(bin())
            .args(["admin", "get-settings", "--json"])
            .env("DATABASE_URL", url)
            .output()
            .unwrap();
        let (error, _) = error_json(&out);
        assert_eq!(error["code"], "unavailable", "{error}");
        assert!(error["message"].as_str().unwrap().contains(cause), "{error}");
        assert!(!error.to_string().contains("not-the-password"));

        let out = Command::new(bin()).args(["worker", "--once"]).env("DATABASE_URL", url).output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(text.contains(cause), "worker: {text}");

        let mut child = Command::new(bin())
            .arg("mcp-serve")
            .env("DATABASE_URL", url)
            .env("QUERYLAYER_TOKEN", "qlc_not_a_secret")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}});
        writeln!(child.stdin.take().unwrap(), "{initialize}").unwrap();
        let out = child.wait_with_output().unwrap();
        let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains("could not start") && message.contains(cause), "mcp-serve: {message}");
    }
}

/// Output cut short by its reader (`querylayer completion bash | head -1`) ends the command
/// quietly: no panic, status 0. The pipe's reading end is closed before the command starts, so
/// its first write fails.
#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    let db = TestDb::new();
    let commands: [(&[&str], Option<String>); 3] = [
        (&["completion", "bash"], None),
        (&["tool-schemas"], None),
        (&["admin", "list-value-limits"], Some(tcp_dsn("ql_dba", DBA_PASSWORD, &db.name))),
    ];
    for (args, url) in commands {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut command = Command::new(bin());
        command.args(args).stdout(writer).stderr(Stdio::piped());
        if let Some(url) = url {
            command.env("DATABASE_URL", url);
        }
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
}

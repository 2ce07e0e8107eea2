//! The tool registry against the catalog: each tool's `querylayer_api` function checks the very
//! scopes the registry shows the tool under, and the scope catalogue of the edge is the
//! `querylayer.scopes` table. The registry is read from the real binary (`querylayer tools`).

use querylayer_e2e::TestDb;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn registry() -> Value {
    let bin = std::env::var_os("QUERYLAYER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/querylayer"));
    let out = std::process::Command::new(&bin)
        .arg("tools")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    assert!(out.status.success(), "querylayer tools: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("querylayer tools prints JSON")
}

fn strings(v: &Value) -> BTreeSet<String> {
    v.as_array().expect("an array").iter().map(|s| s.as_str().expect("a string").to_string()).collect()
}

/// The scope literals of every `querylayer.require_*(…)` call in a function's definition.
fn required_scopes(definition: &str, catalogue: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in definition.match_indices("querylayer.require_") {
        let call = &definition[at..];
        let call = &call[..call.find(')').unwrap_or(call.len())];
        for literal in call.split('\'').skip(1).step_by(2) {
            if catalogue.contains(literal) {
                found.insert(literal.to_string());
            }
        }
    }
    found
}

/// Tools whose function checks no scope, and why the registry's scope is discovery only.
const UNCHECKED: &[(&str, &str)] = &[(
    "verify_envelope",
    "a pure function (a Rust #[pg_extern]): it checks an envelope's own signature, reads no table \
     and decides nothing about access",
)];

/// The definitions of `schema.name` (one per overload).
fn definitions(su: &mut postgres::Client, schema: &str, name: &str) -> Vec<String> {
    su.query(
        "SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = $1 AND p.proname = $2",
        &[&schema, &name],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The `querylayer.<helper>(` functions a definition calls, other than the `require_*` guards.
fn helpers(definition: &str) -> BTreeSet<String> {
    definition
        .match_indices("querylayer.")
        .filter_map(|(at, needle)| {
            let rest = &definition[at + needle.len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let called = rest[name.len()..].starts_with('(');
            (called && !name.is_empty() && !name.starts_with("require_")).then_some(name)
        })
        .collect()
}

#[test]
fn every_tool_function_requires_the_scopes_the_registry_names() {
    let registry = registry();
    let db = TestDb::new();
    let mut su = db.superuser();
    let table: BTreeSet<String> =
        su.query("SELECT scope FROM querylayer.scopes", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(strings(&registry["scopes"]), table, "auth::SCOPES and querylayer.scopes disagree");
    // A proposal's scope is its type's (querylayer.proposal_types.required_scope).
    let by_type: BTreeSet<String> = su
        .query("SELECT DISTINCT required_scope FROM querylayer.proposal_types", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut wrong = Vec::new();
    for tool in registry["tools"].as_array().expect("tools") {
        let name = tool["name"].as_str().unwrap();
        let function = tool["function"].as_str().unwrap();
        let found = definitions(&mut su, "querylayer_api", function);
        assert_eq!(found.len(), 1, "{name}: querylayer_api.{function} is not one function");
        let definition = &found[0];
        let mut checked = required_scopes(definition, &table);
        // A function that hands the whole call to a helper (`RETURN querylayer.propose(…)`)
        // checks the scope there.
        let mut bodies = vec![definition.clone()];
        if checked.is_empty() {
            for helper in helpers(definition) {
                for body in definitions(&mut su, "querylayer", &helper) {
                    checked.extend(required_scopes(&body, &table));
                    bodies.push(body);
                }
            }
        }
        if bodies.iter().any(|b| b.contains("querylayer.require_connection(v_type.required_scope)")) {
            checked.extend(by_type.iter().cloned());
        }
        let named = strings(&tool["scopes"]);
        if let Some((_, why)) = UNCHECKED.iter().find(|(tool, _)| *tool == name) {
            assert!(checked.is_empty(), "{name} ({why}) now checks {checked:?}: drop it from UNCHECKED");
            continue;
        }
        if checked != named {
            wrong.push(format!("{name}: the registry names {named:?}, {function} checks {checked:?}"));
        }
    }
    assert!(wrong.is_empty(), "tools whose function checks other scopes:\n  {}", wrong.join("\n  "));
}

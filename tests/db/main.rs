//! The client-side tier: the installed extension in a real cluster, reached through the real
//! roles over real logins. Each test gets a fresh database.

mod admin_cli;
mod content;
mod context;
mod envelopes;
mod faults;
mod immutability;
mod install;
mod isolation;
mod ledger;
mod liveness;
mod operators;
mod runs;
mod tool_calls;
mod tools;

use querylayer_e2e::{issued, json, TestDb};
use serde_json::Value;

/// Two sites of one organization, one agent with a connection on each.
pub(crate) fn two_sites(db: &TestDb) -> (String, String) {
    let mut dba = db.dba();
    dba.batch_execute(
        "SELECT querylayer_api.create_organization('org');
         SELECT querylayer_api.create_site('org', 'site-a');
         SELECT querylayer_api.create_site('org', 'site-b');
         SELECT querylayer_api.create_agent('org', 'agent');
         SELECT querylayer_api.grant_agent_scopes('site-a', 'agent', '{runs:read,runs:write,site:read}');
         SELECT querylayer_api.grant_agent_scopes('site-b', 'agent', '{runs:read,runs:write,site:read}');",
    )
    .unwrap();
    let mut secret = |site: &str| {
        let v: Value = json(
            &mut dba,
            "SELECT querylayer_api.create_connection($1, 'agent', 'c', '{runs:read,runs:write,site:read}', now() + interval '1 hour')",
            &[&site],
        );
        let s = v["secret"].as_str().unwrap().to_string();
        issued(&s);
        s
    };
    (secret("site-a"), secret("site-b"))
}

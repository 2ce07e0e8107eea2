//! Agents and their profiles (`sql/030_identity.sql`).

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{authenticate, json};
    use pgrx::prelude::*;

    #[pg_test]
    fn renaming_a_profile_keeps_the_identity() {
        let before = json("SELECT querylayer_api.seed_demo()");
        let agent = json("SELECT querylayer_api.resolve_agent_profile('demo-profile-0001')");
        Spi::run("SELECT querylayer_api.rename_agent_profile('demo-profile-0001', 'demo-renamed')").unwrap();
        let after = json("SELECT querylayer_api.resolve_agent_profile('demo-profile-0001')");
        assert_eq!(agent["agent_id"], after["agent_id"]);
        assert_eq!(after["profile_name"], "demo-renamed");
        // The existing connection still authenticates as the same agent, with the same scopes.
        let ctx = authenticate(before["connection"]["secret"].as_str().unwrap());
        assert_eq!(ctx["agent_id"], agent["agent_id"]);
        assert_eq!(ctx["scopes"].as_array().unwrap().len(), 8);
        let renames =
            Spi::get_one::<i64>("SELECT count(*) FROM querylayer.agent_profile_renames").unwrap().unwrap();
        assert_eq!(renames, 1);
    }

    #[pg_test(error = "profile name 'twin' is ambiguous (2 agents); resolve by profile_id")]
    fn ambiguous_profile_name_fails_closed() {
        Spi::run("SELECT querylayer_api.create_organization('o1')").unwrap();
        Spi::run("SELECT querylayer_api.create_agent('o1', 'a1', 'hermes', 'p-1', 'twin')").unwrap();
        Spi::run("SELECT querylayer_api.create_agent('o1', 'a2', 'hermes', 'p-2', 'twin')").unwrap();
        Spi::run("SELECT querylayer_api.resolve_agent_profile(p_profile_name => 'twin')").unwrap();
    }

    #[pg_test(error = "no agent is bound to profile_id 'p-'")]
    fn missing_profile_never_resolves_to_a_similar_one() {
        Spi::run("SELECT querylayer_api.create_organization('o1')").unwrap();
        Spi::run("SELECT querylayer_api.create_agent('o1', 'a1', 'hermes', 'p-1', 'one')").unwrap();
        Spi::run("SELECT querylayer_api.resolve_agent_profile('p-')").unwrap();
    }
}

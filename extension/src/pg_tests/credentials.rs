//! Connections and their authentication (`sql/040_credentials.sql`): fingerprints, revocation,
//! scopes bounded by the agent's permissions, listings without secrets.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{as_edge, authenticate, demo_secret, expect_sqlstate, json, text};
    use pgrx::prelude::*;

    #[pg_test(error = "authentication failed")]
    fn unknown_fingerprint_fails() {
        demo_secret();
        as_edge();
        authenticate("qlc_not-a-real-secret");
    }

    #[pg_test(error = "authentication failed")]
    fn malformed_fingerprint_fails() {
        as_edge();
        Spi::run("SELECT querylayer_api.authenticate('\\x0102'::bytea)").unwrap();
    }

    #[pg_test(error = "authentication failed")]
    fn revoked_connection_fails() {
        let seeded = json("SELECT querylayer_api.seed_demo()");
        let id = seeded["connection"]["connection_id"].as_str().unwrap();
        Spi::run(&format!("SELECT querylayer_api.revoke_connection('{id}')")).unwrap();
        as_edge();
        authenticate(seeded["connection"]["secret"].as_str().unwrap());
    }

    #[pg_test(error = "the agent does not hold this scope on this site: content:write")]
    fn connection_cannot_expand_the_agents_authority() {
        demo_secret();
        Spi::run("SELECT querylayer_api.create_agent('demo', 'reader')").unwrap();
        Spi::run("SELECT querylayer_api.grant_agent_scopes('demo', 'reader', '{content:read}')").unwrap();
        Spi::run(
            "SELECT querylayer_api.create_connection('demo', 'reader', 'r1', '{content:read,content:write}', now() + interval '1 hour')",
        )
        .unwrap();
    }

    #[pg_test]
    fn removed_permission_disables_the_scope_on_existing_connections() {
        let secret = demo_secret();
        Spi::run("SELECT querylayer_api.revoke_agent_scopes('demo', 'demo-agent', '{runs:write}')").unwrap();
        as_edge();
        let ctx = authenticate(&secret);
        assert!(!ctx["scopes"].as_array().unwrap().iter().any(|s| s == "runs:write"));
        expect_sqlstate("SELECT querylayer_api.begin_run('article.draft')", "QL403");
    }

    #[pg_test]
    fn listing_connections_shows_no_secret_or_fingerprint() {
        let seeded = json("SELECT querylayer_api.seed_demo()");
        let secret = seeded["connection"]["secret"].as_str().unwrap();
        let listed =
            text("SELECT jsonb_agg(to_jsonb(c))::text FROM querylayer_api.list_connections('demo') c");
        assert!(!listed.contains(secret));
        assert!(!listed.contains(&secret[12..]));
        let fingerprint = text(&format!("SELECT encode(sha256(convert_to('{secret}', 'UTF8')), 'hex')"));
        assert!(!listed.contains(&fingerprint));
        assert!(listed.contains(&secret[..12]), "the display prefix is listed");
        let audit = text("SELECT coalesce(jsonb_agg(to_jsonb(a))::text, '') FROM querylayer.audit_events a");
        assert!(!audit.contains(&secret[4..]) && !audit.contains(&fingerprint));
    }
}

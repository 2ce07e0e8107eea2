//! OAuth 2.1 for MCP clients (`sql/190_oauth.sql`, `oauth.rs`): consent writes a single-use code
//! bound to client, redirect URI, PKCE challenge and resource; redeeming it creates a connection
//! whose secret is the access token; refresh tokens rotate and a reused one ends the grant.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{
        as_edge, as_member, authenticate, demo, expect_sqlstate, json, member_token, text,
    };
    use pgrx::prelude::*;
    use serde_json::Value;

    const REDIRECT: &str = "http://127.0.0.1:33418/callback";
    const RESOURCE: &str = "http://127.0.0.1:8080/mcp";
    const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";

    fn register() -> String {
        let c =
            json(&format!("SELECT querylayer_api.oauth_register_client('Test client', ARRAY['{REDIRECT}'])"));
        c["client_id"].as_str().unwrap().to_string()
    }

    /// As the demo owner: consent for `client` with `scopes`; returns the code.
    fn consent(owner: &str, client: &str, scopes: &str) -> String {
        as_member(owner);
        let challenge = text(&format!("SELECT querylayer.pkce_s256('{VERIFIER}')"));
        let c = json(&format!(
            "SELECT querylayer_api.oauth_consent('{client}', '{REDIRECT}', '{challenge}', 'S256', '{RESOURCE}',
                    'demo-agent', '{scopes}', now() + interval '7 days')"
        ));
        c["code"].as_str().unwrap().to_string()
    }

    fn redeem(code: &str, client: &str, redirect: &str, verifier: &str, resource: &str) -> Value {
        json(&format!(
            "SELECT querylayer_api.oauth_redeem_code(sha256(convert_to('{code}', 'UTF8')), '{client}', '{redirect}',
                    '{verifier}', '{resource}')"
        ))
    }

    fn refresh(token: &str, client: &str) -> Value {
        json(&format!(
            "SELECT querylayer_api.oauth_refresh(sha256(convert_to('{token}', 'UTF8')), '{client}', '{RESOURCE}')"
        ))
    }

    fn connection_state(id: &Value) -> String {
        text(&format!(
            "SELECT CASE WHEN revoked_at IS NULL THEN 'live' ELSE 'revoked' END FROM querylayer.connections WHERE id = '{}'",
            id.as_str().unwrap()
        ))
    }

    fn audited(action: &str) -> i64 {
        Spi::get_one::<i64>(&format!(
            "SELECT count(*) FROM querylayer.audit_events WHERE action = '{action}'"
        ))
        .unwrap()
        .unwrap()
    }

    #[pg_test]
    fn pkce_and_redirect_uris_follow_the_rfcs() {
        // RFC 7636, appendix B.
        assert_eq!(
            text(&format!("SELECT querylayer.pkce_s256('{VERIFIER}')")),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
        for ok in [
            "https://client.example/cb",
            "http://127.0.0.1:4000/callback",
            "http://[::1]/cb",
            "http://localhost:9/x",
        ] {
            assert_eq!(
                text(&format!("SELECT querylayer.oauth_redirect_uri_valid('{ok}')::text")),
                "true",
                "{ok}"
            );
        }
        for bad in [
            "http://client.example/cb",
            "https://a.example/cb#frag",
            "javascript:alert(1)",
            "https://u@evil.example/x@",
        ] {
            assert_eq!(
                text(&format!("SELECT querylayer.oauth_redirect_uri_valid('{bad}')::text")),
                "false",
                "{bad}"
            );
        }
        // A loopback redirect may use another port (RFC 8252 §7.3); nothing else may differ.
        let m = |uri: &str| {
            text(&format!("SELECT querylayer.oauth_redirect_uri_matches(ARRAY['{REDIRECT}'], '{uri}')::text"))
        };
        assert_eq!(m("http://127.0.0.1:5555/callback"), "true");
        assert_eq!(m("http://127.0.0.1:5555/other"), "false");
        assert_eq!(m("http://evil.example/callback"), "false");
        expect_sqlstate(
            "SELECT querylayer_api.oauth_register_client('x', ARRAY['http://evil.example/cb'])",
            "22023",
        );
    }

    #[pg_test]
    fn a_code_makes_one_connection_once_and_refresh_tokens_rotate() {
        let (_, owner) = demo();
        let client = register();
        let code = consent(&owner, &client, "{site:read,content:read}");
        assert!(code.starts_with("qla_"));
        let stored = text("SELECT count(*)::text FROM querylayer.oauth_codes WHERE code_sha256 = sha256(convert_to(code_challenge, 'UTF8'))");
        assert_eq!(stored, "0");
        let t = redeem(&code, &client, REDIRECT, VERIFIER, RESOURCE);
        assert_eq!(t["ok"], true, "{t}");
        assert_eq!(t["scope"], "content:read site:read");
        let access = t["access_token"].as_str().unwrap().to_string();
        assert!(access.starts_with("qlc_"), "the access token is a connection secret");
        // The access token authenticates as a connection with exactly the consented scopes.
        let ctx = authenticate(&access);
        assert_eq!(ctx["scopes"], serde_json::json!(["content:read", "site:read"]), "{ctx}");
        assert_eq!(audited("oauth.consent"), 1);
        assert_eq!(audited("oauth.grant"), 1);

        // Refresh: a new connection, the old one revoked, a new refresh token.
        let r = refresh(t["refresh_token"].as_str().unwrap(), &client);
        assert_eq!(r["ok"], true, "{r}");
        assert_ne!(r["access_token"], t["access_token"]);
        assert_eq!(connection_state(&t["connection_id"]), "revoked");
        assert_eq!(connection_state(&r["connection_id"]), "live");
        assert_eq!(audited("oauth.refresh"), 1);

        // The spent refresh token presented again: the grant and its live connection end.
        let again = refresh(t["refresh_token"].as_str().unwrap(), &client);
        assert_eq!((again["ok"].as_bool(), again["error"].as_str()), (Some(false), Some("invalid_grant")));
        assert_eq!(connection_state(&r["connection_id"]), "revoked");
        assert_eq!(audited("oauth.refresh_reuse"), 1);
        assert_eq!(audited("oauth.revoke"), 1);
        // And the newest refresh token died with its grant.
        let after = refresh(r["refresh_token"].as_str().unwrap(), &client);
        assert_eq!(after["ok"], false, "{after}");
    }

    #[pg_test]
    fn a_reused_code_revokes_its_grant() {
        let (_, owner) = demo();
        let client = register();
        let code = consent(&owner, &client, "{site:read}");
        let t = redeem(&code, &client, REDIRECT, VERIFIER, RESOURCE);
        assert_eq!(t["ok"], true, "{t}");
        let again = redeem(&code, &client, REDIRECT, VERIFIER, RESOURCE);
        assert_eq!(again["reason"], "code reused");
        assert_eq!(connection_state(&t["connection_id"]), "revoked");
        let r = refresh(t["refresh_token"].as_str().unwrap(), &client);
        assert_eq!(r["ok"], false, "the grant is gone: {r}");
    }

    #[pg_test]
    fn a_code_is_refused_for_another_verifier_redirect_client_or_resource_and_when_expired() {
        let (_, owner) = demo();
        let client = register();
        let other = register();
        let code = consent(&owner, &client, "{site:read}");
        let refused = |v: Value| v["reason"].as_str().unwrap_or_default().to_string();
        let wrong = "x".repeat(43);
        assert_eq!(refused(redeem(&code, &client, REDIRECT, &wrong, RESOURCE)), "wrong code_verifier");
        // From here as the edge (the member's context ended with the call above).
        as_edge();
        assert_eq!(refused(redeem(&code, &client, REDIRECT, "short", RESOURCE)), "wrong code_verifier");
        assert_eq!(
            refused(redeem(&code, &client, "http://127.0.0.1:33418/elsewhere", VERIFIER, RESOURCE)),
            "redirect_uri differs"
        );
        assert_eq!(refused(redeem(&code, &other, REDIRECT, VERIFIER, RESOURCE)), "another client");
        assert_eq!(
            refused(redeem(&code, &client, REDIRECT, VERIFIER, "https://other.example/mcp")),
            "resource differs"
        );
        assert_eq!(refused(redeem("qla_not-a-code", &client, REDIRECT, VERIFIER, RESOURCE)), "unknown");
        // None of the refusals spent it.
        assert_eq!(redeem(&code, &client, REDIRECT, VERIFIER, RESOURCE)["ok"], true);
        Spi::run("RESET ROLE").unwrap();
        // An expired code (written as it would be a few minutes after consent).
        Spi::run(&format!(
            "INSERT INTO querylayer.oauth_codes (code_sha256, site_id, organization_id, client_id, redirect_uri,
                    code_challenge, resource, member_id, agent_id, scopes, grant_expires_at, created_at, expires_at)
             SELECT sha256(convert_to('qla_old', 'UTF8')), site_id, organization_id, client_id, redirect_uri,
                    code_challenge, resource, member_id, agent_id, scopes, grant_expires_at,
                    now() - interval '5 minutes', now() - interval '4 minutes'
               FROM querylayer.oauth_codes LIMIT 1"
        ))
        .unwrap();
        as_edge();
        assert_eq!(refused(redeem("qla_old", &client, REDIRECT, VERIFIER, RESOURCE)), "code expired");
    }

    #[pg_test]
    fn consent_never_widens_the_agent_and_only_owners_and_admins_give_it() {
        let (_, owner) = demo();
        let client = register();
        Spi::run("SELECT querylayer_api.create_agent('demo', 'narrow-agent')").unwrap();
        Spi::run("SELECT querylayer_api.grant_agent_scopes('demo', 'narrow-agent', '{site:read}')").unwrap();
        let challenge = text(&format!("SELECT querylayer.pkce_s256('{VERIFIER}')"));
        let call = |agent: &str, scopes: &str| {
            format!(
                "SELECT querylayer_api.oauth_consent('{client}', '{REDIRECT}', '{challenge}', 'S256', '{RESOURCE}',
                        '{agent}', '{scopes}', now() + interval '1 day')"
            )
        };
        as_member(&owner);
        expect_sqlstate(&call("narrow-agent", "{site:read,content:write}"), "QL403");
        expect_sqlstate(
            &format!(
                "SELECT querylayer_api.oauth_consent('{client}', '{REDIRECT}', '{challenge}', 'plain', '{RESOURCE}',
                        'demo-agent', '{{site:read}}', now() + interval '1 day')"
            ),
            "22023",
        );
        expect_sqlstate(
            &format!(
                "SELECT querylayer_api.oauth_consent('{client}', 'https://evil.example/cb', '{challenge}', 'S256',
                        '{RESOURCE}', 'demo-agent', '{{site:read}}', now() + interval '1 day')"
            ),
            "22023",
        );
        let code = json(&call("narrow-agent", "{site:read}"))["code"].as_str().unwrap().to_string();
        // The agent loses the scope before the code is redeemed: the connection trigger refuses,
        // and the token endpoint answers invalid_grant (the code is spent, no grant is made).
        Spi::run("SELECT querylayer_api.revoke_agent_scopes('demo', 'narrow-agent', '{site:read}')").unwrap();
        let t = redeem(&code, &client, REDIRECT, VERIFIER, RESOURCE);
        assert_eq!(t["reason"], "the agent no longer holds the scopes", "{t}");
        assert_eq!(text("SELECT count(*)::text FROM querylayer.oauth_grants"), "0");
    }

    #[pg_test]
    fn an_editor_cannot_consent() {
        demo();
        let client = register();
        let editor = member_token("eddie", "editor");
        as_member(&editor);
        let challenge = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";
        expect_sqlstate(
            &format!(
                "SELECT querylayer_api.oauth_consent('{client}', '{REDIRECT}', '{challenge}', 'S256', '{RESOURCE}',
                        'demo-agent', '{{site:read}}', now() + interval '1 day')"
            ),
            "QL403",
        );
    }

    #[pg_test]
    fn the_edge_and_the_owner_cannot_bypass_the_functions() {
        let (_, owner) = demo();
        let client = register();
        let code = consent(&owner, &client, "{site:read}");
        let t = redeem(&code, &client, REDIRECT, VERIFIER, RESOURCE);
        assert_eq!(t["ok"], true);
        as_edge();
        for table in ["oauth_clients", "oauth_codes", "oauth_grants", "oauth_refresh_tokens"] {
            expect_sqlstate(&format!("SELECT count(*) FROM querylayer.{table}"), "42501");
        }
        expect_sqlstate("UPDATE querylayer.oauth_codes SET used_at = NULL", "42501");
        Spi::run("RESET ROLE").unwrap();
        // A superuser (past row-level security) meets the guards: a used code stays used, a
        // spent refresh token stays spent, nothing is deleted, a grant never widens.
        expect_sqlstate("UPDATE querylayer.oauth_codes SET used_at = NULL", "QL409");
        expect_sqlstate("DELETE FROM querylayer.oauth_grants", "QL423");
        let r = refresh(t["refresh_token"].as_str().unwrap(), &client);
        assert_eq!(r["ok"], true);
        expect_sqlstate(
            "UPDATE querylayer.oauth_refresh_tokens SET spent_at = NULL WHERE spent_at IS NOT NULL",
            "QL409",
        );
        expect_sqlstate("UPDATE querylayer.oauth_grants SET scopes = '{site:read,content:write}'", "QL423");
    }

    #[pg_test]
    fn a_connection_revoked_in_the_dashboard_ends_its_grant_and_a_withdrawn_scope_too() {
        let (_, owner) = demo();
        let client = register();
        let code = consent(&owner, &client, "{site:read}");
        let t = redeem(&code, &client, REDIRECT, VERIFIER, RESOURCE);
        assert_eq!(t["ok"], true, "{t}");
        // An owner revokes the connection where every connection is listed.
        as_member(&owner);
        json(&format!(
            "SELECT querylayer_api.console_revoke_connection('{}', 'not this one')",
            t["connection_id"].as_str().unwrap()
        ));
        let r = refresh(t["refresh_token"].as_str().unwrap(), &client);
        assert_eq!(r["reason"], "connection revoked", "{r}");
        assert_eq!(
            text("SELECT count(*)::text FROM querylayer.oauth_grants WHERE revoked_at IS NOT NULL"),
            "1"
        );

        // A second grant; the agent then loses the scope: the next refresh ends the grant.
        let code = consent(&owner, &client, "{site:read}");
        let t = redeem(&code, &client, REDIRECT, VERIFIER, RESOURCE);
        assert_eq!(t["ok"], true, "{t}");
        Spi::run("SELECT querylayer_api.revoke_agent_scopes('demo', 'demo-agent', '{site:read}')").unwrap();
        let r = refresh(t["refresh_token"].as_str().unwrap(), &client);
        assert_eq!(r["reason"], "the agent no longer holds the scopes", "{r}");
        assert_eq!(
            text("SELECT count(*)::text FROM querylayer.oauth_grants WHERE revoked_at IS NOT NULL"),
            "2"
        );
    }

    const DOCUMENT: &str = "https://app.example/oauth/client.json";

    fn document(name: &str, redirect: &str) -> String {
        format!(
            r#"{{"client_id": "{DOCUMENT}", "client_name": "{name}", "redirect_uris": ["{redirect}"], "token_endpoint_auth_method": "none"}}"#
        )
    }

    #[pg_test]
    fn a_client_named_by_its_metadata_document_consents_and_redeems_like_a_registered_one() {
        let (_, owner) = demo();
        let first = json(&format!(
            "SELECT querylayer_api.oauth_record_client_document('{DOCUMENT}', '{}')",
            document("Doc client", REDIRECT)
        ));
        assert_eq!(
            (first["client_name"].clone(), first["changed"].clone()),
            ("Doc client".into(), true.into())
        );
        // The same document again keeps no new version; a changed one does, and wins.
        let same = json(&format!(
            "SELECT querylayer_api.oauth_record_client_document('{DOCUMENT}', '{}')",
            document("Doc client", REDIRECT)
        ));
        assert_eq!(same["changed"], false);
        let moved = "http://127.0.0.1:4444/moved";
        json(&format!(
            "SELECT querylayer_api.oauth_record_client_document('{DOCUMENT}', '{}')",
            document("Doc client 2", moved)
        ));
        assert_eq!(text("SELECT count(*)::text FROM querylayer.oauth_client_documents"), "2");
        let client = json(&format!("SELECT querylayer_api.oauth_client('{DOCUMENT}', '{moved}')"));
        assert_eq!(
            (
                client["client_name"].clone(),
                client["from_document"].clone(),
                client["redirect_uri_ok"].clone()
            ),
            ("Doc client 2".into(), true.into(), true.into())
        );
        assert_eq!(
            json(&format!("SELECT querylayer_api.oauth_client('{DOCUMENT}', '{REDIRECT}')"))
                ["redirect_uri_ok"],
            false,
            "the newest document decides"
        );
        // Consent and redemption as for a registered client.
        as_member(&owner);
        let challenge = text(&format!("SELECT querylayer.pkce_s256('{VERIFIER}')"));
        let c = json(&format!(
            "SELECT querylayer_api.oauth_consent('{DOCUMENT}', '{moved}', '{challenge}', 'S256', '{RESOURCE}',
                    'demo-agent', '{{site:read}}', now() + interval '1 day')"
        ));
        let t = redeem(c["code"].as_str().unwrap(), DOCUMENT, moved, VERIFIER, RESOURCE);
        assert_eq!(t["ok"], true, "{t}");
        // Versions are append-only for everyone.
        expect_sqlstate("UPDATE querylayer.oauth_client_documents SET client_name = 'evil'", "QL423");
    }

    #[pg_test]
    fn a_metadata_document_must_name_itself_and_describe_a_public_client() {
        demo();
        as_edge();
        let record = |url: &str, doc: &str| {
            format!("SELECT querylayer_api.oauth_record_client_document('{url}', '{doc}')")
        };
        // Another client_id than its own URL; a URL that is not https or has no path.
        expect_sqlstate(
            &record(DOCUMENT, &document("x", REDIRECT).replace(DOCUMENT, "https://evil.example/c.json")),
            "22023",
        );
        expect_sqlstate(&record("http://app.example/c.json", &document("x", REDIRECT)), "22023");
        expect_sqlstate(&record("https://app.example/", &document("x", REDIRECT)), "22023");
        // Redirect URIs neither https nor loopback; a confidential client; foreign grant types.
        expect_sqlstate(&record(DOCUMENT, &document("x", "http://evil.example/cb")), "22023");
        expect_sqlstate(
            &record(DOCUMENT, &document("x", REDIRECT).replace("\"none\"", "\"private_key_jwt\"")),
            "22023",
        );
        expect_sqlstate(
            &record(
                DOCUMENT,
                &format!(
                    r#"{{"client_id": "{DOCUMENT}", "redirect_uris": ["{REDIRECT}"], "grant_types": ["client_credentials"]}}"#
                ),
            ),
            "22023",
        );
        expect_sqlstate(&record(DOCUMENT, "[]"), "22023");
        Spi::run("RESET ROLE").unwrap();
        assert_eq!(text("SELECT count(*)::text FROM querylayer.oauth_clients"), "0");
    }

    #[pg_test]
    fn consent_may_register_a_new_agent_for_the_client_and_grant_it_what_the_member_chose() {
        let (_, owner) = demo();
        let client = register();
        let agents_before = audited("agent.create");
        as_member(&owner);
        let challenge = text(&format!("SELECT querylayer.pkce_s256('{VERIFIER}')"));
        let c = json(&format!(
            "SELECT querylayer_api.oauth_consent('{client}', '{REDIRECT}', '{challenge}', 'S256', '{RESOURCE}',
                    NULL, '{{site:read,runs:write}}', now() + interval '1 day', true)"
        ));
        assert_eq!(
            (c["agent"].clone(), c["new_agent"].clone()),
            ("oauth-test-client".into(), true.into()),
            "{c}"
        );
        let t = redeem(c["code"].as_str().unwrap(), &client, REDIRECT, VERIFIER, RESOURCE);
        assert_eq!(t["ok"], true, "{t}");
        let ctx = authenticate(t["access_token"].as_str().unwrap());
        assert_eq!(ctx["agent"], "oauth-test-client");
        assert_eq!(ctx["scopes"], serde_json::json!(["runs:write", "site:read"]));
        assert_eq!(audited("agent.create"), agents_before + 1);
        // A second one for the same client gets a handle of its own.
        as_member(&owner);
        let again = json(&format!(
            "SELECT querylayer_api.oauth_consent('{client}', '{REDIRECT}', '{challenge}', 'S256', '{RESOURCE}',
                    NULL, '{{site:read}}', now() + interval '1 day', true)"
        ));
        assert_eq!(again["agent"], "oauth-test-client-2");
    }

    #[pg_test]
    fn a_code_lives_for_the_configured_seconds() {
        let (_, owner) = demo();
        let client = register();
        Spi::run("SELECT querylayer_api.set_setting('oauth_code_ttl_seconds', '1')").unwrap();
        let code = consent(&owner, &client, "{site:read}");
        let ttl = text(&format!(
            "SELECT extract(epoch FROM expires_at - created_at)::int::text FROM querylayer.oauth_codes
              WHERE code_sha256 = sha256(convert_to('{code}', 'UTF8'))"
        ));
        assert_eq!(ttl, "1");
        expect_sqlstate("SELECT querylayer_api.set_setting('oauth_code_ttl_seconds', '0')", "22023");
        expect_sqlstate("SELECT querylayer_api.set_setting('oauth_code_ttl_seconds', '601')", "22023");
    }

    #[pg_test]
    fn a_scope_refusal_names_the_scope_for_the_step_up_challenge() {
        demo();
        let narrow = json(
            "SELECT querylayer_api.create_connection('demo', 'demo-agent', 'narrow', '{site:read}', now() + interval '1 hour')",
        );
        authenticate(narrow["secret"].as_str().unwrap());
        let detail = text(
            "DO $t$ BEGIN PERFORM querylayer.require_connection('publish:request'::text);
               EXCEPTION WHEN SQLSTATE 'QL403' THEN
                 DECLARE d text; BEGIN GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL;
                   PERFORM set_config('ql.test', d, true); END;
             END $t$;
             SELECT current_setting('ql.test')",
        );
        assert_eq!(detail, "required_scope=publish:request");
    }
}

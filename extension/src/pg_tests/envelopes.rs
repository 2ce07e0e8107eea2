//! Envelope authentication for `/v1` (`sql/095_envelopes.sql`, `envelopes.rs`): did:key
//! bindings, v1 and v2 envelopes, replays.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{as_member, demo_secret, expect_sqlstate, json, text};
    use pgrx::prelude::*;
    use serde_json::Value;

    fn envelope_vectors() -> Value {
        serde_json::from_str(include_str!("../../../docs/envelope-vectors.json")).unwrap()
    }

    fn authenticate_envelope(header: &str, method: &str, path: &str, body: &str) -> Value {
        json(&format!(
            "SELECT querylayer_api.authenticate_envelope({}, '{method}', '{path}', sha256(convert_to({}, 'UTF8')))",
            pgrx::spi::quote_literal(header),
            pgrx::spi::quote_literal(body)
        ))
    }

    /// The signer of a did:key of the shared vectors (their seeds are public) or of the tests.
    fn signer_of(did: &str) -> querylayer_envelope::Signer {
        let vectors = envelope_vectors();
        for set in ["v1", "v2"] {
            for v in vectors[set].as_array().unwrap() {
                if v["did_key"] == did {
                    return querylayer_envelope::Signer::from_seed_bytes(
                        v["seed_utf8"].as_str().unwrap().as_bytes(),
                    );
                }
            }
        }
        let test = querylayer_envelope::Signer::from_seed_bytes(b"pg-test-key");
        assert_eq!(test.did_key(), did, "no known seed for {did}");
        test
    }

    /// As the operator: a proof of possession of `did` for binding it on `site`.
    fn operator_proof(site: &str, did: &str) -> String {
        let challenge = json(&format!("SELECT querylayer_api.create_did_challenge('{site}', '{did}')"));
        querylayer_envelope::binding_proof(&signer_of(did), site, challenge["challenge"].as_str().unwrap())
            .to_string()
    }

    fn bind(did: &str) {
        demo_secret();
        Spi::run(&format!(
            "SELECT querylayer_api.create_connection('demo', 'demo-agent', 'key', '{{content:read,site:read}}',
               now() + interval '1 hour', 'generic', '{did}', false, '{}')",
            operator_proof("demo", did)
        ))
        .unwrap();
    }

    /// As the operator: binds `did` to a demo connection, then revokes that connection.
    fn bind_then_revoke(did: &str) {
        let bound = json(&format!(
            "SELECT querylayer_api.create_connection('demo', 'demo-agent', 'key', '{{site:read}}',
               now() + interval '1 hour', 'generic', '{did}', false, '{}')",
            operator_proof("demo", did)
        ));
        let id = bound["connection_id"].as_str().unwrap();
        Spi::run(&format!("SELECT querylayer_api.revoke_connection('{id}')")).unwrap();
    }

    /// As the member in context (owner or admin of `site`): binds `did` with its holder's proof.
    fn console_bind(agent: &str, name: &str, did: &str, site: &str) -> String {
        let challenge = json(&format!("SELECT querylayer_api.console_create_did_challenge('{did}')"));
        let proof = querylayer_envelope::binding_proof(
            &signer_of(did),
            site,
            challenge["challenge"].as_str().unwrap(),
        );
        format!(
            "SELECT querylayer_api.console_create_connection('{agent}', '{name}', '{{site:read}}',
               now() + interval '1 hour', 'generic', '{did}', '{proof}')"
        )
    }

    fn now_rfc3339(offset_seconds: i64) -> String {
        text(&format!(
            "SELECT to_char((clock_timestamp() + interval '{offset_seconds} seconds') AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
        ))
    }

    fn mint_v2(created_at: &str, nonce: &str) -> (String, String) {
        use querylayer_envelope::{canonical, Envelope, Signer};
        let signer = Signer::from_seed_bytes(b"pg-test-key");
        let body = r#"{"question": "q"}"#;
        let payload = serde_json::json!({"bodySha256": canonical::sha256_hex(body.as_bytes())});
        let env = Envelope::mint_v2(
            &signer,
            "did:web:qg-server",
            "invoke",
            "/v1/answer",
            &payload,
            "POST",
            created_at,
            nonce,
        );
        (env.to_header_json(), signer.did_key())
    }

    #[pg_test]
    fn a_member_cannot_bind_a_did_key_another_organization_has_used() {
        let v1 = &envelope_vectors()["v1"];
        let (used, fresh) = (v1[0]["did_key"].as_str().unwrap(), v1[1]["did_key"].as_str().unwrap());
        assert_ne!(used, fresh);
        demo_secret();
        bind_then_revoke(used);
        Spi::run("SELECT querylayer_api.create_organization('o2')").unwrap();
        Spi::run("SELECT querylayer_api.create_site('o2', 's2')").unwrap();
        Spi::run("SELECT querylayer_api.create_member('o2', 'm2')").unwrap();
        Spi::run("SELECT querylayer_api.set_member_role('s2', 'm2', 'owner')").unwrap();
        Spi::run("SELECT querylayer_api.create_agent('o2', 'a2')").unwrap();
        Spi::run("SELECT querylayer_api.grant_agent_scopes('s2', 'a2', '{site:read}')").unwrap();
        let token =
            json("SELECT querylayer_api.create_member_token('s2', 'm2', 't', now() + interval '1 hour')");
        as_member(token["token"].as_str().unwrap());
        // Demo's key is not live any more, yet another organization's owner cannot take it over.
        expect_sqlstate(&console_bind("a2", "taken", used, "s2"), "QL409");
        let own = json(&console_bind("a2", "new key", fresh, "s2"));
        assert_eq!(own["did"], fresh);
    }

    #[pg_test]
    fn a_member_can_rebind_a_key_of_their_own_organization() {
        let used = envelope_vectors()["v1"][0]["did_key"].as_str().unwrap().to_string();
        let seeded = json("SELECT querylayer_api.seed_demo()");
        bind_then_revoke(&used);
        as_member(seeded["member_token"]["token"].as_str().unwrap());
        let again = json(&console_bind("demo-agent", "key again", &used, "demo"));
        assert_eq!(again["did"], used.as_str());
    }

    #[pg_test]
    fn an_unbound_key_is_refused_and_a_bound_key_acts_as_its_connection() {
        let v = &envelope_vectors()["v1"][1];
        let (header, path, body) =
            (v["header"].as_str().unwrap(), v["path"].as_str().unwrap(), v["body_utf8"].as_str().unwrap());
        let refused = authenticate_envelope(header, "POST", path, body);
        assert_eq!(refused["allowed"], false);
        assert_eq!(refused["error"], "envelope auth failed");
        assert_eq!(refused["checks"]["signatureValid"], true);
        assert_eq!(refused["checks"]["keyBound"], false);
        assert_eq!(refused["contract"]["header"], "x-qg-envelope");

        bind(v["did_key"].as_str().unwrap());
        let allowed = authenticate_envelope(header, "POST", path, body);
        assert_eq!(allowed["allowed"], true, "{allowed}");
        assert_eq!(allowed["context"]["site"], "demo");
        assert_eq!(allowed["context"]["connection"], "key");
        // The context serves the signed route only.
        expect_sqlstate("SELECT querylayer_api.site_context()", "QL403");

        let elsewhere = authenticate_envelope(header, "POST", "/v1/models/import/osi", body);
        assert_eq!(elsewhere["checks"]["resourceBoundToPath"], false);
        let swapped = authenticate_envelope(header, "POST", path, "{}");
        assert_eq!(swapped["checks"]["bodyBound"], false);
        let missing = json(
            "SELECT querylayer_api.authenticate_envelope(NULL, 'POST', '/v1/answer', sha256(''::bytea))",
        );
        assert_eq!(missing["error"], "missing x-qg-envelope header");
        assert_eq!(missing["checks"], Value::Null);
        let receipts =
            Spi::get_one::<i64>("SELECT count(*) FROM querylayer.envelope_receipts").unwrap().unwrap();
        assert_eq!(receipts, 5, "every decision is a receipt");
    }

    #[pg_test]
    fn v2_refuses_replays_and_stale_envelopes() {
        let (fresh, did) = mint_v2(&now_rfc3339(0), "nonce-aaaaaaaaaaaaaaaa");
        bind(&did);
        let body = r#"{"question": "q"}"#;
        assert_eq!(authenticate_envelope(&fresh, "POST", "/v1/answer", body)["allowed"], true);
        let replay = authenticate_envelope(&fresh, "POST", "/v1/answer", body);
        assert_eq!(replay["allowed"], false);
        assert_eq!(replay["checks"]["nonceUnused"], false);
        let (stale, _) = mint_v2(&now_rfc3339(-3600), "nonce-bbbbbbbbbbbbbbbb");
        let refused = authenticate_envelope(&stale, "POST", "/v1/answer", body);
        assert_eq!(refused["checks"]["fresh"], false);
        let (other, _) = mint_v2(&now_rfc3339(0), "nonce-cccccccccccccccc");
        assert_eq!(authenticate_envelope(&other, "PUT", "/v1/answer", body)["checks"]["methodBound"], false);
    }

    #[pg_test]
    fn operators_can_require_v2() {
        let v = &envelope_vectors()["v1"][1];
        bind(v["did_key"].as_str().unwrap());
        Spi::run("SELECT querylayer_api.set_setting('envelope_require_v2', 'true')").unwrap();
        let refused = authenticate_envelope(
            v["header"].as_str().unwrap(),
            "POST",
            v["path"].as_str().unwrap(),
            v["body_utf8"].as_str().unwrap(),
        );
        assert_eq!(refused["checks"]["profileAccepted"], false);
        assert_eq!(refused["allowed"], false);
    }

    #[pg_test]
    fn a_live_binding_cannot_be_taken_by_another_connection() {
        let v = &envelope_vectors()["v1"][1];
        let did = v["did_key"].as_str().unwrap();
        bind(did);
        expect_sqlstate(
            &format!("SELECT querylayer_api.create_connection('demo', 'demo-agent', 'key2', '{{site:read}}', now() + interval '1 hour', 'generic', '{did}')"),
            "QL409",
        );
    }
}

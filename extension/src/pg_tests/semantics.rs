//! The semantics plane (`sql/140_semantics.sql`, `semantic.rs`): answers, the story, signed
//! attestations, model validation.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{as_edge, authenticate, content_site, count, expect_sqlstate, json};
    use pgrx::prelude::*;

    #[pg_test]
    fn the_demo_question_reproduces_the_captured_run_and_signs_it() {
        let site = content_site();
        authenticate(&site.secret);
        let a = json("SELECT querylayer_api.answer_question('Where do fiscal capacity and energy burden overlap with health risk?')");
        assert_eq!(a["answer"], "Answerable from governed sources sail.qg_lakehouse.access_2018__access_data, sail.qg_lakehouse.government_finance__countydata via 3 planned queries. Restricted sources were denied with receipts: sail.qg_lakehouse.haalsi_baseline__restricted_raw.");
        assert_eq!(
            a["denied_sources"],
            serde_json::json!(["sail.qg_lakehouse.haalsi_baseline__restricted_raw"])
        );
        assert_eq!(a["plans"].as_array().unwrap().len(), 3);
        let receipts = Spi::get_one::<i64>(
            "SELECT count(*) FROM querylayer.access_receipts WHERE decided_for = 'answer'",
        )
        .unwrap()
        .unwrap();
        assert_eq!(receipts, 3);
        let denied = Spi::get_one::<i64>("SELECT count(*) FROM querylayer.access_receipts WHERE NOT allowed")
            .unwrap()
            .unwrap();
        assert_eq!(denied, 1);
        // The attestation verifies against the published key over the stored event bytes, and
        // fails once any byte changes.
        let ok = Spi::get_one::<bool>(
            "SELECT querylayer.attestation_valid(a.attestation, e.event::text, k.did_key)
               FROM querylayer.lineage_events e JOIN querylayer.attestations a ON a.lineage_event_id = e.id
               JOIN querylayer.server_keys k ON k.id = a.server_key_id",
        )
        .unwrap()
        .unwrap();
        assert!(ok);
        let tampered = Spi::get_one::<bool>(
            "SELECT querylayer.attestation_valid(a.attestation, replace(e.event::text, 'COMPLETE', 'COMPLETF'), k.did_key)
               FROM querylayer.lineage_events e JOIN querylayer.attestations a ON a.lineage_event_id = e.id
               JOIN querylayer.server_keys k ON k.id = a.server_key_id",
        ).unwrap().unwrap();
        assert!(!tampered);
    }

    #[pg_test]
    fn the_story_denies_the_restricted_broker_only() {
        let site = content_site();
        authenticate(&site.secret);
        let story = json("SELECT querylayer_api.run_qglake_story()");
        let statuses: Vec<(String, String)> = story["responses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["agent"].as_str().unwrap().to_string(), r["status"].as_str().unwrap().to_string()))
            .collect();
        let denied: Vec<&str> =
            statuses.iter().filter(|(_, s)| s == "denied").map(|(a, _)| a.as_str()).collect();
        assert_eq!(denied, ["RestrictedDataBroker"]);
        assert_eq!(count("lineage_events"), 6);
        assert_eq!(count("attestations"), 6);
    }

    #[pg_test]
    fn every_specialists_story_attestation_verifies_against_the_server_key() {
        let site = content_site();
        authenticate(&site.secret);
        let story = json("SELECT querylayer_api.run_qglake_story()");
        let specialists =
            Spi::get_one::<i32>("SELECT jsonb_array_length(querylayer.story_roster()->'specialists')")
                .unwrap()
                .unwrap() as i64;
        assert!(specialists > 1, "the roster has several specialists");
        assert_eq!(story["responses"].as_array().unwrap().len() as i64, specialists);
        let server_did = story["server_did"].as_str().unwrap();
        assert_eq!(json("SELECT querylayer_api.server_keys()")["current"], server_did);
        // The same check the answer test makes, over every story row, against the key the story
        // names and against the key each attestation row points to.
        let checked = json(&format!(
            "SELECT jsonb_build_object(
                 'rows', count(*),
                 'agents', count(DISTINCT e.story_agent),
                 'valid', count(*) FILTER (WHERE querylayer.attestation_valid(a.attestation, e.event::text, k.did_key)
                                             AND querylayer.attestation_valid(a.attestation, e.event::text, '{server_did}')),
                 'tampered_valid', count(*) FILTER (WHERE querylayer.attestation_valid(
                                             a.attestation, replace(e.event::text, 'COMPLETE', 'COMPLETF'), k.did_key)))
               FROM querylayer.lineage_events e JOIN querylayer.attestations a ON a.lineage_event_id = e.id
               JOIN querylayer.server_keys k ON k.id = a.server_key_id
              WHERE e.story_agent IS NOT NULL"
        ));
        assert_eq!(checked["rows"], specialists, "{checked}");
        assert_eq!(checked["agents"], specialists, "one attested event per specialist: {checked}");
        assert_eq!(checked["valid"], specialists, "every attestation verifies: {checked}");
        assert_eq!(checked["tampered_valid"], 0, "{checked}");
    }

    #[pg_test]
    fn rotating_the_server_key_keeps_earlier_attestations_verifiable() {
        let site = content_site();
        authenticate(&site.secret);
        json("SELECT querylayer_api.answer_question('fiscal capacity')");
        let before = json("SELECT querylayer_api.server_keys()")["current"].clone();
        json("SELECT querylayer_api.rotate_server_key()");
        let keys = json("SELECT querylayer_api.server_keys()");
        assert_ne!(keys["current"], before);
        let ok = Spi::get_one::<bool>(&format!(
            "SELECT querylayer.attestation_valid(a.attestation, e.event::text, '{}')
               FROM querylayer.lineage_events e JOIN querylayer.attestations a ON a.lineage_event_id = e.id",
            before.as_str().unwrap()
        ))
        .unwrap()
        .unwrap();
        assert!(ok);
        as_edge();
        expect_sqlstate("SELECT secret FROM querylayer.server_keys", "42501");
    }

    #[pg_test]
    fn an_invalid_model_is_refused_with_the_offending_path() {
        let site = content_site();
        authenticate(&site.secret);
        let err = Spi::get_one::<String>(
            "DO $t$ BEGIN PERFORM querylayer_api.import_semantic_model('{\"semantic_model\": {\"name\": \"m\", \"datasets\": [{\"name\": \"d\"}]}}');
             EXCEPTION WHEN SQLSTATE '22023' THEN PERFORM set_config('ql.test', SQLERRM, true); END $t$;
             SELECT current_setting('ql.test')",
        ).unwrap().unwrap();
        assert!(err.contains("semantic_model.datasets[0].source"), "{err}");
    }
}

//! Idempotency keys (`sql/155_idempotency.sql`).

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{authenticate, demo, failure, json, other_agent};
    use pgrx::prelude::*;
    use serde_json::Value;

    #[pg_test]
    fn a_key_answers_its_first_request_and_refuses_any_other() {
        let (secret, _) = demo();
        authenticate(&secret);
        let first = json("SELECT coalesce(querylayer_api.claim_idempotency_key('k-1', 'querylayer_begin_run', sha256('a')), 'null')");
        assert_eq!(first, Value::Null, "a new key goes ahead");
        Spi::run("SELECT querylayer_api.store_idempotent_response('k-1', '{\"run_id\": \"r\", \"secret\": \"s\"}')").unwrap();
        let again =
            json("SELECT querylayer_api.claim_idempotency_key('k-1', 'querylayer_begin_run', sha256('a'))");
        assert_eq!(again["response"]["run_id"], "r");
        assert_eq!(again["response"]["secret"], Value::Null, "a stored answer never keeps a secret");
        let (state, message) = failure(
            "SELECT querylayer_api.claim_idempotency_key('k-1', 'querylayer_begin_run', sha256('b'))",
        );
        assert_eq!(state, "QLI09", "{message}");
        let (state, _) = failure(
            "SELECT querylayer_api.claim_idempotency_key('k-1', 'querylayer_finish_run', sha256('a'))",
        );
        assert_eq!(state, "QLI09", "another tool under the same key");
        let (state, _) =
            failure("SELECT querylayer_api.claim_idempotency_key('has space', 'x', sha256('a'))");
        assert_eq!(state, "22023");
    }

    #[pg_test]
    fn keys_belong_to_their_principal_and_expire() {
        let (secret, _) = demo();
        let other = other_agent();
        authenticate(&secret);
        Spi::run("SELECT querylayer_api.claim_idempotency_key('shared', 'a', sha256('a'))").unwrap();
        Spi::run("SELECT querylayer_api.store_idempotent_response('shared', '1')").unwrap();
        authenticate(&other);
        let theirs =
            json("SELECT coalesce(querylayer_api.claim_idempotency_key('shared', 'a', sha256('b')), 'null')");
        assert_eq!(theirs, Value::Null, "another connection's key of the same name is its own");
        // Past its window a key is reclaimed by retention.
        Spi::run("UPDATE querylayer.idempotency_keys SET expires_at = now() - interval '1 second'").unwrap();
        let retention = json("SELECT querylayer_api.apply_retention()");
        assert_eq!(retention["idempotency_keys_deleted"], 2);
    }
}

//! Limits decided in the database for every edge at once (`sql/157_rate.sql`): token buckets
//! (a connection's rate, an address's failed authentications, its client registrations) and a
//! connection's budgets, spent where the scope is checked.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{
        as_edge, as_member, authenticate, demo, expect_sqlstate, failure, json, text,
    };
    use pgrx::prelude::*;

    fn take(kind: &str, key: &str, rate: f64, burst: f64) -> i32 {
        Spi::get_one::<i32>(&format!("SELECT querylayer.take_token('{kind}', '{key}', {rate}, {burst})"))
            .unwrap()
            .unwrap()
    }

    #[pg_test]
    fn the_resolver_for_objects_before_budgets_names_no_budget_table() {
        // Between a package upgrade and ALTER EXTENSION UPDATE the new library resolves
        // connections against 0.3.0's objects, which have no connection_budgets.
        let before = crate::context::RESOLVE_CONNECTION_BEFORE_BUDGETS.as_str();
        assert!(!before.contains("connection_budgets") && !before.contains("has_budgets"), "{before}");
        assert!(before.contains("'harness', c.harness,") && before.contains("'expires_at', c.expires_at"));
    }

    #[pg_test]
    fn a_bucket_admits_its_burst_then_says_how_long_to_wait() {
        for _ in 0..3 {
            assert_eq!(take("connection", "c1", 0.5, 3.0), 0);
        }
        assert_eq!(take("connection", "c1", 0.5, 3.0), 2, "one token every two seconds");
        assert_eq!(take("connection", "c2", 0.5, 3.0), 0, "buckets are per key");
        assert_eq!(take("connection", "c1", 0.0, 3.0), 0, "a rate of 0 admits everything");
        // Asking takes nothing.
        let wait = |key: &str| {
            Spi::get_one::<i32>(&format!("SELECT querylayer_api.peer_failure_wait('{key}', 0.5, 2)"))
                .unwrap()
                .unwrap()
        };
        assert_eq!(wait("192.0.2.9"), 0);
        assert_eq!(text("SELECT querylayer_api.spend_peer_failure('192.0.2.9', 0.5, 2)::text"), "0");
        assert_eq!(text("SELECT querylayer_api.spend_peer_failure('192.0.2.9', 0.5, 2)::text"), "2");
        assert_eq!(wait("192.0.2.9"), 2);
    }

    #[pg_test]
    fn the_edges_authentication_refuses_a_spent_address_and_takes_the_connections_token() {
        let (secret, _) = demo();
        let fp = format!("sha256(convert_to('{secret}', 'UTF8'))");
        for _ in 0..2 {
            Spi::run("SELECT querylayer_api.spend_peer_failure('198.51.100.7', 0.01, 2)").unwrap();
        }
        let (code, message) =
            failure(&format!("SELECT querylayer_api.authenticate_edge({fp}, '198.51.100.7', 0.01, 2, 0, 0)"));
        assert_eq!(code, "QL429", "even the right credential, from a spent address: {message}");
        // From another address: admitted, and its connection's bucket (burst 1) is spent after one.
        json(&format!("SELECT querylayer_api.authenticate_edge({fp}, '198.51.100.8', 0.01, 2, 0.01, 1)"));
        let (code, message) = failure(&format!(
            "SELECT querylayer_api.open_tool_call({fp}, 'querylayer_site_context', NULL, NULL, 0.01, 1)"
        ));
        assert_eq!(code, "QL429", "{message}");
        assert!(message.contains("this connection"), "{message}");
    }

    #[pg_test]
    fn a_budget_refuses_the_call_past_it_and_a_refused_call_spends_nothing() {
        let (secret, owner) = demo();
        let connection = authenticate(&secret)["connection_id"].as_str().unwrap().to_string();
        Spi::run(&format!(
            "SELECT querylayer_api.set_connection_budget('demo', '{connection}', 'runs:write', 'hour', 2)"
        ))
        .unwrap();
        Spi::run(&format!(
            "SELECT querylayer_api.set_connection_budget('demo', '{connection}', '*write', 'day', 100)"
        ))
        .unwrap();
        // A budget is seen at authentication; two runs, then the third is refused.
        authenticate(&secret);
        json("SELECT querylayer_api.begin_run('budget.one')");
        json("SELECT querylayer_api.begin_run('budget.two')");
        let (code, message) = failure("SELECT querylayer_api.begin_run('budget.three')");
        assert_eq!(code, "QL429", "{message}");
        assert!(message.contains("budget of 2 calls per hour"), "{message}");
        let detail = text(
            "DO $t$ BEGIN PERFORM querylayer_api.begin_run('budget.four');
               EXCEPTION WHEN SQLSTATE 'QL429' THEN
                 DECLARE d text; BEGIN GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL;
                   PERFORM set_config('ql.test', d, true); END;
             END $t$;
             SELECT current_setting('ql.test')",
        );
        assert!(detail.starts_with("retry_after="), "{detail}");
        // Reads are not spent; the refused calls spent nothing (their statements rolled back).
        json("SELECT querylayer_api.site_context()");
        as_member(&owner);
        let listed = json("SELECT querylayer_api.console_list_connections()");
        let mine = listed["connections"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["connection_id"] == connection.as_str())
            .unwrap()
            .clone();
        let budgets = mine["budgets"].as_array().unwrap();
        let hourly = budgets.iter().find(|b| b["scope"] == "runs:write").unwrap();
        let daily = budgets.iter().find(|b| b["scope"] == "*write").unwrap();
        assert_eq!((hourly["used"].clone(), hourly["max_calls"].clone()), (2.into(), 2.into()), "{mine}");
        assert_eq!(daily["used"], 2, "{mine}");
        // The owner raises it; an editor may not; the edge role cannot reach the tables.
        json(&format!(
            "SELECT querylayer_api.console_set_connection_budget('{connection}', 'runs:write', 'hour', 3)"
        ));
        authenticate(&secret);
        json("SELECT querylayer_api.begin_run('budget.three')");
        let audited =
            text("SELECT count(*)::text FROM querylayer.audit_events WHERE action = 'connection.budget'");
        assert_eq!(audited, "3");
        expect_sqlstate(
            &format!("SELECT querylayer_api.set_connection_budget('demo', '{connection}', 'nope:scope', 'hour', 1)"),
            "22023",
        );
        as_edge();
        expect_sqlstate("SELECT count(*) FROM querylayer.connection_budgets", "42501");
        expect_sqlstate("DELETE FROM querylayer.connection_budget_use", "42501");
        expect_sqlstate("SELECT count(*) FROM querylayer.rate_buckets", "42501");
    }

    #[pg_test]
    fn registrations_from_one_address_are_limited() {
        let register = |peer: &str| {
            failure(&format!(
                "SELECT querylayer_api.oauth_register_client('r', ARRAY['http://127.0.0.1:9/cb'], '{peer}', 0.01, 2)"
            ))
        };
        assert_eq!(register("203.0.113.5").0, "none");
        assert_eq!(register("203.0.113.5").0, "none");
        assert_eq!(register("203.0.113.5").0, "QL429");
        assert_eq!(register("203.0.113.6").0, "none", "per address");
    }
}

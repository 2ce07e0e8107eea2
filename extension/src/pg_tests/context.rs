//! Roles, schemas and the request context (`sql/000_bootstrap.sql`, `sql/010_context.sql`):
//! what the edge role can reach, and what an authenticated context holds.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{as_edge, authenticate, demo, demo_secret, failure, json, text};
    use pgrx::prelude::*;

    #[pg_test]
    fn creates_private_schema_api_schema_and_roles() {
        let owner = text(
            "SELECT format('%s/%s/%s', rolcanlogin, rolbypassrls, rolsuper) FROM pg_roles WHERE rolname = 'querylayer_owner'",
        );
        assert_eq!(owner, "f/f/f");
        let edge = text(
            "SELECT format('%s/%s', rolbypassrls, rolsuper) FROM pg_roles WHERE rolname = 'querylayer_edge'",
        );
        assert_eq!(edge, "f/f");
        assert!(Spi::get_one::<bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'querylayer_admin')"
        )
        .unwrap()
        .unwrap());
        let definers = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'querylayer_api'::regnamespace
              AND (NOT prosecdef OR proowner <> 'querylayer_owner'::regrole
                   OR NOT ('search_path=pg_catalog, pg_temp' = ANY (proconfig)))",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            definers, 0,
            "every API function is SECURITY DEFINER, owned by querylayer_owner, with a pinned search_path"
        );
    }

    #[pg_test]
    fn edge_role_holds_no_privilege_on_any_table() {
        let granted = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_class c
              WHERE c.relnamespace = 'querylayer'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S')
                AND (has_table_privilege('querylayer_edge', c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
                     OR has_schema_privilege('querylayer_edge', 'querylayer', 'USAGE'))",
        )
        .unwrap()
        .unwrap();
        assert_eq!(granted, 0);
        let callable = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'querylayer'::regnamespace
              AND has_function_privilege('querylayer_edge', oid, 'EXECUTE')",
        )
        .unwrap()
        .unwrap();
        assert_eq!(callable, 0, "no internal function is executable by the edge");
    }

    #[pg_test(error = "permission denied for schema querylayer")]
    fn edge_role_cannot_read_a_table() {
        as_edge();
        Spi::run("SELECT * FROM querylayer.connections").unwrap();
    }

    #[pg_test(error = "permission denied for function create_connection")]
    fn edge_role_cannot_call_operator_functions() {
        as_edge();
        Spi::run("SELECT querylayer_api.create_connection('demo', 'demo-agent', 'x', '{site:read}', now() + interval '1 hour')").unwrap();
    }

    #[pg_test]
    fn the_edge_role_cannot_call_worker_or_retention_functions() {
        demo();
        Spi::run("SET LOCAL ROLE querylayer_edge").unwrap();
        for sql in [
            "SELECT querylayer_api.worker_close_expired_runs()",
            "SELECT querylayer_api.apply_retention()",
            "SELECT querylayer_api.cancel_run('demo', gen_random_uuid())",
            "SELECT querylayer.drop_time_partition('querylayer.audit_events_default')",
        ] {
            assert_eq!(failure(sql).0, "42501", "{sql}");
        }
    }

    #[pg_test(error = "no authenticated connection in this transaction")]
    fn settings_do_not_create_a_context() {
        demo_secret();
        as_edge();
        Spi::run("SELECT set_config('querylayer.site_id', gen_random_uuid()::text, true)").unwrap();
        Spi::run("SET LOCAL querylayer.connection_id = 'x'").unwrap();
        Spi::run("SELECT querylayer_api.begin_run('article.draft')").unwrap();
    }

    #[pg_test]
    fn authenticated_context_names_site_agent_and_scopes() {
        let secret = demo_secret();
        as_edge();
        let ctx = authenticate(&secret);
        assert_eq!(ctx["site"], "demo");
        assert_eq!(ctx["agent"], "demo-agent");
        assert_eq!(ctx["scopes"].as_array().unwrap().len(), 8);
        let site = json("SELECT querylayer_api.site_context()");
        assert_eq!(site["site"]["slug"], "demo");
        assert!(!site.to_string().contains(&secret[12..]), "the secret never comes back");
    }

    #[pg_test(
        error = "this transaction already carries a request context; authenticate once per transaction"
    )]
    fn edge_cannot_switch_principal_within_a_transaction() {
        let secret = demo_secret();
        as_edge();
        authenticate(&secret);
        authenticate(&secret);
    }

    #[pg_test]
    fn every_list_refuses_a_limit_outside_its_range_with_the_same_sqlstate_and_message() {
        let secret = demo_secret();
        let expected = ("22023".to_string(), "limit must be between 1 and 500".to_string());
        // The operator's lists (as the superuser, an operator).
        for limit in [0, 501] {
            for list in [
                format!("SELECT * FROM querylayer_api.list_audit('demo', {limit})"),
                format!("SELECT * FROM querylayer_api.list_envelope_receipts(NULL, {limit})"),
                format!("SELECT * FROM querylayer_api.list_retention_drops({limit})"),
            ] {
                assert_eq!(failure(&list), expected, "{list}");
            }
        }
        Spi::run("SELECT * FROM querylayer_api.list_audit('demo', 500)").unwrap();
        // The agent's lists: list_lineage refuses as list_runs does.
        authenticate(&secret);
        for limit in [0, 501] {
            let runs = failure(&format!("SELECT querylayer_api.list_runs({limit})"));
            assert_eq!(runs, expected);
            assert_eq!(failure(&format!("SELECT querylayer_api.list_lineage(NULL, {limit})")), runs);
        }
        Spi::run("SELECT querylayer_api.list_lineage(NULL, 500)").unwrap();
    }
}

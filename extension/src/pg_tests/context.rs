//! Roles, schemas and the request context (`sql/000_bootstrap.sql`, `sql/010_context.sql`):
//! what the edge role can reach, and what an authenticated context holds.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{
        as_edge, as_owner, authenticate, demo, demo_secret, failure, fingerprint, json, text,
    };
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

    /// `ctx_connection_holds` is the fast path of `require_connection_for`: it may say "passes"
    /// only where the full check passes with nothing to do. (An envelope context and a budget take
    /// the full check: envelopes.rs and rate.rs show them refused and spent through
    /// `require_connection`; an expired credential, the next test.)
    #[pg_test]
    fn the_fast_path_of_require_connection_holds_only_where_the_full_check_passes() {
        let secret = demo_secret();
        let holds = |scope: &str| {
            Spi::get_one::<bool>(&format!("SELECT querylayer.ctx_connection_holds({scope})"))
                .unwrap()
                .unwrap()
        };
        as_owner();
        assert!(!holds("NULL") && !holds("'content:read'"), "no context holds nothing");
        let (code, message) = failure("SELECT querylayer.require_connection('content:read')");
        assert_eq!(
            (code.as_str(), message.as_str()),
            ("QL401", "no authenticated connection in this transaction")
        );

        Spi::run("RESET ROLE").unwrap();
        as_edge();
        authenticate(&secret);
        as_owner();
        assert!(holds("NULL"));
        let scopes = json("SELECT to_jsonb(array_agg(scope)) FROM querylayer.scopes");
        for scope in scopes.as_array().unwrap() {
            let scope = scope.as_str().unwrap();
            let held = text(&format!("SELECT ('{scope}' = ANY (querylayer.ctx_scopes()))::text")) == "true";
            assert_eq!(holds(&format!("'{scope}'")), held, "{scope}");
            Spi::run(&format!("SELECT querylayer.require_connection('{scope}')")).unwrap();
        }
        assert!(!holds("'no:such'"));
        let (code, message) = failure("SELECT querylayer.require_connection('no:such')");
        assert_eq!(code, "QL403");
        assert_eq!(message, "this connection does not hold the scope no:such");
    }

    /// A verdict kept in this backend (context.rs, "Kept verdicts") is taken up again only while
    /// nothing it was decided from has changed: each change below, made after the verdict was
    /// kept, is seen by the very next authentication, and a change rolled back leaves no trace.
    #[pg_test]
    fn a_kept_verdict_gives_way_to_every_change_it_was_decided_from() {
        use crate::context::kept_verdicts_taken_up as taken_up;
        let secret = demo_secret();
        let scopes = |v: &serde_json::Value| -> Vec<String> {
            v["scopes"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()
        };
        let first = authenticate(&secret);
        let before = taken_up();
        assert_eq!(authenticate(&secret), first);
        assert_eq!(taken_up(), before + 1, "the second authentication takes up the kept verdict");

        // Each statement on a table the verdict reads moves the generation: the next
        // authentication decides again, and keeps what it decided.
        Spi::run("SELECT querylayer_api.rename_agent_profile('demo-profile-0001', 'Renamed writer')")
            .unwrap();
        let renamed = authenticate(&secret);
        assert_eq!(renamed["profile_name"], "Renamed writer");
        assert_eq!(taken_up(), before + 1, "decided again after the rename");
        assert_eq!(authenticate(&secret), renamed);
        assert_eq!(taken_up(), before + 2);

        Spi::run("SELECT querylayer_api.revoke_agent_scopes('demo', 'demo-agent', '{runs:write}')").unwrap();
        let narrowed = authenticate(&secret);
        assert!(scopes(&first).contains(&"runs:write".to_string()));
        assert!(!scopes(&narrowed).contains(&"runs:write".to_string()), "{narrowed}");

        // A permission granted, and a verdict kept on it, inside a subtransaction that rolls
        // back: the generation that verdict was kept at is never committed, nor drawn again.
        Spi::run(&format!(
            "DO $t$ BEGIN
               PERFORM querylayer_api.grant_agent_scopes('demo', 'demo-agent', '{{runs:write}}');
               PERFORM querylayer_api.authenticate({fp});
               IF NOT 'runs:write' = ANY (querylayer.ctx_scopes()) THEN
                   RAISE EXCEPTION 'the scope granted in this subtransaction is missing';
               END IF;
               RAISE EXCEPTION 'roll back' USING ERRCODE = 'QLT01';
             EXCEPTION WHEN SQLSTATE 'QLT01' THEN NULL; END $t$",
            fp = fingerprint(&secret)
        ))
        .unwrap();
        let after_rollback = authenticate(&secret);
        assert!(!scopes(&after_rollback).contains(&"runs:write".to_string()), "{after_rollback}");

        // A budget (the scope checks spend it) and, last, the revocation.
        let connection = first["connection_id"].as_str().unwrap().to_string();
        authenticate(&secret);
        assert!(!Spi::get_one::<bool>("SELECT querylayer.ctx_has_budgets()").unwrap().unwrap());
        Spi::run(&format!(
            "SELECT querylayer_api.set_connection_budget('demo', '{connection}', 'content:read', 'hour', 100)"
        ))
        .unwrap();
        authenticate(&secret);
        assert!(Spi::get_one::<bool>("SELECT querylayer.ctx_has_budgets()").unwrap().unwrap());
        Spi::run(&format!("SELECT querylayer_api.revoke_connection('{connection}', 'lost')")).unwrap();
        let (code, message) =
            failure(&format!("SELECT querylayer_api.authenticate({})", fingerprint(&secret)));
        assert_eq!((code.as_str(), message.as_str()), ("28000", "authentication failed"));
    }

    /// The secret of a demo connection that expires one second from now.
    fn connection_of_one_second() -> String {
        demo_secret();
        json(
            "SELECT querylayer_api.create_connection('demo', 'demo-agent', 'brief', ARRAY['content:read'],
                                                     clock_timestamp() + interval '1 second')",
        )["secret"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// A kept verdict ends with its credential: one that expires while kept is refused.
    #[pg_test]
    fn a_kept_verdict_is_not_taken_up_past_its_credential_s_expiry() {
        use crate::context::kept_verdicts_taken_up as taken_up;
        let secret = connection_of_one_second();
        authenticate(&secret);
        let before = taken_up();
        authenticate(&secret);
        assert_eq!(taken_up(), before + 1);
        Spi::run("SELECT pg_sleep(1.2)").unwrap();
        let (code, message) =
            failure(&format!("SELECT querylayer_api.authenticate({})", fingerprint(&secret)));
        assert_eq!((code.as_str(), message.as_str()), ("28000", "authentication failed"));
        assert_eq!(taken_up(), before + 1);
    }

    #[pg_test]
    fn a_credential_that_expires_during_its_transaction_is_refused_at_the_next_guard() {
        let secret = connection_of_one_second();
        as_edge();
        authenticate(&secret);
        Spi::run("SELECT querylayer_api.list_content(p_limit => 1)").unwrap();
        Spi::run("SELECT pg_sleep(1.2)").unwrap();
        let (code, message) = failure("SELECT querylayer_api.list_content(p_limit => 1)");
        assert_eq!(code, "28000");
        assert_eq!(message, "the credential of this transaction has expired");
        // The guard itself, which the call above might not have reached first.
        as_owner();
        let (code, message) = failure("SELECT querylayer.require_connection('content:read')");
        assert_eq!(
            (code.as_str(), message.as_str()),
            ("28000", "the credential of this transaction has expired")
        );
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

    /// Every function of the schemas pins its search_path (sql/990_privileges.sql), so an
    /// SQL-language one would never be inlined and would be parsed and planned again in every
    /// transaction that calls it: the schemas hold none. A tool call's statement, the run
    /// workflow, drafts, the lists and an answer, counted as they run, call none either.
    #[pg_test]
    fn the_schemas_hold_no_sql_language_function_and_a_request_calls_none() {
        let functions = |condition: &str| {
            text(&format!(
                "SELECT coalesce(string_agg(p.oid::regprocedure::text, ', ' ORDER BY p.oid::regprocedure::text), '')
                   FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                  WHERE p.pronamespace IN ('querylayer'::regnamespace, 'querylayer_api'::regnamespace) AND {condition}"
            ))
        };
        assert_eq!(functions("l.lanname = 'sql'"), "", "SQL-language functions of the schemas");
        let (secret, _) = demo();
        let fp = fingerprint(&secret);
        Spi::run("SET LOCAL track_functions = 'all'").unwrap();
        json(&format!(
            "SELECT querylayer_api.close_tool_call(o, to_jsonb(querylayer_api.list_content(p_limit => 1)), 0)
               FROM querylayer_api.open_tool_call({fp}, 'querylayer_list_content') AS o"
        ));
        authenticate(&secret);
        let run = json("SELECT querylayer_api.begin_run('sql.functions')");
        let run_id = run["run_id"].as_str().unwrap();
        json(&format!("SELECT querylayer_api.record_artifact('{run_id}', 'k', '{{\"words\": 1}}')"));
        let draft = json(&format!(
            "SELECT querylayer_api.create_draft('{run_id}', 'article', '{{\"title\": \"T\", \"body\": \"B\"}}', NULL, 'sql-functions')"
        ));
        json(&format!(
            "SELECT querylayer_api.create_draft('{run_id}', 'article', '{{\"title\": \"T2\", \"body\": \"B2\"}}', '{}')",
            draft["content_id"].as_str().unwrap()
        ));
        json(&format!(
            "SELECT querylayer_api.create_draft('{run_id}', 'article', '{{\"title\": \"U\", \"body\": \"B\"}}', NULL, 'sql-functions-2')"
        ));
        json("SELECT querylayer_api.begin_run('sql.functions.two')");
        for list in ["list_content(p_limit => 1)", "list_runs(p_limit => 1)"] {
            let page = json(&format!("SELECT querylayer_api.{list}"));
            assert!(page["next_cursor"].is_string(), "{list} has a next page: {page}");
        }
        json(&format!("SELECT querylayer_api.finish_run('{run_id}', 'completed', 'done')"));
        json("SELECT querylayer_api.answer_question('Where do fiscal capacity and energy burden overlap with health risk?')");
        // The count is live: the PL/pgSQL functions the calls ran are in it, and nothing else.
        let called = functions("pg_stat_get_xact_function_calls(p.oid) > 0");
        for f in [
            "querylayer_api.record_artifact(",
            "querylayer.next_cursor(",
            "querylayer.content_json_list(",
            "querylayer.run_json_list(",
            "querylayer.content_state(",
            "querylayer.chain_append(",
            "querylayer.enforce_value_limits(",
        ] {
            assert!(called.contains(f), "{f} is counted: {called}");
        }
        assert_eq!(
            functions("pg_stat_get_xact_function_calls(p.oid) > 0 AND l.lanname NOT IN ('plpgsql', 'c')"),
            ""
        );
    }
}

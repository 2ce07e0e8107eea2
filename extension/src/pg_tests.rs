//! In-database tests: each runs inside one transaction that is rolled back. They try to break
//! the invariants from inside PostgreSQL — as the edge role, as the table owner, as a superuser.
//! What needs several transactions or real logins lives in the client-side tier (`tests/`).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;
    use pgrx::JsonB;
    use serde_json::Value;

    fn json(sql: &str) -> Value {
        Spi::get_one::<JsonB>(sql).expect("query failed").expect("NULL result").0
    }

    fn text(sql: &str) -> String {
        Spi::get_one::<String>(sql).expect("query failed").expect("NULL result")
    }

    /// Seeds the demo (as the superuser, an operator) and returns its connection secret.
    fn demo_secret() -> String {
        let seeded = json("SELECT querylayer_api.seed_demo()");
        seeded["connection"]["secret"].as_str().unwrap().to_string()
    }

    fn authenticate(secret: &str) -> Value {
        json(&format!(
            "SELECT querylayer_api.authenticate(sha256(convert_to('{secret}', 'UTF8')))"
        ))
    }

    /// Runs `sql` and requires it to fail with `sqlstate` (a subtransaction catches the error, so
    /// the test can go on).
    fn expect_sqlstate(sql: &str, sqlstate: &str) {
        Spi::run(&format!(
            "DO $t$ BEGIN EXECUTE $q${sql}$q$;
               RAISE EXCEPTION 'expected SQLSTATE {sqlstate}, but the statement succeeded' USING ERRCODE = 'XX000';
             EXCEPTION WHEN SQLSTATE '{sqlstate}' THEN NULL; END $t$"
        ))
        .unwrap();
    }

    fn as_edge() {
        Spi::run("SET LOCAL ROLE querylayer_edge").unwrap();
    }

    fn as_owner() {
        Spi::run("SET LOCAL ROLE querylayer_owner").unwrap();
    }

    #[pg_test]
    fn creates_private_schema_api_schema_and_roles() {
        let owner = text(
            "SELECT format('%s/%s/%s', rolcanlogin, rolbypassrls, rolsuper) FROM pg_roles WHERE rolname = 'querylayer_owner'",
        );
        assert_eq!(owner, "f/f/f");
        let edge = text("SELECT format('%s/%s', rolbypassrls, rolsuper) FROM pg_roles WHERE rolname = 'querylayer_edge'");
        assert_eq!(edge, "f/f");
        assert!(Spi::get_one::<bool>("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'querylayer_admin')").unwrap().unwrap());
        let definers = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'querylayer_api'::regnamespace
              AND (NOT prosecdef OR proowner <> 'querylayer_owner'::regrole
                   OR NOT ('search_path=pg_catalog, pg_temp' = ANY (proconfig)))",
        )
        .unwrap()
        .unwrap();
        assert_eq!(definers, 0, "every API function is SECURITY DEFINER, owned by querylayer_owner, with a pinned search_path");
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

    #[pg_test(error = "no authenticated connection in this transaction")]
    fn settings_do_not_create_a_context() {
        demo_secret();
        as_edge();
        Spi::run("SELECT set_config('querylayer.site_id', gen_random_uuid()::text, true)").unwrap();
        Spi::run("SET LOCAL querylayer.connection_id = 'x'").unwrap();
        Spi::run("SELECT querylayer_api.begin_run('article.draft')").unwrap();
    }

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

    #[pg_test(error = "this transaction already carries a request context; authenticate once per transaction")]
    fn edge_cannot_switch_principal_within_a_transaction() {
        let secret = demo_secret();
        as_edge();
        authenticate(&secret);
        authenticate(&secret);
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
    fn missing_required_outputs_block_the_run_whatever_the_client_asks() {
        let secret = demo_secret();
        as_edge();
        authenticate(&secret);
        let run = json("SELECT querylayer_api.begin_run('article.draft', '{\"topic\": \"x\"}', '{draft_id,summary}', '{\"a draft exists\"}')");
        let id = run["run_id"].as_str().unwrap();
        Spi::run(&format!("SELECT querylayer_api.record_artifact('{id}', 'summary', '\"done\"')")).unwrap();
        let finished = json(&format!("SELECT querylayer_api.finish_run('{id}', 'completed', 'all good')"));
        assert_eq!(finished["outcome"], "blocked");
        assert_eq!(finished["requested_outcome"], "completed");
        assert_eq!(finished["reason_code"], "missing_required_outputs");
        assert_eq!(finished["missing_outputs"], serde_json::json!(["draft_id"]));
    }

    #[pg_test]
    fn finished_run_accepts_nothing() {
        let secret = demo_secret();
        as_edge();
        authenticate(&secret);
        let run = json("SELECT querylayer_api.begin_run('article.draft')");
        let id = run["run_id"].as_str().unwrap();
        Spi::run(&format!("SELECT querylayer_api.finish_run('{id}', 'failed')")).unwrap();
        expect_sqlstate(&format!("SELECT querylayer_api.record_artifact('{id}', 'late', '1')"), "QL410");
        expect_sqlstate(&format!("SELECT querylayer_api.finish_run('{id}', 'completed')"), "QL410");
    }

    #[pg_test(error = "querylayer.run_events is append-only: UPDATE is refused")]
    fn owner_cannot_update_run_events() {
        let secret = demo_secret();
        authenticate(&secret);
        Spi::run("SELECT querylayer_api.begin_run('article.draft')").unwrap();
        as_owner();
        Spi::run("UPDATE querylayer.run_events SET summary = 'rewritten'").unwrap();
    }

    #[pg_test(error = "querylayer.run_artifacts is append-only: DELETE is refused")]
    fn superuser_in_replica_mode_cannot_delete_artifacts() {
        let secret = demo_secret();
        authenticate(&secret);
        let run = json("SELECT querylayer_api.begin_run('article.draft')");
        let id = run["run_id"].as_str().unwrap();
        Spi::run(&format!("SELECT querylayer_api.record_artifact('{id}', 'k', '1')")).unwrap();
        Spi::run("SET LOCAL session_replication_role = replica").unwrap();
        Spi::run("DELETE FROM querylayer.run_artifacts").unwrap();
    }

    #[pg_test(error = "querylayer.run_events is append-only: TRUNCATE is refused")]
    fn superuser_in_replica_mode_cannot_truncate_run_events() {
        Spi::run("SET LOCAL session_replication_role = replica").unwrap();
        Spi::run("TRUNCATE querylayer.run_events CASCADE").unwrap();
    }

    #[pg_test(error = "querylayer_owner may not run DDL (ALTER TABLE); schema changes go through extension upgrades")]
    fn owner_cannot_disable_the_append_only_triggers() {
        as_owner();
        Spi::run("ALTER TABLE querylayer.run_events DISABLE TRIGGER append_only_row").unwrap();
    }

    #[pg_test]
    fn chain_check_reports_a_record_edited_behind_the_triggers() {
        let secret = demo_secret();
        authenticate(&secret);
        let run = json("SELECT querylayer_api.begin_run('article.draft')");
        let id = run["run_id"].as_str().unwrap().to_string();
        for key in ["a", "b", "c"] {
            Spi::run(&format!("SELECT querylayer_api.record_artifact('{id}', '{key}', '1')")).unwrap();
        }
        let clean = json("SELECT querylayer_api.verify_ledger('demo')");
        assert_eq!(clean["ok"], true, "{clean}");
        // A superuser goes around the triggers and edits one artifact.
        Spi::run("ALTER TABLE querylayer.run_artifacts DISABLE TRIGGER append_only_row").unwrap();
        Spi::run("UPDATE querylayer.run_artifacts SET value = '2' WHERE key = 'b'").unwrap();
        let report = json("SELECT querylayer_api.verify_ledger('demo')");
        assert_eq!(report["ok"], false);
        assert_eq!(report["broken"]["table"], "querylayer.run_artifacts");
        assert_eq!(report["broken"]["problem"], "content does not match content_sha256 (record edited)");
    }

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
        let renames = Spi::get_one::<i64>("SELECT count(*) FROM querylayer.agent_profile_renames").unwrap().unwrap();
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

    #[pg_test]
    fn listing_connections_shows_no_secret_or_fingerprint() {
        let seeded = json("SELECT querylayer_api.seed_demo()");
        let secret = seeded["connection"]["secret"].as_str().unwrap();
        let listed = text("SELECT jsonb_agg(to_jsonb(c))::text FROM querylayer_api.list_connections('demo') c");
        assert!(!listed.contains(secret));
        assert!(!listed.contains(&secret[12..]));
        let fingerprint = text(&format!("SELECT encode(sha256(convert_to('{secret}', 'UTF8')), 'hex')"));
        assert!(!listed.contains(&fingerprint));
        assert!(listed.contains(&secret[..12]), "the display prefix is listed");
        let audit = text("SELECT coalesce(jsonb_agg(to_jsonb(a))::text, '') FROM querylayer.audit_events a");
        assert!(!audit.contains(&secret[4..]) && !audit.contains(&fingerprint));
    }
}

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
        json(&format!("SELECT querylayer_api.authenticate(sha256(convert_to('{secret}', 'UTF8')))"))
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

    #[pg_test(
        error = "this transaction already carries a request context; authenticate once per transaction"
    )]
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

    #[pg_test(
        error = "querylayer_owner may not run DDL (ALTER TABLE); schema changes go through extension upgrades"
    )]
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

    // ---------------------------------------------------------------------------------------
    // Content governance.

    struct Site {
        secret: String,
        owner_token: String,
    }

    /// The demo plus an editor; returns the agent's secret and the owner's token.
    fn content_site() -> Site {
        let seeded = json("SELECT querylayer_api.seed_demo()");
        Site {
            secret: seeded["connection"]["secret"].as_str().unwrap().to_string(),
            owner_token: seeded["member_token"]["token"].as_str().unwrap().to_string(),
        }
    }

    fn member_token(handle: &str, role: &str) -> String {
        Spi::run(&format!("SELECT querylayer_api.create_member('demo', '{handle}')")).unwrap();
        Spi::run(&format!("SELECT querylayer_api.set_member_role('demo', '{handle}', '{role}')")).unwrap();
        let t = json(&format!(
            "SELECT querylayer_api.create_member_token('demo', '{handle}', 't', now() + interval '1 hour')"
        ));
        t["token"].as_str().unwrap().to_string()
    }

    fn as_member(token: &str) -> Value {
        json(&format!("SELECT querylayer_api.authenticate_member(sha256(convert_to('{token}', 'UTF8')))"))
    }

    /// As the agent: begins a run and drafts an article. Returns (run_id, content_id, revision_id).
    fn draft(secret: &str, slug: &str) -> (String, String, String) {
        authenticate(secret);
        let run = json("SELECT querylayer_api.begin_run('article.draft')");
        let run_id = run["run_id"].as_str().unwrap().to_string();
        let d = json(&format!(
            "SELECT querylayer_api.create_draft('{run_id}', 'article', '{{\"title\": \"T\", \"body\": \"B\"}}', NULL, '{slug}')"
        ));
        (
            run_id,
            d["content_id"].as_str().unwrap().to_string(),
            d["revision_id"].as_str().unwrap().to_string(),
        )
    }

    fn redraft(run_id: &str, content_id: &str) -> String {
        let d = json(&format!(
            "SELECT querylayer_api.create_draft('{run_id}', 'article', '{{\"title\": \"T2\", \"body\": \"B2\"}}', '{content_id}')"
        ));
        d["revision_id"].as_str().unwrap().to_string()
    }

    fn request_publish(run_id: &str, content_id: &str, revision_id: &str) -> String {
        let p = json(&format!(
            "SELECT querylayer_api.request_publish_approval('{run_id}',
               '[{{\"content_id\": \"{content_id}\", \"action\": \"publish\", \"revision_id\": \"{revision_id}\"}}]')"
        ));
        p["proposal_id"].as_str().unwrap().to_string()
    }

    fn live_pointer(content_id: &str) -> Option<String> {
        Spi::get_one::<String>(&format!(
            "SELECT published_revision_id::text FROM querylayer.content_items WHERE id = '{content_id}'"
        ))
        .unwrap()
    }

    #[pg_test]
    fn a_draft_never_publishes_and_an_approval_moves_the_live_pointer() {
        let site = content_site();
        let (run_id, content_id, revision_id) = draft(&site.secret, "hello");
        assert_eq!(live_pointer(&content_id), None, "creating a draft leaves the live pointer untouched");
        let proposal = request_publish(&run_id, &content_id, &revision_id);
        as_member(&site.owner_token);
        let decided =
            json(&format!("SELECT querylayer_api.decide_proposal('{proposal}', 'approve', 'ship it')"));
        assert_eq!(decided["state"], "applied", "{decided}");
        assert_eq!(live_pointer(&content_id), Some(revision_id));
    }

    #[pg_test]
    fn template_contract_names_the_fields() {
        let site = content_site();
        authenticate(&site.secret);
        let run = json("SELECT querylayer_api.begin_run('article.draft')");
        let run_id = run["run_id"].as_str().unwrap();
        let err = Spi::get_one::<String>(&format!(
            "DO $t$ BEGIN PERFORM querylayer_api.create_draft('{run_id}', 'article', '{{\"title\": 5, \"colour\": \"red\"}}', NULL, 'x');
             EXCEPTION WHEN SQLSTATE 'QL422' THEN RAISE NOTICE '%', SQLERRM; PERFORM set_config('ql.test', SQLERRM, true); END $t$;
             SELECT current_setting('ql.test')"
        ));
        let message = err.unwrap().unwrap();
        assert_eq!(
            message,
            "the draft does not satisfy template article (version 1): missing required fields: body; unknown fields: colour; title must be a string"
        );
    }

    #[pg_test]
    fn an_agent_draft_outside_an_open_run_is_refused() {
        let site = content_site();
        authenticate(&site.secret);
        expect_sqlstate(
            "SELECT querylayer_api.create_draft(NULL, 'article', '{\"title\": \"T\", \"body\": \"B\"}', NULL, 'x')",
            "22023",
        );
        let run = json("SELECT querylayer_api.begin_run('article.draft')");
        let run_id = run["run_id"].as_str().unwrap();
        Spi::run(&format!("SELECT querylayer_api.finish_run('{run_id}', 'cancelled')")).unwrap();
        expect_sqlstate(
            &format!("SELECT querylayer_api.create_draft('{run_id}', 'article', '{{\"title\": \"T\", \"body\": \"B\"}}', NULL, 'x')"),
            "QL410",
        );
    }

    #[pg_test]
    fn content_revisions_are_immutable_for_owner_and_replica_superuser() {
        let site = content_site();
        draft(&site.secret, "a");
        as_owner();
        expect_sqlstate("UPDATE querylayer.content_revisions SET fields = '{}'", "QL423");
        expect_sqlstate("DELETE FROM querylayer.content_revisions", "QL423");
        expect_sqlstate("TRUNCATE querylayer.content_revisions CASCADE", "QL423");
        Spi::run("RESET ROLE").unwrap();
        Spi::run("SET LOCAL session_replication_role = replica").unwrap();
        expect_sqlstate("UPDATE querylayer.content_revisions SET fields = '{}'", "QL423");
        expect_sqlstate("DELETE FROM querylayer.content_revisions", "QL423");
        expect_sqlstate("TRUNCATE querylayer.content_revisions CASCADE", "QL423");
    }

    #[pg_test]
    fn live_pointer_and_archived_at_refuse_every_direct_update() {
        let site = content_site();
        let (_, content_id, revision_id) = draft(&site.secret, "a");
        let set_live = format!("UPDATE querylayer.content_items SET published_revision_id = '{revision_id}'");
        // The superuser, directly and from inside a function.
        expect_sqlstate(&set_live, "QL423");
        expect_sqlstate("UPDATE querylayer.content_items SET archived_at = now()", "QL423");
        Spi::run(&format!("CREATE FUNCTION pg_temp.sneak() RETURNS void LANGUAGE sql AS $$ {set_live} $$"))
            .unwrap();
        expect_sqlstate("SELECT pg_temp.sneak()", "QL423");
        // Even replica mode does not skip the guard.
        Spi::run("SET LOCAL session_replication_role = replica").unwrap();
        expect_sqlstate(&set_live, "QL423");
        Spi::run("SET LOCAL session_replication_role = origin").unwrap();
        // The table owner.
        as_owner();
        expect_sqlstate(&set_live, "QL423");
        expect_sqlstate("UPDATE querylayer.content_items SET archived_at = now()", "QL423");
        assert_eq!(live_pointer(&content_id), None);
        // The edge role has no way in at all.
        as_edge();
        expect_sqlstate(&set_live, "42501");
    }

    #[pg_test]
    fn the_apply_function_alone_cannot_move_the_pointer() {
        let site = content_site();
        let (run_id, content_id, revision_id) = draft(&site.secret, "a");
        let proposal = request_publish(&run_id, &content_id, &revision_id);
        // A real approval, inserted by hand, then applied without the extension's execution path.
        as_member(&site.owner_token);
        let decision = text(&format!(
            "INSERT INTO querylayer.proposal_decisions (site_id, proposal_id, decision, member_id, member_role)
             SELECT site_id, id, 'approved', querylayer.ctx_member_id(), 'owner' FROM querylayer.proposals
              WHERE id = '{proposal}' RETURNING id::text"
        ));
        expect_sqlstate(&format!("SELECT querylayer.apply_lifecycle('{decision}')"), "QL423");
        assert_eq!(live_pointer(&content_id), None);
    }

    #[pg_test]
    fn an_agent_cannot_decide() {
        let site = content_site();
        let (run_id, content_id, revision_id) = draft(&site.secret, "a");
        let proposal = request_publish(&run_id, &content_id, &revision_id);
        expect_sqlstate(&format!("SELECT querylayer_api.decide_proposal('{proposal}', 'approve')"), "QL401");
    }

    #[pg_test]
    fn an_editor_cannot_approve_archive_or_restore_and_viewers_decide_nothing() {
        let site = content_site();
        let editor = member_token("ed", "editor");
        let viewer = member_token("vi", "viewer");
        let (run_id, content_id, revision_id) = draft(&site.secret, "a");
        let publish = request_publish(&run_id, &content_id, &revision_id);
        let archive = json(&format!(
            "SELECT querylayer_api.create_proposal('{run_id}', 'content_lifecycle',
               '{{\"items\": [{{\"content_id\": \"{content_id}\", \"action\": \"archive\", \"archived_at\": null}}]}}')"
        ));
        assert_eq!(archive["risk"], "high");
        let archive = archive["proposal_id"].as_str().unwrap();
        as_member(&viewer);
        expect_sqlstate(&format!("SELECT querylayer_api.decide_proposal('{publish}', 'approve')"), "QL403");
        as_member(&editor);
        expect_sqlstate(&format!("SELECT querylayer_api.decide_proposal('{archive}', 'approve')"), "QL403");
        let rejected =
            json(&format!("SELECT querylayer_api.decide_proposal('{publish}', 'reject', 'not yet')"));
        assert_eq!(rejected["state"], "rejected");
        expect_sqlstate(&format!("SELECT querylayer_api.decide_proposal('{publish}', 'approve')"), "QL409");
    }

    #[pg_test]
    fn a_member_of_another_site_cannot_decide() {
        let site = content_site();
        let (run_id, content_id, revision_id) = draft(&site.secret, "a");
        let proposal = request_publish(&run_id, &content_id, &revision_id);
        Spi::run("SELECT querylayer_api.create_site('demo', 'other')").unwrap();
        Spi::run("SELECT querylayer_api.create_member('demo', 'stranger')").unwrap();
        Spi::run("SELECT querylayer_api.set_member_role('other', 'stranger', 'owner')").unwrap();
        let token = json(
            "SELECT querylayer_api.create_member_token('other', 'stranger', 't', now() + interval '1 hour')",
        );
        as_member(token["token"].as_str().unwrap());
        expect_sqlstate(&format!("SELECT querylayer_api.decide_proposal('{proposal}', 'approve')"), "QL404");
        assert_eq!(live_pointer(&content_id), None);
    }

    #[pg_test]
    fn a_stale_publish_publishes_nothing_and_says_why() {
        let site = content_site();
        let (run_id, content_id, revision_id) = draft(&site.secret, "a");
        let proposal = request_publish(&run_id, &content_id, &revision_id);
        let newer = redraft(&run_id, &content_id);
        as_member(&site.owner_token);
        let decided = json(&format!("SELECT querylayer_api.decide_proposal('{proposal}', 'approve')"));
        assert_eq!(decided["state"], "failed");
        assert_eq!(decided["decision"]["decision"], "approved");
        let problem = &decided["execution"]["detail"]["problems"][0];
        assert_eq!(problem["reason"], "stale_revision");
        assert_eq!(
            problem["message"],
            format!("revision {revision_id} is no longer the current draft (now {newer})")
        );
        assert_eq!(live_pointer(&content_id), None);
    }

    #[pg_test]
    fn unpublish_takes_down_what_is_live_and_archive_requires_unpublishing() {
        let site = content_site();
        let (run_id, content_id, revision_id) = draft(&site.secret, "a");
        let publish = request_publish(&run_id, &content_id, &revision_id);
        as_member(&site.owner_token);
        json(&format!("SELECT querylayer_api.decide_proposal('{publish}', 'approve')"));
        // A newer draft exists; unpublishing still takes down the live revision, whatever it is.
        authenticate(&site.secret);
        redraft(&run_id, &content_id);
        let archive_live = format!(
            "SELECT querylayer_api.create_proposal('{run_id}', 'content_lifecycle',
               '{{\"items\": [{{\"content_id\": \"{content_id}\", \"action\": \"archive\", \"archived_at\": null}}]}}')"
        );
        expect_sqlstate(&archive_live, "QL422");
        let unpublish = json(&format!(
            "SELECT querylayer_api.request_publish_approval('{run_id}', '[{{\"content_id\": \"{content_id}\", \"action\": \"unpublish\"}}]')"
        ));
        let unpublish = unpublish["proposal_id"].as_str().unwrap().to_string();
        as_member(&site.owner_token);
        let done = json(&format!("SELECT querylayer_api.decide_proposal('{unpublish}', 'approve')"));
        assert_eq!(done["state"], "applied");
        assert_eq!(done["execution"]["detail"]["effects"][0]["revision_id"], revision_id.as_str());
        assert_eq!(live_pointer(&content_id), None);
        // Now it can be archived, and restoring leaves it unpublished.
        authenticate(&site.secret);
        let archive = json(&archive_live)["proposal_id"].as_str().unwrap().to_string();
        as_member(&site.owner_token);
        assert_eq!(
            json(&format!("SELECT querylayer_api.decide_proposal('{archive}', 'approve')"))["state"],
            "applied"
        );
        let archived_at = text(&format!(
            "SELECT to_jsonb(archived_at)#>>'{{}}' FROM querylayer.content_items WHERE id = '{content_id}'"
        ));
        authenticate(&site.secret);
        let restore = json(&format!(
            "SELECT querylayer_api.create_proposal('{run_id}', 'content_lifecycle',
               '{{\"items\": [{{\"content_id\": \"{content_id}\", \"action\": \"restore\", \"archived_at\": \"{archived_at}\"}}]}}')"
        ))["proposal_id"]
            .as_str()
            .unwrap()
            .to_string();
        as_member(&site.owner_token);
        assert_eq!(
            json(&format!("SELECT querylayer_api.decide_proposal('{restore}', 'approve')"))["state"],
            "applied"
        );
        assert_eq!(live_pointer(&content_id), None, "restoring never republishes");
        let state = text(&format!(
            "SELECT querylayer.content_state(c) FROM querylayer.content_items c WHERE id = '{content_id}'"
        ));
        assert_eq!(state, "draft");
    }

    fn lifecycle_proposal(run_id: &str, content_id: &str, action: &str, archived_at: Option<&str>) -> String {
        let snapshot = archived_at.map_or("null".to_string(), |a| format!("\"{a}\""));
        json(&format!(
            "SELECT querylayer_api.create_proposal('{run_id}', 'content_lifecycle',
               '{{\"items\": [{{\"content_id\": \"{content_id}\", \"action\": \"{action}\", \"archived_at\": {snapshot}}}]}}')"
        ))["proposal_id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// The whole content_items row, to show a decision changed nothing.
    fn content_row(content_id: &str) -> String {
        text(&format!("SELECT to_jsonb(c)::text FROM querylayer.content_items c WHERE id = '{content_id}'"))
    }

    fn archived_at(content_id: &str) -> Option<String> {
        Spi::get_one::<String>(&format!(
            "SELECT to_jsonb(archived_at)#>>'{{}}' FROM querylayer.content_items WHERE id = '{content_id}'"
        ))
        .unwrap()
    }

    /// Approves as `token` a decision expected to execute and fail; returns its one problem.
    fn approve_expecting_failure(token: &str, proposal: &str, content_id: &str) -> Value {
        as_member(token);
        let before = content_row(content_id);
        let executions = count("proposal_executions");
        let decided = json(&format!("SELECT querylayer_api.decide_proposal('{proposal}', 'approve')"));
        assert_eq!(decided["state"], "failed", "{decided}");
        assert_eq!(decided["decision"]["decision"], "approved");
        assert_eq!(decided["execution"]["status"], "failed");
        assert_eq!(decided["execution"]["detail"]["message"], "nothing was changed");
        assert_eq!(count("proposal_executions"), executions + 1, "the failure is recorded");
        assert_eq!(content_row(content_id), before, "a failed execution changes nothing");
        let problems = decided["execution"]["detail"]["problems"].as_array().unwrap();
        assert_eq!(problems.len(), 1, "{decided}");
        problems[0].clone()
    }

    #[pg_test]
    fn archive_and_restore_whose_snapshot_moved_fail_at_decision_time_and_change_nothing() {
        let site = content_site();
        let (run_id, content_id, _) = draft(&site.secret, "a");
        // Two archive requests made against the same (unarchived) state; the first approved wins.
        let first = lifecycle_proposal(&run_id, &content_id, "archive", None);
        let second = lifecycle_proposal(&run_id, &content_id, "archive", None);
        as_member(&site.owner_token);
        assert_eq!(
            json(&format!("SELECT querylayer_api.decide_proposal('{second}', 'approve')"))["state"],
            "applied"
        );
        let archived = archived_at(&content_id).expect("archived");
        let problem = approve_expecting_failure(&site.owner_token, &first, &content_id);
        assert_eq!(problem["content_id"], content_id.as_str());
        assert_eq!(problem["reason"], "snapshot_mismatch", "{problem}");
        assert_eq!(
            problem["message"],
            format!(
                "archived_at is {}, the proposal expected null",
                text(&format!(
                    "SELECT archived_at::text FROM querylayer.content_items WHERE id = '{content_id}'"
                ))
            )
        );
        assert_eq!(archived_at(&content_id), Some(archived.clone()));
        // Likewise two restores of that archive: the second finds the item no longer archived.
        authenticate(&site.secret);
        let restore_a = lifecycle_proposal(&run_id, &content_id, "restore", Some(&archived));
        let restore_b = lifecycle_proposal(&run_id, &content_id, "restore", Some(&archived));
        as_member(&site.owner_token);
        assert_eq!(
            json(&format!("SELECT querylayer_api.decide_proposal('{restore_a}', 'approve')"))["state"],
            "applied"
        );
        assert_eq!(archived_at(&content_id), None);
        let problem = approve_expecting_failure(&site.owner_token, &restore_b, &content_id);
        assert_eq!(problem["reason"], "snapshot_mismatch", "{problem}");
        assert_eq!(archived_at(&content_id), None);
        assert_eq!(live_pointer(&content_id), None);
    }

    #[pg_test]
    fn an_item_that_went_live_after_the_archive_request_is_not_archived() {
        let site = content_site();
        let (run_id, content_id, revision_id) = draft(&site.secret, "a");
        let archive = lifecycle_proposal(&run_id, &content_id, "archive", None);
        // Meanwhile the item is published.
        let publish = request_publish(&run_id, &content_id, &revision_id);
        as_member(&site.owner_token);
        assert_eq!(
            json(&format!("SELECT querylayer_api.decide_proposal('{publish}', 'approve')"))["state"],
            "applied"
        );
        assert_eq!(live_pointer(&content_id), Some(revision_id.clone()));
        let problem = approve_expecting_failure(&site.owner_token, &archive, &content_id);
        assert_eq!(problem["content_id"], content_id.as_str());
        assert_eq!(problem["reason"], "live", "{problem}");
        assert_eq!(problem["message"], "the item is live; unpublish it first");
        assert_eq!(live_pointer(&content_id), Some(revision_id), "still live");
        assert_eq!(archived_at(&content_id), None, "not archived");
    }

    #[pg_test]
    fn an_editor_cannot_approve_a_restore_but_an_admin_can() {
        let site = content_site();
        let editor = member_token("ed", "editor");
        let admin = member_token("ad", "admin");
        let (run_id, content_id, _) = draft(&site.secret, "a");
        let archive = lifecycle_proposal(&run_id, &content_id, "archive", None);
        as_member(&site.owner_token);
        assert_eq!(
            json(&format!("SELECT querylayer_api.decide_proposal('{archive}', 'approve')"))["state"],
            "applied"
        );
        let archived = archived_at(&content_id).expect("archived");
        authenticate(&site.secret);
        let restore = json(&format!(
            "SELECT querylayer_api.create_proposal('{run_id}', 'content_lifecycle',
               '{{\"items\": [{{\"content_id\": \"{content_id}\", \"action\": \"restore\", \"archived_at\": \"{archived}\"}}]}}')"
        ));
        assert_eq!(restore["risk"], "high");
        let restore = restore["proposal_id"].as_str().unwrap();
        as_member(&editor);
        let decisions = count("proposal_decisions");
        expect_sqlstate(&format!("SELECT querylayer_api.decide_proposal('{restore}', 'approve')"), "QL403");
        assert_eq!(count("proposal_decisions"), decisions, "the editor's attempt records no decision");
        assert_eq!(archived_at(&content_id), Some(archived), "still archived");
        let pending = json(&format!("SELECT querylayer_api.list_proposals('pending') -> 'proposals' -> 0"));
        assert_eq!(pending["proposal_id"], restore);
        // The editor cannot reject it either (a decision of this type is the owner's or an admin's).
        expect_sqlstate(&format!("SELECT querylayer_api.decide_proposal('{restore}', 'reject')"), "QL403");
        as_member(&admin);
        let decided = json(&format!("SELECT querylayer_api.decide_proposal('{restore}', 'approve')"));
        assert_eq!(decided["state"], "applied", "{decided}");
        assert_eq!(decided["decision"]["member_role"], "admin");
        assert_eq!(archived_at(&content_id), None);
    }

    #[pg_test]
    fn the_server_assigns_risk_whatever_the_client_says() {
        let site = content_site();
        let (run_id, content_id, revision_id) = draft(&site.secret, "a");
        let p = json(&format!(
            "SELECT querylayer_api.create_proposal('{run_id}', 'revision',
               '{{\"content_id\": \"{content_id}\", \"revision_id\": \"{revision_id}\", \"risk\": \"low\"}}')"
        ));
        assert_eq!(p["risk"], "medium");
        assert!(p["payload"].get("risk").is_none());
        // And a direct insert by the superuser cannot choose it either.
        let risk = text(&format!(
            "INSERT INTO querylayer.proposals (site_id, type, risk, payload, author_kind, agent_id, connection_id, run_id)
             SELECT site_id, 'content_lifecycle', 'low', '{{}}', 'agent', agent_id, connection_id, id
               FROM querylayer.runs WHERE id = '{run_id}' RETURNING risk"
        ));
        assert_eq!(risk, "high");
    }

    // ---------------------------------------------------------------------------------------
    // Envelope authentication (/v1).

    fn envelope_vectors() -> Value {
        serde_json::from_str(include_str!("../../docs/envelope-vectors.json")).unwrap()
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

    // ---------------------------------------------------------------------------------------
    // Agent Console and task plans.

    /// The demo with a registered Hermes session and a conversation holding one queued turn.
    /// Returns (site, conversation_id, turn_id).
    fn console_turn(session: &str) -> (Site, String, String) {
        let site = content_site();
        as_member(&site.owner_token);
        json(&format!("SELECT querylayer_api.console_register_session('demo-profile-0001', '{session}')"));
        let conv = json(&format!(
            "SELECT querylayer_api.console_open_conversation('demo-profile-0001', '{session}', 'Pricing page')"
        ));
        let conv_id = conv["conversation_id"].as_str().unwrap().to_string();
        let turn = json(&format!(
            "SELECT querylayer_api.console_add_turn('{conv_id}', 'Draft, revise and publish a pricing page')"
        ));
        (site, conv_id, turn["turn_id"].as_str().unwrap().to_string())
    }

    const THREE_STEPS: &str = r#"[
        {"key": "draft", "operation": "draft", "instructions": "Draft the page"},
        {"key": "revise", "operation": "revision", "instructions": "Propose the revision", "depends_on": ["draft"]},
        {"key": "publish", "operation": "publish", "instructions": "Request publishing", "depends_on": ["revise"]}
    ]"#;

    #[pg_test]
    fn the_deep_link_is_the_seed_form_and_survives_a_rename() {
        let (site, conv, _) = console_turn("sess-1");
        let link = json(&format!("SELECT querylayer_api.console_conversation_link('{conv}')"));
        assert_eq!(link["link"], "hermes://sessions/sess-1?profile_id=demo-profile-0001");
        Spi::run("SELECT querylayer_api.rename_agent_profile('demo-profile-0001', 'Renamed')").unwrap();
        as_member(&site.owner_token);
        let again = json(&format!("SELECT querylayer_api.console_conversation_link('{conv}')"));
        assert_eq!(again["link"], link["link"]);
        json("SELECT querylayer_api.console_end_session('sess-1', 'deleted in Hermes')");
        expect_sqlstate(&format!("SELECT querylayer_api.console_conversation_link('{conv}')"), "QL422");
        // Nor does the conversation take a turn that no harness could act on.
        expect_sqlstate(
            &format!("SELECT querylayer_api.console_add_turn('{conv}', 'Another request')"),
            "QL422",
        );
    }

    #[pg_test]
    fn a_plan_hands_out_one_ready_step_at_a_time_and_waits_for_approval() {
        let (site, _, turn) = console_turn("sess-2");
        authenticate(&site.secret);
        let claimed = json("SELECT querylayer_api.claim_console_task()");
        assert_eq!(claimed["turn"]["turn_id"], turn.as_str());
        let plan = json(&format!(
            "SELECT querylayer_api.create_task_plan('{turn}', 'sess-2', 'Publish a pricing page', '{THREE_STEPS}')"
        ));
        assert_eq!(plan["step"]["key"], "draft");
        assert_eq!(plan["plan"]["steps"][2]["risk"], "high");
        // Step 1: a draft inside a run.
        let run = json("SELECT querylayer_api.begin_run('console.step')");
        let run_id = run["run_id"].as_str().unwrap().to_string();
        let d = json(&format!(
            "SELECT querylayer_api.create_draft('{run_id}', 'article', '{{\"title\": \"Pricing\", \"body\": \"v1\"}}', NULL, 'pricing')"
        ));
        let content_id = d["content_id"].as_str().unwrap().to_string();
        let step1 = plan["step"]["step_id"].as_str().unwrap();
        let next = json(&format!(
            "SELECT querylayer_api.complete_console_task('{turn}', 'succeeded', 'sess-2', '{step1}', 'drafted', ARRAY['{run_id}']::uuid[])"
        ));
        assert_eq!(next["step"]["key"], "revise");
        // Step 2: a revision proposal; the plan waits for the decision.
        let rev = redraft(&run_id, &content_id);
        let proposal = json(&format!(
            "SELECT querylayer_api.create_proposal('{run_id}', 'revision', '{{\"content_id\": \"{content_id}\", \"revision_id\": \"{rev}\"}}')"
        ))["proposal_id"].as_str().unwrap().to_string();
        let step2 = next["step"]["step_id"].as_str().unwrap();
        let waiting = json(&format!(
            "SELECT querylayer_api.complete_console_task('{turn}', 'succeeded', 'sess-2', '{step2}', 'proposed', ARRAY['{run_id}']::uuid[], ARRAY['{proposal}']::uuid[])"
        ));
        assert_eq!(waiting["status"], "awaiting_approval");
        assert_eq!(
            json(&format!("SELECT querylayer_api.claim_console_task('sess-2', '{turn}')"))["status"],
            "awaiting_approval"
        );
        as_member(&site.owner_token);
        json(&format!("SELECT querylayer_api.decide_proposal('{proposal}', 'approve')"));
        authenticate(&site.secret);
        let step3 = json(&format!("SELECT querylayer_api.claim_console_task('sess-2', '{turn}')"));
        assert_eq!(step3["step"]["key"], "publish");
        // Step 3: a publish request. Nothing is live until a member approves it.
        let publish = request_publish(&run_id, &content_id, &rev);
        let step3_id = step3["step"]["step_id"].as_str().unwrap();
        json(&format!(
            "SELECT querylayer_api.complete_console_task('{turn}', 'succeeded', 'sess-2', '{step3_id}', 'requested', ARRAY['{run_id}']::uuid[], ARRAY['{publish}']::uuid[])"
        ));
        assert_eq!(live_pointer(&content_id), None, "a plan never publishes by itself");
        as_member(&site.owner_token);
        json(&format!("SELECT querylayer_api.decide_proposal('{publish}', 'approve')"));
        assert_eq!(live_pointer(&content_id), Some(rev));
        authenticate(&site.secret);
        assert_eq!(
            json(&format!("SELECT querylayer_api.claim_console_task('sess-2', '{turn}')"))["status"],
            "completed"
        );
        let done = json(&format!(
            "SELECT querylayer_api.complete_console_task('{turn}', 'completed', 'sess-2', NULL, 'published')"
        ));
        assert_eq!(done["turn"]["state"], "completed");
    }

    #[pg_test]
    fn a_step_failing_three_times_ends_failed_after_two_retries_and_its_dependents_never_start() {
        let (site, _, turn) = console_turn("sess-3");
        authenticate(&site.secret);
        json("SELECT querylayer_api.claim_console_task()");
        let mut state = json(&format!(
            "SELECT querylayer_api.create_task_plan('{turn}', 'sess-3', 'Analyse', '[
               {{\"key\": \"a\", \"operation\": \"analysis\", \"instructions\": \"try\"}},
               {{\"key\": \"b\", \"operation\": \"analysis\", \"instructions\": \"after\", \"depends_on\": [\"a\"]}}]')"
        ));
        for attempt in 0..3 {
            assert_eq!(state["step"]["key"], "a", "attempt {attempt}: {state}");
            assert_eq!(state["step"]["retry_count"], attempt);
            let step = state["step"]["step_id"].as_str().unwrap().to_string();
            state = json(&format!(
                "SELECT querylayer_api.complete_console_task('{turn}', 'failed', 'sess-3', '{step}', 'boom')"
            ));
        }
        assert_eq!(state["status"], "failed");
        assert_eq!(state["plan"]["steps"][0]["state"], "failed");
        assert_eq!(state["plan"]["steps"][0]["retry_count"], 2);
        assert_eq!(state["plan"]["steps"][1]["state"], "cancelled");
        // The failed plan failed its turn: no new version can start over with fresh retries.
        assert_eq!(state["turn"]["state"], "failed", "{state}");
        assert_eq!(state["turn"]["retries_left"], 0);
        expect_sqlstate(&format!(
            "SELECT querylayer_api.create_task_plan('{turn}', 'sess-3', 'Again', '[{{\"key\": \"a\", \"operation\": \"analysis\", \"instructions\": \"try\"}}]')"
        ), "QL422");
    }

    #[pg_test]
    fn the_retry_budget_is_the_turns_and_a_new_plan_version_does_not_restore_it() {
        let (site, _, turn) = console_turn("sess-7");
        authenticate(&site.secret);
        json("SELECT querylayer_api.claim_console_task()");
        let one = r#"[{"key": "a", "operation": "analysis", "instructions": "try"}]"#;
        let mut state =
            json(&format!("SELECT querylayer_api.create_task_plan('{turn}', 'sess-7', 'Analyse', '{one}')"));
        for _ in 0..2 {
            let step = state["step"]["step_id"].as_str().unwrap().to_string();
            state = json(&format!(
                "SELECT querylayer_api.complete_console_task('{turn}', 'failed', 'sess-7', '{step}', 'boom')"
            ));
        }
        assert_eq!(state["turn"]["retries_left"], 0, "{state}");
        // The budget only shrinks, even for the superuser (a member's re-open restores it).
        expect_sqlstate(
            &format!("UPDATE querylayer.console_turns SET retries_used = 0 WHERE id = '{turn}'"),
            "QL423",
        );
        // A new version hands out the step again, but the turn's budget is spent: one failure ends it.
        state = json(&format!(
            "SELECT querylayer_api.create_task_plan('{turn}', 'sess-7', 'Analyse again', '{one}')"
        ));
        assert_eq!(state["plan"]["version"], 2);
        assert_eq!(state["step"]["retry_count"], 0);
        let step = state["step"]["step_id"].as_str().unwrap().to_string();
        state = json(&format!(
            "SELECT querylayer_api.complete_console_task('{turn}', 'failed', 'sess-7', '{step}', 'boom')"
        ));
        assert_eq!(state["status"], "failed", "{state}");
        assert_eq!(state["turn"]["state"], "failed");
        // Not even the table owner can start a plan on the failed turn, or restore its budget.
        as_owner();
        expect_sqlstate(&format!(
            "INSERT INTO querylayer.task_plans (site_id, turn_id, version, goal, agent_id, profile_id, session_id, connection_id)
             SELECT site_id, turn_id, 3, 'sneak', agent_id, profile_id, session_id, connection_id
               FROM querylayer.task_plans WHERE turn_id = '{turn}' AND version = 2"
        ), "QL422");
        expect_sqlstate(
            &format!("UPDATE querylayer.console_turns SET state = 'queued' WHERE id = '{turn}'"),
            "QL403",
        );
        Spi::run("RESET ROLE").unwrap();
        // A member re-opens it: queued again, with its two retries.
        as_member(&site.owner_token);
        let reopened = json(&format!("SELECT querylayer_api.console_reopen_turn('{turn}', 'try once more')"));
        assert_eq!(reopened["state"], "queued");
        assert_eq!(reopened["retries_left"], 2);
        authenticate(&site.secret);
        let claimed = json("SELECT querylayer_api.claim_console_task()");
        assert_eq!(claimed["turn"]["turn_id"], turn.as_str());
        let needs = json(&format!("SELECT querylayer_api.claim_console_task('sess-7', '{turn}')"));
        assert_eq!(needs["status"], "needs_plan", "{needs}");
        let v3 =
            json(&format!("SELECT querylayer_api.create_task_plan('{turn}', 'sess-7', 'Third', '{one}')"));
        assert_eq!(v3["plan"]["version"], 3);
    }

    #[pg_test]
    fn a_revocation_fails_its_tasks_in_the_revoking_transaction_whoever_revokes() {
        let (site, _, turn) = console_turn("sess-8");
        authenticate(&site.secret);
        json("SELECT querylayer_api.claim_console_task()");
        let plan = json(&format!(
            "SELECT querylayer_api.create_task_plan('{turn}', 'sess-8', 'Draft', '{THREE_STEPS}')"
        ));
        let plan_id = plan["plan"]["plan_id"].as_str().unwrap().to_string();
        // Not through a revoke function at all: the superuser's direct UPDATE.
        Spi::run(&format!(
            "UPDATE querylayer.connections SET revoked_at = now(), revoked_reason = 'laptop lost'
              WHERE id = (SELECT connection_id FROM querylayer.task_plans WHERE id = '{plan_id}')"
        ))
        .unwrap();
        let row = text(&format!(
            "SELECT format('%s|%s|%s|%s', t.state, t.failure_reason, p.state, p.failure_reason)
               FROM querylayer.console_turns t JOIN querylayer.task_plans p ON p.turn_id = t.id WHERE p.id = '{plan_id}'"
        ));
        assert!(row.starts_with("failed|connection "), "{row}");
        assert!(row.ends_with("was revoked: laptop lost"), "{row}");
        assert!(row.contains("|failed|connection "), "{row}");
    }

    #[pg_test]
    fn one_hermes_session_is_registered_on_one_site_only() {
        let (site, _, _) = console_turn("sess-9");
        json("SELECT querylayer_api.create_site('demo', 'second')");
        // Even a direct insert by the superuser cannot register the session on the second site.
        expect_sqlstate(
            "INSERT INTO querylayer.agent_sessions (site_id, session_id, agent_id, profile_id, registered_by)
             SELECT (SELECT id FROM querylayer.sites WHERE slug = 'second'), session_id, agent_id, profile_id, registered_by
               FROM querylayer.agent_sessions WHERE session_id = 'sess-9'",
            "23505",
        );
        let _ = site;
    }

    #[pg_test]
    fn plans_refuse_unknown_dependencies_and_cycles() {
        let (site, _, turn) = console_turn("sess-4");
        authenticate(&site.secret);
        json("SELECT querylayer_api.claim_console_task()");
        expect_sqlstate(&format!(
            "SELECT querylayer_api.create_task_plan('{turn}', 'sess-4', 'g', '[{{\"key\": \"a\", \"operation\": \"analysis\", \"instructions\": \"x\", \"depends_on\": [\"zz\"]}}]')"
        ), "22023");
        expect_sqlstate(
            &format!(
                "SELECT querylayer_api.create_task_plan('{turn}', 'sess-4', 'g', '[
               {{\"key\": \"a\", \"operation\": \"analysis\", \"instructions\": \"x\", \"depends_on\": [\"b\"]}},
               {{\"key\": \"b\", \"operation\": \"analysis\", \"instructions\": \"y\", \"depends_on\": [\"a\"]}}]')"
            ),
            "22023",
        );
        // Another session cannot plan this turn.
        expect_sqlstate(&format!(
            "SELECT querylayer_api.create_task_plan('{turn}', 'other', 'g', '[{{\"key\": \"a\", \"operation\": \"analysis\", \"instructions\": \"x\"}}]')"
        ), "QL403");
    }

    /// A plan step without its progress (state), to compare step definitions across versions.
    fn step_definition(step: &Value) -> Value {
        let mut s = step.clone();
        s.as_object_mut().unwrap().remove("state");
        s
    }

    #[pg_test]
    fn replanning_supersedes_the_previous_version_and_hands_out_the_new_first_ready_step() {
        let (site, _, turn) = console_turn("sess-6");
        authenticate(&site.secret);
        json("SELECT querylayer_api.claim_console_task()");
        let first = json(&format!(
            "SELECT querylayer_api.create_task_plan('{turn}', 'sess-6', 'Publish a pricing page', '{THREE_STEPS}')"
        ));
        assert_eq!(first["plan"]["version"], 1);
        assert_eq!(first["step"]["key"], "draft");
        let v1_id = first["plan"]["plan_id"].as_str().unwrap().to_string();
        let v1_steps = first["plan"]["steps"].as_array().unwrap().clone();
        // Version 2: its first step in order waits on the second, so the second is the ready one.
        let second = json(&format!(
            "SELECT querylayer_api.create_task_plan('{turn}', 'sess-6', 'Outline first', '[
               {{\"key\": \"announce\", \"operation\": \"analysis\", \"instructions\": \"announce it\", \"depends_on\": [\"outline\"]}},
               {{\"key\": \"outline\", \"operation\": \"research\", \"instructions\": \"outline it\"}}]')"
        ));
        let v2_id = second["plan"]["plan_id"].as_str().unwrap().to_string();
        assert_ne!(v1_id, v2_id);
        assert_eq!(second["plan"]["version"], 2);
        assert_eq!(second["plan"]["state"], "active");
        assert_eq!(second["status"], "running", "{second}");
        assert_eq!(second["step"]["key"], "outline");
        assert_eq!(second["step"]["state"], "running");
        assert_eq!(second["step"]["step_id"], second["plan"]["steps"][1]["step_id"], "a step of version 2");
        assert!(v1_steps.iter().all(|s| s["step_id"] != second["step"]["step_id"]));

        as_member(&site.owner_token);
        let turn_state = json(&format!("SELECT querylayer_api.console_get_turn('{turn}')"));
        let plans = turn_state["plans"].as_array().unwrap();
        assert_eq!(plans.len(), 2);
        let (v1, v2) = (&plans[0], &plans[1]);
        assert_eq!(v1["plan_id"], v1_id.as_str());
        assert_eq!((v1["version"].as_i64().unwrap(), v1["state"].as_str().unwrap()), (1, "superseded"));
        assert_eq!(v2["plan_id"], v2_id.as_str());
        assert_eq!((v2["version"].as_i64().unwrap(), v2["state"].as_str().unwrap()), (2, "active"));
        assert!(v2["version"].as_i64() > v1["version"].as_i64());
        assert_eq!(v1["goal"], "Publish a pricing page", "version 1 is not rewritten");
        // Version 1's steps keep their definitions (keys, operations, instructions, dependencies,
        // ids and progress fields); only their state says they were superseded.
        let after: Vec<Value> = v1["steps"].as_array().unwrap().iter().map(step_definition).collect();
        let before: Vec<Value> = v1_steps.iter().map(step_definition).collect();
        assert_eq!(after, before);
        let keys: Vec<&str> =
            v1["steps"].as_array().unwrap().iter().map(|s| s["key"].as_str().unwrap()).collect();
        assert_eq!(keys, ["draft", "revise", "publish"]);
        assert!(v1["steps"].as_array().unwrap().iter().all(|s| s["state"] == "superseded"), "{v1}");
        let v2_states: Vec<&str> =
            v2["steps"].as_array().unwrap().iter().map(|s| s["state"].as_str().unwrap()).collect();
        assert_eq!(v2_states, ["pending", "running"]);
    }

    #[pg_test]
    fn a_missing_session_fails_the_turn_closed() {
        let (site, _, turn) = console_turn("sess-5");
        as_member(&site.owner_token);
        json("SELECT querylayer_api.console_end_session('sess-5', 'missing')");
        authenticate(&site.secret);
        let claim = json("SELECT querylayer_api.claim_console_task()");
        assert_eq!(claim["status"], "idle");
        assert_eq!(claim["closed"][0]["turn_id"], turn.as_str());
        assert_eq!(claim["closed"][0]["reason"], "session sess-5 is missing or ended");
    }

    // ---------------------------------------------------------------------------------------
    // Editorial planning.

    fn count(table: &str) -> i64 {
        Spi::get_one::<i64>(&format!("SELECT count(*) FROM querylayer.{table}")).unwrap().unwrap()
    }

    #[pg_test]
    fn strategy_opportunities_become_a_proposal_and_an_approval_commissions_one_brief() {
        let site = content_site();
        json(
            r#"SELECT querylayer_api.import_topical_strategy('demo', 'keyword-tool-export', '[
            {"id": "opp-1", "topic": "pricing", "title": "Pricing explained", "signals": {"estimated_volume": 1200}},
            {"id": "opp-2", "topic": "pricing", "title": "Pricing for teams"}]')"#,
        );
        authenticate(&site.secret);
        let queue = json("SELECT querylayer_api.list_topical_strategy_opportunities()");
        let opps = queue["opportunities"].as_array().unwrap();
        assert_eq!(opps.len(), 2);
        assert!(opps.iter().all(|o| o["reconciliation_state"] == "new"));
        assert_eq!(opps[0]["provenance"]["source"], "keyword-tool-export");
        let ids: Vec<String> =
            opps.iter().map(|o| o["opportunity_id"].as_str().unwrap().to_string()).collect();
        let run = json("SELECT querylayer_api.begin_run('strategy.triage')")["run_id"]
            .as_str()
            .unwrap()
            .to_string();
        let proposal = json(&format!(
            "SELECT querylayer_api.propose_topical_strategy_opportunities('{run}', ARRAY['{}', '{}']::uuid[], 'two pages')", ids[0], ids[1]
        ));
        assert_eq!(proposal["type"], "topical_map");
        let after = json("SELECT querylayer_api.list_topical_strategy_opportunities()");
        assert!(after["opportunities"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["reconciliation_state"] == "proposed"));
        assert_eq!(count("topics"), 0, "proposing changes nothing");
        // The agent (or the owner role) cannot write the map directly.
        as_owner();
        expect_sqlstate(
            "INSERT INTO querylayer.topics (site_id, slug, title) SELECT id, 'x', 'X' FROM querylayer.sites",
            "QL423",
        );
        Spi::run("RESET ROLE").unwrap();
        as_member(&site.owner_token);
        let pid = proposal["proposal_id"].as_str().unwrap();
        let decided = json(&format!("SELECT querylayer_api.decide_proposal('{pid}', 'approve')"));
        assert_eq!(decided["state"], "applied", "{decided}");
        assert_eq!(count("topics"), 1);
        assert_eq!(count("content_briefs"), 1, "exactly one brief per approval");
        authenticate(&site.secret);
        let briefs = json("SELECT querylayer_api.list_content_briefs()");
        assert_eq!(briefs["briefs"][0]["brief"]["pages"].as_array().unwrap().len(), 2);
        let accepted = json("SELECT querylayer_api.list_topical_strategy_opportunities('accepted')");
        assert_eq!(accepted["opportunities"].as_array().unwrap().len(), 2);
    }

    #[pg_test]
    fn staging_a_package_twice_is_recognised_and_creates_no_content() {
        let site = content_site();
        authenticate(&site.secret);
        let run =
            json("SELECT querylayer_api.begin_run('sources.stage')")["run_id"].as_str().unwrap().to_string();
        let records = r#"[{"title": "A", "url": "https://a.example/x", "author": "Ann", "published_at": "2026-01-01", "body": "short"},
                          {"title": "", "url": "ftp://nope"},
                          {"title": "C", "url": "https://a.example/x"}]"#;
        let before = (count("content_items"), count("content_revisions"), count("proposals"));
        let first = json(&format!(
            "SELECT querylayer_api.stage_content_source_package('{run}', 'batch', '{records}')"
        ));
        let second = json(&format!(
            "SELECT querylayer_api.stage_content_source_package('{run}', 'batch again', '{records}')"
        ));
        assert_eq!(first["resubmitted"], false);
        assert_eq!(second["resubmitted"], true);
        assert_eq!(first["package_sha256"], second["package_sha256"]);
        assert_eq!(first["warnings"], second["warnings"]);
        assert_eq!(first["records"], second["records"]);
        assert_eq!(first["invalid_count"], 1);
        assert_eq!(
            first["records"][1]["problems"],
            serde_json::json!([
                "title: text of 1 to 300 characters is required",
                "url: an http(s) URL is required"
            ])
        );
        assert_eq!(
            first["warnings"],
            serde_json::json!([
                "1 of 3 records are invalid and were kept for review",
                "url https://a.example/x appears in records 0, 2"
            ])
        );
        assert_eq!((count("content_items"), count("content_revisions"), count("proposals")), before);
        let pkg = first["package_id"].as_str().unwrap();
        let invalid = json(&format!("SELECT querylayer_api.list_content_source_records('{pkg}', false)"));
        assert_eq!(invalid["records"].as_array().unwrap().len(), 1);
    }

    #[pg_test]
    fn evidence_reverification_opens_exactly_one_review_and_agents_see_only_metadata() {
        let site = content_site();
        let (run, content, rev) = draft(&site.secret, "claims");
        let sha = "a".repeat(64);
        expect_sqlstate(&format!(
            "SELECT querylayer_api.record_claim_evidence('{run}', '{rev}', 'not in the draft', 'https://s.example', 'q', now(), '{sha}')"
        ), "22023");
        json(&format!(
            "SELECT querylayer_api.record_claim_evidence('{run}', '{rev}', 'B', 'https://s.example/page', 'B', now(), '{sha}')"
        ));
        Spi::run("SELECT querylayer_api.make_evidence_jobs_due('demo')").unwrap();
        for observed in ["b", "c"] {
            let jobs = json("SELECT querylayer_api.worker_claim_evidence_jobs(10)");
            if let Some(job) = jobs.as_array().unwrap().first() {
                let id = job["job_id"].as_str().unwrap();
                let outcome = json(&format!(
                    "SELECT querylayer_api.worker_record_evidence_attempt('{id}', 200, '{}', 'secret body text')",
                    observed.repeat(64)
                ));
                assert_eq!(outcome["status"], "changed");
            }
        }
        assert_eq!(count("evidence_reviews"), 1);
        authenticate(&site.secret);
        let state = json(&format!("SELECT querylayer_api.list_evidence_reverification('{content}')"))
            ["evidence"]
            .clone();
        let text = state.to_string();
        assert!(state[0]["open_review"]["reason"] == "changed", "{state}");
        assert!(!text.contains("secret body text") && !text.contains(&"b".repeat(64)), "{text}");
    }

    #[pg_test]
    fn a_vanished_source_opens_exactly_one_vanished_review() {
        let site = content_site();
        let (run, content, rev) = draft(&site.secret, "claims");
        let sha = "a".repeat(64);
        // Two claims of the draft ("T" and "B"): one source answers 404, the other 410.
        let mut status_of = std::collections::HashMap::new();
        for (claim, http) in [("T", 404), ("B", 410)] {
            let ev = json(&format!(
                "SELECT querylayer_api.record_claim_evidence('{run}', '{rev}', '{claim}', 'https://s.example/{claim}', '{claim}', now(), '{sha}')"
            ));
            status_of.insert(ev["evidence_id"].as_str().unwrap().to_string(), http);
        }
        Spi::run("SELECT querylayer_api.make_evidence_jobs_due('demo')").unwrap();
        let mut attempts = 0;
        for _ in 0..2 {
            let jobs = json("SELECT querylayer_api.worker_claim_evidence_jobs(10)");
            for job in jobs.as_array().unwrap() {
                let id = job["job_id"].as_str().unwrap();
                let http = status_of[job["evidence_id"].as_str().unwrap()];
                let outcome = json(&format!(
                    "SELECT querylayer_api.worker_record_evidence_attempt('{id}', {http}, NULL, 'Not Found')"
                ));
                assert_eq!(outcome["status"], "vanished", "{http}: {outcome}");
                assert!(outcome["review_id"].is_string(), "{outcome}");
                attempts += 1;
            }
        }
        assert_eq!(attempts, 2, "a vanished source schedules no further job while its review is open");
        // Even when a job is forced onto the 404 evidence (as an operator bringing one forward
        // would), vanishing again opens no second review.
        let (gone, _) = status_of.iter().find(|(_, h)| **h == 404).unwrap();
        Spi::run(&format!(
            "SELECT querylayer.schedule_evidence_job(id, site_id, now()) FROM querylayer.claim_evidence WHERE id = '{gone}'"
        ))
        .unwrap();
        let jobs = json("SELECT querylayer_api.worker_claim_evidence_jobs(10)");
        assert_eq!(jobs.as_array().unwrap().len(), 1, "{jobs}");
        let again = json(&format!(
            "SELECT querylayer_api.worker_record_evidence_attempt('{}', 404, NULL)",
            jobs[0]["job_id"].as_str().unwrap()
        ));
        assert_eq!(again["status"], "vanished");
        assert_eq!(again["review_id"], Value::Null, "the open review is not duplicated: {again}");
        assert_eq!(count("evidence_attempts"), 3);
        let per_evidence = json(
            "SELECT jsonb_agg(jsonb_build_object('evidence_id', evidence_id, 'n', n, 'reasons', reasons))
               FROM (SELECT evidence_id, count(*) AS n, array_agg(reason || '/' || state) AS reasons
                       FROM querylayer.evidence_reviews GROUP BY evidence_id) r",
        );
        let per_evidence = per_evidence.as_array().unwrap();
        assert_eq!(per_evidence.len(), 2, "{per_evidence:?}");
        for r in per_evidence {
            assert_eq!(r["n"], 1, "{r}");
            assert_eq!(r["reasons"], serde_json::json!(["vanished/open"]), "{r}");
        }
        authenticate(&site.secret);
        let state = json(&format!("SELECT querylayer_api.list_evidence_reverification('{content}')"))
            ["evidence"]
            .clone();
        assert_eq!(state.as_array().unwrap().len(), 2, "{state}");
        for e in state.as_array().unwrap() {
            assert_eq!(e["open_review"]["reason"], "vanished", "{state}");
            assert_eq!(e["last_attempt"]["status"], "vanished", "{state}");
            assert_eq!(e["due_job"], Value::Null, "{state}");
        }
        as_member(&site.owner_token);
        let reviews = json("SELECT querylayer_api.console_list_evidence_reviews()")["reviews"].clone();
        let mut seen: Vec<i64> = reviews
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                assert_eq!(r["reason"], "vanished");
                r["observed"]["http_status"].as_i64().unwrap()
            })
            .collect();
        seen.sort();
        assert_eq!(seen, [404, 410]);
    }

    #[pg_test]
    fn the_retention_purge_removes_old_rejected_events_and_rejected_totals_follow_the_window() {
        let site = content_site();
        json(
            r#"SELECT querylayer_api.report_form_screening('demo', '[
            {"form": "contact", "decision": "rejected", "reason": "spam", "occurred_at": "2020-01-01T10:00:00Z", "contact": "a@b.example", "payload": {"msg": "buy"}},
            {"form": "contact", "decision": "rejected", "reason": "spam", "occurred_at": "2020-01-01T11:00:00Z"},
            {"form": "contact", "decision": "accepted", "reason": "clean", "occurred_at": "2020-01-01T12:00:00Z"},
            {"form": "contact", "decision": "rejected", "reason": "spam"}]')"#,
        );
        authenticate(&site.secret);
        let before = json("SELECT querylayer_api.form_screening_metrics(366)");
        Spi::run("SELECT querylayer_api.purge_form_screening()").unwrap();
        assert_eq!(
            count("form_screening_events"),
            2,
            "the old rejected events are gone; recent and accepted stay"
        );
        authenticate(&site.secret);
        let after = json("SELECT querylayer_api.form_screening_metrics(366)");
        assert_eq!(before, after);
        // The day rows stay, but rejected totals are reported only inside the retention window.
        let old = json("SELECT jsonb_agg(to_jsonb(d)) FROM querylayer.form_screening_daily d WHERE day = '2020-01-01' AND decision = 'rejected'");
        assert_eq!(old[0]["events"], 2);
        // Forty days back: inside the year asked for, outside the 30-day window of rejections.
        let day = text("SELECT ((now() - interval '40 days') AT TIME ZONE 'UTC')::date::text");
        json(&format!(
            r#"SELECT querylayer_api.report_form_screening('demo', '[
            {{"form": "contact", "decision": "rejected", "reason": "spam", "occurred_at": "{day}T12:00:00Z"}},
            {{"form": "contact", "decision": "accepted", "reason": "clean", "occurred_at": "{day}T12:00:00Z"}}]')"#
        ));
        authenticate(&site.secret);
        let now = json("SELECT querylayer_api.form_screening_metrics(366)");
        let reported: Vec<(String, String)> = now["counts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["day"].as_str().unwrap().to_string(), c["decision"].as_str().unwrap().to_string()))
            .collect();
        assert!(reported.contains(&(day.clone(), "accepted".to_string())), "{now}");
        assert!(!reported.contains(&(day, "rejected".to_string())), "{now}");
        assert!(reported.iter().any(|(_, d)| d == "rejected"), "today's rejection is reported: {now}");
        assert!(!after.to_string().contains("a@b.example"));
    }

    // ---------------------------------------------------------------------------------------
    // The semantics plane.

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

    // The reviewer's desk: reading, stale requests, passwords, sessions, delivery.
    include!("pg_tests_desk.rs");
}

//! In-database tests of staying up and telling the truth under faults: bounded values, runs that
//! end (and who may end them), idempotency keys, retention that leaves a signed account, and the
//! owner's DDL guard around partition maintenance. Each runs inside one rolled-back transaction;
//! what needs several sessions (a held lock, a concurrent duplicate, a deadline passing) lives in
//! the client-side tier (tests/db/faults.rs).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;
    use pgrx::JsonB;
    use serde_json::Value;

    fn json(sql: &str) -> Value {
        Spi::get_one::<JsonB>(sql).expect("query failed").expect("NULL result").0
    }

    /// Seeds the demo (as the superuser, an operator) and returns (connection secret, owner token).
    fn demo() -> (String, String) {
        let seeded = json("SELECT querylayer_api.seed_demo()");
        (
            seeded["connection"]["secret"].as_str().unwrap().to_string(),
            seeded["member_token"]["token"].as_str().unwrap().to_string(),
        )
    }

    fn authenticate(secret: &str) -> Value {
        json(&format!("SELECT querylayer_api.authenticate(sha256(convert_to('{secret}', 'UTF8')))"))
    }

    fn as_member(token: &str) -> Value {
        json(&format!("SELECT querylayer_api.authenticate_member(sha256(convert_to('{token}', 'UTF8')))"))
    }

    /// The SQLSTATE and message `sql` fails with (a subtransaction catches it).
    fn failure(sql: &str) -> (String, String) {
        let caught = Spi::get_one::<String>(&format!(
            "DO $t$ BEGIN EXECUTE $q${sql}$q$;
               PERFORM set_config('ql.failure', 'none|no error', true);
             EXCEPTION WHEN OTHERS THEN PERFORM set_config('ql.failure', SQLSTATE || '|' || SQLERRM, true); END $t$;
             SELECT current_setting('ql.failure')"
        ))
        .unwrap()
        .unwrap();
        let (state, message) = caught.split_once('|').unwrap();
        (state.to_string(), message.to_string())
    }

    /// A second agent on the demo site with its own connection; returns its secret.
    fn other_agent() -> String {
        Spi::run("SELECT querylayer_api.create_agent('demo', 'other-agent')").unwrap();
        Spi::run("SELECT querylayer_api.grant_agent_scopes('demo', 'other-agent', '{runs:write,runs:read}')")
            .unwrap();
        json("SELECT querylayer_api.create_connection('demo', 'other-agent', 'o1', '{runs:write,runs:read}', now() + interval '1 hour')")
            ["secret"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn member(handle: &str, role: &str) -> String {
        Spi::run(&format!("SELECT querylayer_api.create_member('demo', '{handle}')")).unwrap();
        Spi::run(&format!("SELECT querylayer_api.set_member_role('demo', '{handle}', '{role}')")).unwrap();
        json(&format!(
            "SELECT querylayer_api.create_member_token('demo', '{handle}', 't', now() + interval '1 hour')"
        ))["token"]
            .as_str()
            .unwrap()
            .to_string()
    }

    // -----------------------------------------------------------------------------------------
    // Bounded storage.

    #[pg_test]
    fn an_oversized_value_is_refused_naming_the_argument_on_every_path() {
        let (secret, _) = demo();
        authenticate(&secret);
        let (state, message) =
            failure("SELECT querylayer_api.begin_run('x', jsonb_build_object('big', repeat('x', 70000)))");
        assert_eq!(state, "QL413");
        assert!(message.starts_with("input is too large: 70011 bytes, at most 65536"), "{message}");
        let run = json("SELECT querylayer_api.begin_run('x')");
        let id = run["run_id"].as_str().unwrap();
        let (state, message) =
            failure(&format!("SELECT querylayer_api.finish_run('{id}', 'failed', repeat('s', 20000))"));
        assert_eq!(
            (state.as_str(), message.starts_with("summary is too large")),
            ("QL413", true),
            "{message}"
        );
        // The table holds the limit, not the function: a direct insert meets it too.
        let (state, _) = failure(&format!(
            "INSERT INTO querylayer.run_artifacts (site_id, run_id, key, value, agent_id, connection_id, harness)
             SELECT site_id, id, 'k', to_jsonb(repeat('v', 1100000)), agent_id, connection_id, harness
               FROM querylayer.runs WHERE id = '{id}'"
        ));
        assert_eq!(state, "QL413");
    }

    #[pg_test]
    fn the_documented_size_limits_are_the_tables() {
        let doc = include_str!("../../docs/api.md");
        let section = doc.split("### Size limits").nth(1).expect("docs/api.md has a Size limits section");
        let mut documented: Vec<String> = section
            .lines()
            .skip_while(|l| !l.starts_with("|---"))
            .skip(1)
            .take_while(|l| l.starts_with("| `"))
            .map(|l| l.replace(['`', ' '], ""))
            .collect();
        documented.sort();
        let enforced = Spi::get_one::<String>(
            "SELECT string_agg(format('|%s|%s|%s|%s|', table_name, column_name, argument, max_bytes), ' ')
               FROM querylayer.value_limits",
        )
        .unwrap()
        .unwrap();
        let mut enforced: Vec<&str> = enforced.split(' ').collect();
        enforced.sort();
        assert_eq!(documented, enforced);
    }

    #[pg_test]
    fn the_limits_table_names_a_column_of_every_table_it_lists() {
        let missing = Spi::get_one::<i64>(
            "SELECT count(*) FROM querylayer.value_limits l
              WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a
                                 WHERE a.attrelid = format('querylayer.%I', l.table_name)::regclass
                                   AND a.attname = l.column_name AND NOT a.attisdropped)
                 OR NOT EXISTS (SELECT 1 FROM pg_trigger t
                                 WHERE t.tgrelid = format('querylayer.%I', l.table_name)::regclass
                                   AND t.tgname = 'a0_value_limits' AND t.tgenabled = 'A')",
        )
        .unwrap()
        .unwrap();
        assert_eq!(missing, 0);
    }

    // -----------------------------------------------------------------------------------------
    // Runs end.

    #[pg_test]
    fn a_deadline_beyond_the_operators_bound_is_refused() {
        let (secret, _) = demo();
        Spi::run("SELECT querylayer_api.set_setting('run_deadline_default_seconds', '600')").unwrap();
        Spi::run("SELECT querylayer_api.set_setting('run_deadline_max_seconds', '3600')").unwrap();
        authenticate(&secret);
        let (state, message) = failure("SELECT querylayer_api.begin_run('x', '{}', '{}', '{}', 3601)");
        assert_eq!(state, "22023");
        assert!(message.contains("deadline_seconds must be between 1 and 3600"), "{message}");
        let run = json("SELECT querylayer_api.begin_run('x', '{}', '{}', '{}', 60)");
        assert!(run["deadline_at"].is_string());
        let default = json("SELECT querylayer_api.begin_run('x')");
        assert!(
            default["deadline_at"].as_str() > run["deadline_at"].as_str(),
            "the default (10 min) is later"
        );
    }

    #[pg_test]
    fn another_agent_cannot_finish_or_close_a_run() {
        let (secret, _) = demo();
        let other = other_agent();
        authenticate(&secret);
        let run = json("SELECT querylayer_api.begin_run('x')");
        let id = run["run_id"].as_str().unwrap().to_string();
        authenticate(&other);
        let (state, message) = failure(&format!("SELECT querylayer_api.finish_run('{id}', 'cancelled')"));
        assert_eq!(
            (state.as_str(), message.as_str()),
            ("QL403", format!("run {id} belongs to another agent").as_str())
        );
        // Not through the table either: a finished event in the run's name from another agent.
        let (state, _) = failure(&format!(
            "INSERT INTO querylayer.run_events (site_id, run_id, kind, agent_id, connection_id, harness, outcome)
             SELECT site_id, id, 'finished', agent_id, connection_id, harness, 'cancelled' FROM querylayer.runs WHERE id = '{id}'"
        ));
        assert_eq!(state, "QL403");
    }

    #[pg_test]
    fn another_connection_of_the_same_agent_may_finish_its_run() {
        let (secret, _) = demo();
        let second = json(
            "SELECT querylayer_api.create_connection('demo', 'demo-agent', 'second', '{runs:write}', now() + interval '1 hour')",
        )["secret"]
            .as_str()
            .unwrap()
            .to_string();
        authenticate(&secret);
        let id = json("SELECT querylayer_api.begin_run('x')")["run_id"].as_str().unwrap().to_string();
        authenticate(&second);
        let done = json(&format!(
            "SELECT querylayer_api.finish_run('{id}', 'failed', 'the first connection was lost')"
        ));
        assert_eq!(done["outcome"], "failed");
        // It may not add artifacts to a run it did not begin.
        let (state, _) = failure(&format!("SELECT querylayer_api.record_artifact('{id}', 'k', '1')"));
        assert_eq!(state, "QL403");
    }

    #[pg_test]
    fn an_owner_cancels_a_run_and_its_history_says_who_and_why() {
        let (secret, owner) = demo();
        authenticate(&secret);
        let id = json("SELECT querylayer_api.begin_run('x')")["run_id"].as_str().unwrap().to_string();
        let viewer = member("watcher", "viewer");
        as_member(&viewer);
        let (state, _) = failure(&format!("SELECT querylayer_api.console_cancel_run('{id}', 'no')"));
        assert_eq!(state, "QL403");
        as_member(&owner);
        let run = json(&format!("SELECT querylayer_api.console_cancel_run('{id}', 'stuck since Monday')"));
        assert_eq!(
            (run["outcome"].as_str(), run["reason_code"].as_str()),
            (Some("cancelled"), Some("cancelled_by_member"))
        );
        assert_eq!(run["reasons"][0]["closed_by"]["kind"], "member");
        assert_eq!(run["reasons"][0]["closed_by"]["role"], "owner");
        assert_eq!(run["reasons"][0]["message"], "stuck since Monday");
        let (state, _) = failure(&format!("SELECT querylayer_api.console_cancel_run('{id}')"));
        assert_eq!(state, "QL410", "a finished run has nothing to cancel");
        // A member may only cancel, and only in the run's agent's name.
        authenticate(&secret);
        json("SELECT querylayer_api.begin_run('x')");
        as_member(&owner);
        let (state, _) = failure(
            "INSERT INTO querylayer.run_events (site_id, run_id, kind, agent_id, connection_id, harness, outcome)
             SELECT site_id, id, 'finished', agent_id, connection_id, harness, 'completed' FROM querylayer.runs
              WHERE NOT EXISTS (SELECT 1 FROM querylayer.run_events e WHERE e.run_id = runs.id AND e.kind = 'finished')",
        );
        assert_eq!(state, "QL403");
    }

    #[pg_test]
    fn an_operator_cancels_a_run_by_site() {
        let (secret, _) = demo();
        authenticate(&secret);
        let id = json("SELECT querylayer_api.begin_run('x')")["run_id"].as_str().unwrap().to_string();
        let run = json(&format!("SELECT querylayer_api.cancel_run('demo', '{id}', 'maintenance')"));
        assert_eq!(run["reason_code"], "cancelled_by_operator");
        assert_eq!(run["reasons"][0]["closed_by"]["kind"], "operator");
        assert_eq!(json("SELECT querylayer_api.verify_ledger('demo')")["ok"], true);
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

    // -----------------------------------------------------------------------------------------
    // Idempotency keys.

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

    // -----------------------------------------------------------------------------------------
    // Retention and the owner's DDL guard.

    #[pg_test]
    fn the_owner_cannot_drop_or_create_a_partition_by_itself() {
        demo();
        Spi::run("SET LOCAL ROLE querylayer_owner").unwrap();
        for sql in [
            "DROP TABLE querylayer.audit_events_default",
            "ALTER TABLE querylayer.audit_events DETACH PARTITION querylayer.audit_events_default",
            "CREATE TABLE querylayer.audit_events_p209901 PARTITION OF querylayer.audit_events FOR VALUES FROM ('2099-01-01') TO ('2099-02-01')",
            "TRUNCATE querylayer.audit_events_default",
        ] {
            let (state, message) = failure(sql);
            assert!(state == "42501" || state == "QL423", "{sql}: {state} {message}");
        }
        assert!(!Spi::get_one::<bool>("SELECT querylayer.partition_maintenance_active()").unwrap().unwrap());
    }

    #[pg_test]
    fn the_owner_creates_month_partitions_and_nothing_else() {
        demo();
        // As apply_retention runs: the owner, creating a month ahead.
        Spi::run("SET LOCAL ROLE querylayer_owner").unwrap();
        let name = Spi::get_one::<String>(
            "SELECT querylayer.create_time_partition('querylayer.audit_events', 2099, 11)",
        )
        .unwrap()
        .unwrap();
        assert_eq!(name, "querylayer.audit_events_p209911");
        let (state, _) = failure("CREATE TABLE querylayer.anything (x int)");
        assert_eq!(state, "42501", "outside partition maintenance the owner creates nothing");
    }

    #[pg_test]
    fn a_month_inside_the_retention_window_is_not_dropped() {
        demo();
        let current = Spi::get_one::<String>(
            "SELECT partition_name FROM querylayer.time_partitions()
              WHERE table_name = 'querylayer.audit_events' AND range_from <= now() AND range_to > now()",
        )
        .unwrap()
        .unwrap();
        Spi::run("SELECT querylayer.enter_operator(NULL)").unwrap();
        let (state, _) = failure(&format!("SELECT querylayer.drop_aged_partition('{current}')"));
        assert_eq!(state, "QL422");
        let (state, _) = failure("SELECT querylayer.drop_aged_partition('querylayer.runs')");
        assert_eq!(state, "XX000", "governed history is not a partition of an aging table");
    }

    #[pg_test]
    fn dropping_an_aged_month_leaves_a_signed_summary_in_each_sites_chain() {
        let (secret, _) = demo();
        Spi::run("SELECT querylayer.create_time_partition('querylayer.audit_events', 2020, 3)").unwrap();
        Spi::run(
            "INSERT INTO querylayer.audit_events (at, site_id, principal_kind, action)
             SELECT ('2020-03-0' || n || ' 12:00+00')::timestamptz, (SELECT id FROM querylayer.sites WHERE slug = 'demo'), 'connection', 'tool.call'
               FROM generate_series(1, 3) n
             UNION ALL SELECT '2020-03-09 12:00+00', NULL, 'anonymous', 'authenticate'",
        )
        .unwrap();
        let result = json("SELECT querylayer_api.apply_retention()");
        let dropped = result["dropped"].as_array().unwrap();
        assert_eq!(dropped.len(), 1, "{result}");
        assert_eq!(dropped[0]["rows"], 4);
        assert_eq!(
            Spi::get_one::<bool>("SELECT to_regclass('querylayer.audit_events_p202003') IS NULL").unwrap(),
            Some(true)
        );
        let drop = json("SELECT to_jsonb(d) FROM querylayer_api.list_retention_drops() d");
        assert_eq!(drop["signature_valid"], true);
        assert_eq!(drop["statement"]["without_site"]["rows"], 1);
        let summary = json(
            "SELECT jsonb_build_object('statement', s.statement, 'valid',
                    querylayer.statement_signature_valid(s.statement, s.signature, k.did_key))
               FROM querylayer.retention_summaries s JOIN querylayer.server_keys k ON k.id = s.server_key_id",
        );
        assert_eq!(summary["valid"], true);
        assert_eq!(summary["statement"]["rows"], 3);
        assert_eq!(summary["statement"]["table"], "querylayer.audit_events");
        let ledger = json("SELECT querylayer_api.verify_ledger('demo')");
        assert_eq!(ledger["ok"], true, "{ledger}");
        // A changed summary no longer verifies.
        let forged = Spi::get_one::<bool>(
            "SELECT querylayer.statement_signature_valid(s.statement || '{\"rows\": 2}', s.signature, k.did_key)
               FROM querylayer.retention_summaries s JOIN querylayer.server_keys k ON k.id = s.server_key_id",
        )
        .unwrap()
        .unwrap();
        assert!(!forged);
        // Governed history stays: the run this agent began is untouched.
        authenticate(&secret);
        assert!(json("SELECT querylayer_api.list_runs(10)")["runs"].is_array());
    }

    #[pg_test]
    fn health_reports_what_it_checks() {
        demo();
        let health = json("SELECT querylayer_api.health()");
        assert_eq!(health["writable"], true, "{health}");
        assert_eq!(health["in_recovery"], false);
        assert!(health["extension_version"].is_string());
        assert!(health["free_bytes"].as_i64().unwrap() > 0);
        Spi::run("SELECT querylayer_api.set_setting('readiness_min_free_mb', '1048576')").unwrap();
        assert_eq!(json("SELECT querylayer_api.health()")["writable"], false, "a terabyte is not free here");
    }
}

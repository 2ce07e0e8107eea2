//! The Agent Console and task plans (`sql/110_console_tasks.sql`).

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{
        as_member, as_owner, authenticate, content_site, expect_sqlstate, json, live_pointer, redraft,
        request_publish, text, Site,
    };
    use pgrx::prelude::*;
    use serde_json::Value;

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

    /// A plan step without its progress (state), to compare step definitions across versions.
    fn step_definition(step: &Value) -> Value {
        let mut s = step.clone();
        s.as_object_mut().unwrap().remove("state");
        s
    }

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
}

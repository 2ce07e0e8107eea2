//! Governed runs (`sql/060_runs.sql`): required outputs, finished runs, deadlines, and who may
//! finish, close or cancel a run.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{
        as_edge, as_member, authenticate, demo, demo_secret, expect_sqlstate, failure, json, member_token,
        other_agent,
    };
    use pgrx::prelude::*;

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

    /// begin_run answers from the row it holds (no finish, no artifact, the deadline it wrote);
    /// the answer is the run as run_json reads it back.
    #[pg_test]
    fn a_begun_runs_answer_is_the_run_as_read_back() {
        let secret = demo_secret();
        as_edge();
        authenticate(&secret);
        for call in [
            "SELECT querylayer_api.begin_run('article.draft', '{\"topic\": \"x\"}', '{draft_id,summary}', '{\"a draft exists\"}', 90)",
            "SELECT querylayer_api.begin_run('x')",
        ] {
            let run = json(call);
            let id = run["run_id"].as_str().unwrap();
            Spi::run("RESET ROLE").unwrap();
            let read_back = json(&format!(
                "SELECT querylayer.run_json(r) FROM querylayer.runs r WHERE id = '{id}'"
            ));
            as_edge();
            assert_eq!(run, read_back, "{call}");
            assert_eq!(run["state"], "open");
            assert!(run["deadline_at"].is_string(), "{run}");
        }
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
        // Each deadline is its run's start and the seconds asked for, or the operator's default.
        for (answer, seconds) in [(&run, 60), (&default, 600)] {
            let id = answer["run_id"].as_str().unwrap();
            Spi::run("RESET ROLE").unwrap();
            let after = Spi::get_one::<f64>(&format!(
                "SELECT extract(epoch FROM d.deadline_at - r.started_at)::float8
                   FROM querylayer.runs r JOIN querylayer.run_deadlines d ON d.run_id = r.id WHERE r.id = '{id}'"
            ))
            .unwrap()
            .unwrap();
            as_edge();
            assert_eq!(after, f64::from(seconds), "{answer}");
        }
        // A bound lowered below the default refuses the default too, naming the bound.
        Spi::run("RESET ROLE").unwrap();
        Spi::run("UPDATE querylayer.settings SET value = '300' WHERE key = 'run_deadline_max_seconds'")
            .unwrap();
        as_edge();
        let (state, message) = failure("SELECT querylayer_api.begin_run('x')");
        assert_eq!(state, "22023");
        assert!(message.contains("between 1 and 300") && message.contains("got NULL"), "{message}");
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
        let viewer = member_token("watcher", "viewer");
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

    /// `list_runs` (the tool querylayer_list_runs): the connection's site only, newest first, by
    /// status and agent, in pages; refused without runs:read.
    #[pg_test]
    fn list_runs_pages_the_sites_runs_newest_first_by_status_and_agent() {
        let (secret, _) = demo();
        let other = other_agent();
        Spi::run("SELECT querylayer_api.create_site('demo', 'elsewhere')").unwrap();
        Spi::run("SELECT querylayer_api.grant_agent_scopes('elsewhere', 'demo-agent', '{runs:write}')")
            .unwrap();
        let elsewhere = json(
            "SELECT querylayer_api.create_connection('elsewhere', 'demo-agent', 'e1', '{runs:write}', now() + interval '1 hour')",
        )["secret"]
            .as_str()
            .unwrap()
            .to_string();
        let writer = json(
            "SELECT querylayer_api.create_connection('demo', 'demo-agent', 'w1', '{runs:write}', now() + interval '1 hour')",
        )["secret"]
            .as_str()
            .unwrap()
            .to_string();
        let begin = |run_type: &str| -> String {
            json(&format!("SELECT querylayer_api.begin_run('{run_type}')"))["run_id"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let ids = |sql: &str| -> Vec<String> {
            json(sql)["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["run_id"].as_str().unwrap().to_string())
                .collect()
        };
        authenticate(&elsewhere);
        begin("listed.elsewhere");
        authenticate(&secret);
        let first = begin("listed.first");
        let failed = begin("listed.failed");
        Spi::run(&format!("SELECT querylayer_api.finish_run('{failed}', 'failed')")).unwrap();
        authenticate(&other);
        let theirs = begin("listed.theirs");

        authenticate(&secret);
        Spi::run(&format!("SELECT querylayer_api.record_artifact('{first}', 'b', '1')")).unwrap();
        Spi::run(&format!("SELECT querylayer_api.record_artifact('{first}', 'a', '2')")).unwrap();
        let all = json("SELECT querylayer_api.list_runs()");
        // A page is one query (querylayer.run_json_list); each run in it is the run get_run shows,
        // member for member, with its agent's handle.
        for run in all["runs"].as_array().unwrap() {
            let id = run["run_id"].as_str().unwrap();
            let whole = json(&format!("SELECT querylayer_api.get_run('{id}')"));
            let members = run.as_object().unwrap();
            assert_eq!(members.len(), 20, "{run}");
            for (key, value) in members.iter().filter(|(key, _)| key.as_str() != "agent") {
                assert_eq!(&whole[key], value, "{key} of {id}");
            }
        }
        assert_eq!(all["runs"][2]["artifact_keys"], serde_json::json!(["a", "b"]));
        assert_eq!(all["runs"][1]["state"], "finished");
        assert_eq!(all["runs"][1]["outcome"], "failed");
        assert!(
            all["runs"][1]["deadline_at"].is_string() && all["runs"][1]["finished_at"].is_string(),
            "{all}"
        );
        assert_eq!(all["runs"][0]["state"], "open");
        assert_eq!(
            ids("SELECT querylayer_api.list_runs()"),
            [theirs.as_str(), failed.as_str(), first.as_str()],
            "this site's, newest first"
        );
        assert_eq!(all["runs"][0]["agent"], "other-agent");
        assert_eq!(ids("SELECT querylayer_api.list_runs(p_agent => 'other-agent')"), [theirs.as_str()]);
        assert_eq!(
            ids("SELECT querylayer_api.list_runs(p_status => 'open')"),
            [theirs.as_str(), first.as_str()]
        );
        assert_eq!(
            ids("SELECT querylayer_api.list_runs(p_status => 'failed', p_agent => 'demo-agent')"),
            [failed.as_str()]
        );
        assert!(ids("SELECT querylayer_api.list_runs(p_agent => 'no-such-agent')").is_empty());
        let page = json("SELECT querylayer_api.list_runs(p_limit => 2)");
        let cursor = page["next_cursor"].as_str().unwrap();
        assert_eq!(
            ids(&format!("SELECT querylayer_api.list_runs(p_limit => 2, p_cursor => '{cursor}')")),
            [first.as_str()]
        );
        let (state, message) = failure("SELECT querylayer_api.list_runs(p_status => 'done')");
        assert_eq!(state, "22023");
        assert!(message.contains("status is open, completed"), "{message}");
        expect_sqlstate("SELECT querylayer_api.list_runs(p_limit => 501)", "22023");
        // runs:write alone does not read runs.
        authenticate(&writer);
        expect_sqlstate("SELECT querylayer_api.list_runs()", "QL403");
    }
}

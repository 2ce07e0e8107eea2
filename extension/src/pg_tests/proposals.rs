//! Proposals and decisions (`sql/080_proposals.sql`): who may decide, stale publishes, unpublish,
//! archive and restore checked at decision time, risk assigned by the server.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{
        as_member, authenticate, content_site, count, draft, expect_sqlstate, json, lifecycle_proposal,
        live_pointer, member_token, redraft, request_publish, text,
    };
    use pgrx::prelude::*;
    use serde_json::Value;

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
        let restore = lifecycle_proposal(&run_id, &content_id, "restore", Some(&archived_at));
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

    /// `list_proposals` filters a state on the decision and execution rows, with `proposal_json`'s
    /// rule written again: each state's page is exactly the proposals `proposal_json` puts in that
    /// state, in the same order, and every branch of the rule is met.
    #[pg_test]
    fn each_state_lists_exactly_the_proposals_in_that_state() {
        let site = content_site();
        let (run_id, a, a_revision) = draft(&site.secret, "a");
        let pending = request_publish(&run_id, &a, &a_revision);
        let (run_id, b, b_revision) = draft(&site.secret, "b");
        let applied = request_publish(&run_id, &b, &b_revision);
        let (run_id, c, c_revision) = draft(&site.secret, "c");
        let failed = request_publish(&run_id, &c, &c_revision);
        redraft(&run_id, &c);
        let (run_id, d, d_revision) = draft(&site.secret, "d");
        let rejected = request_publish(&run_id, &d, &d_revision);
        let approved = json(&format!(
            "SELECT querylayer_api.create_proposal('{run_id}', 'revision',
               '{{\"content_id\": \"{d}\", \"revision_id\": \"{d_revision}\"}}')"
        ))["proposal_id"]
            .as_str()
            .unwrap()
            .to_string();
        as_member(&site.owner_token);
        for (proposal, decision) in
            [(&applied, "approve"), (&failed, "approve"), (&rejected, "reject"), (&approved, "approve")]
        {
            Spi::run(&format!("SELECT querylayer_api.decide_proposal('{proposal}', '{decision}')")).unwrap();
        }
        let page = |state: &str| -> Vec<(String, String)> {
            let listed =
                json(&format!("SELECT querylayer_api.console_list_proposals({state}, 500) -> 'proposals'"));
            listed
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    (p["proposal_id"].as_str().unwrap().to_string(), p["state"].as_str().unwrap().to_string())
                })
                .collect()
        };
        let all = page("NULL");
        for (proposal, state) in [
            (&pending, "pending"),
            (&applied, "applied"),
            (&failed, "failed"),
            (&rejected, "rejected"),
            (&approved, "approved"),
        ] {
            assert!(all.contains(&(proposal.clone(), state.to_string())), "{proposal} {state}: {all:?}");
        }
        for state in ["pending", "approved", "applied", "failed", "rejected"] {
            let expected: Vec<_> = all.iter().filter(|(_, s)| s == state).cloned().collect();
            assert_eq!(page(&format!("'{state}'")), expected, "{state}");
        }
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
}

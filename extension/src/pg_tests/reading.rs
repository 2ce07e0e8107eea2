//! Reading for agents and reviewers (`sql/170_reading.sql`): revisions, history, templates, and a
//! stale publish request flagged before anyone decides.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{
        as_member, authenticate, content_site, draft, expect_sqlstate, json, live_pointer, redraft,
        request_publish,
    };
    use pgrx::prelude::*;
    use serde_json::Value;

    #[pg_test]
    fn agents_read_revisions_their_history_and_the_templates() {
        let site = content_site();
        let (run_id, content_id, first) = draft(&site.secret, "readable");
        let second = redraft(&run_id, &content_id);
        let revision = json(&format!("SELECT querylayer_api.get_revision('{second}')"));
        assert_eq!(revision["fields"]["title"], "T2");
        assert_eq!(
            (revision["template"].as_str(), revision["template_version"].as_i64()),
            (Some("article"), Some(1))
        );
        assert_eq!(revision["author"]["agent"], "demo-agent");
        assert_eq!(revision["author"]["run_id"], run_id.as_str());
        assert_eq!(revision["author"]["run_type"], "article.draft");
        assert_eq!(
            (revision["is_draft"].as_bool(), revision["is_live"].as_bool()),
            (Some(true), Some(false))
        );

        let history = json(&format!("SELECT querylayer_api.list_revisions('{content_id}', 1)"));
        assert_eq!(history["revisions"][0]["revision_id"], second.as_str());
        let cursor = history["next_cursor"].as_str().expect("a next_cursor while older revisions remain");
        let older = json(&format!("SELECT querylayer_api.list_revisions('{content_id}', 1, '{cursor}')"));
        assert_eq!(older["revisions"][0]["revision_id"], first.as_str());
        assert_eq!(older["next_cursor"], Value::Null);
        assert_eq!(revision["previous_revision_id"], first.as_str());

        let templates = json("SELECT querylayer_api.list_templates()");
        assert_eq!(templates["next_cursor"], Value::Null);
        let templates = &templates["templates"];
        assert_eq!(templates[0]["name"], "article");
        assert!(templates[0]["fields"].as_array().unwrap().iter().any(|f| f["name"] == "body"));
        assert_eq!(json("SELECT querylayer_api.site_context()")["templates"], serde_json::json!(["article"]));

        let item = json(&format!("SELECT querylayer_api.get_content('{content_id}')"));
        assert_eq!(item["draft"]["revision_id"], second.as_str());
        assert_eq!(item["live"], Value::Null);

        // Without content:read a connection reads nothing.
        let narrow = json(
            "SELECT querylayer_api.create_connection('demo', 'demo-agent', 'narrow', '{runs:write}', now() + interval '1 hour')",
        );
        authenticate(narrow["secret"].as_str().unwrap());
        expect_sqlstate(&format!("SELECT querylayer_api.get_revision('{second}')"), "QL403");
        expect_sqlstate(&format!("SELECT querylayer_api.list_revisions('{content_id}')"), "QL403");
        expect_sqlstate("SELECT querylayer_api.list_templates()", "QL403");
    }

    #[pg_test]
    fn a_stale_publish_request_is_flagged_before_anyone_decides() {
        let site = content_site();
        let (run_id, content_id, revision_id) = draft(&site.secret, "moving");
        let proposal = request_publish(&run_id, &content_id, &revision_id);
        let fresh = json(&format!("SELECT querylayer_api.get_proposal('{proposal}')"));
        assert_eq!(fresh["stale"], false);
        assert_eq!(fresh["details"][0]["requested"]["fields"]["title"], "T");
        assert_eq!(fresh["details"][0]["live"], Value::Null);
        assert_eq!(fresh["run"]["run_id"], run_id.as_str());
        assert_eq!(fresh["agent"], "demo-agent");

        let newer = redraft(&run_id, &content_id);
        as_member(&site.owner_token);
        let listed = json("SELECT querylayer_api.console_list_proposals('pending')");
        let card = listed["proposals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["proposal_id"] == proposal.as_str())
            .unwrap();
        assert_eq!(card["stale"], true);
        assert_eq!(card["stale_problems"][0]["reason"], "stale_revision");
        let runs =
            json("SELECT querylayer_api.console_list_runs('open', 'demo-agent', now() - interval '1 hour')");
        assert_eq!(runs["runs"][0]["agent"], "demo-agent");
        assert_eq!(
            json("SELECT querylayer_api.console_list_runs('failed')"),
            serde_json::json!({"runs": [], "next_cursor": null})
        );
        let inbox = json("SELECT querylayer_api.console_inbox()");
        assert_eq!(inbox["proposals"][0]["risk"], "high");
        assert_eq!(inbox["proposals"][0]["stale"], true);
        let detail = json(&format!("SELECT querylayer_api.get_proposal('{proposal}')"));
        assert_eq!(detail["details"][0]["current_draft_revision_id"], newer.as_str());
        assert_eq!(detail["details"][0]["problem"]["reason"], "stale_revision");

        // Approving it anyway is recorded, executes nothing, and is no longer called stale (decided).
        let decided = json(&format!("SELECT querylayer_api.decide_proposal('{proposal}', 'approve')"));
        assert_eq!((decided["state"].as_str(), decided["stale"].as_bool()), (Some("failed"), Some(false)));
        assert_eq!(live_pointer(&content_id), None);
    }
}

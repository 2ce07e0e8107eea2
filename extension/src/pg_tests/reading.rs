//! Reading for agents and reviewers (`sql/170_reading.sql`): revisions, history, templates, pages
//! of content, and a stale publish request flagged before anyone decides.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{
        as_member, authenticate, content_site, draft, expect_sqlstate, json, lifecycle_proposal,
        live_pointer, redraft, request_publish, text,
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

    /// Every item of a page of content, as the agent's list and the desk's list page it (one
    /// query a page, `content_json_list`), and the item get_content shows are one shape: the same
    /// members with the same values, page by page in list order, filtered by state, in every
    /// state (the page writes the item's shape and its state's rule in its own query).
    #[pg_test]
    fn a_page_of_content_shows_each_item_as_get_content_does() {
        let site = content_site();
        let (run_id, published, first) = draft(&site.secret, "paged-a");
        let mut archived = String::new();
        for slug in ["paged-b", "paged-c", "paged-d"] {
            archived = json(&format!(
                "SELECT querylayer_api.create_draft('{run_id}', 'article', '{{\"title\": \"{slug}\", \"body\": \"B\"}}', NULL, '{slug}')"
            ))["content_id"]
                .as_str()
                .unwrap()
                .to_string();
        }
        let proposal = request_publish(&run_id, &published, &first);
        let archive = lifecycle_proposal(&run_id, &archived, "archive", None);
        as_member(&site.owner_token);
        json(&format!("SELECT querylayer_api.decide_proposal('{proposal}', 'approve')"));
        assert_eq!(live_pointer(&published).as_deref(), Some(first.as_str()));
        let decided = json(&format!("SELECT querylayer_api.decide_proposal('{archive}', 'approve')"));
        assert_eq!(decided["execution"]["status"], "applied", "{decided}");
        authenticate(&site.secret);
        redraft(&run_id, &published);
        as_member(&site.owner_token);

        let pages = |list: &str, order: &str| -> Vec<Value> {
            let mut items = Vec::new();
            let mut cursor = "NULL".to_string();
            loop {
                let page = json(&format!("SELECT querylayer_api.{list}(NULL, 2, {cursor})"));
                let got = page["items"].as_array().unwrap();
                assert!(got.len() <= 2, "{page}");
                items.extend(got.iter().cloned());
                match page["next_cursor"].as_str() {
                    Some(next) => cursor = format!("'{next}'"),
                    None => break,
                }
            }
            let ids: Vec<&str> = items.iter().map(|i| i["content_id"].as_str().unwrap()).collect();
            let expected = text(&format!(
                "SELECT string_agg(id::text, ',' ORDER BY {order}) FROM querylayer.content_items
                  WHERE site_id = querylayer.ctx_site_id()"
            ));
            assert_eq!(ids.join(","), expected, "{list} pages every item once, in its order");
            items
        };
        let desk = pages("console_list_content", "updated_at DESC, id DESC");
        authenticate(&site.secret);
        let agent = pages("list_content", "created_at DESC, id DESC");
        assert!(agent.len() >= 4, "{agent:?}");
        for item in &agent {
            let id = item["content_id"].as_str().unwrap();
            let whole = json(&format!("SELECT querylayer_api.get_content('{id}')"));
            let members = item.as_object().unwrap();
            assert_eq!(members.len(), 12, "{item}");
            for (key, value) in members {
                assert_eq!(&whole[key], value, "{key} of {id}");
            }
            assert!(desk.contains(item), "the desk shows {item} alike");
        }
        let state =
            |s: &str| json(&format!("SELECT querylayer_api.list_content('{s}', 50)"))["items"].clone();
        let published_page = state("published");
        assert_eq!(published_page.as_array().unwrap().len(), 1, "{published_page}");
        assert_eq!(published_page[0]["content_id"], published.as_str());
        assert_eq!(published_page[0]["has_unpublished_changes"], true);
        assert_eq!(published_page[0]["title"], "T2");
        assert!(state("draft")
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["state"] == "draft" && i["content_id"] != published.as_str()));
        let archived_page = state("archived");
        assert_eq!(archived_page.as_array().unwrap().len(), 1, "{archived_page}");
        assert_eq!(archived_page[0]["content_id"], archived.as_str());
        assert!(archived_page[0]["archived_at"].is_string(), "{archived_page}");

        // Each list's filter writes content_state's rule in its query: every state's page is
        // exactly the items content_state puts in that state, in the list's order.
        let filtered = |list: &str, s: &str| -> String {
            let page = json(&format!("SELECT querylayer_api.{list}('{s}', 50)"));
            let ids: Vec<&str> =
                page["items"].as_array().unwrap().iter().map(|i| i["content_id"].as_str().unwrap()).collect();
            ids.join(",")
        };
        let ruled = |s: &str, order: &str| {
            text(&format!(
                "SELECT coalesce(string_agg(c.id::text, ',' ORDER BY {order}), '') FROM querylayer.content_items c
                  WHERE c.site_id = querylayer.ctx_site_id() AND querylayer.content_state(c) = '{s}'"
            ))
        };
        for s in ["draft", "published", "archived"] {
            let expected = ruled(s, "c.created_at DESC, c.id DESC");
            assert!(!expected.is_empty(), "an item is {s}");
            assert_eq!(filtered("list_content", s), expected, "list_content('{s}')");
        }
        as_member(&site.owner_token);
        for s in ["draft", "published", "archived"] {
            assert_eq!(
                filtered("console_list_content", s),
                ruled(s, "c.updated_at DESC, c.id DESC"),
                "console_list_content('{s}')"
            );
        }
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

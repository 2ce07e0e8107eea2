//! The delivery API (`sql/180_delivery.sql`, `delivery.rs`): only what is live, and only an owner
//! makes a site public.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{
        as_member, authenticate, content_site, draft, expect_sqlstate, fingerprint, json, member_token,
        redraft, request_publish,
    };
    use pgrx::prelude::*;

    #[pg_test]
    fn delivery_serves_only_what_is_live_and_nothing_else() {
        let site = content_site();
        let (run_id, content_id, revision_id) = draft(&site.secret, "hello");
        let token = json(
            "SELECT querylayer_api.create_delivery_token('demo', 'website', now() + interval '30 days')",
        );
        let token = token["token"].as_str().unwrap().to_string();
        assert!(token.starts_with("qld_"));
        let as_website =
            || json(&format!("SELECT querylayer_api.authenticate_delivery('demo', {})", fingerprint(&token)));
        as_website();
        expect_sqlstate("SELECT querylayer_api.delivery_item('hello')", "QL404");
        assert_eq!(json("SELECT querylayer_api.delivery_items()")["items"], serde_json::json!([]));
        // The token reads nothing but delivery.
        expect_sqlstate("SELECT querylayer_api.list_content()", "QL401");
        expect_sqlstate(&format!("SELECT querylayer_api.get_revision('{revision_id}')"), "QL401");
        expect_sqlstate("SELECT querylayer_api.console_inbox()", "QL401");

        authenticate(&site.secret);
        let proposal = request_publish(&run_id, &content_id, &revision_id);
        as_member(&site.owner_token);
        json(&format!("SELECT querylayer_api.decide_proposal('{proposal}', 'approve')"));
        authenticate(&site.secret);
        redraft(&run_id, &content_id);

        as_website();
        let live = json("SELECT querylayer_api.delivery_item('hello')");
        assert_eq!(
            (live["revision_id"].as_str(), live["fields"]["title"].as_str()),
            (Some(revision_id.as_str()), Some("T"))
        );
        assert!(live["etag"].as_str().unwrap().starts_with('"'));
        let page = json("SELECT querylayer_api.delivery_items(1)");
        // A page writes the item's shape in its own query: member for member the item itself.
        assert_eq!(page["items"][0], live, "{page}");
        assert!(page["last_modified"].is_string());

        // Another site's token, and no token while the site is not public, fail alike.
        expect_sqlstate(
            &format!("SELECT querylayer_api.authenticate_delivery('other', {})", fingerprint(&token)),
            "28000",
        );
        expect_sqlstate("SELECT querylayer_api.authenticate_delivery('demo', NULL)", "28000");
        as_member(&site.owner_token);
        json("SELECT querylayer_api.console_set_delivery_public(true)");
        json("SELECT querylayer_api.authenticate_delivery('demo', NULL)");
        assert_eq!(json("SELECT querylayer_api.delivery_item('hello')")["revision_id"], revision_id.as_str());

        // Unpublished: gone at once.
        authenticate(&site.secret);
        let unpublish = json(&format!(
            "SELECT querylayer_api.request_publish_approval('{run_id}', '[{{\"content_id\": \"{content_id}\", \"action\": \"unpublish\"}}]')"
        ))["proposal_id"]
            .as_str()
            .unwrap()
            .to_string();
        as_member(&site.owner_token);
        json(&format!("SELECT querylayer_api.decide_proposal('{unpublish}', 'approve')"));
        as_website();
        expect_sqlstate("SELECT querylayer_api.delivery_item('hello')", "QL404");
        // A revoked token is dead at once.
        as_member(&site.owner_token);
        let tokens = json("SELECT querylayer_api.console_list_delivery()");
        let id = tokens["tokens"][0]["delivery_token_id"].as_str().unwrap().to_string();
        json(&format!("SELECT querylayer_api.console_revoke_delivery_token('{id}')"));
        expect_sqlstate(
            &format!("SELECT querylayer_api.authenticate_delivery('demo', {})", fingerprint(&token)),
            "28000",
        );
    }

    #[pg_test]
    fn only_an_owner_makes_delivery_public() {
        content_site();
        let admin = member_token("ada", "admin");
        as_member(&admin);
        json("SELECT querylayer_api.console_create_delivery_token('build', now() + interval '1 day')");
        expect_sqlstate("SELECT querylayer_api.console_set_delivery_public(true)", "QL403");
        let editor = member_token("eli", "editor");
        as_member(&editor);
        expect_sqlstate("SELECT querylayer_api.console_list_delivery()", "QL403");
    }
}

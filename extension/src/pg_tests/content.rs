//! Content (`sql/070_content.sql`): drafts inside runs, templates, immutable revisions, and the
//! live pointer that only an approval moves.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{
        as_edge, as_member, as_owner, authenticate, content_site, draft, error_message, expect_sqlstate,
        json, live_pointer, request_publish, text,
    };
    use pgrx::prelude::*;

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
    fn a_draft_without_template_or_on_a_site_without_templates_names_the_argument() {
        let site = content_site();
        authenticate(&site.secret);
        let run =
            json("SELECT querylayer_api.begin_run('article.draft')")["run_id"].as_str().unwrap().to_string();
        let missing = error_message(
            &format!("SELECT querylayer_api.create_draft('{run}', NULL, '{{\"title\": \"T\"}}', NULL, 'no-template')"),
            "22023",
        );
        assert!(missing.starts_with("template is required for a new item (one of: article)"), "{missing}");
        let unknown = error_message(
            &format!(
                "SELECT querylayer_api.create_draft('{run}', 'page', '{{\"title\": \"T\"}}', NULL, 'x')"
            ),
            "QL404",
        );
        assert!(unknown.contains("template: no template named 'page'"), "{unknown}");

        // A site with no template at all: a clear refusal, not "RAISE statement option cannot be null".
        Spi::run("SELECT querylayer_api.create_site('demo', 'bare')").unwrap();
        Spi::run("SELECT querylayer_api.grant_agent_scopes('bare', 'demo-agent', '{content:write,runs:write,site:read}')")
            .unwrap();
        let bare = json(
            "SELECT querylayer_api.create_connection('bare', 'demo-agent', 'bare', '{content:write,runs:write,site:read}',
                                                     now() + interval '1 hour')",
        );
        authenticate(bare["secret"].as_str().unwrap());
        assert_eq!(json("SELECT querylayer_api.site_context()")["templates"], serde_json::json!([]));
        let run =
            json("SELECT querylayer_api.begin_run('article.draft')")["run_id"].as_str().unwrap().to_string();
        let none = error_message(
            &format!(
                "SELECT querylayer_api.create_draft('{run}', 'article', '{{\"title\": \"T\"}}', NULL, 'x')"
            ),
            "QL422",
        );
        assert!(none.starts_with("template: this site has no templates yet"), "{none}");
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
}

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
    fn a_drafts_answer_is_the_item_as_read_back() {
        let site = content_site();
        authenticate(&site.secret);
        let run = json("SELECT querylayer_api.begin_run('article.draft')");
        let run_id = run["run_id"].as_str().unwrap();
        let mut content_id = String::new();
        for (number, title) in [(1, "Café"), (2, "Second"), (3, "Ünïcode — third")] {
            let answer = if number == 1 {
                json(&format!(
                    "SELECT querylayer_api.create_draft('{run_id}', 'article', '{{\"title\": \"{title}\", \"body\": \"B\"}}', NULL, 'read-back')"
                ))
            } else {
                json(&format!(
                    "SELECT querylayer_api.create_draft('{run_id}', NULL, '{{\"title\": \"{title}\", \"body\": \"B\"}}', '{content_id}')"
                ))
            };
            content_id = answer["content_id"].as_str().unwrap().to_string();
            Spi::run("RESET ROLE").unwrap();
            let read_back = json(&format!(
                "SELECT querylayer.content_json(i) || jsonb_build_object('revision_id', i.draft_revision_id,
                                                                         'revision_number', {number})
                   FROM querylayer.content_items i WHERE id = '{content_id}'"
            ));
            as_edge();
            assert_eq!(answer, read_back, "revision {number}");
            assert_eq!(answer["title"], title);
            assert_eq!(answer["draft_revision_number"], number);
            assert_eq!(answer["draft_revision_id"], answer["revision_id"]);
        }
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

    /// The extension vouches for a draft (drafts.rs) only when the statement finds no problem in it,
    /// over every shape of value the statement tells apart, in three fields of each kind and with
    /// unknown keys; and it vouches for every draft the statement passes but the URLs whose
    /// characters are the locale's call.
    #[pg_test]
    fn a_draft_the_extension_vouches_for_is_one_the_statement_finds_no_problem_in() {
        Spi::run(
            "CREATE FUNCTION pg_temp.problems(t jsonb, f jsonb) RETURNS text[] LANGUAGE plpgsql AS $f$
             BEGIN RETURN querylayer.draft_field_problems(t, f);
             EXCEPTION WHEN OTHERS THEN RETURN NULL; END $f$",
        )
        .unwrap();
        let shapes = r#"(VALUES (NULL::jsonb), ('null'), ('""'), ('"x"'), ('"hello world"'), ('"abcdefghijkl"'),
                 ('"https://a.test/x?y=1"'), ('"http://b"'), ('"https://"'), ('"ftp://x.test"'),
                 ('"https://x.test/é"'), ('"https://x.test/\u0001"'), ('5'), ('true'), ('[]'), ('["a", "b"]'),
                 ('["a", 1]'), ('{"k": "v"}')) AS s(v)"#;
        let counts = json(&format!(
            r#"WITH t(fields) AS (VALUES
                   ('[{{"name": "title", "type": "text", "required": true, "max_length": 5}},
                      {{"name": "link", "type": "url", "required": false}},
                      {{"name": "tags", "type": "list", "required": true}}]'::jsonb),
                   ('[{{"name": "body", "type": "markdown", "required": false, "max_length": 11}},
                      {{"name": "ref", "type": "url", "required": true}},
                      {{"name": "tags", "type": "list", "required": false}}]'::jsonb)),
                  d AS (
                   SELECT t.fields AS t,
                          '{{}}'::jsonb
                            || CASE WHEN a.v IS NULL THEN '{{}}' ELSE jsonb_build_object(t.fields->0->>'name', a.v) END
                            || CASE WHEN b.v IS NULL THEN '{{}}' ELSE jsonb_build_object(t.fields->1->>'name', b.v) END
                            || CASE WHEN c.v IS NULL THEN '{{}}' ELSE jsonb_build_object(t.fields->2->>'name', c.v) END
                            || CASE WHEN u.extra THEN '{{"colour": "red"}}'::jsonb ELSE '{{}}' END AS f
                     FROM t, {a}, {b}, {c}, (VALUES (false), (true)) AS u(extra)
                    WHERE NOT u.extra OR c.v IS NULL),
                  r AS (
                   SELECT querylayer.draft_fields_fit(t, f) AS fit, pg_temp.problems(t, f) AS problems,
                          f::text ~ 'é|\\u0001' AS locale_url
                     FROM d)
               SELECT jsonb_build_object(
                   'drafts', count(*),
                   'errors', count(*) FILTER (WHERE problems IS NULL),
                   'vouched', count(*) FILTER (WHERE fit),
                   'vouched_with_a_problem', count(*) FILTER (WHERE fit AND cardinality(problems) > 0),
                   'with_problems', count(*) FILTER (WHERE cardinality(problems) > 0),
                   'fine_not_vouched', count(*) FILTER (WHERE NOT fit AND cardinality(problems) = 0 AND NOT locale_url))
                 FROM r"#,
            a = shapes.replace("s(v)", "a(v)"),
            b = shapes.replace("s(v)", "b(v)"),
            c = shapes.replace("s(v)", "c(v)"),
        ));
        assert_eq!(counts["errors"], 0, "{counts}");
        assert_eq!(counts["vouched_with_a_problem"], 0, "{counts}");
        assert_eq!(counts["fine_not_vouched"], 0, "{counts}");
        assert!(counts["drafts"].as_i64().unwrap() > 10_000, "{counts}");
        assert!(counts["vouched"].as_i64().unwrap() >= 50, "{counts}");
        assert!(counts["with_problems"].as_i64().unwrap() >= 8_000, "{counts}");

        // Templates the extension is unsure of go to the statement, whatever the draft.
        for odd in [
            r#"{"name": "a", "type": "text", "required": false, "max_length": 2.5}"#,
            r#"{"name": "a", "type": "date", "required": false}"#,
            r#"{"name": "a", "type": "text", "required": "yes"}"#,
        ] {
            let fit = Spi::get_one::<bool>(&format!(
                "SELECT querylayer.draft_fields_fit('[{odd}]', '{{\"a\": \"x\"}}')"
            ));
            assert_eq!(fit, Ok(Some(false)), "{odd}");
        }
    }

    /// A template's max_length is a whole number (0.9.0); one made before, holding 2.5, still
    /// checks drafts (two characters fit, three do not) instead of failing on the cast.
    #[pg_test]
    fn max_length_is_a_whole_number_and_an_older_fractional_one_still_checks_drafts() {
        for bad in ["2.5", "0", "3000000000", "\"5\"", "\"abc\"", "null"] {
            let message = error_message(
                &format!(
                    "SELECT querylayer.check_template_fields('[{{\"name\": \"a\", \"type\": \"text\", \"required\": false, \"max_length\": {bad}}}]')"
                ),
                "22023",
            );
            assert!(
                message.starts_with("fields.a.max_length must be a whole number from 1 to 2147483647"),
                "{message}"
            );
        }
        Spi::run(
            "SELECT querylayer.check_template_fields('[{\"name\": \"a\", \"type\": \"text\", \"required\": false, \"max_length\": 5}]')",
        )
        .unwrap();
        let legacy = "jsonb_populate_record(NULL::querylayer.templates,
             '{\"name\": \"legacy\", \"version\": 1, \"fields\": [{\"name\": \"a\", \"type\": \"text\", \"required\": true, \"max_length\": 2.5}]}')";
        Spi::run(&format!("SELECT querylayer.check_draft_fields({legacy}, '{{\"a\": \"ab\"}}')")).unwrap();
        let message = error_message(
            &format!("SELECT querylayer.check_draft_fields({legacy}, '{{\"a\": \"abc\"}}')"),
            "QL422",
        );
        assert!(message.ends_with("a is longer than 2.5 characters"), "{message}");
    }
}

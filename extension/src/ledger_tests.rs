//! In-database tests of verifiable history: the SQL-facing leaf, tree and signing functions
//! agree with the shared vectors (docs/ledger-vectors.json), and the state events follow every
//! governed move of the topical map. Each runs inside one transaction that is rolled back.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;
    use pgrx::JsonB;
    use querylayer_ledger::{Checkpoint, TrustedKeys};
    use serde_json::Value;

    fn vectors() -> Value {
        serde_json::from_str(include_str!("../../docs/ledger-vectors.json")).unwrap()
    }

    fn bytes(sql: &str) -> Vec<u8> {
        Spi::get_one::<Vec<u8>>(sql).expect("query failed").expect("NULL result")
    }

    #[pg_test]
    fn leaves_trees_and_signatures_in_sql_match_the_shared_vectors() {
        let v = vectors();
        let mut frontier = Vec::new();
        for r in v["records"].as_array().unwrap() {
            let leaf = bytes(&format!(
                "SELECT querylayer.ledger_leaf({}::bigint, '{}'::text, {}::smallint, '\\x{}'::bytea)",
                r["seq"],
                r["table"].as_str().unwrap(),
                r["form"],
                r["content_sha256"].as_str().unwrap()
            ));
            assert_eq!(hex::encode(&leaf), r["leaf_hash"].as_str().unwrap());
            frontier = bytes(&format!(
                "SELECT querylayer.ledger_extend('\\x{}'::bytea, {}::bigint, '\\x{}'::bytea)",
                hex::encode(&frontier),
                r["seq"].as_i64().unwrap() - 1,
                hex::encode(&leaf)
            ));
        }
        let cp: Checkpoint = serde_json::from_value(v["checkpoints"][1].clone()).unwrap();
        let root = bytes(&format!(
            "SELECT querylayer.ledger_tree_root('\\x{}'::bytea, {}::bigint)",
            hex::encode(&frontier),
            cp.seq
        ));
        assert_eq!(hex::encode(root), cp.tree_root);

        // Signed in the database with the vectors' second key: the same checkpoint, byte for byte.
        let secret =
            querylayer_envelope::Signer::from_seed_bytes(v["key_seeds"][1].as_str().unwrap().as_bytes())
                .secret();
        let signed = Spi::get_one::<JsonB>(&format!(
            "SELECT querylayer.ledger_sign_checkpoint('{}'::uuid, {}::bigint, '\\x{}'::bytea, '\\x{}'::bytea, '{}'::text, '\\x{}'::bytea, '\\x{}'::bytea)",
            cp.site_id, cp.seq, cp.head_sha256, cp.tree_root, cp.checkpointed_at,
            cp.prev_checkpoint_sha256.as_deref().unwrap(), hex::encode(secret)
        ))
        .unwrap()
        .unwrap()
        .0;
        assert_eq!(signed["signature"], cp.signature.as_str());
        assert_eq!(signed["checkpoint_sha256"], v["checkpoint_sha256"][1]);
        cp.verify(&TrustedKeys::new([signed["key"].as_str().unwrap()])).unwrap();
    }

    #[pg_test]
    fn operator_and_approved_changes_of_the_topical_map_are_chained_state_events() {
        Spi::run("SELECT querylayer_api.seed_demo()").unwrap();
        let before = Spi::get_one::<i64>("SELECT count(*) FROM querylayer.state_events").unwrap().unwrap();
        Spi::run("SELECT querylayer_api.add_topic('demo'::text, 'ledger-test'::text, 'Ledger test'::text)")
            .unwrap();
        let event = Spi::get_one::<JsonB>(
            "SELECT jsonb_build_object('subject', subject, 'cause', cause, 'state', state, 'actor', actor)
               FROM querylayer.state_events ORDER BY recorded_at DESC, chain_seq DESC LIMIT 1",
        )
        .unwrap()
        .unwrap()
        .0;
        assert_eq!(event["subject"], "topic");
        assert_eq!(event["cause"], "operator");
        assert_eq!(event["state"]["slug"], "ledger-test");
        assert!(event["actor"].as_str().unwrap().starts_with("operator:"));
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM querylayer.state_events").unwrap().unwrap(),
            before + 1
        );
        let live = Spi::get_one::<JsonB>("SELECT querylayer_api.verify_live_state('demo'::text)")
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(live["ok"], true, "{live}");
        // Changed behind the trigger's back: the replay no longer matches.
        Spi::run(
            "ALTER TABLE querylayer.topics DISABLE TRIGGER ALL;
             UPDATE querylayer.topics SET title = 'Forged' WHERE slug = 'ledger-test';
             ALTER TABLE querylayer.topics ENABLE TRIGGER ALL;",
        )
        .unwrap();
        let live = Spi::get_one::<JsonB>("SELECT querylayer_api.verify_live_state('demo'::text)")
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(live["ok"], false, "{live}");
        assert_eq!(live["problem"]["subject"], "topic", "{live}");
    }

    #[pg_test]
    fn a_retention_summary_is_checkpointed_and_exported_in_its_time_window() {
        Spi::run("SELECT querylayer_api.seed_demo()").unwrap();
        Spi::run("SELECT querylayer.create_time_partition('querylayer.audit_events'::text, 2020, 3)")
            .unwrap();
        Spi::run(
            "INSERT INTO querylayer.audit_events (at, site_id, principal_kind, action)
             VALUES ('2020-03-02 12:00+00', (SELECT id FROM querylayer.sites WHERE slug = 'demo'), 'connection', 'tool.call')",
        )
        .unwrap();
        Spi::run("SELECT querylayer_api.apply_retention()").unwrap();
        let summary =
            Spi::get_one::<String>("SELECT id::text FROM querylayer.retention_summaries").unwrap().unwrap();
        // The chain now ends with the summary; a checkpoint is signed over it.
        let made = Spi::get_one::<JsonB>("SELECT querylayer_api.create_checkpoints('demo'::text)")
            .unwrap()
            .unwrap()
            .0;
        let head = Spi::get_one::<i64>(
            "SELECT h.seq FROM querylayer.ledger_heads h JOIN querylayer.sites s ON s.id = h.site_id WHERE s.slug = 'demo'",
        )
        .unwrap()
        .unwrap();
        assert_eq!(made[0]["created"], true, "{made}");
        assert_eq!(made[0]["checkpoint"]["seq"], head, "{made}");
        // An export by time finds the summary by its time (created_at).
        let found = Spi::get_one::<JsonB>(&format!(
            "SELECT coalesce(jsonb_agg(x.r), '[]') FROM querylayer_api.ledger_records('demo'::text, {head}::bigint,
                    now() - interval '1 hour', now() + interval '1 hour') AS x(r)
              WHERE x.r->>'table' = 'querylayer.retention_summaries'"
        ))
        .unwrap()
        .unwrap()
        .0;
        assert_eq!(found.as_array().map(Vec::len), Some(1), "{found}");
        assert_eq!(found[0]["id"], summary.as_str());
        assert!(found[0]["recorded_at"].is_string(), "{found}");
        let before = Spi::get_one::<JsonB>(
            "SELECT coalesce(jsonb_agg(x.r), '[]') FROM querylayer_api.ledger_records('demo'::text, 1000000::bigint,
                    NULL::timestamptz, '2000-01-01'::timestamptz) AS x(r)",
        )
        .unwrap()
        .unwrap()
        .0;
        assert_eq!(before, serde_json::json!([]), "nothing was recorded before 2000");
    }

    fn json(sql: &str) -> Value {
        Spi::get_one::<JsonB>(sql).expect("query failed").expect("NULL result").0
    }

    /// The fast paths of a governed write keep what they replaced: the content hash that
    /// chain_append takes inline is the one verification recomputes (querylayer.ledger_content
    /// over the record's form), each record links to the one before, a draft pointer's move is
    /// no state event, and a refusal still names the templates.
    #[pg_test]
    fn governed_writes_chain_exactly_what_verification_recomputes() {
        let seeded = json("SELECT querylayer_api.seed_demo()");
        let secret = seeded["connection"]["secret"].as_str().unwrap().to_string();
        let events = || Spi::get_one::<i64>("SELECT count(*) FROM querylayer.state_events").unwrap().unwrap();
        let before = events();
        json(&format!("SELECT querylayer_api.authenticate(sha256(convert_to('{secret}', 'UTF8')))"));
        let run = json("SELECT querylayer_api.begin_run('ledger.test')");
        let run_id = run["run_id"].as_str().unwrap();
        let artifact = json(&format!(
            "SELECT querylayer_api.record_artifact('{run_id}'::uuid, 'k1'::text, '{{\"n\": 1.50, \"at\": \"x\"}}'::jsonb)"
        ));
        let d = json(&format!(
            "SELECT querylayer_api.create_draft('{run_id}'::uuid, 'article'::text,
                    '{{\"title\": \"T\", \"body\": \"B\"}}'::jsonb, NULL::uuid, 'ledger-fast-path'::text)"
        ));
        let content_id = d["content_id"].as_str().unwrap();
        json(&format!(
            "SELECT querylayer_api.create_draft('{run_id}'::uuid, 'article'::text,
                    '{{\"title\": \"T2\", \"body\": \"B2\"}}'::jsonb, '{content_id}'::uuid)"
        ));
        assert_eq!(events(), before, "moving a draft pointer is no state event");
        // Every record of the run, as verification reads it.
        let mismatched = Spi::get_one::<i64>(&format!(
            "SELECT count(*) FROM (
                 SELECT r.content_sha256, r.prev_sha256, r.record_sha256, r.ledger_form, to_jsonb(r) AS j, 'querylayer.run_artifacts' AS t
                   FROM querylayer.run_artifacts r WHERE r.run_id = '{run_id}'
                 UNION ALL
                 SELECT r.content_sha256, r.prev_sha256, r.record_sha256, r.ledger_form, to_jsonb(r), 'querylayer.content_revisions'
                   FROM querylayer.content_revisions r WHERE r.content_id = '{content_id}'
                 UNION ALL
                 SELECT r.content_sha256, r.prev_sha256, r.record_sha256, r.ledger_form, to_jsonb(r), 'querylayer.runs'
                   FROM querylayer.runs r WHERE r.id = '{run_id}') x
               JOIN querylayer.ledger_forms f ON f.table_name = x.t AND f.form = x.ledger_form
              WHERE x.ledger_form <> (SELECT max(g.form) FROM querylayer.ledger_forms g WHERE g.table_name = x.t)
                 OR x.content_sha256 <> querylayer.ledger_content(x.j, f.fields)
                 OR x.record_sha256 <> sha256(x.prev_sha256 || x.content_sha256)"
        ))
        .unwrap()
        .unwrap();
        assert_eq!(mismatched, 0);
        assert_eq!(
            artifact["record_sha256"],
            Spi::get_one::<String>(
                "SELECT encode(record_sha256, 'hex') FROM querylayer.run_artifacts WHERE key = 'k1'"
            )
            .unwrap()
            .unwrap()
            .as_str()
        );
        let verified = json(
            "SELECT querylayer.verify_ledger_site((SELECT id FROM querylayer.sites WHERE slug = 'demo'))",
        );
        assert_eq!(verified["ok"], true, "{verified}");
        // Refusals still list the site's templates.
        Spi::run(&format!(
            "DO $t$ BEGIN
                 PERFORM querylayer_api.create_draft('{run_id}'::uuid, 'nope'::text, '{{}}'::jsonb, NULL::uuid, 'x'::text);
                 RAISE EXCEPTION 'a draft of an unknown template was accepted' USING ERRCODE = 'XX000';
             EXCEPTION WHEN SQLSTATE 'QL404' THEN
                 IF SQLERRM NOT LIKE '%(one of: %article%' THEN
                     RAISE EXCEPTION 'the refusal does not name the templates: %', SQLERRM USING ERRCODE = 'XX000';
                 END IF;
             END $t$"
        ))
        .unwrap();
    }
}

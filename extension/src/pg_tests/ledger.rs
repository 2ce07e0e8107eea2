//! The append-only triggers, the per-site chain check and sealing of pending records
//! (`sql/020_ledger.sql`). Ledger forms, restore mode and checkpoints: `ledger_tests.rs`,
//! `durability_tests.rs`. Pending records written by concurrent sessions: `tests/db/ledger.rs`.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{as_edge, as_owner, authenticate, demo_secret, failure, json, text};
    use pgrx::prelude::*;

    #[pg_test(error = "querylayer.run_events is append-only: UPDATE is refused")]
    fn owner_cannot_update_run_events() {
        let secret = demo_secret();
        authenticate(&secret);
        Spi::run("SELECT querylayer_api.begin_run('article.draft')").unwrap();
        as_owner();
        Spi::run("UPDATE querylayer.run_events SET summary = 'rewritten'").unwrap();
    }

    #[pg_test(error = "querylayer.run_artifacts is append-only: DELETE is refused")]
    fn superuser_in_replica_mode_cannot_delete_artifacts() {
        let secret = demo_secret();
        authenticate(&secret);
        let run = json("SELECT querylayer_api.begin_run('article.draft')");
        let id = run["run_id"].as_str().unwrap();
        Spi::run(&format!("SELECT querylayer_api.record_artifact('{id}', 'k', '1')")).unwrap();
        Spi::run("SET LOCAL session_replication_role = replica").unwrap();
        Spi::run("DELETE FROM querylayer.run_artifacts").unwrap();
    }

    #[pg_test(error = "querylayer.run_events is append-only: TRUNCATE is refused")]
    fn superuser_in_replica_mode_cannot_truncate_run_events() {
        Spi::run("SET LOCAL session_replication_role = replica").unwrap();
        Spi::run("TRUNCATE querylayer.run_events CASCADE").unwrap();
    }

    #[pg_test(
        error = "querylayer_owner may not run DDL (ALTER TABLE); schema changes go through extension upgrades"
    )]
    fn owner_cannot_disable_the_append_only_triggers() {
        as_owner();
        Spi::run("ALTER TABLE querylayer.run_events DISABLE TRIGGER append_only_row").unwrap();
    }

    #[pg_test]
    fn chain_check_reports_a_record_edited_behind_the_triggers() {
        let secret = demo_secret();
        authenticate(&secret);
        let run = json("SELECT querylayer_api.begin_run('article.draft')");
        let id = run["run_id"].as_str().unwrap().to_string();
        for key in ["a", "b", "c"] {
            Spi::run(&format!("SELECT querylayer_api.record_artifact('{id}', '{key}', '1')")).unwrap();
        }
        let clean = json("SELECT querylayer_api.verify_ledger('demo')");
        assert_eq!(clean["ok"], true, "{clean}");
        // A superuser goes around the triggers and edits one artifact.
        Spi::run("ALTER TABLE querylayer.run_artifacts DISABLE TRIGGER append_only_row").unwrap();
        Spi::run("UPDATE querylayer.run_artifacts SET value = '2' WHERE key = 'b'").unwrap();
        let report = json("SELECT querylayer_api.verify_ledger('demo')");
        assert_eq!(report["ok"], false);
        assert_eq!(report["broken"]["table"], "querylayer.run_artifacts");
        assert_eq!(report["broken"]["problem"], "content does not match content_sha256 (record edited)");
    }

    /// A pending artifact of run `run`, as a restore brings one back from a dump taken while it
    /// waited to be sealed: a superuser in replica mode inserts the row with its form and content
    /// hash but an empty link, and its `ledger_pending` entry. Returns its id.
    fn restored_pending_artifact(run: &str, key: &str) -> String {
        Spi::run("SET LOCAL TimeZone = 'UTC'").unwrap();
        Spi::run(&format!(
            "CREATE TEMP TABLE pending_row ON COMMIT DROP AS SELECT * FROM querylayer.run_artifacts WHERE false;
             INSERT INTO pending_row (id, site_id, run_id, key, value, affected_objects, agent_id, connection_id, harness, created_at)
             SELECT gen_random_uuid(), r.site_id, r.id, '{key}', '\"restored\"', '[]', r.agent_id, r.connection_id, r.harness,
                    clock_timestamp()
               FROM querylayer.runs r WHERE r.id = '{run}';
             UPDATE pending_row p SET (ledger_form, content_sha256) = (
                 SELECT f.form, querylayer.ledger_content(to_jsonb(p), f.fields) FROM querylayer.ledger_forms f
                  WHERE f.table_name = 'querylayer.run_artifacts' ORDER BY f.form DESC LIMIT 1);
             SET LOCAL session_replication_role = replica;
             INSERT INTO querylayer.run_artifacts SELECT * FROM pending_row;
             INSERT INTO querylayer.ledger_pending (site_id, table_name, record_id)
             SELECT site_id, 'querylayer.run_artifacts', id FROM pending_row;
             SET LOCAL session_replication_role = origin;
             RESET TimeZone;"
        ))
        .unwrap();
        let id = text("SELECT id::text FROM pending_row");
        Spi::run("DROP TABLE pending_row").unwrap();
        id
    }

    fn begun_run(secret: &str) -> String {
        authenticate(secret);
        json("SELECT querylayer_api.begin_run('article.draft')")["run_id"].as_str().unwrap().to_string()
    }

    fn seq_of(id: &str) -> Option<i64> {
        Spi::get_one::<i64>(&format!("SELECT chain_seq FROM querylayer.run_artifacts WHERE id = '{id}'"))
            .unwrap()
    }

    #[pg_test]
    fn a_pending_record_verifies_as_pending_and_the_next_writer_seals_it_first() {
        let secret = demo_secret();
        let run = begun_run(&secret);
        let pending = restored_pending_artifact(&run, "restored");
        let before = json("SELECT querylayer_api.verify_ledger('demo')");
        assert_eq!((before["ok"].clone(), before["pending"].clone()), (true.into(), 1.into()), "{before}");
        let sealed_before = before["checked"].as_i64().unwrap();
        assert_eq!(seq_of(&pending), None);

        // The next writer holds the head: it seals what committed pending first, then links its own.
        authenticate(&secret);
        let mine = json(&format!("SELECT querylayer_api.record_artifact('{run}', 'next', '1')"));
        let mine_id = mine["artifact_id"].as_str().unwrap();
        assert_eq!(seq_of(&pending), Some(sealed_before + 1));
        assert_eq!(seq_of(mine_id), Some(sealed_before + 2));
        assert_eq!(mine["record_sha256"].as_str().map(str::len), Some(64), "{mine}");
        let after = json("SELECT querylayer_api.verify_ledger('demo')");
        assert_eq!((after["ok"].clone(), after["pending"].clone()), (true.into(), 0.into()), "{after}");
        assert_eq!(after["checked"].as_i64(), Some(sealed_before + 2));
        assert_eq!(text("SELECT count(*)::text FROM querylayer.ledger_pending"), "0");
    }

    #[pg_test]
    fn seal_ledger_and_checkpoints_seal_what_is_pending() {
        let secret = demo_secret();
        let run = begun_run(&secret);
        let first = restored_pending_artifact(&run, "one");
        let sealed = json("SELECT querylayer_api.seal_ledger()");
        assert_eq!(sealed[0]["site"], "demo");
        assert_eq!(sealed[0]["sealed"], 1);
        assert!(seq_of(&first).is_some());
        assert_eq!(json("SELECT querylayer_api.seal_ledger('demo')"), serde_json::json!([]));

        let second = restored_pending_artifact(&run, "two");
        let made = json("SELECT querylayer_api.create_checkpoints('demo')");
        let checkpoint_seq = made[0]["checkpoint"]["seq"].as_i64().unwrap();
        assert_eq!(seq_of(&second), Some(checkpoint_seq), "the checkpoint covers the record it sealed");
        let report = json("SELECT querylayer_api.verify_ledger('demo')");
        assert_eq!(report["ok"], true, "{report}");
    }

    #[pg_test]
    fn nobody_fills_a_pending_link_by_hand() {
        let secret = demo_secret();
        let run = begun_run(&secret);
        let pending = restored_pending_artifact(&run, "restored");
        // The link a seal would write, exactly: still refused outside the sealer.
        let fill = format!(
            "UPDATE querylayer.run_artifacts a SET chain_seq = h.seq + 1, prev_sha256 = h.head,
                    record_sha256 = sha256(h.head || a.content_sha256)
               FROM querylayer.ledger_heads h WHERE h.site_id = a.site_id AND a.id = '{pending}'"
        );
        let superuser = failure(&fill);
        assert_eq!(superuser.0, "QL423", "{superuser:?}");
        Spi::run("SET LOCAL session_replication_role = replica").unwrap();
        let replica = failure(&fill);
        assert_eq!(replica.0, "QL423", "{replica:?}");
        Spi::run("SET LOCAL session_replication_role = origin").unwrap();
        as_owner();
        let owner = failure(&fill);
        assert_eq!(owner.0, "QL423", "{owner:?}");
        Spi::run("RESET ROLE").unwrap();
        as_edge();
        let edge = failure(&fill);
        assert_eq!(edge.0, "42501", "{edge:?}");
        let seal = failure(&format!("SELECT querylayer.ledger_seal('{pending}'::uuid, 10)"));
        assert_eq!(seal.0, "42501", "the edge cannot call the sealer: {seal:?}");
        Spi::run("RESET ROLE").unwrap();
        assert_eq!(seq_of(&pending), None);
    }

    /// Under the seal mark (which only the extension's Rust sets, while it seals), forbid_change
    /// admits an UPDATE that fills a pending record's empty link correctly, and nothing else:
    /// not another column changed with it, not a wrong record hash, not an already sealed
    /// record, not a table without a link, not a DELETE.
    #[pg_test]
    fn a_seal_fills_an_empty_link_once_and_changes_nothing_else() {
        let secret = demo_secret();
        let run = begun_run(&secret);
        let link = |id: &str, extra: &str, record: &str| {
            format!(
                "UPDATE querylayer.run_artifacts a SET chain_seq = h.seq + 1, prev_sha256 = h.head,
                        record_sha256 = {record}{extra}
                   FROM querylayer.ledger_heads h WHERE h.site_id = a.site_id AND a.id = '{id}'"
            )
        };
        let right = "sha256(h.head || a.content_sha256)";
        let pending = restored_pending_artifact(&run, "to-seal");
        // (A subtransaction that aborts drops the mark, so each statement is marked anew.)
        let sealing = |sql: &str| {
            let _mark = crate::ledger::SealGuard::set();
            failure(sql).0
        };
        assert_eq!(sealing(&link(&pending, ", key = 'other'", right)), "QL423");
        assert_eq!(sealing(&link(&pending, "", "sha256(a.content_sha256)")), "QL423");
        assert_eq!(failure(&link(&pending, "", right)).0, "QL423", "not without the mark");
        assert_eq!(seq_of(&pending), None);
        assert_eq!(sealing(&link(&pending, "", right)), "none", "the one seal");
        assert!(seq_of(&pending).is_some(), "the link is filled");
        assert_eq!(sealing(&link(&pending, "", right)), "QL423", "a sealed record is sealed once");
        assert_eq!(sealing(&format!("DELETE FROM querylayer.run_artifacts WHERE id = '{pending}'")), "QL423");
        assert_eq!(
            sealing("UPDATE querylayer.ledger_forms SET fields = fields"),
            "QL423",
            "no link, no seal"
        );
    }

    #[pg_test]
    fn verify_names_a_pending_record_edited_orphaned_or_gone() {
        let secret = demo_secret();
        let run = begun_run(&secret);
        let pending = restored_pending_artifact(&run, "restored");
        Spi::run("ALTER TABLE querylayer.run_artifacts DISABLE TRIGGER append_only_row").unwrap();
        Spi::run(&format!("UPDATE querylayer.run_artifacts SET value = '\"edited\"' WHERE id = '{pending}'"))
            .unwrap();
        let edited = json("SELECT querylayer_api.verify_ledger('demo')");
        assert_eq!(edited["ok"], false);
        assert_eq!(edited["broken"]["id"], pending.as_str());
        assert_eq!(edited["broken"]["problem"], "content does not match content_sha256 (record edited)");
        Spi::run(&format!(
            "UPDATE querylayer.run_artifacts SET value = '\"restored\"' WHERE id = '{pending}'"
        ))
        .unwrap();
        assert_eq!(json("SELECT querylayer_api.verify_ledger('demo')")["ok"], true);

        // Its entry deleted: it would never be sealed.
        Spi::run("CREATE TEMP TABLE entries ON COMMIT DROP AS SELECT * FROM querylayer.ledger_pending")
            .unwrap();
        Spi::run("DELETE FROM querylayer.ledger_pending").unwrap();
        let orphaned = json("SELECT querylayer_api.verify_ledger('demo')");
        assert_eq!(orphaned["ok"], false);
        assert!(orphaned["broken"]["problem"].as_str().unwrap().contains("waits for no seal"), "{orphaned}");
        Spi::run("INSERT INTO querylayer.ledger_pending SELECT * FROM entries").unwrap();

        // The record deleted behind the triggers, its entry left: verify and the sealer name it.
        Spi::run(&format!("DELETE FROM querylayer.run_artifacts WHERE id = '{pending}'")).unwrap();
        let gone = json("SELECT querylayer_api.verify_ledger('demo')");
        assert_eq!(gone["ok"], false);
        assert!(
            gone["broken"]["problem"].as_str().unwrap().contains("a pending record is missing"),
            "{gone}"
        );
        let sealing = failure("SELECT querylayer_api.seal_ledger('demo')");
        assert_eq!(sealing.0, "QLL09", "{sealing:?}");
    }
}

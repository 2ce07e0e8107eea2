//! The append-only triggers and the per-site chain check (`sql/020_ledger.sql`). Ledger forms,
//! restore mode and checkpoints: `ledger_tests.rs`, `durability_tests.rs`.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{as_owner, authenticate, demo_secret, json};
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
}

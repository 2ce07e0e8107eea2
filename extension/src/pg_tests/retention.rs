//! Retention that leaves a signed account, and the owner's DDL guard around month partitions
//! (`sql/160_retention.sql`, `partitions.rs`, `retention.rs`).

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{authenticate, demo, failure, json};
    use pgrx::prelude::*;

    #[pg_test]
    fn the_owner_cannot_drop_or_create_a_partition_by_itself() {
        demo();
        Spi::run("SET LOCAL ROLE querylayer_owner").unwrap();
        for sql in [
            "DROP TABLE querylayer.audit_events_default",
            "ALTER TABLE querylayer.audit_events DETACH PARTITION querylayer.audit_events_default",
            "CREATE TABLE querylayer.audit_events_p209901 PARTITION OF querylayer.audit_events FOR VALUES FROM ('2099-01-01') TO ('2099-02-01')",
            "TRUNCATE querylayer.audit_events_default",
        ] {
            let (state, message) = failure(sql);
            assert!(state == "42501" || state == "QL423", "{sql}: {state} {message}");
        }
        assert!(!Spi::get_one::<bool>("SELECT querylayer.partition_maintenance_active()").unwrap().unwrap());
    }

    #[pg_test]
    fn the_owner_creates_month_partitions_and_nothing_else() {
        demo();
        // As apply_retention runs: the owner, creating a month ahead.
        Spi::run("SET LOCAL ROLE querylayer_owner").unwrap();
        let name = Spi::get_one::<String>(
            "SELECT querylayer.create_time_partition('querylayer.audit_events', 2099, 11)",
        )
        .unwrap()
        .unwrap();
        assert_eq!(name, "querylayer.audit_events_p209911");
        let (state, _) = failure("CREATE TABLE querylayer.anything (x int)");
        assert_eq!(state, "42501", "outside partition maintenance the owner creates nothing");
    }

    #[pg_test]
    fn a_month_inside_the_retention_window_is_not_dropped() {
        demo();
        let current = Spi::get_one::<String>(
            "SELECT partition_name FROM querylayer.time_partitions()
              WHERE table_name = 'querylayer.audit_events' AND range_from <= now() AND range_to > now()",
        )
        .unwrap()
        .unwrap();
        Spi::run("SELECT querylayer.enter_operator(NULL)").unwrap();
        let (state, _) = failure(&format!("SELECT querylayer.drop_aged_partition('{current}')"));
        assert_eq!(state, "QL422");
        let (state, _) = failure("SELECT querylayer.drop_aged_partition('querylayer.runs')");
        assert_eq!(state, "XX000", "governed history is not a partition of an aging table");
    }

    #[pg_test]
    fn dropping_an_aged_month_leaves_a_signed_summary_in_each_sites_chain() {
        let (secret, _) = demo();
        Spi::run("SELECT querylayer.create_time_partition('querylayer.audit_events', 2020, 3)").unwrap();
        Spi::run(
            "INSERT INTO querylayer.audit_events (at, site_id, principal_kind, action)
             SELECT ('2020-03-0' || n || ' 12:00+00')::timestamptz, (SELECT id FROM querylayer.sites WHERE slug = 'demo'), 'connection', 'tool.call'
               FROM generate_series(1, 3) n
             UNION ALL SELECT '2020-03-09 12:00+00', NULL, 'anonymous', 'authenticate'",
        )
        .unwrap();
        let result = json("SELECT querylayer_api.apply_retention()");
        let dropped = result["dropped"].as_array().unwrap();
        assert_eq!(dropped.len(), 1, "{result}");
        assert_eq!(dropped[0]["rows"], 4);
        assert_eq!(
            Spi::get_one::<bool>("SELECT to_regclass('querylayer.audit_events_p202003') IS NULL").unwrap(),
            Some(true)
        );
        let drop = json("SELECT to_jsonb(d) FROM querylayer_api.list_retention_drops() d");
        assert_eq!(drop["signature_valid"], true);
        assert_eq!(drop["statement"]["without_site"]["rows"], 1);
        let summary = json(
            "SELECT jsonb_build_object('statement', s.statement, 'valid',
                    querylayer.statement_signature_valid(s.statement, s.signature, k.did_key))
               FROM querylayer.retention_summaries s JOIN querylayer.server_keys k ON k.id = s.server_key_id",
        );
        assert_eq!(summary["valid"], true);
        assert_eq!(summary["statement"]["rows"], 3);
        assert_eq!(summary["statement"]["table"], "querylayer.audit_events");
        let ledger = json("SELECT querylayer_api.verify_ledger('demo')");
        assert_eq!(ledger["ok"], true, "{ledger}");
        // A changed summary no longer verifies.
        let forged = Spi::get_one::<bool>(
            "SELECT querylayer.statement_signature_valid(s.statement || '{\"rows\": 2}', s.signature, k.did_key)
               FROM querylayer.retention_summaries s JOIN querylayer.server_keys k ON k.id = s.server_key_id",
        )
        .unwrap()
        .unwrap();
        assert!(!forged);
        // Governed history stays: the run this agent began is untouched.
        authenticate(&secret);
        assert!(json("SELECT querylayer_api.list_runs(10)")["runs"].is_array());
    }
}

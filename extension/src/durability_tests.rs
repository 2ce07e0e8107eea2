//! In-database tests of what keeps history through operations: versioned canonical forms of
//! chained records, the restore mode only a superuser in replica mode gets, and the registration
//! of every data table for pg_dump. Each runs inside one transaction that is rolled back.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;
    use pgrx::JsonB;
    use serde_json::Value;

    fn json(sql: &str) -> Value {
        Spi::get_one::<JsonB>(sql).expect("query failed").expect("NULL result").0
    }

    fn boolean(sql: &str) -> bool {
        Spi::get_one::<bool>(sql).expect("query failed").expect("NULL result")
    }

    fn expect_sqlstate(sql: &str, sqlstate: &str) {
        Spi::run(&format!(
            "DO $t$ BEGIN EXECUTE $q${sql}$q$;
               RAISE EXCEPTION 'expected SQLSTATE {sqlstate}, but the statement succeeded' USING ERRCODE = 'XX000';
             EXCEPTION WHEN SQLSTATE '{sqlstate}' THEN NULL; END $t$"
        ))
        .unwrap();
    }

    /// A chained table of the demo site with one column, then a second column added the way a
    /// release adds one: ALTER TABLE, then the next form.
    fn notes_table() {
        json("SELECT querylayer_api.seed_demo()");
        Spi::run(
            "CREATE TABLE querylayer.test_notes (
                 id      uuid PRIMARY KEY DEFAULT gen_random_uuid(),
                 site_id uuid NOT NULL,
                 body    text NOT NULL,
                 at      timestamptz NOT NULL DEFAULT now());
             ALTER TABLE querylayer.test_notes OWNER TO querylayer_owner;
             SELECT querylayer.make_chained('querylayer.test_notes');",
        )
        .unwrap();
    }

    fn add_note(body: &str) {
        Spi::run(&format!(
            "INSERT INTO querylayer.test_notes (site_id, body)
             SELECT id, '{body}' FROM querylayer.sites WHERE slug = 'demo'"
        ))
        .unwrap();
    }

    fn verify() -> Value {
        json("SELECT querylayer_api.verify_ledger('demo')")
    }

    #[pg_test]
    fn adding_a_column_opens_a_form_and_earlier_records_verify_unchanged() {
        notes_table();
        add_note("before");
        let forms = json("SELECT jsonb_agg(fields ORDER BY form) FROM querylayer.ledger_forms WHERE table_name = 'querylayer.test_notes'");
        assert_eq!(forms, serde_json::json!([["at", "body", "id", "site_id"]]));
        let before = verify();
        assert_eq!(before["ok"], true, "{before}");

        Spi::run("ALTER TABLE querylayer.test_notes ADD COLUMN mood text DEFAULT 'calm'").unwrap();
        assert_eq!(
            Spi::get_one::<i16>("SELECT querylayer.add_ledger_form('querylayer.test_notes')").unwrap(),
            Some(2)
        );
        // The earlier record keeps form 1: the column it never had is not part of its hash.
        let after = verify();
        assert_eq!(after["ok"], true, "{after}");
        assert_eq!(after["head_sha256"], before["head_sha256"]);

        add_note("after");
        assert!(boolean(
            "SELECT array_agg(ledger_form ORDER BY chain_seq) = '{1,2}' FROM querylayer.test_notes"
        ));
        // Form 2 hashes the new column: the content hash is that of exactly its fields, printed
        // as jsonb prints an object, timestamps in UTC.
        Spi::run("SET LOCAL TimeZone = 'UTC'").unwrap();
        assert!(boolean(
            "SELECT content_sha256 = sha256(convert_to(jsonb_build_object('at', at, 'body', body, 'id', id,
                        'mood', mood, 'site_id', site_id)::text, 'UTF8'))
               FROM querylayer.test_notes WHERE body = 'after'"
        ));
        assert_eq!(verify()["ok"], true);

        // A superuser edits the new column of the new record behind the triggers: detected.
        Spi::run("ALTER TABLE querylayer.test_notes DISABLE TRIGGER append_only_row").unwrap();
        Spi::run("UPDATE querylayer.test_notes SET mood = 'stormy' WHERE body = 'after'").unwrap();
        let edited = verify();
        assert_eq!(edited["ok"], false);
        assert_eq!(edited["broken"]["table"], "querylayer.test_notes");
        assert_eq!(edited["broken"]["problem"], "content does not match content_sha256 (record edited)");
        // Putting it back heals it; an edit of a form-1 field of the old record is detected too.
        Spi::run("UPDATE querylayer.test_notes SET mood = 'calm' WHERE body = 'after'").unwrap();
        assert_eq!(verify()["ok"], true);
        Spi::run("UPDATE querylayer.test_notes SET body = 'rewritten' WHERE body = 'before'").unwrap();
        assert_eq!(verify()["broken"]["problem"], "content does not match content_sha256 (record edited)");
    }

    #[pg_test]
    fn a_record_of_an_unregistered_form_is_reported() {
        notes_table();
        add_note("one");
        Spi::run("ALTER TABLE querylayer.test_notes DISABLE TRIGGER append_only_row").unwrap();
        Spi::run("UPDATE querylayer.test_notes SET ledger_form = 7").unwrap();
        let report = verify();
        assert_eq!(report["ok"], false);
        assert_eq!(report["broken"]["problem"], "unknown ledger form 7");
    }

    #[pg_test]
    fn a_form_names_hashable_columns_and_something_new() {
        notes_table();
        // Nothing new since form 1.
        expect_sqlstate("SELECT querylayer.add_ledger_form('querylayer.test_notes')", "22023");
        // Not a column, or a chain column.
        expect_sqlstate("SELECT querylayer.add_ledger_form('querylayer.test_notes', '{body,nope}')", "22023");
        expect_sqlstate(
            "SELECT querylayer.add_ledger_form('querylayer.test_notes', '{body,chain_seq}')",
            "22023",
        );
        // Registered forms never change, for anyone.
        expect_sqlstate("UPDATE querylayer.ledger_forms SET fields = '{body}'", "QL423");
        expect_sqlstate("DELETE FROM querylayer.ledger_forms", "QL423");
        // An upgrade that brings another field list under a registered number fails, naming both.
        expect_sqlstate(
            "SELECT querylayer.ensure_ledger_form('querylayer.test_notes', 1::smallint, '{body,id}')",
            "QL422",
        );
        Spi::run("SELECT querylayer.ensure_ledger_form('querylayer.test_notes', 1::smallint, '{at,body,id,site_id}')")
            .unwrap();
    }

    #[pg_test]
    fn every_chained_table_of_the_release_has_a_form_for_its_columns() {
        // Each chained table's newest form hashes every column but the chain columns.
        let stale = Spi::get_one::<i64>(
            "SELECT count(*) FROM querylayer.ledger_tables t
              WHERE (querylayer.newest_ledger_form(t.table_name)).fields IS DISTINCT FROM
                    ARRAY(SELECT a.attname::text FROM pg_attribute a
                           WHERE a.attrelid = t.table_name::regclass AND a.attnum > 0 AND NOT a.attisdropped
                             AND NOT (a.attname::text = ANY (querylayer.ledger_chain_columns()))
                           ORDER BY a.attname::text COLLATE \"C\")",
        )
        .unwrap()
        .unwrap();
        assert_eq!(stale, 0, "a column was added to a chained table without registering the next form");
        let runs = json("SELECT jsonb_agg(fields ORDER BY form) FROM querylayer.ledger_forms WHERE table_name = 'querylayer.runs'");
        assert_eq!(runs.as_array().unwrap().len(), 2);
        assert!(!runs[0].as_array().unwrap().contains(&Value::from("extension_version")));
        assert!(runs[1].as_array().unwrap().contains(&Value::from("extension_version")));
    }

    #[pg_test]
    fn a_run_records_the_extension_version_in_form_2() {
        let seeded = json("SELECT querylayer_api.seed_demo()");
        let secret = seeded["connection"]["secret"].as_str().unwrap();
        json(&format!("SELECT querylayer_api.authenticate(sha256(convert_to('{secret}', 'UTF8')))"));
        json("SELECT querylayer_api.begin_run('versioned')");
        assert!(boolean(
            "SELECT extension_version = (SELECT extversion FROM pg_extension WHERE extname = 'querylayer')
                    AND ledger_form = 2
               FROM querylayer.runs WHERE run_type = 'versioned'"
        ));
    }

    #[pg_test]
    fn only_a_superuser_in_replica_mode_is_restoring() {
        assert!(!boolean("SELECT querylayer.restoring()"));
        Spi::run("SET LOCAL session_replication_role = replica").unwrap();
        assert!(boolean("SELECT querylayer.restoring()"));
        // A role that may set session_replication_role (PostgreSQL 15 lets a superuser grant it)
        // is not restoring, the table owner included.
        Spi::run("SET LOCAL session_replication_role = origin").unwrap();
        Spi::run("GRANT SET ON PARAMETER session_replication_role TO querylayer_owner").unwrap();
        Spi::run("SET LOCAL ROLE querylayer_owner").unwrap();
        Spi::run("SET LOCAL session_replication_role = replica").unwrap();
        assert!(!boolean("SELECT querylayer.restoring()"));
        Spi::run("RESET ROLE").unwrap();
        Spi::run("SET LOCAL session_replication_role = origin").unwrap();
    }

    #[pg_test]
    fn outside_a_restore_the_chain_ignores_supplied_chain_columns() {
        notes_table();
        add_note("first");
        // A superuser, not restoring, supplies a forged chain: the trigger chains the row anyway.
        Spi::run(
            "INSERT INTO querylayer.test_notes (site_id, body, chain_seq, prev_sha256, content_sha256, record_sha256, ledger_form)
             SELECT id, 'forged', 99, '\\x00', '\\x00', '\\x00', 9 FROM querylayer.sites WHERE slug = 'demo'",
        )
        .unwrap();
        assert!(boolean(
            "SELECT chain_seq < 99 AND ledger_form = 1 FROM querylayer.test_notes WHERE body = 'forged'"
        ));
        assert_eq!(verify()["ok"], true);
    }

    #[pg_test]
    fn a_restored_record_must_carry_its_chain() {
        notes_table();
        Spi::run("SET LOCAL session_replication_role = replica").unwrap();
        expect_sqlstate(
            "INSERT INTO querylayer.test_notes (site_id, body) SELECT id, 'bare' FROM querylayer.sites WHERE slug = 'demo'",
            "QL423",
        );
        // Linked columns are taken as dumped; verify_ledger then judges the chain.
        Spi::run(
            "INSERT INTO querylayer.test_notes (site_id, body, chain_seq, prev_sha256, content_sha256, record_sha256, ledger_form)
             SELECT id, 'restored', 1, '\\x00', '\\x01', sha256('\\x0001'::bytea), 1 FROM querylayer.sites WHERE slug = 'demo'",
        )
        .unwrap();
        // Updates and deletes stay refused in replica mode, restoring or not.
        expect_sqlstate("UPDATE querylayer.test_notes SET body = 'x'", "QL423");
        expect_sqlstate("DELETE FROM querylayer.test_notes", "QL423");
        Spi::run("SET LOCAL session_replication_role = origin").unwrap();
        assert!(boolean("SELECT chain_seq = 1 AND content_sha256 = '\\x01' FROM querylayer.test_notes"));
        assert_eq!(verify()["ok"], false, "a chain that does not link up is reported");
    }

    #[pg_test]
    fn a_restore_brings_back_a_value_over_its_limit() {
        notes_table();
        Spi::run("SELECT querylayer.limit_values('querylayer.test_notes'::regclass)").unwrap();
        Spi::run("INSERT INTO querylayer.value_limits VALUES ('test_notes', 'body', 'body', 4)").unwrap();
        expect_sqlstate(
            "INSERT INTO querylayer.test_notes (site_id, body) SELECT id, 'too long' FROM querylayer.sites WHERE slug = 'demo'",
            "QL413",
        );
        Spi::run("SET LOCAL session_replication_role = replica").unwrap();
        Spi::run(
            "INSERT INTO querylayer.test_notes (site_id, body, chain_seq, prev_sha256, content_sha256, record_sha256, ledger_form)
             SELECT id, 'too long, as dumped', 1, '\\x00', '\\x01', sha256('\\x0001'::bytea), 1 FROM querylayer.sites WHERE slug = 'demo'",
        )
        .unwrap();
        Spi::run("SET LOCAL session_replication_role = origin").unwrap();
        assert!(boolean("SELECT count(*) = 1 FROM querylayer.test_notes WHERE body = 'too long, as dumped'"));
    }

    #[pg_test]
    fn every_insert_guard_lets_a_restore_through() {
        // A restore inserts history as it was written; an insert trigger that fires in replica
        // mode (enabled ALWAYS or REPLICA) must recognise it (docs/operations.md, "Add a table").
        // (A trigger after the statement neither rewrites a row nor refuses one for what it
        // holds: the liveness generation's and the catalogs' are such.) The two row triggers in C
        // ask querylayer.restoring() in their Rust (chain.rs, limits.rs), which the tests of a
        // restored chain and of a restored value over its limit prove.
        let blind = Spi::get_one::<String>(
            "SELECT string_agg(format('%s on %s', t.tgname, t.tgrelid::regclass), ', ' ORDER BY 1)
               FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_language l ON l.oid = p.prolang
              WHERE t.tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'querylayer'::regnamespace)
                AND NOT t.tgisinternal AND t.tgenabled IN ('A', 'R')
                AND (t.tgtype & 4) <> 0                       -- fires on INSERT
                AND (t.tgtype & 3) <> 0                       -- for each row, or before the statement
                AND CASE l.lanname WHEN 'c' THEN p.prosrc NOT IN ('chain_append', 'enforce_value_limits')
                                   ELSE p.prosrc NOT LIKE '%querylayer.restoring()%' END",
        )
        .unwrap();
        assert_eq!(blind, None, "insert triggers that would refuse or rewrite restored rows");
    }

    #[pg_test]
    fn every_data_table_and_sequence_is_in_a_logical_backup() {
        let missing = Spi::get_one::<String>(
            "SELECT string_agg(c.oid::regclass::text, ', ' ORDER BY c.relname)
               FROM pg_class c
              WHERE c.relnamespace = 'querylayer'::regnamespace AND c.relkind IN ('r', 'p', 'S')
                AND NOT c.relispartition
                AND NOT (c.relname::text = ANY (querylayer.catalog_tables()))
                AND c.oid <> ALL ((SELECT extconfig FROM pg_extension WHERE extname = 'querylayer')::oid[])",
        )
        .unwrap();
        assert_eq!(missing, None, "tables and sequences pg_dump would leave out");
        // The month partitions of the aging tables are not members of the extension, so pg_dump
        // keeps them whole (definition and rows), like any table of the database.
        let members = Spi::get_one::<String>(
            "SELECT string_agg(c.oid::regclass::text, ', ' ORDER BY c.relname)
               FROM pg_class c JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
              WHERE c.relnamespace = 'querylayer'::regnamespace AND c.relispartition",
        )
        .unwrap();
        assert_eq!(members, None, "partitions that belong to the extension (pg_dump would leave them out)");
        assert!(boolean("SELECT count(*) >= 2 FROM pg_class WHERE relnamespace = 'querylayer'::regnamespace AND relispartition"));
        // The catalogs are the extension's, alike in every install: they are not dumped.
        assert!(boolean(
            "SELECT NOT EXISTS (SELECT 1 FROM pg_extension e, unnest(e.extconfig) t
                                 WHERE e.extname = 'querylayer' AND t::regclass::text = ANY (
                                       SELECT 'querylayer.' || c FROM unnest(querylayer.catalog_tables()) c))"
        ));
    }
}

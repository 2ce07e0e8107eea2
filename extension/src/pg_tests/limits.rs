//! Bounded storage (`sql/150_limits.sql`): every oversized value refused, naming the argument,
//! and the documented limits equal to the table's.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{authenticate, demo, failure, json};
    use pgrx::prelude::*;

    #[pg_test]
    fn an_oversized_value_is_refused_naming_the_argument_on_every_path() {
        let (secret, _) = demo();
        authenticate(&secret);
        let (state, message) =
            failure("SELECT querylayer_api.begin_run('x', jsonb_build_object('big', repeat('x', 70000)))");
        assert_eq!(state, "QL413");
        assert!(message.starts_with("input is too large: 70011 bytes, at most 65536"), "{message}");
        let run = json("SELECT querylayer_api.begin_run('x')");
        let id = run["run_id"].as_str().unwrap();
        let (state, message) =
            failure(&format!("SELECT querylayer_api.finish_run('{id}', 'failed', repeat('s', 20000))"));
        assert_eq!(
            (state.as_str(), message.starts_with("summary is too large")),
            ("QL413", true),
            "{message}"
        );
        // The table holds the limit, not the function: a direct insert meets it too.
        let (state, _) = failure(&format!(
            "INSERT INTO querylayer.run_artifacts (site_id, run_id, key, value, agent_id, connection_id, harness)
             SELECT site_id, id, 'k', to_jsonb(repeat('v', 1100000)), agent_id, connection_id, harness
               FROM querylayer.runs WHERE id = '{id}'"
        ));
        assert_eq!(state, "QL413");
    }

    #[pg_test]
    fn the_documented_size_limits_are_the_tables() {
        let doc = include_str!("../../../docs/api.md");
        let section = doc.split("### Size limits").nth(1).expect("docs/api.md has a Size limits section");
        let mut documented: Vec<String> = section
            .lines()
            .skip_while(|l| !l.starts_with("|---"))
            .skip(1)
            .take_while(|l| l.starts_with("| `"))
            .map(|l| l.replace(['`', ' '], ""))
            .collect();
        documented.sort();
        let enforced = Spi::get_one::<String>(
            "SELECT string_agg(format('|%s|%s|%s|%s|', table_name, column_name, argument, max_bytes), ' ')
               FROM querylayer.value_limits",
        )
        .unwrap()
        .unwrap();
        let mut enforced: Vec<&str> = enforced.split(' ').collect();
        enforced.sort();
        assert_eq!(documented, enforced);
    }

    #[pg_test]
    fn the_limits_table_names_a_column_of_every_table_it_lists() {
        let missing = Spi::get_one::<i64>(
            "SELECT count(*) FROM querylayer.value_limits l
              WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a
                                 WHERE a.attrelid = format('querylayer.%I', l.table_name)::regclass
                                   AND a.attname = l.column_name AND NOT a.attisdropped)
                 OR NOT EXISTS (SELECT 1 FROM pg_trigger t
                                 WHERE t.tgrelid = format('querylayer.%I', l.table_name)::regclass
                                   AND t.tgname = 'a0_value_limits' AND t.tgenabled = 'A')",
        )
        .unwrap()
        .unwrap();
        assert_eq!(missing, 0);
    }
}

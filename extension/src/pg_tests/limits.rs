//! Bounded storage (`sql/150_limits.sql`): every oversized value refused, naming the argument,
//! and the documented limits equal to the table's.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{authenticate, content_site, demo, failure, json, text};
    use pgrx::prelude::*;

    /// A slug, a run type, an artifact's key and an idempotency key are checked with their length apart since 0.10.0
    /// (a bounded repetition costs the regex engine twenty times the test): the tables' checks and
    /// the functions' let in exactly the strings the bounded patterns did.
    #[pg_test]
    fn a_pattern_with_its_length_apart_lets_in_what_the_bounded_one_did() {
        let rules = [
            ("content_items", "slug", "^[a-z0-9][a-z0-9/_-]{0,199}$", 200, "^[a-z0-9][a-z0-9/_-]*$"),
            ("runs", "run_type", "^[a-z][a-z0-9_.:-]{0,79}$", 80, "^[a-z][a-z0-9_.:-]*$"),
            (
                "run_artifacts",
                "key",
                "^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$",
                128,
                "^[A-Za-z0-9][A-Za-z0-9_.:/-]*$",
            ),
            ("idempotency_keys", "key", "^[!-~]{1,255}$", 255, "^[!-~]+$"),
        ];
        for (table, column, bounded, max, pattern) in rules {
            let check = text(&format!(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint
                  WHERE conrelid = 'querylayer.{table}'::regclass AND conname = '{table}_{column}_check'"
            ));
            assert!(
                check.contains(&format!("length({column}) <= {max}"))
                    && check.contains(&format!("'{pattern}'")),
                "{table}: {check}"
            );
            // Every first character and every filling of the classes' edges, at every length
            // around the bound: (agreeing, let in, refused).
            let counts = Spi::get_three::<i64, i64, i64>(&format!(
                "WITH c(s) AS (
                     SELECT f || repeat(x, n - 1)
                       FROM unnest(ARRAY['a', 'z', '0', '9', 'A', '-', '/', '_', '.', ':', '!', '~', ' ', 'é', E'\n']) f,
                            unnest(ARRAY['a', 'z', '0', '9', 'A', 'Z', '-', '/', '_', '.', ':', '@', '!', '~', ' ',
                                         'é', E'\t', E'\n', chr(127)]) x,
                            unnest(ARRAY[1, 2, 3, {max} - 1, {max}, {max} + 1, {max} + 2]) n
                     UNION ALL SELECT '')
                 SELECT count(*) FILTER (WHERE (s ~ '{bounded}') = (length(s) <= {max} AND s ~ '{pattern}')),
                        count(*) FILTER (WHERE s ~ '{bounded}'), count(*) FILTER (WHERE s !~ '{bounded}')
                   FROM c"
            ))
            .unwrap();
            let (agreeing, let_in, refused) = (counts.0.unwrap(), counts.1.unwrap(), counts.2.unwrap());
            assert_eq!(agreeing, let_in + refused, "{table}.{column}: the two disagree on some string");
            assert!(let_in >= 20 && refused >= 500, "{table}.{column}: {let_in} let in, {refused} refused");
        }
        // The functions' own checks, at the bounds.
        let site = content_site();
        authenticate(&site.secret);
        let run = json("SELECT querylayer_api.begin_run('article.draft')");
        let run_id = run["run_id"].as_str().unwrap();
        let draft = |slug: &str| {
            format!(
                "SELECT querylayer_api.create_draft('{run_id}', 'article', '{{\"title\": \"T\", \"body\": \"B\"}}', NULL, '{slug}')"
            )
        };
        json(&draft(&"a".repeat(200)));
        for slug in ["a".repeat(201), "-a".to_string(), "a b".to_string()] {
            assert_eq!(failure(&draft(&slug)).0, "22023", "{slug}");
        }
        let claim =
            |key: &str| format!("SELECT querylayer_api.claim_idempotency_key('{key}', 'x', sha256('a'))");
        Spi::run(&claim(&"~".repeat(255))).unwrap();
        for key in ["~".repeat(256), String::new(), "a\tb".to_string()] {
            assert_eq!(failure(&claim(&key)).0, "22023", "{key:?}");
        }
    }

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

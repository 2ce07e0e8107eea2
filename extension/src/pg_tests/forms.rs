//! Form screening aggregates and their retention (`sql/135_forms.sql`).

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{authenticate, content_site, count, json, text};
    use pgrx::prelude::*;

    #[pg_test]
    fn the_retention_purge_removes_old_rejected_events_and_rejected_totals_follow_the_window() {
        let site = content_site();
        json(
            r#"SELECT querylayer_api.report_form_screening('demo', '[
            {"form": "contact", "decision": "rejected", "reason": "spam", "occurred_at": "2020-01-01T10:00:00Z", "contact": "a@b.example", "payload": {"msg": "buy"}},
            {"form": "contact", "decision": "rejected", "reason": "spam", "occurred_at": "2020-01-01T11:00:00Z"},
            {"form": "contact", "decision": "accepted", "reason": "clean", "occurred_at": "2020-01-01T12:00:00Z"},
            {"form": "contact", "decision": "rejected", "reason": "spam"}]')"#,
        );
        authenticate(&site.secret);
        let before = json("SELECT querylayer_api.form_screening_metrics(366)");
        Spi::run("SELECT querylayer_api.purge_form_screening()").unwrap();
        assert_eq!(
            count("form_screening_events"),
            2,
            "the old rejected events are gone; recent and accepted stay"
        );
        authenticate(&site.secret);
        let after = json("SELECT querylayer_api.form_screening_metrics(366)");
        assert_eq!(before, after);
        // The day rows stay, but rejected totals are reported only inside the retention window.
        let old = json("SELECT jsonb_agg(to_jsonb(d)) FROM querylayer.form_screening_daily d WHERE day = '2020-01-01' AND decision = 'rejected'");
        assert_eq!(old[0]["events"], 2);
        // Forty days back: inside the year asked for, outside the 30-day window of rejections.
        let day = text("SELECT ((now() - interval '40 days') AT TIME ZONE 'UTC')::date::text");
        json(&format!(
            r#"SELECT querylayer_api.report_form_screening('demo', '[
            {{"form": "contact", "decision": "rejected", "reason": "spam", "occurred_at": "{day}T12:00:00Z"}},
            {{"form": "contact", "decision": "accepted", "reason": "clean", "occurred_at": "{day}T12:00:00Z"}}]')"#
        ));
        authenticate(&site.secret);
        let now = json("SELECT querylayer_api.form_screening_metrics(366)");
        let reported: Vec<(String, String)> = now["counts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["day"].as_str().unwrap().to_string(), c["decision"].as_str().unwrap().to_string()))
            .collect();
        assert!(reported.contains(&(day.clone(), "accepted".to_string())), "{now}");
        assert!(!reported.contains(&(day, "rejected".to_string())), "{now}");
        assert!(reported.iter().any(|(_, d)| d == "rejected"), "today's rejection is reported: {now}");
        assert!(!after.to_string().contains("a@b.example"));
    }
}

//! Claim evidence and its re-verification (`sql/130_evidence.sql`).

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{
        as_member, authenticate, content_site, count, draft, expect_sqlstate, json,
    };
    use pgrx::prelude::*;
    use serde_json::Value;

    #[pg_test]
    fn evidence_reverification_opens_exactly_one_review_and_agents_see_only_metadata() {
        let site = content_site();
        let (run, content, rev) = draft(&site.secret, "claims");
        let sha = "a".repeat(64);
        expect_sqlstate(&format!(
            "SELECT querylayer_api.record_claim_evidence('{run}', '{rev}', 'not in the draft', 'https://s.example', 'q', now(), '{sha}')"
        ), "22023");
        json(&format!(
            "SELECT querylayer_api.record_claim_evidence('{run}', '{rev}', 'B', 'https://s.example/page', 'B', now(), '{sha}')"
        ));
        Spi::run("SELECT querylayer_api.make_evidence_jobs_due('demo')").unwrap();
        for observed in ["b", "c"] {
            let jobs = json("SELECT querylayer_api.worker_claim_evidence_jobs(10)");
            if let Some(job) = jobs.as_array().unwrap().first() {
                let id = job["job_id"].as_str().unwrap();
                let outcome = json(&format!(
                    "SELECT querylayer_api.worker_record_evidence_attempt('{id}', 200, '{}', 'secret body text')",
                    observed.repeat(64)
                ));
                assert_eq!(outcome["status"], "changed");
            }
        }
        assert_eq!(count("evidence_reviews"), 1);
        authenticate(&site.secret);
        let state = json(&format!("SELECT querylayer_api.list_evidence_reverification('{content}')"))
            ["evidence"]
            .clone();
        let text = state.to_string();
        assert!(state[0]["open_review"]["reason"] == "changed", "{state}");
        assert!(!text.contains("secret body text") && !text.contains(&"b".repeat(64)), "{text}");
    }

    #[pg_test]
    fn a_vanished_source_opens_exactly_one_vanished_review() {
        let site = content_site();
        let (run, content, rev) = draft(&site.secret, "claims");
        let sha = "a".repeat(64);
        // Two claims of the draft ("T" and "B"): one source answers 404, the other 410.
        let mut status_of = std::collections::HashMap::new();
        for (claim, http) in [("T", 404), ("B", 410)] {
            let ev = json(&format!(
                "SELECT querylayer_api.record_claim_evidence('{run}', '{rev}', '{claim}', 'https://s.example/{claim}', '{claim}', now(), '{sha}')"
            ));
            status_of.insert(ev["evidence_id"].as_str().unwrap().to_string(), http);
        }
        Spi::run("SELECT querylayer_api.make_evidence_jobs_due('demo')").unwrap();
        let mut attempts = 0;
        for _ in 0..2 {
            let jobs = json("SELECT querylayer_api.worker_claim_evidence_jobs(10)");
            for job in jobs.as_array().unwrap() {
                let id = job["job_id"].as_str().unwrap();
                let http = status_of[job["evidence_id"].as_str().unwrap()];
                let outcome = json(&format!(
                    "SELECT querylayer_api.worker_record_evidence_attempt('{id}', {http}, NULL, 'Not Found')"
                ));
                assert_eq!(outcome["status"], "vanished", "{http}: {outcome}");
                assert!(outcome["review_id"].is_string(), "{outcome}");
                attempts += 1;
            }
        }
        assert_eq!(attempts, 2, "a vanished source schedules no further job while its review is open");
        // Even when a job is forced onto the 404 evidence (as an operator bringing one forward
        // would), vanishing again opens no second review.
        let (gone, _) = status_of.iter().find(|(_, h)| **h == 404).unwrap();
        Spi::run(&format!(
            "SELECT querylayer.schedule_evidence_job(id, site_id, now()) FROM querylayer.claim_evidence WHERE id = '{gone}'"
        ))
        .unwrap();
        let jobs = json("SELECT querylayer_api.worker_claim_evidence_jobs(10)");
        assert_eq!(jobs.as_array().unwrap().len(), 1, "{jobs}");
        let again = json(&format!(
            "SELECT querylayer_api.worker_record_evidence_attempt('{}', 404, NULL)",
            jobs[0]["job_id"].as_str().unwrap()
        ));
        assert_eq!(again["status"], "vanished");
        assert_eq!(again["review_id"], Value::Null, "the open review is not duplicated: {again}");
        assert_eq!(count("evidence_attempts"), 3);
        let per_evidence = json(
            "SELECT jsonb_agg(jsonb_build_object('evidence_id', evidence_id, 'n', n, 'reasons', reasons))
               FROM (SELECT evidence_id, count(*) AS n, array_agg(reason || '/' || state) AS reasons
                       FROM querylayer.evidence_reviews GROUP BY evidence_id) r",
        );
        let per_evidence = per_evidence.as_array().unwrap();
        assert_eq!(per_evidence.len(), 2, "{per_evidence:?}");
        for r in per_evidence {
            assert_eq!(r["n"], 1, "{r}");
            assert_eq!(r["reasons"], serde_json::json!(["vanished/open"]), "{r}");
        }
        authenticate(&site.secret);
        let state = json(&format!("SELECT querylayer_api.list_evidence_reverification('{content}')"))
            ["evidence"]
            .clone();
        assert_eq!(state.as_array().unwrap().len(), 2, "{state}");
        for e in state.as_array().unwrap() {
            assert_eq!(e["open_review"]["reason"], "vanished", "{state}");
            assert_eq!(e["last_attempt"]["status"], "vanished", "{state}");
            assert_eq!(e["due_job"], Value::Null, "{state}");
        }
        as_member(&site.owner_token);
        let reviews = json("SELECT querylayer_api.console_list_evidence_reviews()")["reviews"].clone();
        let mut seen: Vec<i64> = reviews
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                assert_eq!(r["reason"], "vanished");
                r["observed"]["http_status"].as_i64().unwrap()
            })
            .collect();
        seen.sort();
        assert_eq!(seen, [404, 410]);
    }
}

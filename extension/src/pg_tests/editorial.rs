//! Editorial planning (`sql/120_editorial.sql`): strategy opportunities and content briefs.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{
        as_member, as_owner, authenticate, content_site, count, expect_sqlstate, json,
    };
    use pgrx::prelude::*;

    #[pg_test]
    fn strategy_opportunities_become_a_proposal_and_an_approval_commissions_one_brief() {
        let site = content_site();
        json(
            r#"SELECT querylayer_api.import_topical_strategy('demo', 'keyword-tool-export', '[
            {"id": "opp-1", "topic": "pricing", "title": "Pricing explained", "signals": {"estimated_volume": 1200}},
            {"id": "opp-2", "topic": "pricing", "title": "Pricing for teams"}]')"#,
        );
        authenticate(&site.secret);
        let queue = json("SELECT querylayer_api.list_topical_strategy_opportunities()");
        let opps = queue["opportunities"].as_array().unwrap();
        assert_eq!(opps.len(), 2);
        assert!(opps.iter().all(|o| o["reconciliation_state"] == "new"));
        assert_eq!(opps[0]["provenance"]["source"], "keyword-tool-export");
        let ids: Vec<String> =
            opps.iter().map(|o| o["opportunity_id"].as_str().unwrap().to_string()).collect();
        let run = json("SELECT querylayer_api.begin_run('strategy.triage')")["run_id"]
            .as_str()
            .unwrap()
            .to_string();
        let proposal = json(&format!(
            "SELECT querylayer_api.propose_topical_strategy_opportunities('{run}', ARRAY['{}', '{}']::uuid[], 'two pages')", ids[0], ids[1]
        ));
        assert_eq!(proposal["type"], "topical_map");
        let after = json("SELECT querylayer_api.list_topical_strategy_opportunities()");
        assert!(after["opportunities"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["reconciliation_state"] == "proposed"));
        assert_eq!(count("topics"), 0, "proposing changes nothing");
        // The agent (or the owner role) cannot write the map directly.
        as_owner();
        expect_sqlstate(
            "INSERT INTO querylayer.topics (site_id, slug, title) SELECT id, 'x', 'X' FROM querylayer.sites",
            "QL423",
        );
        Spi::run("RESET ROLE").unwrap();
        as_member(&site.owner_token);
        let pid = proposal["proposal_id"].as_str().unwrap();
        let decided = json(&format!("SELECT querylayer_api.decide_proposal('{pid}', 'approve')"));
        assert_eq!(decided["state"], "applied", "{decided}");
        assert_eq!(count("topics"), 1);
        assert_eq!(count("content_briefs"), 1, "exactly one brief per approval");
        authenticate(&site.secret);
        let briefs = json("SELECT querylayer_api.list_content_briefs()");
        assert_eq!(briefs["briefs"][0]["brief"]["pages"].as_array().unwrap().len(), 2);
        let accepted = json("SELECT querylayer_api.list_topical_strategy_opportunities('accepted')");
        assert_eq!(accepted["opportunities"].as_array().unwrap().len(), 2);
    }
}

//! Staged source packages (`sql/125_source_packages.sql`).

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{authenticate, content_site, count, json};
    use pgrx::prelude::*;

    #[pg_test]
    fn staging_a_package_twice_is_recognised_and_creates_no_content() {
        let site = content_site();
        authenticate(&site.secret);
        let run =
            json("SELECT querylayer_api.begin_run('sources.stage')")["run_id"].as_str().unwrap().to_string();
        let records = r#"[{"title": "A", "url": "https://a.example/x", "author": "Ann", "published_at": "2026-01-01", "body": "short"},
                          {"title": "", "url": "ftp://nope"},
                          {"title": "C", "url": "https://a.example/x"}]"#;
        let before = (count("content_items"), count("content_revisions"), count("proposals"));
        let first = json(&format!(
            "SELECT querylayer_api.stage_content_source_package('{run}', 'batch', '{records}')"
        ));
        let second = json(&format!(
            "SELECT querylayer_api.stage_content_source_package('{run}', 'batch again', '{records}')"
        ));
        assert_eq!(first["resubmitted"], false);
        assert_eq!(second["resubmitted"], true);
        assert_eq!(first["package_sha256"], second["package_sha256"]);
        assert_eq!(first["warnings"], second["warnings"]);
        assert_eq!(first["records"], second["records"]);
        assert_eq!(first["invalid_count"], 1);
        assert_eq!(
            first["records"][1]["problems"],
            serde_json::json!([
                "title: text of 1 to 300 characters is required",
                "url: an http(s) URL is required"
            ])
        );
        assert_eq!(
            first["warnings"],
            serde_json::json!([
                "1 of 3 records are invalid and were kept for review",
                "url https://a.example/x appears in records 0, 2"
            ])
        );
        assert_eq!((count("content_items"), count("content_revisions"), count("proposals")), before);
        let pkg = first["package_id"].as_str().unwrap();
        let invalid = json(&format!("SELECT querylayer_api.list_content_source_records('{pkg}', false)"));
        assert_eq!(invalid["records"].as_array().unwrap().len(), 1);
    }
}

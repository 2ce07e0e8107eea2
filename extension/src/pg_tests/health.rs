//! Readiness as the database sees it (`sql/165_health.sql`).

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{demo, json};
    use pgrx::prelude::*;

    #[pg_test]
    fn health_reports_what_it_checks() {
        demo();
        let health = json("SELECT querylayer_api.health()");
        assert_eq!(health["writable"], true, "{health}");
        assert_eq!(health["in_recovery"], false);
        assert!(health["extension_version"].is_string());
        assert!(health["free_bytes"].as_i64().unwrap() > 0);
        Spi::run("SELECT querylayer_api.set_setting('readiness_min_free_mb', '1048576')").unwrap();
        assert_eq!(json("SELECT querylayer_api.health()")["writable"], false, "a terabyte is not free here");
    }
}

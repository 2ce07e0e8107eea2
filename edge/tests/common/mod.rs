//! What the in-process HTTP tests share: the state of an edge whose database is never reached
//! (the pool points at a closed port), for `app()` driven with `oneshot`.

use std::time::Duration;

use querylayer_edge::config::{HttpConfig, ServeArgs};
use querylayer_edge::db::Db;
use querylayer_edge::AppState;

/// `serve`'s arguments for a public URL of https://edge.example.com and one allowed console origin.
pub fn serve_args() -> ServeArgs {
    ServeArgs {
        bind: "127.0.0.1".into(),
        port: 8080,
        database_url: "postgres://nobody@127.0.0.1:1/none".into(),
        read_database_url: None,
        replica_max_staleness_ms: 1000,
        public_url: Some("https://edge.example.com".into()),
        allowed_hosts: vec![],
        allowed_origins: vec!["https://console.example.com".into()],
        rate_limit: 20.0,
        rate_burst: 60,
        auth_failure_rate: 2.0,
        auth_failure_burst: 60,
        registration_rate: 0.1,
        registration_burst: 20,
        client_metadata_allow_private_networks: false,
        client_metadata_ca_file: None,
        client_metadata_timeout_secs: 5,
        max_body_bytes: 1024,
        request_timeout_secs: 30,
        statement_timeout_secs: 20,
        db_pool_size: 1,
        site_max_reads: None,
        site_max_writes: None,
        site_queue_timeout_ms: 2000,
        header_read_timeout_secs: 10,
        idle_timeout_secs: 60,
        max_connections: 0,
        max_connections_per_peer: 256,
        shutdown_grace_secs: 1,
        require_auth: true,
        llm_url: None,
        llm_model: None,
        llm_timeout_secs: 60,
        metrics_listen: None,
        otlp_endpoint: None,
        config: None,
        print_config: false,
    }
}

/// The state of an edge serving `args`.
pub fn state_of(args: ServeArgs) -> AppState {
    let db = Db::connect(&args.database_url, 1, Duration::from_secs(1)).unwrap();
    AppState::new(db, HttpConfig::from_args(&args).unwrap()).unwrap()
}

//! Configuration of `querylayer serve`: flags and environment, the Host and Origin allow-lists,
//! limits, and the log format. Read once at start-up; nothing here changes afterwards.

use std::time::Duration;

use clap::Args;

pub use crate::telemetry::LogFormat;

#[derive(Args, Debug, Clone, serde::Serialize)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "QUERYLAYER_BIND", default_value = "127.0.0.1")]
    pub bind: String,

    /// Port to listen on.
    #[arg(long, env = "QUERYLAYER_PORT", default_value_t = 8080)]
    pub port: u16,

    /// PostgreSQL connection string for the `querylayer_edge` login.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// PostgreSQL connection string of a hot standby (libpq multi-host lists and
    /// target_session_attrs accepted) to serve read-only tools from when it is fresh enough
    /// (--replica-max-staleness-ms, and past the connection's own last write through this edge).
    /// Every call is still audited on the primary before it is answered.
    #[arg(long, env = "QUERYLAYER_READ_DATABASE_URL", hide_env_values = true)]
    pub read_database_url: Option<String>,

    /// How far behind the primary, in milliseconds, a standby may be and still serve reads.
    #[arg(long, env = "QUERYLAYER_REPLICA_MAX_STALENESS_MS", default_value_t = 1000)]
    pub replica_max_staleness_ms: u64,

    /// The URL clients use to reach this edge (for the resource metadata and the 401
    /// challenge); defaults to http://<bind>:<port>. Its host and origin are allowed too.
    #[arg(long, env = "QUERYLAYER_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// Extra Host header values to accept (`name` for any port, `name:port` for one port),
    /// beyond localhost, 127.0.0.1 and [::1].
    #[arg(long = "allowed-host", env = "QUERYLAYER_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,

    /// Extra Origin header values to accept (`https://app.example.com`, `http://host:*` for
    /// any port), beyond http(s) origins on localhost, 127.0.0.1 and [::1]. Requests without
    /// an Origin header (non-browser clients) are not affected.
    #[arg(long = "allowed-origin", env = "QUERYLAYER_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,

    /// Requests per second per connection (a token bucket in the database, shared by every edge
    /// on it; member tokens: per edge instance); 0 turns it off.
    #[arg(long, env = "QUERYLAYER_RATE_LIMIT", default_value_t = 20.0)]
    pub rate_limit: f64,

    /// Burst size of the per-credential token bucket.
    #[arg(long, env = "QUERYLAYER_RATE_BURST", default_value_t = 60)]
    pub rate_burst: u32,

    /// Failed authentications (answers 401) per second a peer address may make on average;
    /// beyond its burst it is answered 429 before any database work. 0 disables the budget
    /// (behind a reverse proxy every client shares the proxy's address).
    #[arg(long, env = "QUERYLAYER_AUTH_FAILURE_RATE", default_value_t = 2.0)]
    pub auth_failure_rate: f64,

    /// How many failed authentications a peer address may make at once.
    #[arg(long, env = "QUERYLAYER_AUTH_FAILURE_BURST", default_value_t = 60)]
    pub auth_failure_burst: u32,

    /// Dynamic client registrations (`POST /register`) per second a peer address may make on
    /// average, beyond its burst answered 429; 0 turns the limit off.
    #[arg(long, env = "QUERYLAYER_REGISTRATION_RATE", default_value_t = 0.1)]
    pub registration_rate: f64,

    /// How many client registrations a peer address may make at once.
    #[arg(long, env = "QUERYLAYER_REGISTRATION_BURST", default_value_t = 20)]
    pub registration_burst: u32,

    /// Also fetch OAuth Client ID Metadata Documents from loopback, private and other non-public
    /// addresses. Off by default: client_id URLs come from anyone.
    #[arg(long, env = "QUERYLAYER_CLIENT_METADATA_ALLOW_PRIVATE_NETWORKS")]
    pub client_metadata_allow_private_networks: bool,

    /// PEM certificates to trust, besides the web's roots, when fetching Client ID Metadata
    /// Documents (a private CA).
    #[arg(long, env = "QUERYLAYER_CLIENT_METADATA_CA_FILE")]
    pub client_metadata_ca_file: Option<std::path::PathBuf>,

    /// How long fetching one Client ID Metadata Document may take, in seconds.
    #[arg(long, env = "QUERYLAYER_CLIENT_METADATA_TIMEOUT", default_value_t = 5)]
    pub client_metadata_timeout_secs: u64,

    /// Largest request body accepted, in bytes.
    #[arg(long, env = "QUERYLAYER_MAX_BODY_BYTES", default_value_t = 2 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Longest a request may take, in seconds (answered 408 beyond it).
    #[arg(long, env = "QUERYLAYER_REQUEST_TIMEOUT", default_value_t = 30)]
    pub request_timeout_secs: u64,

    /// PostgreSQL statement_timeout for the edge's sessions, in seconds.
    #[arg(long, env = "QUERYLAYER_STATEMENT_TIMEOUT", default_value_t = 20)]
    pub statement_timeout_secs: u64,

    /// Size of the database connection pool.
    #[arg(long, env = "QUERYLAYER_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: usize,

    /// Pooled connections one site's reading calls may hold at once (default: half the pool).
    #[arg(long, env = "QUERYLAYER_SITE_MAX_READS")]
    pub site_max_reads: Option<usize>,

    /// Pooled connections one site's writing calls may hold at once (default: a quarter of the
    /// pool). A site whose history is held by a stalled transaction holds no more than this.
    #[arg(long, env = "QUERYLAYER_SITE_MAX_WRITES")]
    pub site_max_writes: Option<usize>,

    /// How long a call waits for its site's share of the pool before it is refused as
    /// `overloaded` (retryable), in milliseconds.
    #[arg(long, env = "QUERYLAYER_SITE_QUEUE_TIMEOUT_MS", default_value_t = 2000)]
    pub site_queue_timeout_ms: u64,

    /// How long a client may take to send a request's head, from the connection's opening or
    /// its previous response (HTTP/1.1), in seconds. Slow or stalled clients are cut off here,
    /// before authentication.
    #[arg(long, env = "QUERYLAYER_HEADER_READ_TIMEOUT", default_value_t = 10)]
    pub header_read_timeout_secs: u64,

    /// A connection that carries no byte either way for this long is closed, in seconds (longer
    /// than --request-timeout-secs).
    #[arg(long, env = "QUERYLAYER_IDLE_TIMEOUT", default_value_t = 60)]
    pub idle_timeout_secs: u64,

    /// Open client connections at most; past it new ones are answered 503 and closed at once.
    /// 0: as many as the open-files limit leaves room for (the limit is raised to its hard
    /// maximum at start and logged).
    #[arg(long, env = "QUERYLAYER_MAX_CONNECTIONS", default_value_t = 0)]
    pub max_connections: usize,

    /// Open connections at most from one peer address; 0 turns the cap off (behind a reverse
    /// proxy every client has the proxy's address).
    #[arg(long, env = "QUERYLAYER_MAX_CONNECTIONS_PER_PEER", default_value_t = 256)]
    pub max_connections_per_peer: usize,

    /// On SIGTERM or Ctrl-C, how long in-flight requests may still take, in seconds.
    #[arg(long, env = "QUERYLAYER_SHUTDOWN_GRACE", default_value_t = 30)]
    pub shutdown_grace_secs: u64,

    /// Serve the governed `/v1` API (`POST /v1/models/import/osi`, `POST /v1/answer`), which
    /// demands a signed `x-qg-envelope` on every request. Without it `/v1` is not served:
    /// QueryLayer has no anonymous mode.
    #[arg(long, env = "QUERYLAYER_REQUIRE_AUTH")]
    pub require_auth: bool,

    /// An OpenAI-compatible chat endpoint that writes answer text (`…/v1/chat/completions`);
    /// without it answers are synthesized deterministically. Governance is the same either way.
    #[arg(long, env = "QUERYLAYER_LLM_URL", requires = "llm_model")]
    pub llm_url: Option<String>,

    /// The model to ask at `--llm-url`.
    #[arg(long, env = "QUERYLAYER_LLM_MODEL", requires = "llm_url")]
    pub llm_model: Option<String>,

    /// How long the LLM may take, in seconds; shorter than the request timeout, so a slow LLM
    /// ends as an error that keeps the receipt rather than as a dropped request.
    #[arg(long, env = "QUERYLAYER_LLM_TIMEOUT", default_value_t = 20)]
    pub llm_timeout_secs: u64,

    /// Serve Prometheus metrics at http://<address>/metrics, on a listener of their own (for
    /// example 127.0.0.1:9464). Off unless set.
    #[arg(long, env = "QUERYLAYER_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,

    /// Send OpenTelemetry traces (a span per request, tool call and database call) over
    /// OTLP/HTTP with JSON encoding to this collector (for example http://127.0.0.1:4318; the
    /// path /v1/traces is added). Off unless set.
    #[arg(long, env = "QUERYLAYER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// A TOML file of settings under the flags and the environment: each key is a flag's long
    /// name (`port = 8080`, `database_url = "…"`; `-` or `_`). A flag wins over its environment
    /// variable, which wins over the file, which wins over the default.
    #[arg(long, env = "QUERYLAYER_CONFIG")]
    pub config: Option<std::path::PathBuf>,

    /// Print the effective configuration (secrets masked, each value's source) and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// What the HTTP stages need at run time.
#[derive(Clone)]
pub struct HttpConfig {
    /// Without a trailing slash.
    pub public_url: String,
    pub allow: AllowList,
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
    pub rate_limit_per_sec: f64,
    pub rate_burst: u32,
    pub auth_failure_rate: f64,
    pub auth_failure_burst: u32,
    pub registration_rate: f64,
    pub registration_burst: u32,
    /// How Client ID Metadata Documents are fetched.
    pub client_documents: crate::client_documents::DocumentLimits,
    /// Serve the envelope-authenticated `/v1` API.
    pub require_auth: bool,
    /// The LLM that writes answers, if configured.
    pub llm: Option<crate::llm::Llm>,
    /// The readiness check's own database connection (outside the pool).
    pub readiness: tokio_postgres::Config,
    /// Its TLS, as the pool's (`sslmode`, `sslrootcert`).
    pub readiness_tls: crate::pgtls::MakeTls,
    /// Each site's share of the pool (reads, writes) and how long a call waits for it.
    pub site_reads: usize,
    pub site_writes: usize,
    pub site_wait: Duration,
    /// The socket's limits (`listener`).
    pub listener: crate::listener::ListenerConfig,
}

impl HttpConfig {
    pub fn from_args(args: &ServeArgs) -> Result<HttpConfig, String> {
        let public_url = match &args.public_url {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => {
                let host = match args.bind.as_str() {
                    "0.0.0.0" => "127.0.0.1".to_string(),
                    "::" => "[::1]".to_string(),
                    h if h.contains(':') => format!("[{h}]"),
                    h => h.to_string(),
                };
                format!("http://{host}:{}", args.port)
            }
        };
        let public: http::Uri = public_url.parse().map_err(|e| format!("--public-url {public_url}: {e}"))?;
        let (Some(scheme), Some(authority)) = (public.scheme_str(), public.authority()) else {
            return Err(format!("--public-url {public_url}: needs a scheme and a host"));
        };
        let mut hosts: Vec<String> = DEFAULT_HOSTS.iter().map(|s| s.to_string()).collect();
        hosts.push(authority.host().to_string());
        hosts.extend(args.allowed_hosts.iter().cloned());
        let mut origins: Vec<String> = DEFAULT_ORIGINS.iter().map(|s| s.to_string()).collect();
        origins.push(format!("{scheme}://{authority}"));
        origins.extend(args.allowed_origins.iter().cloned());
        if args.llm_url.is_some() && args.llm_timeout_secs >= args.request_timeout_secs {
            return Err(format!(
                "--llm-timeout-secs ({}) must be shorter than --request-timeout-secs ({}): a request \
                 cut off while the LLM writes would lose its receipt",
                args.llm_timeout_secs, args.request_timeout_secs
            ));
        }
        if args.idle_timeout_secs <= args.request_timeout_secs {
            return Err(format!(
                "--idle-timeout-secs ({}) must be longer than --request-timeout-secs ({}): a call in progress \
                 would be cut off as idle",
                args.idle_timeout_secs, args.request_timeout_secs
            ));
        }
        if args.header_read_timeout_secs == 0 {
            return Err("--header-read-timeout-secs must be at least 1".into());
        }
        let crate::pgtls::PgConnect { config: mut readiness, tls: readiness_tls, .. } =
            crate::pgtls::parse(&args.database_url)?;
        readiness.application_name("querylayer-edge-readiness");
        let options = readiness.get_options().unwrap_or("").to_string();
        readiness.options(format!("{options} -c statement_timeout=2000").trim());
        readiness.connect_timeout(Duration::from_secs(2));
        let pool = args.db_pool_size.max(1);
        Ok(HttpConfig {
            readiness,
            readiness_tls,
            site_reads: args.site_max_reads.unwrap_or(pool / 2).max(1),
            site_writes: args.site_max_writes.unwrap_or(pool / 4).max(1),
            site_wait: Duration::from_millis(args.site_queue_timeout_ms),
            listener: crate::listener::ListenerConfig {
                header_read_timeout: Duration::from_secs(args.header_read_timeout_secs),
                idle_timeout: Duration::from_secs(args.idle_timeout_secs),
                max_connections: args.max_connections,
                max_connections_per_peer: args.max_connections_per_peer,
                reserved_descriptors: pool as u64 + 2,
            },
            public_url,
            allow: AllowList::new(&hosts, &origins)?,
            max_body_bytes: args.max_body_bytes,
            request_timeout: Duration::from_secs(args.request_timeout_secs),
            rate_limit_per_sec: args.rate_limit,
            rate_burst: args.rate_burst,
            auth_failure_rate: args.auth_failure_rate,
            auth_failure_burst: args.auth_failure_burst,
            registration_rate: args.registration_rate,
            registration_burst: args.registration_burst,
            client_documents: crate::client_documents::DocumentLimits {
                allow_private_networks: args.client_metadata_allow_private_networks,
                ca_pem: match &args.client_metadata_ca_file {
                    Some(path) => Some(
                        std::fs::read(path)
                            .map_err(|e| format!("--client-metadata-ca-file {}: {e}", path.display()))?,
                    ),
                    None => None,
                },
                timeout_secs: args.client_metadata_timeout_secs,
            },
            require_auth: args.require_auth,
            llm: match (&args.llm_url, &args.llm_model) {
                (Some(url), Some(model)) => Some(crate::llm::Llm::new(crate::llm::LlmConfig {
                    url: url.clone(),
                    model: model.clone(),
                    timeout: Duration::from_secs(args.llm_timeout_secs),
                })?),
                _ => None,
            },
        })
    }

    /// The MCP endpoint as a protected resource (RFC 9728 `resource`).
    pub fn resource_url(&self) -> String {
        format!("{}/mcp", self.public_url)
    }

    /// Where the 401 challenge points.
    pub fn resource_metadata_url(&self) -> String {
        format!("{}/.well-known/oauth-protected-resource", self.public_url)
    }
}

const DEFAULT_HOSTS: &[&str] = &["localhost", "127.0.0.1", "[::1]"];
const DEFAULT_ORIGINS: &[&str] = &[
    "http://localhost:*",
    "http://127.0.0.1:*",
    "http://[::1]:*",
    "https://localhost:*",
    "https://127.0.0.1:*",
    "https://[::1]:*",
];

#[derive(Debug, Clone, PartialEq)]
enum Port {
    Any,
    Exact(u16),
}

#[derive(Debug, Clone)]
struct HostRule {
    host: String,
    port: Port,
}

#[derive(Debug, Clone)]
enum OriginRule {
    Null,
    Tuple { scheme: String, host: String, port: Port },
}

/// The Host and Origin values this edge answers (DNS-rebinding and cross-origin protection).
#[derive(Debug, Clone)]
pub struct AllowList {
    hosts: Vec<HostRule>,
    origins: Vec<OriginRule>,
    host_entries: Vec<String>,
    origin_entries: Vec<String>,
}

fn normalize_host(host: &str) -> String {
    host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase()
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

impl AllowList {
    pub fn new(hosts: &[String], origins: &[String]) -> Result<AllowList, String> {
        let mut list = AllowList {
            hosts: Vec::new(),
            origins: Vec::new(),
            host_entries: Vec::new(),
            origin_entries: Vec::new(),
        };
        for entry in hosts.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            let authority: http::uri::Authority =
                entry.parse().map_err(|e| format!("allowed host {entry:?}: {e}"))?;
            let port = authority.port_u16().map(Port::Exact).unwrap_or(Port::Any);
            list.hosts.push(HostRule { host: normalize_host(authority.host()), port });
            list.host_entries.push(entry.to_string());
        }
        for entry in origins.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            let rule = if entry == "null" {
                OriginRule::Null
            } else {
                let (base, any_port) = match entry.strip_suffix(":*") {
                    Some(base) => (base, true),
                    None => (entry, false),
                };
                let uri: http::Uri = base.parse().map_err(|e| format!("allowed origin {entry:?}: {e}"))?;
                let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
                    return Err(format!("allowed origin {entry:?}: needs a scheme and a host"));
                };
                let port = if any_port {
                    Port::Any
                } else {
                    match authority.port_u16().or(default_port(scheme)) {
                        Some(p) => Port::Exact(p),
                        None => return Err(format!("allowed origin {entry:?}: give a port")),
                    }
                };
                OriginRule::Tuple {
                    scheme: scheme.to_ascii_lowercase(),
                    host: normalize_host(authority.host()),
                    port,
                }
            };
            list.origins.push(rule);
            list.origin_entries.push(entry.to_string());
        }
        Ok(list)
    }

    /// Is this Host header (`name` or `name:port`) one of ours?
    pub fn host_allowed(&self, host: &str) -> bool {
        let Ok(authority) = host.parse::<http::uri::Authority>() else {
            return false;
        };
        let name = normalize_host(authority.host());
        let port = authority.port_u16();
        self.hosts.iter().any(|rule| {
            rule.host == name
                && match rule.port {
                    Port::Any => true,
                    Port::Exact(p) => port == Some(p),
                }
        })
    }

    /// Is this Origin header one of ours? (Requests without one are not browser requests.)
    pub fn origin_allowed(&self, origin: &str) -> bool {
        if origin == "null" {
            return self.origins.iter().any(|r| matches!(r, OriginRule::Null));
        }
        let Ok(uri) = origin.parse::<http::Uri>() else {
            return false;
        };
        let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
            return false;
        };
        if uri.path() != "/" && !uri.path().is_empty() {
            return false;
        }
        let scheme = scheme.to_ascii_lowercase();
        let host = normalize_host(authority.host());
        let port = authority.port_u16().or(default_port(&scheme));
        self.origins.iter().any(|rule| match rule {
            OriginRule::Null => false,
            OriginRule::Tuple { scheme: s, host: h, port: p } => {
                *s == scheme
                    && *h == host
                    && match p {
                        Port::Any => true,
                        Port::Exact(p) => port == Some(*p),
                    }
            }
        })
    }

    /// The same lists in rmcp's syntax, so that its own check agrees with ours.
    pub fn host_entries(&self) -> Vec<String> {
        self.host_entries.clone()
    }

    pub fn origin_entries(&self) -> Vec<String> {
        self.origin_entries.clone()
    }
}

/// The environment variables this process took from the configuration file (for
/// `--print-config`).
static FROM_FILE: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// The configuration file of `serve` (`--config PATH` after `serve`, or QUERYLAYER_CONFIG):
/// each key sets its flag's environment variable unless that variable is set already, so that
/// clap then reads flag > environment > file > default. `command` is the whole command line's
/// definition; keys are the long names of `serve`'s flags and of the global ones.
pub fn apply_config_file(command: &clap::Command, argv: &[std::ffi::OsString]) -> Result<(), String> {
    let args: Vec<String> = argv.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    // The subcommand is the first argument after the global `--log-format <format>`.
    let mut at = 1;
    while let Some(arg) = args.get(at) {
        match arg.as_str() {
            "--log-format" => at += 2,
            a if a.starts_with("--log-format=") => at += 1,
            _ => break,
        }
    }
    if args.get(at).map(String::as_str) != Some("serve") {
        return Ok(());
    }
    let mut path = std::env::var_os("QUERYLAYER_CONFIG").map(std::path::PathBuf::from);
    let mut rest = args[at + 1..].iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            break;
        } else if arg == "--config" {
            path = rest.next().map(std::path::PathBuf::from);
        } else if let Some(value) = arg.strip_prefix("--config=") {
            path = Some(value.into());
        }
    }
    let Some(path) = path else {
        return Ok(());
    };
    let text = std::fs::read_to_string(&path).map_err(|e| format!("--config {}: {e}", path.display()))?;
    let serve = command.find_subcommand("serve").expect("the serve command");
    let arguments: Vec<&clap::Arg> = serve.get_arguments().chain(command.get_arguments()).collect();
    let settings =
        file_settings(&text, &arguments).map_err(|e| format!("--config {}: {e}", path.display()))?;
    let mut from_file = Vec::new();
    for (env, value) in settings {
        if std::env::var_os(&env).is_none() {
            // Single-threaded still: main calls this before the runtime starts.
            std::env::set_var(&env, value);
            from_file.push(env);
        }
    }
    let _ = FROM_FILE.set(from_file);
    Ok(())
}

/// (environment variable, value) for each key of the TOML `text`.
fn file_settings(text: &str, arguments: &[&clap::Arg]) -> Result<Vec<(String, String)>, String> {
    let table: toml::Table = text.parse().map_err(|e| format!("not valid TOML: {e}"))?;
    let mut settings = Vec::new();
    for (key, value) in table {
        let long = key.replace('_', "-");
        let Some(arg) = arguments.iter().find(|a| a.get_long() == Some(long.as_str())) else {
            return Err(format!(
                "unknown setting {key:?} (the keys are the long names of `querylayer serve`'s flags)"
            ));
        };
        let Some(env) = arg.get_env() else {
            return Err(format!("{key:?} cannot be set in the configuration file"));
        };
        let value = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    toml::Value::String(s) => Ok(s),
                    other => Err(format!("{key:?}: a list of strings, not {other}")),
                })
                .collect::<Result<Vec<_>, _>>()?
                .join(","),
            other => return Err(format!("{key:?}: not a string, number, boolean or list ({other})")),
        };
        settings.push((env.to_string_lossy().into_owned(), value));
    }
    Ok(settings)
}

/// The effective configuration of `serve` as TOML (a file `--config` accepts), each value with
/// its source (flag, env, file, default), secrets masked.
pub fn effective_config(
    args: &ServeArgs,
    log_format: LogFormat,
    matches: &clap::ArgMatches,
    command: &clap::Command,
) -> String {
    let serve = command.find_subcommand("serve").expect("the serve command");
    let values = serde_json::to_value(args).expect("the arguments serialize");
    let from_file = FROM_FILE.get().cloned().unwrap_or_default();
    let mut out =
        String::from("# querylayer serve: the effective configuration (flag > env > file > default)\n");
    let mut line = |key: &str, value: &serde_json::Value, source: String| {
        let key = key.replace('-', "_");
        let shown = match value {
            serde_json::Value::Null => format!("# {key} = (not set)"),
            serde_json::Value::String(s) => format!("{key} = {}", toml::Value::String(mask_secrets(s))),
            serde_json::Value::Array(items) => format!(
                "{key} = [{}]",
                items
                    .iter()
                    .map(|i| toml::Value::String(i.as_str().unwrap_or("").to_string()).to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            other => format!("{key} = {other}"),
        };
        out.push_str(&format!("{shown:<60} # {source}\n"));
    };
    let source_of = |id: &str, env: Option<&std::ffi::OsStr>, matches: &clap::ArgMatches| -> String {
        match matches.value_source(id) {
            Some(clap::parser::ValueSource::CommandLine) => "flag".into(),
            Some(clap::parser::ValueSource::EnvVariable) => {
                let env = env.map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
                if from_file.contains(&env) {
                    "file".into()
                } else {
                    format!("env {env}")
                }
            }
            Some(clap::parser::ValueSource::DefaultValue) => "default".into(),
            _ => "unset".into(),
        }
    };
    let global = command.get_arguments().find(|a| a.get_id() == "log_format");
    let top = matches;
    if let Some(arg) = global {
        let source = source_of("log_format", arg.get_env(), top);
        line("log_format", &serde_json::to_value(log_format).expect("JSON"), source);
    }
    let serve_matches = matches.subcommand_matches("serve").unwrap_or(matches);
    for arg in serve.get_arguments() {
        let id = arg.get_id().as_str();
        if matches!(id, "config" | "print_config" | "help") {
            continue;
        }
        let value = values.get(id).cloned().unwrap_or(serde_json::Value::Null);
        line(id, &value, source_of(id, arg.get_env(), serve_matches));
    }
    out
}

/// A connection string or URL with its password replaced by `****` (`user:****@`,
/// `password=****`).
pub fn mask_secrets(value: &str) -> String {
    let mut out = value.to_string();
    if let Some(scheme_end) = out.find("://") {
        let authority_end =
            out[scheme_end + 3..].find(['/', '?', '#']).map(|i| i + scheme_end + 3).unwrap_or(out.len());
        if let Some(at) = out[..authority_end].rfind('@') {
            if let Some(colon) = out[scheme_end + 3..at].find(':') {
                out.replace_range(scheme_end + 3 + colon + 1..at, "****");
            }
        }
    }
    // key/value strings and URL query parameters
    let mut masked = String::new();
    let mut rest = out.as_str();
    while let Some(i) = rest.find("password") {
        let after = &rest[i + "password".len()..];
        let trimmed = after.trim_start();
        if let Some(value) = trimmed.strip_prefix('=') {
            let value = value.trim_start();
            let end = if let Some(quoted) = value.strip_prefix('\'') {
                quoted.find('\'').map(|j| j + 2).unwrap_or(value.len())
            } else {
                value.find(|c: char| c.is_whitespace() || c == '&').unwrap_or(value.len())
            };
            masked.push_str(&rest[..i]);
            masked.push_str("password=****");
            rest = &value[end..];
        } else {
            masked.push_str(&rest[..i + "password".len()]);
            rest = after;
        }
    }
    masked.push_str(rest);
    masked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_in_urls_and_key_values() {
        assert_eq!(
            mask_secrets("postgres://edge:s3cret@db:5432/ql?sslmode=require"),
            "postgres://edge:****@db:5432/ql?sslmode=require"
        );
        assert_eq!(
            mask_secrets("host=db user=edge password='a b' dbname=ql"),
            "host=db user=edge password=**** dbname=ql"
        );
        assert_eq!(
            mask_secrets("postgres://db/ql?password=x&user=y"),
            "postgres://db/ql?password=****&user=y"
        );
        assert_eq!(mask_secrets("http://127.0.0.1:4318"), "http://127.0.0.1:4318");
    }

    #[test]
    fn file_keys_map_to_their_flags_environment_variables() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let command = <Cli as clap::CommandFactory>::command();
        let arguments: Vec<&clap::Arg> = command.get_arguments().collect();
        let settings = file_settings(
            "port = 9000\nallowed_host = [\"a.example\", \"b.example\"]\nrequire-auth = true\nrate_limit = 2.5\n",
            &arguments,
        )
        .unwrap();
        assert_eq!(
            settings,
            [
                ("QUERYLAYER_ALLOWED_HOSTS".to_string(), "a.example,b.example".to_string()),
                ("QUERYLAYER_PORT".into(), "9000".into()),
                ("QUERYLAYER_RATE_LIMIT".into(), "2.5".into()),
                ("QUERYLAYER_REQUIRE_AUTH".into(), "true".into()),
            ]
        );
        assert!(file_settings("prot = 1", &arguments).unwrap_err().contains("unknown setting"));
        assert!(file_settings("print_config = true", &arguments).unwrap_err().contains("cannot be set"));
        assert!(file_settings("port = ", &arguments).unwrap_err().contains("not valid TOML"));
    }

    fn list(extra_hosts: &[&str], extra_origins: &[&str]) -> AllowList {
        let mut hosts: Vec<String> = DEFAULT_HOSTS.iter().map(|s| s.to_string()).collect();
        hosts.extend(extra_hosts.iter().map(|s| s.to_string()));
        let mut origins: Vec<String> = DEFAULT_ORIGINS.iter().map(|s| s.to_string()).collect();
        origins.extend(extra_origins.iter().map(|s| s.to_string()));
        AllowList::new(&hosts, &origins).unwrap()
    }

    #[test]
    fn loopback_hosts_are_allowed_on_any_port_and_others_are_not() {
        let allow = list(&[], &[]);
        for ok in ["localhost", "localhost:8080", "127.0.0.1:1", "[::1]:8080", "LOCALHOST:3000"] {
            assert!(allow.host_allowed(ok), "{ok}");
        }
        for bad in ["evil.example.com", "evil.example.com:8080", "127.0.0.2", "localhost.evil.com", ""] {
            assert!(!allow.host_allowed(bad), "{bad}");
        }
    }

    #[test]
    fn extra_hosts_may_pin_a_port() {
        let allow = list(&["edge.example.com:443", "api.example.com"], &[]);
        assert!(allow.host_allowed("edge.example.com:443"));
        assert!(!allow.host_allowed("edge.example.com:8443"));
        assert!(allow.host_allowed("api.example.com:1234"));
    }

    #[test]
    fn origins_match_scheme_host_and_port() {
        let allow = list(&[], &["https://console.example.com"]);
        for ok in [
            "http://localhost:5173",
            "http://127.0.0.1:8080",
            "https://console.example.com",
            "https://console.example.com:443",
        ] {
            assert!(allow.origin_allowed(ok), "{ok}");
        }
        for bad in [
            "http://evil.example.com",
            "http://console.example.com",
            "https://console.example.com:8443",
            "null",
            "http://localhost.evil.com:80",
            "garbage",
        ] {
            assert!(!allow.origin_allowed(bad), "{bad}");
        }
    }
}

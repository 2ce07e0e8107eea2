//! The `querylayer` command: the edge service (`serve`), the same tools over stdio
//! (`mcp-serve`), the operator tools (`admin`), verifiable history (`ledger`), the background
//! worker (`worker`), and the offline commands (`agent-card`, `tool-schemas`, `envelope`,
//! `completion`).

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use rmcp::ServiceExt;

use querylayer_edge::admin::{self, AdminArgs};
use querylayer_edge::commands;
use querylayer_edge::compat;
use querylayer_edge::config::{self, HttpConfig, LogFormat, ServeArgs};
use querylayer_edge::db::Db;
use querylayer_edge::db::Fingerprint;
use querylayer_edge::error::Code;
use querylayer_edge::ledger::{self, LedgerArgs};
use querylayer_edge::mcp::{self, QueryLayerMcp};
use querylayer_edge::telemetry::init_logging;
use querylayer_edge::worker::{self, WorkerArgs};
use querylayer_edge::{app, listener, shutdown_signal, AppState};

/// mimalloc rather than the system allocator: a request allocates and frees many small buffers
/// (headers, JSON values, futures), and glibc's malloc spent a fifth of a tool call's CPU on them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "querylayer",
    version,
    about = "QueryLayer: the governed plane between AI agents and a site's content"
)]
struct Cli {
    /// Log format (logs go to stderr).
    #[arg(long, global = true, value_enum, env = "QUERYLAYER_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve MCP (Streamable HTTP at /mcp) and the console API.
    Serve(ServeArgs),
    /// Serve the same MCP tools over stdio, as the connection whose secret is in QUERYLAYER_TOKEN.
    McpServe(McpServeArgs),
    /// Operator commands against an operator login.
    Admin(AdminArgs),
    /// Verifiable history: signed checkpoints to witnesses, the offline verifier, inclusion proofs, exports.
    Ledger(LedgerArgs),
    /// Background jobs (runs past their deadline, tasks whose binding went, evidence
    /// re-verification, retention, the form screening purge, ledger checkpoints), as a
    /// querylayer_worker login.
    Worker(WorkerArgs),
    /// Print the A2A agent card (the one served at /.well-known/agent-card.json).
    AgentCard(commands::AgentCardArgs),
    /// Print every MCP tool as a function-calling schema (OpenAI or Anthropic flavor).
    ToolSchemas(commands::ToolSchemasArgs),
    /// Mint or verify `x-qg-envelope` headers.
    #[command(subcommand)]
    Envelope(commands::EnvelopeCommand),
    /// Print the tool registry and the scope catalogue as JSON (read by the test tiers).
    #[command(hide = true)]
    Tools,
    /// Print which command reaches each operator function of docs/api.md, as JSON (read by the
    /// test tiers).
    #[command(hide = true)]
    OperatorCommands,
    /// Print a shell completion script: `querylayer completion bash > /etc/bash_completion.d/querylayer`,
    /// `querylayer completion zsh > "${fpath[1]}/_querylayer"`,
    /// `querylayer completion fish > ~/.config/fish/completions/querylayer.fish`.
    Completion {
        /// The shell: bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Args, Debug)]
struct McpServeArgs {
    /// PostgreSQL connection string for the querylayer_edge login.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
}

fn main() -> ExitCode {
    quiet_on_broken_pipe();
    // The configuration file sits under the flags and the environment (config.rs).
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Err(e) = config::apply_config_file(&Cli::command(), &argv) {
        eprintln!("querylayer serve: {e}");
        return ExitCode::from(2);
    }
    let parsed =
        Cli::command().try_get_matches_from(&argv).and_then(|m| Cli::from_arg_matches(&m).map(|c| (c, m)));
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            // `querylayer admin … --json` promises JSON: a usage error is JSON too (on stderr).
            let args: Vec<String> = std::env::args().skip(1).collect();
            let asked = args.iter().any(|a| a == "--json") && args.iter().any(|a| a == "admin");
            let shown = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
            if asked && !shown {
                let text = e.render().to_string();
                let message = text.trim().trim_start_matches("error: ");
                admin::report_error(true, "usage", message, None, false);
                return ExitCode::from(2);
            }
            e.exit()
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Admin(args) => admin::run(args).await,
            Command::Ledger(args) => ledger::run(args).await,
            Command::Worker(args) => {
                init_logging(cli.log_format);
                worker::run(args).await
            }
            Command::AgentCard(args) => match commands::agent_card(args).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("querylayer agent-card: {e}");
                    1
                }
            },
            Command::ToolSchemas(args) => {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&commands::tool_schemas(args.flavor)).expect("JSON")
                );
                0
            }
            Command::Tools => {
                println!("{}", serde_json::to_string_pretty(&mcp::registry::to_json()).expect("JSON"));
                0
            }
            Command::OperatorCommands => {
                println!("{}", serde_json::to_string_pretty(&admin::operator_commands_json()).expect("JSON"));
                0
            }
            Command::Completion { shell } => {
                clap_complete::generate(shell, &mut Cli::command(), "querylayer", &mut std::io::stdout());
                0
            }
            Command::Envelope(command) => match commands::envelope(command) {
                Ok(true) => 0,
                Ok(false) => 1,
                Err(e) => {
                    eprintln!("querylayer envelope: {e}");
                    2
                }
            },
            Command::Serve(args) if args.print_config => {
                print!("{}", config::effective_config(&args, cli.log_format, &matches, &Cli::command()));
                0
            }
            Command::Serve(args) => {
                querylayer_edge::telemetry::init(cli.log_format, args.otlp_endpoint.as_deref());
                match serve(args).await {
                    Ok(()) => 0,
                    Err(e) => {
                        tracing::error!("{e}");
                        1
                    }
                }
            }
            Command::McpServe(args) => {
                init_logging(cli.log_format);
                match mcp_serve(args).await {
                    Ok(()) => 0,
                    Err(e) => {
                        tracing::error!("{e}");
                        1
                    }
                }
            }
        }
    });
    querylayer_edge::telemetry::flush_logs();
    ExitCode::from(code as u8)
}

/// Output cut short by its reader (`querylayer completion bash | head -1`, `… | less` quit early)
/// ends the command quietly, with status 0, as for any filter: Rust ignores SIGPIPE, so a write
/// to a closed pipe fails, and `print!` (or a completion generator) panics on it. Any other panic
/// is reported as before.
fn quiet_on_broken_pipe() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        let writing = message.starts_with("failed printing to std") || message.starts_with("failed to write");
        if writing && (message.contains("Broken pipe") || message.contains("BrokenPipe")) {
            std::process::exit(0);
        }
        querylayer_edge::telemetry::flush_logs();
        report(info);
    }));
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    let config = HttpConfig::from_args(&args)?;
    let public_url = config.public_url.clone();
    let db =
        Db::connect(&args.database_url, args.db_pool_size, Duration::from_secs(args.statement_timeout_secs))?;
    compat::require(&db).await?;
    let ip: IpAddr = args.bind.parse().map_err(|e| format!("--bind {}: {e}", args.bind))?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, args.port))
        .await
        .map_err(|e| format!("cannot listen on {}:{}: {e}", args.bind, args.port))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(%address, %public_url, "querylayer edge listening; MCP at /mcp");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: finishing in-flight requests");
        let _ = stop_tx.send(true);
    });
    let limits = config.listener.clone();
    if let Some(address) = &args.metrics_listen {
        let bound = {
            let db = db.clone();
            let pool: querylayer_edge::metrics::PoolStatus = std::sync::Arc::new(move || db.pool_status());
            querylayer_edge::metrics::serve(address, pool, stop_rx.clone()).await?
        };
        tracing::info!(address = %bound, "metrics at /metrics");
    }
    let mut state = AppState::new(db.clone(), config)?;
    if let Some(url) = &args.read_database_url {
        let standby = Db::connect(url, args.db_pool_size, Duration::from_secs(args.statement_timeout_secs))?;
        let replica = querylayer_edge::replica::Replica::new(
            standby.with_limits(state.db.limits()),
            Duration::from_millis(args.replica_max_staleness_ms),
        );
        replica.spawn_sampler(state.db.clone(), stop_rx.clone());
        tracing::info!(
            max_staleness_ms = args.replica_max_staleness_ms,
            "read tools served by the standby when it is fresh enough"
        );
        state = state.with_replica(replica);
    }
    let (reads, writes) = state.sites.budgets();
    tracing::info!(
        pool = args.db_pool_size,
        site_reads = reads,
        site_writes = writes,
        "each site's share of the pool"
    );
    let server = listener::serve(listener, app(state), limits, stop_rx.clone());
    let mut deadline = stop_rx;
    let grace = Duration::from_secs(args.shutdown_grace_secs);
    tokio::select! {
        result = server => result.map_err(|e| format!("server error: {e}"))?,
        _ = async move {
            let _ = deadline.wait_for(|stop| *stop).await;
            tokio::time::sleep(grace).await;
        } => tracing::warn!("the shutdown grace period ended with requests still in flight"),
    }
    tracing::info!("stopped");
    Ok(())
}

async fn mcp_serve(args: McpServeArgs) -> Result<(), String> {
    let (db, secret) = match mcp_serve_start(args).await {
        Ok(started) => started,
        Err(e) => {
            refuse_over_stdio(&e).await;
            return Err(e);
        }
    };
    let server = QueryLayerMcp::for_stdio(db, &secret);
    drop(secret);
    let running = server.serve(rmcp::transport::stdio()).await.map_err(|e| format!("stdio: {e}"))?;
    running.waiting().await.map_err(|e| format!("stdio: {e}"))?;
    Ok(())
}

/// What `mcp-serve` checks before it serves: the secret, the database and its version, and that
/// the secret is live (every call authenticates again anyway).
async fn mcp_serve_start(args: McpServeArgs) -> Result<(Db, String), String> {
    let secret = std::env::var("QUERYLAYER_TOKEN")
        .map_err(|_| "set QUERYLAYER_TOKEN to the connection secret".to_string())?;
    let secret = secret.trim().to_string();
    let db = Db::connect(&args.database_url, 2, Duration::from_secs(20))?;
    compat::require(&db).await?;
    let fingerprint = Fingerprint::of(&secret);
    if let Err(e) = db.authenticate(&fingerprint).await {
        if e.code == Code::Unauthenticated {
            db.record_failed_authentication(&fingerprint, "stdio").await;
            return Err(format!("QUERYLAYER_TOKEN: {}", e.message));
        }
        // Not the secret's fault: say what failed (TLS, authentication, refused, unreachable).
        return Err(e.with_cause());
    }
    Ok((db, secret))
}

/// A start-up failure of `mcp-serve`, told to the MCP client rather than only to the log: the
/// first request it sends (`initialize`) is answered with a JSON-RPC error whose message is the
/// reason, which clients show (instead of "connection closed"). Waits at most 30 s for it.
async fn refuse_over_stdio(reason: &str) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let answer = async {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(request) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
            // Notifications (no id) get no answer.
            let Some(id) = request.get("id").filter(|id| !id.is_null()) else { continue };
            let reply = serde_json::json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": {"code": -32000, "message": format!("querylayer mcp-serve could not start: {reason}")},
            });
            let mut stdout = tokio::io::stdout();
            let _ = stdout.write_all(format!("{reply}\n").as_bytes()).await;
            let _ = stdout.flush().await;
            return;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), answer).await;
}

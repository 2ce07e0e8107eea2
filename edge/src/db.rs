//! The one SQL call: a connection pool, a `Call` naming one `querylayer_api` function with
//! named arguments, the fingerprint of a presented secret (all the edge hands the database of
//! it), and the statements and transactions the edge wraps around a call. An agent's tool call
//! is one statement: authenticate, the call, the audit row (`Db::tool_call`). Nothing here
//! decides anything; the database does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::GenericClient;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, StatementCache};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio_postgres::types::ToSql;
use tokio_postgres::Statement;
use uuid::Uuid;

use crate::error::{Code, Error};

/// The SHA-256 of a presented secret: all the edge ever hands to the database. Its `Debug`
/// prints nothing of it, so it cannot reach a log line by accident.
#[derive(Clone)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn of(secret: &str) -> Self {
        Fingerprint(Sha256::digest(secret.as_bytes()).into())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fingerprint(..)")
    }
}

/// The database round trips of one request: every statement sent, a statement prepared on a
/// pooled connection for the first time included. The edge logs it with each tool call
/// (`db_round_trips`); the edge tier asserts it (docs/performance.md).
#[derive(Clone, Debug, Default)]
pub struct RoundTrips(Arc<AtomicU32>);

impl RoundTrips {
    pub fn count(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }

    fn add(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

type Param = Box<dyn ToSql + Sync + Send>;

/// One call of one `querylayer_api` function, with named arguments (`p_run_type => $1`).
/// Arguments left out take the function's own SQL defaults, so defaults live in one place.
pub struct Call {
    function: &'static str,
    args: Vec<(&'static str, String, Param)>,
    returns_rows: bool,
    idempotency_key: Option<String>,
}

impl Call {
    pub fn new(function: &'static str) -> Self {
        Call { function, args: Vec::new(), returns_rows: false, idempotency_key: None }
    }

    /// A function declared `RETURNS TABLE`: its rows are aggregated into one JSON array.
    pub fn rows(function: &'static str) -> Self {
        Call { function, args: Vec::new(), returns_rows: true, idempotency_key: None }
    }

    /// The caller's idempotency key, when it sent one (a write tool's `idempotency_key`).
    pub fn idempotent(mut self, key: Option<String>) -> Self {
        self.idempotency_key = key;
        self
    }

    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }

    pub fn arg<T: ToSql + Sync + Send + 'static>(self, name: &'static str, value: T) -> Self {
        self.arg_as(name, "{}", value)
    }

    /// An argument passed through an SQL expression in which `{}` stands for the parameter,
    /// for example `now() + {}::text::interval`.
    pub fn arg_as<T: ToSql + Sync + Send + 'static>(
        mut self,
        name: &'static str,
        expr: &str,
        value: T,
    ) -> Self {
        self.args.push((name, expr.to_string(), Box::new(value)));
        self
    }

    /// An optional argument: left out (so the SQL default applies) when `None`.
    pub fn opt<T: ToSql + Sync + Send + 'static>(self, name: &'static str, value: Option<T>) -> Self {
        match value {
            Some(v) => self.arg(name, v),
            None => self,
        }
    }

    pub fn function(&self) -> &'static str {
        self.function
    }

    /// The function call with its arguments numbered from `$first`.
    fn invocation(&self, first: usize) -> String {
        let args: Vec<String> = self
            .args
            .iter()
            .enumerate()
            .map(|(i, (name, expr, _))| {
                format!("{name} => {}", expr.replace("{}", &format!("${}", i + first)))
            })
            .collect();
        format!("querylayer_api.{}({})", self.function, args.join(", "))
    }

    pub fn sql(&self) -> String {
        let call = self.invocation(1);
        if self.returns_rows {
            format!("SELECT coalesce(jsonb_agg(to_jsonb(r)), '[]'::jsonb) FROM {call} AS r")
        } else {
            format!("SELECT to_jsonb({call})")
        }
    }

    /// The one statement of an agent's tool call (sql/050_audit.sql): `open_tool_call`
    /// authenticates, takes a token of the connection's rate ($6, $7) and claims the key ($1 to
    /// $4), the function runs as the connection unless the key holds a stored answer,
    /// `finish_tool_call` stores the answer and writes the audit row ($5: the edge's
    /// milliseconds before the database). Its row: whether the answer is the stored one, and
    /// the answer. The call's arguments follow.
    pub fn tool_call_sql(&self) -> String {
        let call = self.invocation(8);
        let value = if self.returns_rows {
            format!(
                "(SELECT coalesce(jsonb_agg(to_jsonb(r)), '[]'::jsonb) FROM {call} AS r WHERE o IS NOT NULL)"
            )
        } else {
            format!("to_jsonb({call})")
        };
        format!(
            "SELECT o ? 'replay', querylayer_api.finish_tool_call(o, CASE WHEN o ? 'replay' THEN o->'replay' ELSE {value} END, $5) \
             FROM querylayer_api.open_tool_call($1, $2, $3, $4, $6, $7) AS o"
        )
    }

    /// The call on a standby (edge/src/replica.rs): `open_replica_read` checks the standby's
    /// replay against the floor and authenticates ($1 to $3), then the call runs. Its
    /// arguments follow.
    pub fn replica_sql(&self) -> String {
        let call = self.invocation(4);
        let value = if self.returns_rows {
            format!("(SELECT coalesce(jsonb_agg(to_jsonb(r)), '[]'::jsonb) FROM {call} AS r WHERE o)")
        } else {
            format!("to_jsonb({call})")
        };
        format!("SELECT CASE WHEN o THEN {value} END FROM querylayer_api.open_replica_read($1, $2, $3::text::pg_lsn) AS o")
    }

    /// The one statement of a console request of a member token the edge has seen
    /// (edge/src/console.rs), its own transaction: `authenticate_member` ($1 the token's
    /// fingerprint) holds the member's context, then the call. The call's arguments follow.
    pub fn member_sql(&self) -> String {
        format!("SELECT to_jsonb({}) FROM querylayer_api.authenticate_member($1) AS a", self.invocation(2))
    }

    /// The one statement of a delivery request (edge/src/delivery.rs), its own transaction, made
    /// read-only before anything else runs: `set_config` in the argument list (evaluated before
    /// the call) does what `SET TRANSACTION READ ONLY` does, and once the transaction has run a
    /// query nothing can make it read-write again. Then `authenticate_delivery` ($1 the site, $2
    /// the token's fingerprint or none) holds the delivery context, then the call. Its row: what
    /// the authentication said, the answer without its validators, and the validators (`etag`,
    /// `last_modified`, for the headers), so that the answer's text is passed on unread. (`OFFSET
    /// 0` keeps the inner query whole: the call runs once, after the authentication.) The call's
    /// arguments follow.
    pub fn delivery_sql(&self) -> String {
        format!(
            "SELECT a, v - 'etag' - 'last_modified', v->>'etag', v->>'last_modified' \
             FROM (SELECT a, to_jsonb({}) AS v FROM querylayer_api.authenticate_delivery($1, \
             CASE WHEN pg_catalog.set_config('transaction_read_only', 'on', true) = 'on' THEN $2::bytea END) AS a \
             OFFSET 0) AS s",
            self.invocation(3)
        )
    }

    /// The one statement of a governed `/v1` request (edge/src/v1.rs), its own transaction:
    /// `authenticate_envelope` ($1 the header, $2 the method, $3 the exact path, $4 the SHA-256
    /// of the exact body) decides and records the receipt and, when it allows, holds the bound
    /// connection's context; then a token of that connection's rate ($5, $6), then the call.
    /// The rate and the call run only for an allowed receipt (a `CASE` evaluates its conditions
    /// in order, and the token's subquery only when reached). Its row: the receipt, and the
    /// answer (none when refused). The call's arguments follow.
    pub fn envelope_sql(&self) -> String {
        debug_assert!(!self.returns_rows, "a /v1 route's call returns one value");
        format!(
            "SELECT a, CASE WHEN (a->>'allowed')::boolean IS NOT TRUE THEN NULL \
             WHEN (SELECT true FROM querylayer_api.take_connection_token($5, $6)) THEN to_jsonb({}) END \
             FROM querylayer_api.authenticate_envelope($1, $2, $3, $4) AS a",
            self.invocation(7)
        )
    }

    fn params(&self) -> impl Iterator<Item = &(dyn ToSql + Sync)> {
        self.args.iter().map(|(_, _, p)| p.as_ref() as &(dyn ToSql + Sync))
    }

    /// Runs the call in `client`'s transaction (or as a statement of its own).
    pub async fn run(&self, client: &impl GenericClient) -> Result<Value, Error> {
        use tracing::Instrument;
        async {
            let statement = client.prepare_cached(&self.sql()).await?;
            let params: Vec<_> = self.params().collect();
            let row = client.query_one(&statement, &params).await?;
            Ok(row.get::<_, Option<Value>>(0).unwrap_or(Value::Null))
        }
        .instrument(crate::telemetry::db_span(self.function))
        .await
    }
}

/// What `querylayer_api.authenticate` says about a live connection. Identifiers only; the
/// edge uses the scopes to list tools and the connection id to key its rate limit.
#[derive(Clone, Debug, Deserialize)]
pub struct ConnectionContext {
    pub connection_id: Uuid,
    pub site: String,
    pub agent: String,
    pub scopes: Vec<String>,
    /// What the connection says it is run by; `oauth` for a connection a member's OAuth consent
    /// issued (sql/190_oauth.sql), whose client can ask the member for more scopes.
    #[serde(default)]
    pub harness: Option<String>,
}

impl ConnectionContext {
    /// Issued through OAuth: its client re-authorizes when told which scope it lacks.
    pub fn via_oauth(&self) -> bool {
        self.harness.as_deref() == Some("oauth")
    }
}

/// What `querylayer_api.authenticate_member` says about a live member token.
#[derive(Clone, Debug, Deserialize)]
pub struct MemberContext {
    pub member_token_id: Uuid,
    pub site: String,
    pub member: String,
    pub role: String,
}

/// One agent tool call: the credential, the tool (its one name: what `tools/call` dispatched
/// on, and what the audit row records), when the edge got the request, and a write's
/// idempotency key with the SHA-256 of its arguments.
pub struct ToolCall {
    pub fingerprint: Fingerprint,
    pub tool: &'static str,
    pub started: Instant,
    pub idempotency: Option<(String, [u8; 32])>,
    /// The connection, when the edge knows it (a refusal of its rate is then remembered).
    pub connection_id: Option<Uuid>,
    /// The call takes its request's token of the connection's rate; false when the request
    /// took it already (the middleware authenticated it).
    pub takes_token: bool,
}

impl ToolCall {
    fn elapsed_ms(&self) -> i32 {
        i32::try_from(self.started.elapsed().as_millis()).unwrap_or(i32::MAX)
    }

    fn key(&self) -> (Option<&str>, Option<&[u8]>) {
        match &self.idempotency {
            Some((key, sha256)) => (Some(key.as_str()), Some(sha256.as_slice())),
            None => (None, None),
        }
    }
}

/// A write made safe to retry: the caller's key, what it does (a console route) and the
/// SHA-256 of its arguments (sql/155_idempotency.sql).
#[derive(Clone, Debug)]
pub struct Idempotency {
    pub key: String,
    pub action: String,
    pub request_sha256: [u8; 32],
}

/// Whether an answer is new or the stored answer of an earlier call under the same key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answered {
    Now,
    Before,
}

const CLAIM_KEY: &str = "SELECT querylayer_api.claim_idempotency_key($1, $2, $3)";
const STORE_RESPONSE: &str = "SELECT querylayer_api.store_idempotent_response($1, $2)";

const AUTHENTICATE: &str = "SELECT querylayer_api.authenticate($1)";
const AUTHENTICATE_EDGE: &str = "SELECT querylayer_api.authenticate_edge($1, $2, $3, $4, $5, $6)";
const SPEND_PEER_FAILURE: &str = "SELECT querylayer_api.spend_peer_failure($1, $2, $3)";
const AUTHENTICATE_MEMBER: &str = "SELECT querylayer_api.authenticate_member($1)";
const AUTHENTICATE_ENVELOPE: &str = "SELECT querylayer_api.authenticate_envelope($1, $2, $3, $4)";
const TAKE_CONNECTION_TOKEN: &str = "SELECT querylayer_api.take_connection_token($1, $2)";
const OPEN_TOOL_CALL: &str = "SELECT querylayer_api.open_tool_call($1, $2, $3, $4, $5, $6)";
const FINISH_TOOL_CALL: &str = "SELECT $1::jsonb ? 'replay', querylayer_api.finish_tool_call($1, $2, $3)";
const RECORD_REFUSED_TOOL_CALL: &str = "SELECT querylayer_api.record_refused_tool_call($1, $2, $3, $4)";
const RECORD_REPLICA_READ: &str = "SELECT querylayer_api.record_replica_read($1, $2, $3, $4, $5)";

/// A delivery request's answer (`Db::deliver`).
pub struct Delivered {
    /// The JSON text of the answer, without its validators.
    pub body: String,
    /// The answer's validators, for the `ETag` and `Last-Modified` headers.
    pub etag: Option<String>,
    pub last_modified: Option<String>,
}

/// What became of a read sent to the standby (`Db::replica_read`).
pub enum FromStandby {
    /// Answered there and audited here.
    Served(JsonText),
    /// The standby could not serve it (the primary does); `unreachable`: it could not be reached.
    Unserved { unreachable: bool },
}

/// How long a connection this edge saw authenticate counts as recently authenticated: the
/// `/mcp` middleware then admits its tool calls without a round trip of its own (each call
/// authenticates in its statement anyway). Discovery always authenticates.
const RECENT_FOR: Duration = Duration::from_secs(30);
/// Entries kept before the recent-credential cache starts over.
const RECENT_KEPT: usize = 50_000;

#[derive(Clone)]
pub struct Db {
    pool: Pool,
    /// Connections this edge authenticated lately (fingerprint → when, and their context).
    recent: Arc<Mutex<HashMap<[u8; 32], (Instant, Arc<ConnectionContext>)>>>,
    /// The request's round-trip count, in a `Db` made by `counting`.
    trips: Option<RoundTrips>,
    /// The limits the database decides for every edge, with this edge's rates.
    limits: crate::rate::SharedLimits,
    /// The database's refusals of connections' rates, until they end.
    holds: Arc<crate::rate::Holds<Uuid>>,
}

impl Db {
    /// A pool of connections to `url` (a libpq URL or key/value string). The password inside
    /// it is never logged.
    pub fn connect(url: &str, max_size: usize, statement_timeout: Duration) -> Result<Db, String> {
        let crate::pgtls::PgConnect { mut config, tls, .. } = crate::pgtls::parse(url)?;
        if config.get_application_name().is_none() {
            config.application_name("querylayer-edge");
        }
        let options = config.get_options().unwrap_or("").to_string();
        config.options(format!("{options} -c statement_timeout={}", statement_timeout.as_millis()).trim());
        config.connect_timeout(Duration::from_secs(5));
        let manager =
            Manager::from_config(config, tls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(max_size)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(5)))
            .recycle_timeout(Some(Duration::from_secs(5)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| format!("cannot build the connection pool: {e}"))?;
        Ok(Db {
            pool,
            recent: Arc::default(),
            trips: None,
            limits: crate::rate::SharedLimits::default(),
            holds: Arc::default(),
        })
    }

    /// The same pool, passing `limits` to the database (`serve`; other commands have none).
    pub fn with_limits(mut self, limits: crate::rate::SharedLimits) -> Db {
        self.limits = limits;
        self
    }

    pub fn limits(&self) -> crate::rate::SharedLimits {
        self.limits
    }

    /// The seconds left of the database's refusal of `connection`'s rate, if one holds.
    pub fn connection_held(&self, connection: &Uuid) -> Option<u64> {
        self.holds.held(connection)
    }

    fn remember_refusal(&self, connection: Option<Uuid>, error: &Error) {
        if let (Some(id), Some("connection"), Some(secs)) =
            (connection, error.rate_of(), error.retry_after_secs())
        {
            self.holds.hold(id, secs);
        }
    }

    /// The same pool, counting every round trip it makes into `trips` (one request's).
    pub fn counting(&self, trips: &RoundTrips) -> Db {
        Db { trips: Some(trips.clone()), ..self.clone() }
    }

    fn trip(&self) {
        if let Some(trips) = &self.trips {
            trips.add();
        }
    }

    /// The prepared `statement` of `call` on `client`, with `params` ahead of the call's own
    /// arguments: one round trip, traced as the call.
    async fn query_call<'a>(
        &self,
        client: &tokio_postgres::Client,
        statement: &Statement,
        mut params: Vec<&'a (dyn ToSql + Sync)>,
        call: &'a Call,
    ) -> Result<tokio_postgres::Row, Error> {
        use tracing::Instrument;
        params.extend(call.params());
        self.trip();
        Ok(client.query_one(statement, &params).instrument(crate::telemetry::db_span(call.function)).await?)
    }

    /// `sql` prepared on this connection (cached): a round trip the first time only.
    async fn prepare(
        &self,
        cache: &StatementCache,
        client: &impl GenericClient,
        sql: &str,
    ) -> Result<Statement, Error> {
        let before = cache.size();
        let statement = client.prepare_cached(sql).await?;
        if cache.size() != before {
            self.trip();
        }
        Ok(statement)
    }

    pub(crate) async fn client(&self) -> Result<Object, Error> {
        let started = std::time::Instant::now();
        let client = self.pool.get().await;
        crate::metrics::pool_wait(started.elapsed(), client.is_ok());
        Ok(client?)
    }

    /// The pool's size, open, idle and waiting counts (the metrics' gauges).
    pub fn pool_status(&self) -> deadpool_postgres::Status {
        self.pool.status()
    }

    /// The server's public key material (no context needed: it is public).
    pub async fn server_keys(&self) -> Result<Value, Error> {
        let client = self.client().await?;
        let row = client.query_one("SELECT querylayer_api.server_keys()", &[]).await?;
        Ok(row.get(0))
    }

    /// The version of the querylayer extension installed in the database (None: not installed).
    /// Any login may read pg_extension, and the query works whatever the installed version.
    pub async fn extension_version(&self) -> Result<Option<String>, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'querylayer'", &[])
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Is the database reachable (readiness)?
    pub async fn ping(&self) -> Result<(), Error> {
        let client = self.client().await?;
        client.simple_query("SELECT 1").await?;
        Ok(())
    }

    /// Resolves a connection secret's fingerprint in a transaction of its own (one statement):
    /// the context dies with it. Used by discovery, before any MCP server exists for the
    /// request. A live connection is remembered as recently authenticated, a dead one forgotten.
    pub async fn authenticate(&self, fingerprint: &Fingerprint) -> Result<ConnectionContext, Error> {
        let result = async {
            let client = self.client().await?;
            let statement = self.prepare(&client.statement_cache, &client, AUTHENTICATE).await?;
            self.trip();
            let row = client.query_one(&statement, &[&fingerprint.as_bytes()]).await?;
            parse::<ConnectionContext>(row.get(0))
        }
        .await;
        match &result {
            Ok(context) => self.remember(fingerprint, context),
            Err(e) if e.code == Code::Unauthenticated => self.forget(fingerprint),
            Err(_) => {}
        }
        result
    }

    /// As `authenticate`, for a credential presented to `/mcp` from `peer`, with the limits the
    /// database decides (`authenticate_edge`): refused (`rate_limited`) while the address's
    /// failed-authentication budget is spent, and a live connection takes its request's token.
    pub async fn authenticate_edge(
        &self,
        fingerprint: &Fingerprint,
        peer: Option<std::net::IpAddr>,
    ) -> Result<ConnectionContext, Error> {
        let l = self.limits;
        let peer = peer.map(|p| p.to_string());
        let result = async {
            let client = self.client().await?;
            let statement = self.prepare(&client.statement_cache, &client, AUTHENTICATE_EDGE).await?;
            self.trip();
            let row = client
                .query_one(
                    &statement,
                    &[&fingerprint.as_bytes(), &peer, &l.failure_rate, &l.failure_burst, &l.rate, &l.burst],
                )
                .await?;
            parse::<ConnectionContext>(row.get(0))
        }
        .await;
        match &result {
            Ok(context) => self.remember(fingerprint, context),
            Err(e) if e.code == Code::Unauthenticated => self.forget(fingerprint),
            Err(e) => {
                let known = self.recently_authenticated(fingerprint).map(|c| c.connection_id);
                self.remember_refusal(known, e)
            }
        }
        result
    }

    /// Spends one failure of `peer`'s failed-authentication budget (the one every edge shares):
    /// the seconds the address must now wait, if its budget is spent. Failing to record is
    /// logged, never shown.
    pub async fn spend_peer_failure(&self, peer: std::net::IpAddr) -> Option<u64> {
        let l = self.limits;
        let result = async {
            let client = self.client().await?;
            let statement = self.prepare(&client.statement_cache, &client, SPEND_PEER_FAILURE).await?;
            self.trip();
            let row =
                client.query_one(&statement, &[&peer.to_string(), &l.failure_rate, &l.failure_burst]).await?;
            Ok::<i32, Error>(row.get(0))
        }
        .await;
        match result {
            Ok(wait) if wait > 0 => Some(wait as u64),
            Ok(_) => None,
            Err(e) => {
                e.log("spending a failed-authentication budget");
                None
            }
        }
    }

    /// The context of a connection this edge authenticated within `RECENT_FOR`, if any. It
    /// admits a request to `/mcp`; it grants nothing (the database authenticates every call).
    pub fn recently_authenticated(&self, fingerprint: &Fingerprint) -> Option<Arc<ConnectionContext>> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.get(&fingerprint.0).filter(|(at, _)| at.elapsed() < RECENT_FOR).map(|(_, c)| c.clone())
    }

    fn remember(&self, fingerprint: &Fingerprint, context: &ConnectionContext) {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() >= RECENT_KEPT {
            recent.clear();
        }
        recent.insert(fingerprint.0, (Instant::now(), Arc::new(context.clone())));
    }

    fn forget(&self, fingerprint: &Fingerprint) {
        self.recent.lock().unwrap_or_else(|e| e.into_inner()).remove(&fingerprint.0);
    }

    /// Appends the audit record of a failed connection authentication, in a new transaction.
    /// Failing to record is logged, never shown to the caller.
    pub async fn record_failed_authentication(&self, fingerprint: &Fingerprint, channel: &str) {
        self.record_failure("record_failed_authentication", fingerprint, channel).await
    }

    pub async fn record_failed_member_authentication(&self, fingerprint: &Fingerprint, channel: &str) {
        self.record_failure("record_failed_member_authentication", fingerprint, channel).await
    }

    /// The same for a delivery token (the delivery API).
    pub async fn record_failed_delivery_authentication(&self, fingerprint: &Fingerprint) {
        self.record_failure("record_failed_delivery_authentication", fingerprint, "delivery").await
    }

    async fn record_failure(&self, function: &'static str, fingerprint: &Fingerprint, channel: &str) {
        let sql = format!("SELECT querylayer_api.{function}($1, $2)");
        let result = async {
            let client = self.client().await?;
            let statement = self.prepare(&client.statement_cache, &client, &sql).await?;
            self.trip();
            client.execute(&statement, &[&fingerprint.as_bytes(), &channel]).await?;
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = result {
            e.log("recording a failed authentication");
        }
    }

    /// An agent's tool call: one statement in autocommit, so one round trip once the
    /// connection has prepared it (`Call::tool_call_sql`: authenticate, claim the key, the call,
    /// store the answer, the audit row). A refusal rolls all of it back and is recorded by
    /// `record_refused_tool_call`. Returns the answer and whether it was stored earlier.
    pub async fn tool_call(&self, tool: &ToolCall, call: &Call) -> Result<(JsonText, Answered), Error> {
        let outcome = async {
            let client = self.client().await?;
            let statement = self.prepare(&client.statement_cache, &client, &call.tool_call_sql()).await?;
            let (key, sha256) = tool.key();
            let edge_ms = tool.elapsed_ms();
            let fingerprint = tool.fingerprint.as_bytes();
            let (rate, burst) = self.rate_of(tool);
            let params: Vec<&(dyn ToSql + Sync)> =
                vec![&fingerprint, &tool.tool, &key, &sha256, &edge_ms, &rate, &burst];
            let row = self.query_call(&client, &statement, params, call).await?;
            closed(&row)
        }
        .await;
        self.after_refusal(tool, &outcome).await;
        outcome
    }

    /// A delivery request: one statement in autocommit (`Call::delivery_sql`), so one round trip
    /// once the connection has prepared it. Returns what `authenticate_delivery` said, and the
    /// answer.
    pub async fn deliver(
        &self,
        site: &str,
        token: Option<&Fingerprint>,
        call: &Call,
    ) -> Result<(Value, Delivered), Error> {
        let client = self.client().await?;
        let statement = self.prepare(&client.statement_cache, &client, &call.delivery_sql()).await?;
        let fingerprint = token.map(Fingerprint::as_bytes);
        let params: Vec<&(dyn ToSql + Sync)> = vec![&site, &fingerprint];
        let row = self.query_call(&client, &statement, params, call).await?;
        let delivered = Delivered {
            body: row.try_get::<_, Option<JsonText>>(1)?.map_or_else(|| "null".into(), JsonText::into_string),
            etag: row.try_get(2)?,
            last_modified: row.try_get(3)?,
        };
        Ok((row.try_get(0)?, delivered))
    }

    /// A read tool on the standby `replica` when it has replayed to `floor` (edge/src/replica.rs),
    /// then its audit row on this, the primary, before the answer is given. `Unserved`: the
    /// standby cannot serve it (behind, read-only refusal of a write, unreachable): serve it here. A
    /// governed refusal on the standby is the call's refusal, recorded here as every refusal.
    pub async fn replica_read(
        &self,
        replica: &Db,
        tool: &ToolCall,
        call: &Call,
        floor: &str,
    ) -> Result<FromStandby, Error> {
        let read = async {
            let client = replica.client().await?;
            let statement = replica.prepare(&client.statement_cache, &client, &call.replica_sql()).await?;
            let fingerprint = tool.fingerprint.as_bytes();
            let params: Vec<&(dyn ToSql + Sync)> = vec![&fingerprint, &tool.tool, &floor];
            self.query_call(&client, &statement, params, call).await
        }
        .await;
        let row = match read {
            Ok(row) => row,
            Err(e) if e.cannot_serve_here() => {
                tracing::debug!(code = e.code.as_str(), error = %e.with_cause(), "the standby cannot serve the read; the primary does");
                return Ok(FromStandby::Unserved { unreachable: e.code == crate::error::Code::Unavailable });
            }
            Err(e) => {
                self.after_refusal(tool, &Err::<(), _>(Error::clone_of(&e))).await;
                return Err(e);
            }
        };
        let (rate, burst) = self.rate_of(tool);
        let recorded = async {
            let client = self.client().await?;
            let statement = self.prepare(&client.statement_cache, &client, RECORD_REPLICA_READ).await?;
            self.trip();
            client
                .execute(
                    &statement,
                    &[&tool.fingerprint.as_bytes(), &tool.tool, &tool.elapsed_ms(), &rate, &burst],
                )
                .await?;
            Ok::<(), Error>(())
        }
        .await;
        match recorded {
            Ok(()) => Ok(FromStandby::Served(row.try_get(0).map_err(unexpected_shape)?)),
            Err(e) => {
                self.after_refusal(tool, &Err::<(), _>(Error::clone_of(&e))).await;
                Err(e)
            }
        }
    }

    /// The rate a tool call passes to `open_tool_call`: none when its request took its token.
    fn rate_of(&self, tool: &ToolCall) -> (Option<f64>, Option<f64>) {
        match tool.takes_token {
            true => (Some(self.limits.rate), Some(self.limits.burst)),
            false => (None, None),
        }
    }

    /// The one audit rule for a refused call, except a rate limit: shedding load records nothing
    /// (recording would spend the work the limit saves); its refusal is remembered instead.
    async fn after_refusal<T>(&self, tool: &ToolCall, outcome: &Result<T, Error>) {
        match outcome {
            Err(error) if error.code == Code::RateLimited => self.remember_refusal(tool.connection_id, error),
            Err(error) => {
                self.record_refused_tool_call(tool, error.code.as_str()).await;
            }
            Ok(_) => {}
        }
    }

    /// A tool call whose work takes more than one governed call (an answer prepared in the
    /// database, written by the LLM, signed in the database): the same steps as `tool_call`
    /// in one transaction, `BEGIN; open_tool_call; steps; finish_tool_call; COMMIT`, and the
    /// same rule for a refusal.
    pub async fn tool_steps(
        &self,
        tool: &ToolCall,
        steps: impl AsyncFnOnce(&deadpool_postgres::Transaction<'_>) -> Result<Value, Error>,
    ) -> Result<(JsonText, Answered), Error> {
        let outcome = async {
            let mut client = self.client().await?;
            let edge_ms = tool.elapsed_ms();
            self.trip();
            let tx = client.transaction().await?;
            let open = self.prepare(&tx.statement_cache, &tx, OPEN_TOOL_CALL).await?;
            let (key, sha256) = tool.key();
            let (rate, burst) = self.rate_of(tool);
            self.trip();
            let opened: Value = tx
                .query_one(&open, &[&tool.fingerprint.as_bytes(), &tool.tool, &key, &sha256, &rate, &burst])
                .await?
                .get(0);
            let value = match opened.get("replay") {
                Some(stored) => stored.clone(),
                None => steps(&tx).await?,
            };
            let close = self.prepare(&tx.statement_cache, &tx, FINISH_TOOL_CALL).await?;
            self.trip();
            let row = tx.query_one(&close, &[&opened, &value, &edge_ms]).await?;
            self.trip();
            tx.commit().await?;
            closed(&row)
        }
        .await;
        self.after_refusal(tool, &outcome).await;
        outcome
    }

    /// The one audit rule for a refused tool call (`querylayer_api.record_refused_tool_call`),
    /// in a statement of its own: a live connection gets a `tool.call` row with outcome error
    /// and `code`; a dead credential the failed-authentication record instead. Returns true
    /// when the credential is dead. Failing to record is logged, never shown.
    pub async fn record_refused_tool_call(&self, tool: &ToolCall, code: &str) -> bool {
        let result = async {
            let client = self.client().await?;
            let statement = self.prepare(&client.statement_cache, &client, RECORD_REFUSED_TOOL_CALL).await?;
            self.trip();
            let row = client
                .query_one(&statement, &[&tool.fingerprint.as_bytes(), &tool.tool, &tool.elapsed_ms(), &code])
                .await?;
            Ok::<_, Error>(row.get::<_, String>(0) == "unauthenticated")
        }
        .await;
        match result {
            Ok(dead) => {
                if dead {
                    self.forget(&tool.fingerprint);
                }
                dead
            }
            Err(e) => {
                e.log("recording a refused tool call");
                false
            }
        }
    }

    /// A governed `/v1` request whose route is one call (`call`; `Err`: a request the route
    /// refuses once the envelope holds, such as a malformed body): one statement in autocommit
    /// (`Call::envelope_sql`), so one round trip once the connection has prepared it. A refusal
    /// there (the connection's rate, the call's own) rolls the whole statement back, the
    /// receipt with it, so a second statement records the envelope's decision again
    /// (`authenticate_envelope` alone): every decision is kept, and a v2 envelope whose request
    /// failed has spent its nonce. The answer is what that recorded receipt says: the call's
    /// refusal when it allows, the receipt's own refusal when it no longer does (an envelope
    /// that went stale, or was replayed, in between).
    pub async fn envelope_call(
        &self,
        envelope: &SignedRequestFacts<'_>,
        call: Result<Call, Error>,
    ) -> Result<EnvelopeOutcome, Error> {
        let client = self.client().await?;
        let SignedRequestFacts { header, method, path, body_sha256 } = *envelope;
        let outcome = match call {
            Ok(call) => {
                let statement = self.prepare(&client.statement_cache, &client, &call.envelope_sql()).await?;
                let (rate, burst) = (self.limits.rate, self.limits.burst);
                let params: Vec<&(dyn ToSql + Sync)> =
                    vec![&header, &method, &path, &body_sha256, &rate, &burst];
                match self.query_call(&client, &statement, params, &call).await {
                    Ok(row) => {
                        let receipt: Value = row.try_get(0)?;
                        if !allowed(&receipt) {
                            return Ok(EnvelopeOutcome::Denied(receipt));
                        }
                        let value = row.try_get::<_, Option<Value>>(1)?.unwrap_or(Value::Null);
                        return Ok(EnvelopeOutcome::Allowed { receipt, value });
                    }
                    // The statement never ran, or cannot be known to have: nothing to record.
                    Err(e) if e.code == Code::Unavailable => return Err(e),
                    Err(e) => e,
                }
            }
            Err(refusal) => refusal,
        };
        let statement = self.prepare(&client.statement_cache, &client, AUTHENTICATE_ENVELOPE).await?;
        self.trip();
        let recorded = client.query_one(&statement, &[&header, &method, &path, &body_sha256]).await;
        let receipt: Value = match recorded {
            Ok(row) => row.try_get(0)?,
            Err(e) => {
                Error::from(e).log("recording a refused envelope's receipt");
                return Err(outcome);
            }
        };
        if !allowed(&receipt) {
            return Ok(EnvelopeOutcome::Denied(receipt));
        }
        self.remember_refusal(connection_of(&receipt), &outcome);
        Err(outcome)
    }

    /// A governed `/v1` request that takes several steps (an answer an LLM writes): BEGIN;
    /// authenticate_envelope; when the database allows it, one savepoint holding the
    /// connection's rate token and then `steps` as the bound connection; COMMIT. The receipt
    /// (and a v2 envelope's spent nonce) is committed whatever happens next: every decision is
    /// recorded, and an envelope whose request failed cannot be replayed. A refusal of `steps`
    /// rolls back to the savepoint and is the caller's error; so is a connection whose rate the
    /// database refused lately (`connection_held`), or refuses now (a token taken in the
    /// database, keyed on the verified connection), and the receipt stays.
    pub async fn with_envelope(
        &self,
        envelope: &SignedRequestFacts<'_>,
        steps: impl AsyncFnOnce(&deadpool_postgres::Transaction<'_>) -> Result<Value, Error>,
    ) -> Result<EnvelopeOutcome, Error> {
        let SignedRequestFacts { header, method, path, body_sha256 } = *envelope;
        let mut client = self.client().await?;
        let mut tx = client.transaction().await?;
        let auth = tx.prepare_cached(AUTHENTICATE_ENVELOPE).await?;
        let receipt: Value = tx.query_one(&auth, &[&header, &method, &path, &body_sha256]).await?.get(0);
        if !allowed(&receipt) {
            tx.commit().await?;
            return Ok(EnvelopeOutcome::Denied(receipt));
        }
        let connection = connection_of(&receipt);
        let Some(id) = connection else {
            tx.commit().await?;
            return Err(Error::internal("an allowed envelope receipt names no connection"));
        };
        if let Some(retry_after) = self.connection_held(&id) {
            tx.commit().await?;
            return Err(Error::rate_limited(retry_after));
        }
        // In one savepoint: the connection's rate, the one every edge shares, then the steps.
        // Either refused, the savepoint is rolled back and the receipt stays.
        let savepoint = tx.savepoint("governed_steps").await?;
        let rate = savepoint.prepare_cached(TAKE_CONNECTION_TOKEN).await?;
        if let Err(e) = savepoint.execute(&rate, &[&self.limits.rate, &self.limits.burst]).await {
            savepoint.rollback().await?;
            tx.commit().await?;
            let refusal = Error::from(e);
            self.remember_refusal(connection, &refusal);
            return Err(refusal);
        }
        let outcome = match steps(&savepoint).await {
            Ok(value) => savepoint.commit().await.map(|()| value).map_err(Error::from),
            Err(error) => {
                savepoint.rollback().await?;
                Err(error)
            }
        };
        tx.commit().await?;
        outcome.map(|value| EnvelopeOutcome::Allowed { receipt, value })
    }

    /// Claims the key in `tx`: Some(stored answer) when the call already committed under it.
    async fn claim(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        idem: &Idempotency,
    ) -> Result<Option<Value>, Error> {
        let statement = self.prepare(&tx.statement_cache, tx, CLAIM_KEY).await?;
        self.trip();
        let row =
            tx.query_one(&statement, &[&idem.key, &idem.action, &idem.request_sha256.as_slice()]).await?;
        let claimed: Option<Value> = row.get(0);
        Ok(claimed.map(|c| c.get("response").cloned().unwrap_or(Value::Null)))
    }

    async fn store(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        idem: &Idempotency,
        value: &Value,
    ) -> Result<(), Error> {
        let statement = self.prepare(&tx.statement_cache, tx, STORE_RESPONSE).await?;
        self.trip();
        tx.execute(&statement, &[&idem.key, value]).await?;
        Ok(())
    }

    /// `call` in `tx`, counted: its prepare the first time, then its statement.
    async fn run_in(&self, tx: &deadpool_postgres::Transaction<'_>, call: &Call) -> Result<Value, Error> {
        let statement = self.prepare(&tx.statement_cache, tx, &call.sql()).await?;
        let row = self.query_call(tx.client(), &statement, Vec::new(), call).await?;
        Ok(row.try_get::<_, Option<Value>>(0)?.unwrap_or(Value::Null))
    }

    /// A console request of a member token this edge has authenticated before, without an
    /// idempotency key: one statement in autocommit (`Call::member_sql`), authenticate_member
    /// then the call, so one round trip once the connection has prepared it. A dead token is
    /// recorded as `call_as_member` records it.
    pub async fn member_call(&self, fingerprint: &Fingerprint, call: &Call) -> Result<Value, Error> {
        let outcome = async {
            let client = self.client().await?;
            let statement = self.prepare(&client.statement_cache, &client, &call.member_sql()).await?;
            let presented = fingerprint.as_bytes();
            let row = self.query_call(&client, &statement, vec![&presented], call).await?;
            Ok::<_, Error>(row.try_get::<_, Option<Value>>(0)?.unwrap_or(Value::Null))
        }
        .await;
        if let Err(e) = &outcome {
            if e.code == Code::Unauthenticated {
                self.record_failed_member_authentication(fingerprint, "console").await;
            }
        }
        outcome
    }

    /// One console request as a member: BEGIN; authenticate_member; `check`; the call; COMMIT.
    /// `call` None returns the member's own context (who am I).
    pub async fn call_as_member(
        &self,
        fingerprint: &Fingerprint,
        check: impl FnOnce(&MemberContext) -> Result<(), Error>,
        call: Option<&Call>,
        idem: Option<&Idempotency>,
    ) -> Result<(Value, Answered), Error> {
        let mut client = self.client().await?;
        let outcome = async {
            self.trip();
            let tx = client.transaction().await?;
            let auth = self.prepare(&tx.statement_cache, &tx, AUTHENTICATE_MEMBER).await?;
            self.trip();
            let row = tx
                .query_one(&auth, &[&fingerprint.as_bytes()])
                .await
                .map_err(|e| MemberRefusal::Authentication(e.into()))?;
            let context: Value = row.get(0);
            let member: MemberContext = parse(context.clone())?;
            check(&member)?;
            let earlier = match (call, idem) {
                (Some(_), Some(idem)) => self.claim(&tx, idem).await?,
                _ => None,
            };
            let (value, answered) = match (call, earlier) {
                (_, Some(value)) => (value, Answered::Before),
                (Some(call), None) => {
                    let value = self.run_in(&tx, call).await?;
                    if let Some(idem) = idem {
                        self.store(&tx, idem, &value).await?;
                    }
                    (value, Answered::Now)
                }
                (None, None) => (context, Answered::Now),
            };
            self.trip();
            tx.commit().await?;
            Ok::<_, MemberRefusal>((value, answered))
        }
        .await;
        drop(client);
        match outcome {
            Ok(value) => Ok(value),
            Err(MemberRefusal::Authentication(error)) => {
                if error.code == Code::Unauthenticated {
                    self.record_failed_member_authentication(fingerprint, "console").await;
                }
                Err(error)
            }
            Err(MemberRefusal::Other(error)) => Err(error),
        }
    }

    /// An operator call (the `querylayer admin` commands): one statement, its own transaction.
    pub async fn call_as_operator(&self, call: &Call) -> Result<Value, Error> {
        let client = self.client().await?;
        call.run(&client).await
    }
}

/// What a tool call's statement returned in `row` (`finish_tool_call`): whether the answer is
/// the one stored under the key, and the answer's text.
fn closed(row: &tokio_postgres::Row) -> Result<(JsonText, Answered), Error> {
    let replayed: bool = row.try_get(0).map_err(unexpected_shape)?;
    let value: JsonText = row.try_get(1).map_err(unexpected_shape)?;
    Ok((value, if replayed { Answered::Before } else { Answered::Now }))
}

/// A tool's answer as the text of the JSON the database wrote, without the whitespace it puts
/// after `:` and `,`: the tool passes it on as its result (its text block and structured
/// content) without reading it. (The edge's typed view of each answer declares the tool's
/// output schema; a debug build holds every answer to it, `mcp::output::Json::answer`.)
#[derive(Debug)]
pub struct JsonText(String);

impl JsonText {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl<'a> tokio_postgres::types::FromSql<'a> for JsonText {
    fn from_sql(
        ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        // A jsonb value in binary form is a version byte (1), then the JSON's text.
        let text = match *ty {
            tokio_postgres::types::Type::JSONB => match raw.split_first() {
                Some((1, text)) => text,
                _ => return Err("unsupported jsonb encoding version".into()),
            },
            _ => raw,
        };
        Ok(JsonText(String::from_utf8(compact_json(text))?))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        matches!(*ty, tokio_postgres::types::Type::JSONB | tokio_postgres::types::Type::JSON)
    }
}

/// `json`'s text without the whitespace between its tokens (a string's own is kept). A string is
/// copied a run at a time, up to its next quote or escape.
fn compact_json(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        match b {
            b' ' | b'\n' | b'\r' | b'\t' => {}
            b'"' => {
                out.push(b'"');
                loop {
                    let Some(at) = memchr::memchr2(b'"', b'\\', rest) else {
                        out.extend_from_slice(rest);
                        return out;
                    };
                    let quote = rest[at] == b'"';
                    // A quote ends the string; an escape takes the byte after it.
                    let end = if quote { at + 1 } else { (at + 2).min(rest.len()) };
                    out.extend_from_slice(&rest[..end]);
                    rest = &rest[end..];
                    if quote {
                        break;
                    }
                }
            }
            _ => out.push(b),
        }
    }
    out
}

/// What a governed `/v1` request hands the database to decide on its envelope: the
/// `x-qg-envelope` header (None when missing), the method, the exact path and the SHA-256 of the
/// exact body.
#[derive(Clone, Copy)]
pub struct SignedRequestFacts<'a> {
    pub header: Option<&'a str>,
    pub method: &'a str,
    pub path: &'a str,
    pub body_sha256: &'a [u8],
}

/// What `envelope_call` and `with_envelope` did: the database's receipt, and the result when it
/// allowed the call.
pub enum EnvelopeOutcome {
    Allowed { receipt: Value, value: Value },
    Denied(Value),
}

/// Whether an envelope's receipt allowed the request.
fn allowed(receipt: &Value) -> bool {
    receipt.get("allowed").and_then(Value::as_bool) == Some(true)
}

/// The connection an allowed receipt verified (`context.connection_id`).
fn connection_of(receipt: &Value) -> Option<Uuid> {
    receipt["context"]["connection_id"].as_str().and_then(|id| id.parse().ok())
}

/// A console request's refusal: at the member's authentication (recorded when the token is
/// dead), or after it.
enum MemberRefusal {
    Authentication(Error),
    Other(Error),
}

impl From<Error> for MemberRefusal {
    fn from(e: Error) -> Self {
        MemberRefusal::Other(e)
    }
}

impl From<tokio_postgres::Error> for MemberRefusal {
    fn from(e: tokio_postgres::Error) -> Self {
        MemberRefusal::Other(e.into())
    }
}

/// Reads a function's JSON result into the edge's typed view of it. A mismatch is a contract
/// break between the edge and the SQL surface: an internal error, logged with its detail.
pub fn parse<T: DeserializeOwned>(value: Value) -> Result<T, Error> {
    serde_json::from_value(value).map_err(unexpected_shape)
}

/// A result that does not fit the edge's typed view of it: a contract break, an internal error.
pub fn unexpected_shape(e: impl std::fmt::Display) -> Error {
    Error::internal(format!("unexpected result shape from querylayer_api: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_the_sha256_of_the_secret_and_never_prints() {
        let fp = Fingerprint::of("abc");
        assert_eq!(
            fp.as_bytes(),
            [
                0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22,
                0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00,
                0x15, 0xad
            ]
        );
        assert_eq!(format!("{fp:?}"), "Fingerprint(..)");
    }

    #[test]
    fn an_answer_is_passed_on_without_the_whitespace_between_its_tokens() {
        use tokio_postgres::types::{FromSql, Type};
        let text =
            r#"{"a": "x, y: \"z\" \\", "b": [1, 2.5, null], "c": {"d": "tab\tand  two"}, "e": "ü 🎉"}"#;
        let compact = r#"{"a":"x, y: \"z\" \\","b":[1,2.5,null],"c":{"d":"tab\tand  two"},"e":"ü 🎉"}"#;
        assert_eq!(std::str::from_utf8(&compact_json(text.as_bytes())).unwrap(), compact);
        assert_eq!(
            serde_json::from_str::<Value>(compact).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
        // jsonb's binary form: a version byte, then the text.
        let jsonb = [&[1u8][..], text.as_bytes()].concat();
        assert_eq!(JsonText::from_sql(&Type::JSONB, &jsonb).unwrap().as_str(), compact);
        assert_eq!(JsonText::from_sql(&Type::JSON, text.as_bytes()).unwrap().as_str(), compact);
        assert!(JsonText::from_sql(&Type::JSONB, b"\x021").is_err());
        assert!(JsonText::from_sql(&Type::JSON, b"\"\xff\"").is_err());
    }

    #[test]
    fn a_tool_call_is_one_statement_that_opens_calls_and_closes() {
        let call = Call::new("begin_run").arg("p_run_type", "article.draft".to_string());
        assert_eq!(
            call.tool_call_sql(),
            "SELECT o ? 'replay', querylayer_api.finish_tool_call(o, CASE WHEN o ? 'replay' THEN o->'replay' \
             ELSE to_jsonb(querylayer_api.begin_run(p_run_type => $8)) END, $5) \
             FROM querylayer_api.open_tool_call($1, $2, $3, $4, $6, $7) AS o"
        );
        // A function of rows runs in a subquery that reads the opened call's row, so it runs
        // after the authentication, whatever plan PostgreSQL picks.
        let rows = Call::rows("list_connections").arg("p_site", "demo".to_string());
        assert!(rows.tool_call_sql().contains(
            "(SELECT coalesce(jsonb_agg(to_jsonb(r)), '[]'::jsonb) FROM \
             querylayer_api.list_connections(p_site => $8) AS r WHERE o IS NOT NULL)"
        ));
    }

    #[test]
    fn calls_use_named_arguments_and_leave_defaults_to_sql() {
        let call = Call::new("begin_run")
            .arg("p_run_type", "article.draft".to_string())
            .opt("p_input", None::<Value>)
            .opt("p_required_outputs", Some(vec!["draft_id".to_string()]));
        assert_eq!(
            call.sql(),
            "SELECT to_jsonb(querylayer_api.begin_run(p_run_type => $1, p_required_outputs => $2))"
        );
        let rows = Call::rows("list_connections").arg("p_site", "demo".to_string());
        assert_eq!(
            rows.sql(),
            "SELECT coalesce(jsonb_agg(to_jsonb(r)), '[]'::jsonb) FROM querylayer_api.list_connections(p_site => $1) AS r"
        );
        let expr = Call::new("create_connection").arg_as(
            "p_expires_at",
            "now() + {}::text::interval",
            "1h".to_string(),
        );
        assert_eq!(
            expr.sql(),
            "SELECT to_jsonb(querylayer_api.create_connection(p_expires_at => now() + $1::text::interval))"
        );
    }
}

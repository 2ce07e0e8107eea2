//! The one SQL call: a connection pool, a `Call` naming one `querylayer_api` function with
//! named arguments, and the transactions the edge wraps around it (authenticate, the call,
//! the audit row, commit). Nothing here decides anything; the database does.

use std::time::Duration;

use deadpool_postgres::GenericClient;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::auth::Fingerprint;
use crate::error::{Code, Error};

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

    pub fn sql(&self) -> String {
        let args: Vec<String> = self
            .args
            .iter()
            .enumerate()
            .map(|(i, (name, expr, _))| format!("{name} => {}", expr.replace("{}", &format!("${}", i + 1))))
            .collect();
        let call = format!("querylayer_api.{}({})", self.function, args.join(", "));
        if self.returns_rows {
            format!("SELECT coalesce(jsonb_agg(to_jsonb(r)), '[]'::jsonb) FROM {call} AS r")
        } else {
            format!("SELECT to_jsonb({call})")
        }
    }

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.args.iter().map(|(_, _, p)| p.as_ref() as &(dyn ToSql + Sync)).collect()
    }

    pub(crate) async fn run(&self, client: &impl GenericClient) -> Result<Value, tokio_postgres::Error> {
        use tracing::Instrument;
        async {
            let statement = client.prepare_cached(&self.sql()).await?;
            let row = client.query_one(&statement, &self.params()).await?;
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
}

/// What `querylayer_api.authenticate_member` says about a live member token.
#[derive(Clone, Debug, Deserialize)]
pub struct MemberContext {
    pub member_token_id: Uuid,
    pub site: String,
    pub member: String,
    pub role: String,
}

/// The audit facts of one tool call, written by `querylayer_api.record_tool_call`.
pub struct ToolAudit {
    pub tool: &'static str,
    pub started: std::time::Instant,
}

impl ToolAudit {
    fn duration_ms(&self) -> i32 {
        i32::try_from(self.started.elapsed().as_millis()).unwrap_or(i32::MAX)
    }
}

/// A write made safe to retry: the caller's key, what it does (a tool, a console route) and the
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

/// Claims the key in `tx`: Some(stored answer) when the call already committed under it.
async fn claim(
    tx: &deadpool_postgres::Transaction<'_>,
    idem: &Idempotency,
) -> Result<Option<Value>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(CLAIM_KEY).await?;
    let row = tx.query_one(&statement, &[&idem.key, &idem.action, &idem.request_sha256.as_slice()]).await?;
    let claimed: Option<Value> = row.get(0);
    Ok(claimed.map(|c| c.get("response").cloned().unwrap_or(Value::Null)))
}

async fn store(
    tx: &deadpool_postgres::Transaction<'_>,
    idem: &Idempotency,
    value: &Value,
) -> Result<(), tokio_postgres::Error> {
    let statement = tx.prepare_cached(STORE_RESPONSE).await?;
    tx.execute(&statement, &[&idem.key, value]).await?;
    Ok(())
}

const AUTHENTICATE: &str = "SELECT querylayer_api.authenticate($1)";
const AUTHENTICATE_MEMBER: &str = "SELECT querylayer_api.authenticate_member($1)";
const AUTHENTICATE_ENVELOPE: &str = "SELECT querylayer_api.authenticate_envelope($1, $2, $3, $4)";
const RECORD_TOOL_CALL: &str =
    "SELECT querylayer_api.record_tool_call(p_tool => $1, p_outcome => $2, p_duration_ms => $3, p_error_code => $4)";

#[derive(Clone)]
pub struct Db {
    pool: Pool,
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
        Ok(Db { pool })
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
    /// the context dies with it. Used before any MCP server exists for the request.
    pub async fn authenticate(&self, fingerprint: &Fingerprint) -> Result<ConnectionContext, Error> {
        let client = self.client().await?;
        let statement = client.prepare_cached(AUTHENTICATE).await?;
        let row = client.query_one(&statement, &[&fingerprint.as_bytes()]).await?;
        parse(row.get(0))
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
            client.execute(&sql, &[&fingerprint.as_bytes(), &channel]).await?;
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = result {
            e.log("recording a failed authentication");
        }
    }

    /// One tool call as a connection: BEGIN; authenticate; the call; record_tool_call; COMMIT.
    /// When the call is refused, its transaction rolls back and the refusal is recorded in a
    /// new one (authenticate; record_tool_call).
    /// With `idem`, the key is claimed after authentication in the same transaction: a retry of
    /// a call that committed gets the stored answer (`Answered::Before`) and nothing runs again.
    pub async fn call_as_connection(
        &self,
        fingerprint: &Fingerprint,
        call: &Call,
        audit: &ToolAudit,
        idem: Option<&Idempotency>,
    ) -> Result<(Value, Answered), Error> {
        let mut client = self.client().await?;
        let outcome = async {
            let tx = client.transaction().await?;
            let auth = tx.prepare_cached(AUTHENTICATE).await?;
            tx.query_one(&auth, &[&fingerprint.as_bytes()]).await.map_err(Refusal::Authentication)?;
            let earlier = match idem {
                Some(idem) => claim(&tx, idem).await.map_err(Refusal::Call)?,
                None => None,
            };
            let (value, answered) = match earlier {
                Some(value) => (value, Answered::Before),
                None => {
                    let value = call.run(&tx).await.map_err(Refusal::Call)?;
                    if let Some(idem) = idem {
                        store(&tx, idem, &value).await.map_err(Refusal::Call)?;
                    }
                    (value, Answered::Now)
                }
            };
            let record = tx.prepare_cached(RECORD_TOOL_CALL).await?;
            tx.execute(&record, &[&audit.tool, &"ok", &audit.duration_ms(), &None::<&str>]).await?;
            tx.commit().await?;
            Ok::<_, Refusal>((value, answered))
        }
        .await;
        match outcome {
            Ok(value) => Ok(value),
            Err(Refusal::Authentication(e)) => {
                drop(client);
                let error = Error::from_db(&e);
                if error.code == Code::Unauthenticated {
                    self.record_failed_authentication(fingerprint, "mcp").await;
                }
                Err(error)
            }
            Err(Refusal::Call(e)) | Err(Refusal::Other(e)) => {
                drop(client);
                let error = Error::from_db(&e);
                self.record_refused_tool_call(fingerprint, audit, error.code.as_str()).await;
                Err(error)
            }
        }
    }

    /// As `call_as_connection`, for a tool whose work takes more than one governed call in its
    /// transaction (an answer prepared in the database, written by the LLM, signed in the
    /// database): BEGIN; authenticate; `steps`; record_tool_call; COMMIT.
    pub async fn steps_as_connection(
        &self,
        fingerprint: &Fingerprint,
        audit: &ToolAudit,
        idem: Option<&Idempotency>,
        steps: impl AsyncFnOnce(&deadpool_postgres::Transaction<'_>) -> Result<Value, Error>,
    ) -> Result<(Value, Answered), Error> {
        let mut client = self.client().await?;
        let outcome = async {
            let tx = client.transaction().await.map_err(|e| Error::from_db(&e))?;
            let auth = tx.prepare_cached(AUTHENTICATE).await.map_err(|e| Error::from_db(&e))?;
            tx.query_one(&auth, &[&fingerprint.as_bytes()]).await.map_err(|e| Error::from_db(&e))?;
            let earlier = match idem {
                Some(idem) => claim(&tx, idem).await.map_err(|e| Error::from_db(&e))?,
                None => None,
            };
            let (value, answered) = match earlier {
                Some(value) => (value, Answered::Before),
                None => {
                    let value = steps(&tx).await?;
                    if let Some(idem) = idem {
                        store(&tx, idem, &value).await.map_err(|e| Error::from_db(&e))?;
                    }
                    (value, Answered::Now)
                }
            };
            let record = tx.prepare_cached(RECORD_TOOL_CALL).await.map_err(|e| Error::from_db(&e))?;
            tx.execute(&record, &[&audit.tool, &"ok", &audit.duration_ms(), &None::<&str>])
                .await
                .map_err(|e| Error::from_db(&e))?;
            tx.commit().await.map_err(|e| Error::from_db(&e))?;
            Ok::<_, Error>((value, answered))
        }
        .await;
        drop(client);
        match outcome {
            Ok(value) => Ok(value),
            Err(error) if error.code == Code::Unauthenticated => {
                self.record_failed_authentication(fingerprint, "mcp").await;
                Err(error)
            }
            Err(error) => {
                self.record_refused_tool_call(fingerprint, audit, error.code.as_str()).await;
                Err(error)
            }
        }
    }

    /// A governed `/v1` request: BEGIN; authenticate_envelope (header, method, exact path,
    /// SHA-256 of the exact body); when the database allows it, `steps` as the bound
    /// connection inside a savepoint; COMMIT. The receipt (and a v2 envelope's spent nonce) is
    /// committed whatever happens next: every decision is recorded, and an envelope whose
    /// request failed cannot be replayed. A refusal of `steps` rolls back to the savepoint and
    /// is the caller's error. `admit` sees the allowed receipt (its `context.connection_id` is the
    /// verified connection) before `steps` run; refusing there (a rate limit) keeps the receipt.
    pub async fn with_envelope(
        &self,
        header: Option<&str>,
        method: &str,
        path: &str,
        body_sha256: &[u8],
        admit: impl FnOnce(&Value) -> Result<(), Error>,
        steps: impl AsyncFnOnce(&deadpool_postgres::Transaction<'_>) -> Result<Value, Error>,
    ) -> Result<EnvelopeOutcome, Error> {
        let mut client = self.client().await?;
        let mut tx = client.transaction().await.map_err(|e| Error::from_db(&e))?;
        let auth = tx.prepare_cached(AUTHENTICATE_ENVELOPE).await.map_err(|e| Error::from_db(&e))?;
        let receipt: Value = tx
            .query_one(&auth, &[&header, &method, &path, &body_sha256])
            .await
            .map_err(|e| Error::from_db(&e))?
            .get(0);
        if receipt.get("allowed").and_then(Value::as_bool) != Some(true) {
            tx.commit().await.map_err(|e| Error::from_db(&e))?;
            return Ok(EnvelopeOutcome::Denied(receipt));
        }
        if let Err(refusal) = admit(&receipt) {
            tx.commit().await.map_err(|e| Error::from_db(&e))?;
            return Err(refusal);
        }
        let savepoint = tx.savepoint("governed_steps").await.map_err(|e| Error::from_db(&e))?;
        let outcome = match steps(&savepoint).await {
            Ok(value) => savepoint.commit().await.map(|()| value).map_err(|e| Error::from_db(&e)),
            Err(error) => {
                savepoint.rollback().await.map_err(|e| Error::from_db(&e))?;
                Err(error)
            }
        };
        tx.commit().await.map_err(|e| Error::from_db(&e))?;
        outcome.map(|value| EnvelopeOutcome::Allowed { receipt, value })
    }

    /// Records a tool call that was refused before or inside the database, in a transaction
    /// of its own that authenticates first. Failing to record is logged, never shown.
    pub async fn record_refused_tool_call(&self, fingerprint: &Fingerprint, audit: &ToolAudit, code: &str) {
        let result = async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let auth = tx.prepare_cached(AUTHENTICATE).await?;
            tx.query_one(&auth, &[&fingerprint.as_bytes()]).await?;
            let record = tx.prepare_cached(RECORD_TOOL_CALL).await?;
            tx.execute(&record, &[&audit.tool, &"error", &audit.duration_ms(), &Some(code)]).await?;
            tx.commit().await?;
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = result {
            e.log("recording a refused tool call");
        }
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
            let tx = client.transaction().await.map_err(MemberRefusal::Db)?;
            let auth = tx.prepare_cached(AUTHENTICATE_MEMBER).await.map_err(MemberRefusal::Db)?;
            let row = tx
                .query_one(&auth, &[&fingerprint.as_bytes()])
                .await
                .map_err(MemberRefusal::Authentication)?;
            let context: Value = row.get(0);
            let member: MemberContext = parse(context.clone()).map_err(MemberRefusal::Edge)?;
            check(&member).map_err(MemberRefusal::Edge)?;
            let earlier = match (call, idem) {
                (Some(_), Some(idem)) => claim(&tx, idem).await.map_err(MemberRefusal::Db)?,
                _ => None,
            };
            let (value, answered) = match (call, earlier) {
                (_, Some(value)) => (value, Answered::Before),
                (Some(call), None) => {
                    let value = call.run(&tx).await.map_err(MemberRefusal::Db)?;
                    if let Some(idem) = idem {
                        store(&tx, idem, &value).await.map_err(MemberRefusal::Db)?;
                    }
                    (value, Answered::Now)
                }
                (None, None) => (context, Answered::Now),
            };
            tx.commit().await.map_err(MemberRefusal::Db)?;
            Ok::<_, MemberRefusal>((value, answered))
        }
        .await;
        drop(client);
        match outcome {
            Ok(value) => Ok(value),
            Err(MemberRefusal::Authentication(e)) => {
                let error = Error::from_db(&e);
                if error.code == Code::Unauthenticated {
                    self.record_failed_member_authentication(fingerprint, "console").await;
                }
                Err(error)
            }
            Err(MemberRefusal::Db(e)) => Err(Error::from_db(&e)),
            Err(MemberRefusal::Edge(e)) => Err(e),
        }
    }

    /// An operator call (the `querylayer admin` commands): one statement, its own transaction.
    pub async fn call_as_operator(&self, call: &Call) -> Result<Value, Error> {
        let client = self.client().await?;
        Ok(call.run(&client).await?)
    }
}

/// What `with_envelope` did: the database's receipt, and the result when it allowed the call.
pub enum EnvelopeOutcome {
    Allowed { receipt: Value, value: Value },
    Denied(Value),
}

enum Refusal {
    Authentication(tokio_postgres::Error),
    Call(tokio_postgres::Error),
    Other(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for Refusal {
    fn from(e: tokio_postgres::Error) -> Self {
        Refusal::Other(e)
    }
}

enum MemberRefusal {
    Authentication(tokio_postgres::Error),
    Db(tokio_postgres::Error),
    Edge(Error),
}

/// Reads a function's JSON result into the edge's typed view of it. A mismatch is a contract
/// break between the edge and the SQL surface: an internal error, logged with its detail.
pub fn parse<T: DeserializeOwned>(value: Value) -> Result<T, Error> {
    serde_json::from_value(value)
        .map_err(|e| Error::internal(format!("unexpected result shape from querylayer_api: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

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

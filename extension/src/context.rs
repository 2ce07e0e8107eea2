//! The request context: who is acting, for which site, with which scopes. It lives only in this
//! backend's memory, is set only by the Rust authentication paths below, and is dropped when the
//! transaction ends (commit or abort), so a pooled connection never carries it into the next one.
//! No GUC, table or argument that a caller controls can create or change it.

use crate::jsonb::Jsonb;
use pgrx::prelude::*;
use pgrx::{FromDatum, IntoDatum, Uuid};
use serde_json::{json, Value};
use std::cell::RefCell;

/// Raises an error with a hint a DBA can act on.
pub(crate) fn refuse(code: PgSqlErrorCode, message: &str, hint: &str) -> ! {
    pgrx::pg_sys::panic::ErrorReport::new(code, message.to_string(), "querylayer")
        .set_hint(hint)
        .report(pgrx::PgLogLevel::ERROR);
    unreachable!()
}

/// What kind of principal the current transaction acts as.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// An agent, through one connection (bearer secret or bound did:key).
    Connection,
    /// A human member of a site, through a member token.
    Member,
    /// A DBA holding `querylayer_admin`, inside an operator function.
    Operator,
    /// A credential is being resolved: only its own site's rows are visible, nothing is granted.
    Resolving,
    /// A website reading published content (a delivery token, or a public site): only the
    /// delivery functions serve it (sql/180_delivery.sql).
    Delivery,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Connection => "connection",
            Kind::Member => "member",
            Kind::Operator => "operator",
            Kind::Resolving => "resolving",
            Kind::Delivery => "delivery",
        }
    }
}

#[derive(Clone, Debug)]
struct RequestContext {
    kind: Kind,
    /// The local transaction this context belongs to; a context is never read in another one.
    lxid: u32,
    site_id: Option<Uuid>,
    organization_id: Option<Uuid>,
    agent_id: Option<Uuid>,
    connection_id: Option<Uuid>,
    member_id: Option<Uuid>,
    member_role: Option<String>,
    scopes: Vec<String>,
    harness: Option<String>,
    /// When the credential stops being valid (PostgreSQL microseconds): checked against the
    /// wall clock at every guard, so a context cannot outlive its credential's expiry.
    expires_at: Option<i64>,
    /// For a context made by an envelope: the request it was signed for. Only the functions
    /// mapped to that route (querylayer.envelope_routes) may run under it.
    route: Option<Route>,
    /// The dashboard session a member acts through (none for a member token).
    member_session_id: Option<Uuid>,
    /// The connection has budgets (sql/157_rate.sql): its scope checks spend them.
    has_budgets: bool,
}

impl RequestContext {
    /// A context of `kind` for a site and organization that names no principal and grants nothing.
    fn bare(kind: Kind, site_id: Option<Uuid>, organization_id: Option<Uuid>) -> Self {
        RequestContext {
            kind,
            lxid: current_lxid(),
            site_id,
            organization_id,
            agent_id: None,
            connection_id: None,
            member_id: None,
            member_role: None,
            scopes: Vec::new(),
            harness: None,
            expires_at: None,
            route: None,
            member_session_id: None,
            has_budgets: false,
        }
    }
}

/// The signed request an envelope-derived context is bound to.
#[derive(Clone, Debug)]
pub(crate) struct Route {
    pub method: String,
    pub path: String,
    pub body_sha256: Vec<u8>,
}

thread_local! {
    static CONTEXT: RefCell<Option<RequestContext>> = const { RefCell::new(None) };
    /// The fingerprint being resolved right now; row-level security on `credentials` shows only it.
    static PRESENTED: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
    /// Raw SPI plans of the liveness queries (run under an explicit snapshot), per backend.
    static RAW_PLANS: RefCell<std::collections::HashMap<&'static str, usize>> =
        RefCell::new(std::collections::HashMap::new());
}

/// Registers the end-of-transaction callback. Called from `_PG_init`.
pub fn init() {
    unsafe {
        pg_sys::RegisterXactCallback(Some(on_xact_event), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subxact_event), std::ptr::null_mut());
    }
}

/// A subtransaction that aborts (a caught error) drops the live-pointer and seal marks it may have
/// held.
#[pg_guard]
unsafe extern "C-unwind" fn on_subxact_event(
    event: pg_sys::SubXactEvent::Type,
    _sub: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        crate::lifecycle::clear();
        crate::partitions::clear();
        crate::ledger::clear();
        crate::chain::clear();
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn on_xact_event(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    if event == XACT_EVENT_PRE_PREPARE
        && with_context(|c| matches!(c.kind, Kind::Connection | Kind::Member | Kind::Delivery)) == Some(true)
    {
        // A prepared transaction would keep the credential's lock with no backend to end.
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_STATE,
            "a transaction that carries a request context cannot be prepared"
        );
    }
    if matches!(
        event,
        XACT_EVENT_COMMIT
            | XACT_EVENT_ABORT
            | XACT_EVENT_PREPARE
            | XACT_EVENT_PARALLEL_COMMIT
            | XACT_EVENT_PARALLEL_ABORT
    ) {
        clear();
    }
}

fn current_lxid() -> u32 {
    // SAFETY: MyProc is set for every regular backend before any SQL function can run.
    unsafe { (*pg_sys::MyProc).lxid }
}

pub fn clear() {
    CONTEXT.with(|c| c.borrow_mut().take());
    PRESENTED.with(|p| p.borrow_mut().take());
    crate::lifecycle::clear();
    crate::partitions::clear();
    crate::ledger::clear();
    crate::chain::clear();
}

/// The context of the current transaction, if one was established in it.
fn with_context<R>(f: impl FnOnce(&RequestContext) -> R) -> Option<R> {
    let lxid = current_lxid();
    CONTEXT.with(|c| c.borrow().as_ref().filter(|ctx| ctx.lxid == lxid).map(f))
}

fn set(ctx: RequestContext) {
    CONTEXT.with(|c| *c.borrow_mut() = Some(ctx));
}

/// Shows the rows keyed by `key` (a fingerprint, a sign-in lookup, a public site's key) to the
/// policies that compare against `ctx_presented_fingerprint()`, for the duration of `f` only.
pub(crate) fn while_presenting<R>(key: &[u8], f: impl FnOnce() -> R) -> R {
    PRESENTED.with(|p| *p.borrow_mut() = Some(key.to_vec()));
    let result = f();
    PRESENTED.with(|p| p.borrow_mut().take());
    result
}

/// The first row `sql` selects while `key` is presented, read by `read`; `None` when it selects
/// no row. `lookup` names the lookup in the error raised when the query fails.
pub(crate) fn presented_row<T>(
    key: &[u8],
    sql: &str,
    lookup: &str,
    read: impl FnOnce(&pgrx::spi::SpiTupleTable<'_>) -> Result<Option<T>, pgrx::spi::Error>,
) -> Option<T> {
    while_presenting(key, || {
        Spi::connect(|client| {
            let rows = client.select(sql, Some(1), &[])?;
            if rows.is_empty() {
                return Ok(None);
            }
            read(&rows.first())
        })
        .unwrap_or_else(|e| error!("querylayer: {lookup} failed: {e}"))
    })
}

/// (site_id, organization_id) from the first two columns of `row`.
pub(crate) fn site_and_organization(
    row: &pgrx::spi::SpiTupleTable<'_>,
) -> Result<Option<(Uuid, Uuid)>, pgrx::spi::Error> {
    Ok(match (row.get::<Uuid>(1)?, row.get::<Uuid>(2)?) {
        (Some(s), Some(o)) => Some((s, o)),
        _ => None,
    })
}

/// A resolving context for one site: its rows become visible, nothing is granted.
pub(crate) fn resolving(site: Uuid, organization: Uuid) {
    set(RequestContext::bare(Kind::Resolving, Some(site), Some(organization)));
}

/// A delivery context for one site (a public site read by nobody in particular).
pub(crate) fn delivering(site: Uuid, organization: Uuid) {
    set(RequestContext::bare(Kind::Delivery, Some(site), Some(organization)));
}

// ---------------------------------------------------------------------------------------------
// Readers. Row-level security policies and the governed SQL functions call these; they are
// granted to the owner role only.

#[pg_extern(stable, parallel_restricted)]
fn ctx_site_id() -> Option<Uuid> {
    with_context(|c| c.site_id).flatten()
}

/// The kind of the context; refuses a context whose credential expired since it was made.
#[pg_extern(stable, parallel_restricted)]
fn ctx_kind() -> Option<&'static str> {
    let (kind, expires_at) = with_context(|c| (c.kind, c.expires_at))?;
    if let Some(at) = expires_at {
        if unsafe { pg_sys::GetCurrentTimestamp() } >= at {
            refuse(
                PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
                "the credential of this transaction has expired",
                "authenticate again, in a new transaction, with a live credential",
            );
        }
    }
    Some(kind.as_str())
}

/// The route an envelope-derived context was signed for: `{method, path, body_sha256}`, or
/// NULL for every other context.
#[pg_extern(stable, parallel_restricted)]
fn ctx_envelope_route() -> Option<Jsonb> {
    with_context(|c| {
        c.route.as_ref().map(|r| {
            Jsonb(json!({"method": r.method, "path": r.path, "body_sha256": hex::encode(&r.body_sha256)}))
        })
    })
    .flatten()
}

#[pg_extern(stable, parallel_restricted)]
fn ctx_organization_id() -> Option<Uuid> {
    with_context(|c| c.organization_id).flatten()
}

#[pg_extern(stable, parallel_restricted)]
fn ctx_agent_id() -> Option<Uuid> {
    with_context(|c| c.agent_id).flatten()
}

#[pg_extern(stable, parallel_restricted)]
fn ctx_connection_id() -> Option<Uuid> {
    with_context(|c| c.connection_id).flatten()
}

#[pg_extern(stable, parallel_restricted)]
fn ctx_member_id() -> Option<Uuid> {
    with_context(|c| c.member_id).flatten()
}

#[pg_extern(stable, parallel_restricted)]
fn ctx_member_role() -> Option<String> {
    with_context(|c| c.member_role.clone()).flatten()
}

#[pg_extern(stable, parallel_restricted)]
fn ctx_scopes() -> Vec<String> {
    with_context(|c| c.scopes.clone()).unwrap_or_default()
}

#[pg_extern(stable, parallel_restricted)]
fn ctx_harness() -> Option<String> {
    with_context(|c| c.harness.clone()).flatten()
}

/// Whether the context's connection has budgets to spend (`querylayer.spend_budgets`).
#[pg_extern(stable, parallel_restricted)]
fn ctx_has_budgets() -> bool {
    with_context(|c| c.has_budgets).unwrap_or(false)
}

/// Whether `querylayer.require_connection_for(<any function>, p_scope)` passes with nothing to
/// do: a live connection (an expired one is refused here, as by `ctx_kind`), outside any envelope,
/// holding p_scope (NULL: any), with no budget that the scope check would spend. The guards in
/// sql/010_context.sql return at once when it holds and otherwise take the full check, which
/// alone raises, so this is the fast path of that one rule, not a second rule.
#[pg_extern(stable, parallel_restricted)]
fn ctx_connection_holds(p_scope: Option<&str>) -> bool {
    if ctx_kind() != Some(Kind::Connection.as_str()) {
        return false;
    }
    with_context(|c| {
        c.route.is_none()
            && match p_scope {
                None => true,
                Some(scope) => !c.has_budgets && c.scopes.iter().any(|s| s == scope),
            }
    })
    .unwrap_or(false)
}

#[pg_extern(stable, parallel_restricted)]
fn ctx_member_session_id() -> Option<Uuid> {
    with_context(|c| c.member_session_id).flatten()
}

/// True only for an operator context (a `querylayer_admin` member inside an operator function).
#[pg_extern(stable, parallel_restricted)]
fn ctx_is_operator() -> bool {
    with_context(|c| c.kind == Kind::Operator).unwrap_or(false)
}

/// The role that called in from outside (SET ROLE counts; SECURITY DEFINER does not), for audit.
#[pg_extern(stable, parallel_restricted)]
fn outer_user() -> String {
    unsafe {
        let name = pg_sys::GetUserNameFromId(pg_sys::GetOuterUserId(), false);
        std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned()
    }
}

#[pg_extern(stable, parallel_restricted)]
fn ctx_presented_fingerprint() -> Option<Vec<u8>> {
    PRESENTED.with(|p| p.borrow().clone())
}

// ---------------------------------------------------------------------------------------------
// Operator context.

fn role_oid(name: &std::ffi::CStr) -> Option<pg_sys::Oid> {
    let oid = unsafe { pg_sys::get_role_oid(name.as_ptr(), true) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// True when the role that called in from outside (SET ROLE counts, SECURITY DEFINER does not)
/// is a superuser or holds the privileges of `querylayer_admin` or `querylayer_worker`. Which
/// functions each may call is decided by EXECUTE grants; this is the second lock.
fn outer_user_is_operator() -> bool {
    unsafe {
        let outer = pg_sys::GetOuterUserId();
        if pg_sys::superuser_arg(outer) {
            return true;
        }
        [c"querylayer_admin", c"querylayer_worker"]
            .into_iter()
            .filter_map(role_oid)
            .any(|role| pg_sys::has_privs_of_role(outer, role))
    }
}

/// Enters the operator context for one site (or for identity tables only, when `site` is NULL).
/// Called at the top of every operator function; refuses anyone who is not `querylayer_admin`
/// at the outer level, so an agent-facing function could not borrow it even by mistake.
#[pg_extern(volatile, parallel_unsafe)]
fn enter_operator(site: Option<Uuid>) {
    if !outer_user_is_operator() {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            "operator functions require membership in querylayer_admin (or querylayer_worker)"
        );
    }
    set(RequestContext::bare(Kind::Operator, site, None));
}

// ---------------------------------------------------------------------------------------------
// Authentication.

/// The kinds of credential a fingerprint can belong to. Connections and member tokens are
/// found by the SHA-256 of their secret (`querylayer.credentials`); a did:key bound to a
/// connection by the SHA-256 of the DID (`querylayer.did_bindings`, newest binding wins).
#[derive(Clone, Copy)]
pub enum Credential {
    Connection,
    MemberToken,
    DidKey,
    /// A dashboard session cookie (sql/175_dashboard.sql).
    MemberSession,
    /// A one-time invitation link's token.
    Invitation,
    /// A website's delivery token (sql/180_delivery.sql).
    DeliveryToken,
}

impl Credential {
    fn kind(self) -> &'static str {
        match self {
            Credential::Connection => "connection",
            Credential::MemberToken => "member_token",
            Credential::DidKey => "did_key",
            Credential::MemberSession => "member_session",
            Credential::Invitation => "invitation",
            Credential::DeliveryToken => "delivery_token",
        }
    }
    fn lookup(self) -> &'static str {
        match self {
            Credential::Connection => {
                "SELECT subject_id, site_id, organization_id FROM querylayer.credentials
                  WHERE fingerprint = $1 AND kind = 'connection'"
            }
            Credential::MemberToken => {
                "SELECT subject_id, site_id, organization_id FROM querylayer.credentials
                  WHERE fingerprint = $1 AND kind = 'member_token'"
            }
            Credential::DidKey => {
                "SELECT connection_id, site_id, organization_id FROM querylayer.did_bindings
                  WHERE did_sha256 = $1 ORDER BY bound_at DESC LIMIT 1"
            }
            Credential::MemberSession => {
                "SELECT subject_id, site_id, organization_id FROM querylayer.credentials
                  WHERE fingerprint = $1 AND kind = 'member_session'"
            }
            Credential::Invitation => {
                "SELECT subject_id, site_id, organization_id FROM querylayer.credentials
                  WHERE fingerprint = $1 AND kind = 'invitation'"
            }
            Credential::DeliveryToken => {
                "SELECT subject_id, site_id, organization_id FROM querylayer.credentials
                  WHERE fingerprint = $1 AND kind = 'delivery_token'"
            }
        }
    }
    fn resolver(self) -> &'static str {
        match self {
            Credential::Connection | Credential::DidKey if budgets_exist() => RESOLVE_CONNECTION,
            Credential::Connection | Credential::DidKey => RESOLVE_CONNECTION_BEFORE_BUDGETS.as_str(),
            Credential::MemberToken => "SELECT querylayer.resolve_member_token($1)",
            Credential::MemberSession => "SELECT querylayer.resolve_member_session($1)",
            Credential::Invitation => "SELECT querylayer.resolve_invitation($1)",
            Credential::DeliveryToken => "SELECT querylayer.resolve_delivery_token($1)",
        }
    }
}

/// The verdict on a connection (its id; the nil id for an unknown fingerprint), as the other
/// credentials' `querylayer.resolve_*` functions give theirs, in one statement: no plpgsql call
/// on the path of every tool call. Decided on the wall clock (`clock_timestamp`). Unknown,
/// revoked and expired connections take the same work: one indexed read of the one row, then
/// the verdict; only a live one is read further (the subquery runs only in that branch).
/// Scopes are re-checked at every use: a permission removed from the agent removes the scope.
const RESOLVE_CONNECTION: &str = "
SELECT CASE
         WHEN c.id IS NULL THEN '{\"ok\": false, \"reason\": \"unknown\"}'::pg_catalog.jsonb
         WHEN c.revoked_at IS NOT NULL THEN '{\"ok\": false, \"reason\": \"revoked\"}'::pg_catalog.jsonb
         WHEN c.expires_at <= pg_catalog.clock_timestamp() THEN '{\"ok\": false, \"reason\": \"expired\"}'::pg_catalog.jsonb
         ELSE (SELECT pg_catalog.jsonb_build_object(
                        'ok', true,
                        'organization_id', c.organization_id, 'organization', o.slug,
                        'site_id', c.site_id, 'site', s.slug,
                        'agent_id', c.agent_id, 'agent', a.handle, 'agent_kind', a.kind,
                        'profile_id', a.profile_id, 'profile_name', a.profile_name,
                        'connection_id', c.id, 'connection', c.name,
                        'scopes', pg_catalog.to_jsonb(ARRAY(
                            SELECT sc FROM pg_catalog.unnest(c.scopes) AS sc
                             WHERE EXISTS (SELECT 1 FROM querylayer.agent_site_permissions p
                                            WHERE p.site_id = c.site_id AND p.agent_id = c.agent_id AND p.scope = sc)
                             ORDER BY sc)),
                        'harness', c.harness,
                        'has_budgets', EXISTS (SELECT 1 FROM querylayer.connection_budgets b WHERE b.connection_id = c.id),
                        'expires_at', c.expires_at)
                 FROM querylayer.sites s, querylayer.organizations o, querylayer.agents a
                WHERE s.id = c.site_id AND o.id = c.organization_id AND a.id = c.agent_id)
       END
  FROM (SELECT $1::pg_catalog.uuid AS id) x
  LEFT JOIN querylayer.connections c ON c.id = x.id";

/// `RESOLVE_CONNECTION` for the objects of a release before connection budgets (0.3.0): what
/// this library runs between a package upgrade and `ALTER EXTENSION querylayer UPDATE`.
pub(crate) static RESOLVE_CONNECTION_BEFORE_BUDGETS: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| {
        RESOLVE_CONNECTION.replace(
        "'has_budgets', EXISTS (SELECT 1 FROM querylayer.connection_budgets b WHERE b.connection_id = c.id),",
        "",
    )
    });

thread_local! {
    /// Set once this backend has seen `querylayer.connection_budgets` (it never goes away).
    static BUDGETS_EXIST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the installed objects have connection budgets: asked of the catalog until they do.
fn budgets_exist() -> bool {
    if !BUDGETS_EXIST.get() {
        BUDGETS_EXIST.set(relation_exists("querylayer.connection_budgets"));
    }
    BUDGETS_EXIST.get()
}

/// Whether the installed objects have the relation `name`. A read-only SPI call: `Spi::get_one`
/// would mark the transaction as writing, and a hot standby refuses to give a reader a
/// transaction id.
fn relation_exists(name: &str) -> bool {
    Spi::connect(|client| {
        client
            .select("SELECT pg_catalog.to_regclass($1) IS NOT NULL", Some(1), &[name.into()])
            .and_then(|rows| rows.first().get_one::<bool>())
    })
    .ok()
    .flatten()
    .unwrap_or(false)
}

/// The outcome of resolving a credential, before anything is granted.
pub(crate) enum Resolution {
    Live(Value),
    Dead { reason: String, subject: Option<Uuid>, site: Option<Uuid> },
}

fn uuid_field(v: &Value, key: &str) -> Option<Uuid> {
    let s = v.get(key)?.as_str()?;
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut bytes = [0u8; 16];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(Uuid::from_bytes(bytes))
}

/// The raw saved plan of `sql` (parameters of the types `args`), prepared on first use. Raw,
/// because the liveness queries run under an explicit snapshot (`SPI_execute_snapshot`).
fn raw_plan(sql: &'static str, args: &[pg_sys::Oid]) -> pg_sys::SPIPlanPtr {
    if let Some(p) = RAW_PLANS.with(|m| m.borrow().get(sql).copied()) {
        return p as pg_sys::SPIPlanPtr;
    }
    let text = std::ffi::CString::new(sql).expect("no NUL in SQL text");
    let mut argtypes = args.to_vec();
    // SAFETY: called inside Spi::connect; the plan is kept for the backend's life.
    let plan = unsafe { pg_sys::SPI_prepare(text.as_ptr(), args.len() as i32, argtypes.as_mut_ptr()) };
    if plan.is_null() || unsafe { pg_sys::SPI_keepplan(plan) } != 0 {
        error!("querylayer: cannot prepare an authentication query");
    }
    RAW_PLANS.with(|m| m.borrow_mut().insert(sql, plan as usize));
    plan
}

/// Which state a liveness query reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum View {
    /// The newest committed state, whatever the isolation level (a snapshot taken now).
    Present,
    /// What the transaction's own snapshot shows (REPEATABLE READ and SERIALIZABLE keep the one
    /// taken at their first statement).
    Transaction,
}

/// Runs a plan of the parameters `args` (type, value; none NULL) under `view` and hands the
/// first row (if any) to `read`.
fn query_one<R>(
    sql: &'static str,
    args: &[(pg_sys::Oid, pg_sys::Datum)],
    view: View,
    read: impl FnOnce(pg_sys::HeapTuple, pg_sys::TupleDesc) -> R,
) -> Option<R> {
    Spi::connect(|_client| {
        let types: Vec<pg_sys::Oid> = args.iter().map(|a| a.0).collect();
        let plan = raw_plan(sql, &types);
        let mut values: Vec<pg_sys::Datum> = args.iter().map(|a| a.1).collect();
        let nulls = vec![b' ' as std::ffi::c_char; args.len()];
        // SAFETY: SPI is connected; the plan takes the arguments of `args`. read_only is
        // false, so a snapshot is taken per command (READ COMMITTED reads what committed up
        // to now, after any lock the caller waited for); Present passes the latest snapshot
        // explicitly, which REPEATABLE READ would otherwise not see.
        unsafe {
            let rc = match view {
                View::Present => pg_sys::SPI_execute_snapshot(
                    plan,
                    values.as_mut_ptr(),
                    nulls.as_ptr(),
                    pg_sys::GetLatestSnapshot(),
                    std::ptr::null_mut(),
                    false,
                    false,
                    1,
                ),
                View::Transaction => {
                    pg_sys::SPI_execute_plan(plan, values.as_mut_ptr(), nulls.as_ptr(), false, 1)
                }
            };
            if rc < 0 {
                error!("querylayer: an authentication query failed (SPI code {rc})");
            }
            if pg_sys::SPI_processed == 0 || pg_sys::SPI_tuptable.is_null() {
                return None;
            }
            let table = pg_sys::SPI_tuptable;
            Some(read(*(*table).vals, (*table).tupdesc))
        }
    })
}

fn column<T: FromDatum>(tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc, n: i32) -> Option<T> {
    let mut isnull = false;
    // SAFETY: `tuple` and `desc` come from SPI_tuptable of the query just run.
    unsafe {
        let datum = pg_sys::SPI_getbinval(tuple, desc, n, &mut isnull);
        T::from_datum(datum, isnull)
    }
}

/// The credential's subject (connection or member token), site and organization, if the
/// fingerprint names one.
fn lookup(credential: Credential, fingerprint: &[u8], view: View) -> Option<(Uuid, Uuid, Uuid)> {
    PRESENTED.with(|p| *p.borrow_mut() = Some(fingerprint.to_vec()));
    let arg = fingerprint.into_datum().expect("bytea datum");
    let found = query_one(credential.lookup(), &[(pg_sys::BYTEAOID, arg)], view, |t, d| {
        (column::<Uuid>(t, d, 1), column::<Uuid>(t, d, 2), column::<Uuid>(t, d, 3))
    });
    PRESENTED.with(|p| p.borrow_mut().take());
    match found {
        Some((Some(subject), Some(site), Some(org))) => Some((subject, site, org)),
        _ => None,
    }
}

/// The resolver's verdict on a subject (`{ok, reason}` or the context to hold). An unknown
/// credential is judged too, as the nil subject of no site: the same queries and plans as for a
/// revoked or expired one, so the answer takes the same work whatever the reason.
fn judge(credential: Credential, found: Option<(Uuid, Uuid, Uuid)>, view: View) -> Value {
    let (subject, site, organization) = found.unwrap_or((nil(), nil(), nil()));
    resolving(site, organization);
    let arg = subject.into_datum().expect("uuid datum");
    query_one(credential.resolver(), &[(pg_sys::UUIDOID, arg)], view, |t, d| column::<Jsonb>(t, d, 1))
        .flatten()
        .map(|j| j.0)
        .unwrap_or(Value::Null)
}

fn nil() -> Uuid {
    Uuid::from_bytes([0; 16])
}

/// The advisory lock key of a credential (a connection or member token id). Authentication
/// holds it shared until its transaction ends; revocation ends its holders and takes it alone.
pub(crate) fn lock_key(credential: Uuid) -> i64 {
    let b = credential.as_bytes();
    i64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) ^ 0x514c_4352_4544_0001
}

fn lock_shared(credential: Uuid) {
    let arg = lock_key(credential).into_datum().expect("int8 datum");
    query_one(
        "SELECT pg_catalog.pg_advisory_xact_lock_shared($1)",
        &[(pg_sys::INT8OID, arg)],
        View::Transaction,
        |_, _| (),
    );
}

// ---------------------------------------------------------------------------------------------
// Kept verdicts. A live connection's verdict is decided from rows that change only together
// with the liveness generation (sql/010_context.sql): every statement that writes one of them
// moves the generation, in its own transaction, to a number never used before. So a verdict
// reached after reading generation g is still the verdict while the newest committed generation
// is g: `resolve` keeps it, in this backend's memory, and takes it up again after the
// credential's lock and one read of the generation, instead of the verdict's statement, as long
// as the credential has not expired on the wall clock. Only READ COMMITTED transactions use or
// keep them (the older snapshots of REPEATABLE READ take the whole path, with its check), and
// only verdicts on live connections are kept: a dead credential takes the same work whatever
// made it dead.

/// A live verdict and what it was decided at.
#[derive(Clone)]
struct Kept {
    found: (Uuid, Uuid, Uuid),
    generation: i64,
    /// The credential's expiry, PostgreSQL microseconds.
    expires_at: i64,
    verdict: Value,
}

/// The most verdicts a backend keeps; past it, all are dropped and kept anew.
const KEPT_MAX: usize = 1024;

thread_local! {
    static KEPT: RefCell<std::collections::HashMap<(&'static str, Vec<u8>), Kept>> =
        RefCell::new(std::collections::HashMap::new());
    /// Set once this backend has seen `querylayer.liveness_generation` (0.6.0 on).
    static GENERATION_EXISTS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Credential {
    /// Whether its live verdicts are kept: the credentials resolved by `RESOLVE_CONNECTION`.
    fn kept(self) -> bool {
        matches!(self, Credential::Connection | Credential::DidKey)
    }
}

/// The newest committed liveness generation (0 before the first change), or None for objects of
/// a release without it (served between a package upgrade and `ALTER EXTENSION … UPDATE`).
fn liveness_generation() -> Option<i64> {
    if !GENERATION_EXISTS.get() {
        if !relation_exists("querylayer.liveness_generation") {
            return None;
        }
        GENERATION_EXISTS.set(true);
    }
    Some(
        query_one("SELECT g.generation FROM querylayer.liveness_generation g", &[], View::Present, |t, d| {
            column::<i64>(t, d, 1)
        })
        .flatten()
        .unwrap_or(0),
    )
}

fn kept(credential: Credential, fingerprint: &[u8]) -> Option<Kept> {
    KEPT.with(|k| k.borrow().get(&(credential.kind(), fingerprint.to_vec())).cloned())
}

#[cfg(any(test, feature = "pg_test"))]
thread_local! {
    static TAKEN_UP: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many kept verdicts this backend has taken up (for the in-database tests).
#[cfg(any(test, feature = "pg_test"))]
pub(crate) fn kept_verdicts_taken_up() -> u64 {
    TAKEN_UP.get()
}

fn keep(
    credential: Credential,
    fingerprint: &[u8],
    found: (Uuid, Uuid, Uuid),
    generation: i64,
    verdict: &Value,
) {
    let Some(expires_at) = verdict.get("expires_at").and_then(Value::as_str).and_then(postgres_micros) else {
        return;
    };
    KEPT.with(|k| {
        let mut k = k.borrow_mut();
        if k.len() >= KEPT_MAX {
            k.clear();
        }
        k.insert(
            (credential.kind(), fingerprint.to_vec()),
            Kept { found, generation, expires_at, verdict: verdict.clone() },
        );
    });
}

fn forget(credential: Credential, fingerprint: &[u8]) {
    KEPT.with(|k| k.borrow_mut().remove(&(credential.kind(), fingerprint.to_vec())));
}

/// Looks the fingerprint up and decides, now, whether its subject is live: on the wall clock
/// and on the newest committed state of revocations, permissions and roles, read after taking
/// the credential's lock (so a revocation in progress is waited for and then seen). A
/// REPEATABLE READ or SERIALIZABLE transaction whose own snapshot would judge differently
/// cannot act on what it reads, and is refused. With `hold`, the credential's lock stays
/// held until the transaction ends. Leaves a `Resolving` context behind; callers replace or
/// clear it.
pub(crate) fn resolve(credential: Credential, fingerprint: &[u8], hold: bool) -> Resolution {
    if fingerprint.len() != 32 {
        return Resolution::Dead { reason: "malformed".into(), subject: None, site: None };
    }
    let snapshot_is_old = unsafe { pg_sys::XactIsoLevel } >= pg_sys::XACT_REPEATABLE_READ as i32;
    let keeps = credential.kept() && !snapshot_is_old;
    if let Some(kept) = keeps.then(|| kept(credential, fingerprint)).flatten() {
        if hold {
            lock_shared(kept.found.0);
        }
        // After the lock, so that a revocation that held it has committed, and moved the
        // generation, by now.
        if liveness_generation() == Some(kept.generation)
            && unsafe { pg_sys::GetCurrentTimestamp() } < kept.expires_at
        {
            // The provisional context the verdict's statement leaves (judge).
            resolving(kept.found.1, kept.found.2);
            #[cfg(any(test, feature = "pg_test"))]
            TAKEN_UP.set(TAKEN_UP.get() + 1);
            return Resolution::Live(kept.verdict);
        }
        forget(credential, fingerprint);
    }
    let found = lookup(credential, fingerprint, View::Present);
    if hold {
        // Unknown credentials take the (never contended) lock of the nil id: the same work.
        lock_shared(found.map(|f| f.0).unwrap_or_else(nil));
    }
    // Read before the verdict: a change committed in between moves the generation past it, so
    // the kept verdict is never taken for a state older than the one it was decided on.
    let generation = if keeps { liveness_generation() } else { None };
    let verdict = judge(credential, found, View::Present);
    let live = verdict.get("ok").and_then(Value::as_bool) == Some(true);
    if snapshot_is_old {
        let past_found = lookup(credential, fingerprint, View::Transaction);
        let past = judge(credential, past_found, View::Transaction);
        if live && (past_found != found || past != verdict) {
            clear();
            refuse(
                PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
                "this transaction's snapshot cannot see the present state of the credential",
                "authenticate first in a new transaction: REPEATABLE READ and SERIALIZABLE keep the snapshot of their first statement",
            );
        }
    }
    let Some((subject, site, _)) = found else {
        return Resolution::Dead { reason: "unknown".into(), subject: None, site: None };
    };
    if live {
        if let (Some(generation), Some(found)) = (generation, found) {
            keep(credential, fingerprint, found, generation, &verdict);
        }
        Resolution::Live(verdict)
    } else {
        let reason = verdict.get("reason").and_then(Value::as_str).unwrap_or("unknown").to_string();
        Resolution::Dead { reason, subject: Some(subject), site: Some(site) }
    }
}

/// One principal per transaction: once a connection or member acts, a second authentication in
/// the same transaction is refused, except for operators (a DBA in psql may act as several
/// principals in turn). Replacing an operator context can only narrow what the transaction sees.
pub(crate) fn refuse_if_established() {
    let acting =
        with_context(|c| matches!(c.kind, Kind::Connection | Kind::Member | Kind::Delivery)).unwrap_or(false);
    if acting && !outer_user_is_operator() {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_STATE,
            "this transaction already carries a request context; authenticate once per transaction"
        );
    }
}

pub(crate) fn authentication_failed(credential: Credential, reason: &str, subject: Option<Uuid>) -> ! {
    clear();
    // The server log is for operators; the caller learns nothing beyond the one generic error.
    match subject {
        Some(id) => log!("querylayer: {} authentication failed: {reason} (id {id})", credential.kind()),
        None => log!("querylayer: {} authentication failed: {reason}", credential.kind()),
    }
    ereport!(ERROR, PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION, "authentication failed");
}

pub fn authenticate(credential: Credential, fingerprint: &[u8]) -> Jsonb {
    refuse_if_established();
    match resolve(credential, fingerprint, true) {
        Resolution::Live(v) => establish(credential, v, None),
        Resolution::Dead { reason, subject, .. } => authentication_failed(credential, &reason, subject),
    }
}

/// Holds the context a live resolution describes; returns it without the internal fields.
pub(crate) fn establish(credential: Credential, verdict: Value, route: Option<Route>) -> Jsonb {
    let scopes = verdict
        .get("scopes")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    set(RequestContext {
        kind: match credential {
            Credential::Connection | Credential::DidKey => Kind::Connection,
            Credential::MemberToken | Credential::MemberSession => Kind::Member,
            Credential::DeliveryToken => Kind::Delivery,
            Credential::Invitation => Kind::Resolving,
        },
        lxid: current_lxid(),
        site_id: uuid_field(&verdict, "site_id"),
        organization_id: uuid_field(&verdict, "organization_id"),
        agent_id: uuid_field(&verdict, "agent_id"),
        connection_id: uuid_field(&verdict, "connection_id"),
        member_id: uuid_field(&verdict, "member_id"),
        member_role: verdict.get("role").and_then(Value::as_str).map(str::to_string),
        scopes,
        harness: verdict.get("harness").and_then(Value::as_str).map(str::to_string),
        expires_at: verdict.get("expires_at").and_then(Value::as_str).and_then(postgres_micros),
        route,
        member_session_id: uuid_field(&verdict, "session_id"),
        has_budgets: verdict.get("has_budgets").and_then(Value::as_bool).unwrap_or(false),
    });
    let mut public = verdict;
    if let Some(obj) = public.as_object_mut() {
        obj.remove("ok");
        obj.remove("has_budgets");
    }
    Jsonb(public)
}

/// PostgreSQL's timestamp (microseconds since 2000-01-01 UTC) of an RFC 3339 text.
fn postgres_micros(text: &str) -> Option<i64> {
    let t = chrono::DateTime::parse_from_rfc3339(text).ok()?;
    Some(t.timestamp_micros() - 946_684_800_000_000)
}

/// Whether a did:key is bound to a live connection, without disturbing the caller's context.
pub(crate) fn did_key_is_live(did_sha256: &[u8]) -> bool {
    let saved = CONTEXT.with(|c| c.borrow().clone());
    let live = matches!(resolve(Credential::DidKey, did_sha256, false), Resolution::Live(_));
    CONTEXT.with(|c| *c.borrow_mut() = saved);
    live
}

/// The organizations whose connections were ever bound to this did:key (live or not). The
/// bindings are visible only while their key is the one presented, as during resolution.
pub(crate) fn did_key_organizations(did_sha256: &[u8]) -> Vec<Uuid> {
    PRESENTED.with(|p| *p.borrow_mut() = Some(did_sha256.to_vec()));
    let found = Spi::connect(|client| {
        let rows = client.select(
            "SELECT DISTINCT organization_id FROM querylayer.did_bindings WHERE did_sha256 = $1",
            None,
            &[did_sha256.into()],
        )?;
        rows.map(|row| row.get::<Uuid>(1)).collect::<Result<Vec<_>, _>>()
    });
    PRESENTED.with(|p| p.borrow_mut().take());
    found.unwrap_or_else(|e| error!("querylayer: binding lookup failed: {e}")).into_iter().flatten().collect()
}

/// Classifies a credential that failed to authenticate and appends an audit record for it.
/// Runs in its own transaction (the failed one rolled back). Records nothing for a live one.
pub fn record_failure(credential: Credential, fingerprint: &[u8], channel: &str) -> bool {
    refuse_if_established();
    // Stored in an append-only table from unauthenticated requests: a short name, nothing else.
    if !channel_well_formed(channel) {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "channel: 1 to 32 lowercase letters, digits and _.- are required (for example mcp or console)"
        );
    }
    let outcome = resolve(credential, fingerprint, false);
    clear();
    let Resolution::Dead { reason, subject, site } = outcome else {
        return false;
    };
    let detail = json!({
        "credential": credential.kind(),
        "reason": reason,
        "subject_id": subject.map(|u| u.to_string()),
        "subject_site_id": site.map(|u| u.to_string()),
        "channel": channel,
    });
    Spi::run_with_args("SELECT querylayer.audit_failed_authentication($1)", &[Jsonb(detail).into()])
        .unwrap_or_else(|e| error!("querylayer: could not record the failed authentication: {e}"));
    true
}

/// The channel of a failed authentication record: `[a-z][a-z0-9_.-]{0,31}`.
pub(crate) fn channel_well_formed(channel: &str) -> bool {
    let b = channel.as_bytes();
    (1..=32).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'.' | b'-'))
}

/// Ends every other backend that holds the credential's context (its shared lock), then takes
/// the lock alone, so that an authentication racing with the caller's change waits for it to
/// commit and then sees it. Called by revocations and by changes that narrow what a credential
/// may do (a permission withdrawn, a member's role changed). Returns how many backends it ended.
/// Only regular client backends of this database are signalled: nothing else takes the lock.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn end_credential_sessions(credential: Uuid) -> i32 {
    let key = lock_key(credential);
    let (hi, lo) = (pg_sys::Oid::from((key >> 32) as u32), pg_sys::Oid::from(key as u32));
    let mut ended = 0;
    for _ in 0..500 {
        let holders: Vec<i32> = Spi::connect(|client| {
            let rows = client.select(
                "SELECT l.pid FROM pg_catalog.pg_locks l
                  WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'::pg_catalog.text
                    AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                                            WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                    AND l.classid OPERATOR(pg_catalog.=) $1 AND l.objid OPERATOR(pg_catalog.=) $2
                    AND l.objsubid OPERATOR(pg_catalog.=) 1::pg_catalog.int2 AND l.granted
                    AND l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()",
                None,
                &[hi.into(), lo.into()],
            )?;
            rows.map(|r| r.get::<i32>(1)).collect::<Result<Vec<_>, _>>().map(|v| v.into_iter().flatten().collect())
        })
        .unwrap_or_else(|e| error!("querylayer: cannot list the sessions of credential {credential}: {e}"));
        for pid in holders {
            // SAFETY: BackendPidGetProc only reads the proc array. A regular backend of this
            // database (not a background worker) gets SIGTERM, as pg_terminate_backend sends.
            unsafe {
                let proc = pg_sys::BackendPidGetProc(pid);
                if !proc.is_null()
                    && !(*proc).isBackgroundWorker
                    && (*proc).databaseId == pg_sys::MyDatabaseId
                    && pid != pg_sys::MyProcPid
                {
                    if libc::kill(pid, libc::SIGTERM) == 0 {
                        ended += 1;
                    }
                }
            }
        }
        let locked =
            Spi::get_one_with_args::<bool>("SELECT pg_catalog.pg_try_advisory_xact_lock($1)", &[key.into()])
                .unwrap_or_else(|e| error!("querylayer: cannot lock credential {credential}: {e}"))
                .unwrap_or(false);
        if locked {
            return ended;
        }
        // The ended backends release the lock as they exit, within milliseconds.
        unsafe { pg_sys::pg_usleep(10_000) };
        check_for_interrupts!();
    }
    // Someone holds it without a backend to end (it cannot be a prepared transaction: those are
    // refused with a context). Wait for it, within statement_timeout.
    Spi::run_with_args("SELECT pg_catalog.pg_advisory_xact_lock($1)", &[key.into()])
        .unwrap_or_else(|e| error!("querylayer: cannot lock credential {credential}: {e}"));
    ended
}

#[pg_schema]
mod querylayer_api {
    use super::{authenticate as establish, record_failure, Credential};
    use crate::jsonb::Jsonb;
    use pgrx::prelude::*;

    /// Resolves a connection from the SHA-256 fingerprint of its secret and holds its context
    /// (organization, site, agent, connection, scopes, harness) until this transaction ends.
    /// SECURITY DEFINER: reads the private credential and connection tables.
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn authenticate(fingerprint: &[u8]) -> Jsonb {
        establish(Credential::Connection, fingerprint)
    }

    /// Resolves a member token the same way and holds the member's context for one site.
    /// SECURITY DEFINER: reads the private credential and member tables.
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn authenticate_member(fingerprint: &[u8]) -> Jsonb {
        establish(Credential::MemberToken, fingerprint)
    }

    /// Appends an audit record for a credential that just failed `authenticate` (which rolled
    /// its own transaction back). Returns false, recording nothing, for a live credential.
    /// SECURITY DEFINER: writes the private audit table.
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn record_failed_authentication(fingerprint: &[u8], channel: &str) -> bool {
        record_failure(Credential::Connection, fingerprint, channel)
    }

    /// The same for a member token.
    /// SECURITY DEFINER: writes the private audit table.
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn record_failed_member_authentication(fingerprint: &[u8], channel: &str) -> bool {
        record_failure(Credential::MemberToken, fingerprint, channel)
    }
}

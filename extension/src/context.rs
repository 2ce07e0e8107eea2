//! The request context: who is acting, for which site, with which scopes. It lives only in this
//! backend's memory, is set only by the Rust authentication paths below, and is dropped when the
//! transaction ends (commit or abort), so a pooled connection never carries it into the next one.
//! No GUC, table or argument that a caller controls can create or change it.

use pgrx::prelude::*;
use pgrx::{JsonB, Uuid};
use serde_json::{json, Value};
use std::cell::RefCell;

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
    /// delivery functions serve it (sql/160_delivery.sql).
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
    /// The dashboard session a member acts through (none for a member token).
    member_session_id: Option<Uuid>,
}

thread_local! {
    /// Saved SPI plans of the authentication queries: planned once per backend, not per call.
    static PLANS: RefCell<std::collections::HashMap<&'static str, std::rc::Rc<pgrx::spi::OwnedPreparedStatement>>> =
        RefCell::new(std::collections::HashMap::new());
    static CONTEXT: RefCell<Option<RequestContext>> = const { RefCell::new(None) };
    /// The fingerprint being resolved right now; row-level security on `credentials` shows only it.
    static PRESENTED: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Registers the end-of-transaction callback. Called from `_PG_init`.
pub fn init() {
    unsafe {
        pg_sys::RegisterXactCallback(Some(on_xact_event), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subxact_event), std::ptr::null_mut());
    }
}

/// A subtransaction that aborts (a caught error) drops the live-pointer mark it may have held.
#[pg_guard]
unsafe extern "C-unwind" fn on_subxact_event(
    event: pg_sys::SubXactEvent::Type,
    _sub: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        crate::lifecycle::clear();
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn on_xact_event(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
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

/// A resolving context for one site: its rows become visible, nothing is granted.
pub(crate) fn resolving(site: Uuid, organization: Uuid) {
    set(RequestContext {
        kind: Kind::Resolving,
        lxid: current_lxid(),
        site_id: Some(site),
        organization_id: Some(organization),
        agent_id: None,
        connection_id: None,
        member_id: None,
        member_role: None,
        scopes: Vec::new(),
        harness: None,
        member_session_id: None,
    });
}

/// A delivery context for one site (a public site read by nobody in particular).
pub(crate) fn delivering(site: Uuid, organization: Uuid) {
    set(RequestContext {
        kind: Kind::Delivery,
        lxid: current_lxid(),
        site_id: Some(site),
        organization_id: Some(organization),
        agent_id: None,
        connection_id: None,
        member_id: None,
        member_role: None,
        scopes: Vec::new(),
        harness: None,
        member_session_id: None,
    });
}

// ---------------------------------------------------------------------------------------------
// Readers. Row-level security policies and the governed SQL functions call these; they are
// granted to the owner role only.

#[pg_extern(stable, parallel_restricted)]
fn ctx_site_id() -> Option<Uuid> {
    with_context(|c| c.site_id).flatten()
}

#[pg_extern(stable, parallel_restricted)]
fn ctx_kind() -> Option<&'static str> {
    with_context(|c| c.kind.as_str())
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
    set(RequestContext {
        kind: Kind::Operator,
        lxid: current_lxid(),
        site_id: site,
        organization_id: None,
        agent_id: None,
        connection_id: None,
        member_id: None,
        member_role: None,
        scopes: Vec::new(),
        harness: None,
        member_session_id: None,
    });
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
    /// A dashboard session cookie (sql/155_dashboard.sql).
    MemberSession,
    /// A one-time invitation link's token.
    Invitation,
    /// A website's delivery token (sql/160_delivery.sql).
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
            Credential::Connection | Credential::DidKey => "SELECT querylayer.resolve_connection($1)",
            Credential::MemberToken => "SELECT querylayer.resolve_member_token($1)",
            Credential::MemberSession => "SELECT querylayer.resolve_member_session($1)",
            Credential::Invitation => "SELECT querylayer.resolve_invitation($1)",
            Credential::DeliveryToken => "SELECT querylayer.resolve_delivery_token($1)",
        }
    }
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

/// The saved plan of `sql` (one bytea or uuid parameter), prepared on first use.
fn plan(
    client: &pgrx::spi::SpiClient<'_>,
    sql: &'static str,
    arg: pg_sys::Oid,
) -> std::rc::Rc<pgrx::spi::OwnedPreparedStatement> {
    if let Some(p) = PLANS.with(|m| m.borrow().get(sql).cloned()) {
        return p;
    }
    let prepared = client
        .prepare(sql, &[pgrx::PgOid::from(arg)])
        .unwrap_or_else(|e| error!("querylayer: cannot prepare an authentication query: {e}"))
        .keep();
    let prepared = std::rc::Rc::new(prepared);
    PLANS.with(|m| m.borrow_mut().insert(sql, prepared.clone()));
    prepared
}

/// Looks the fingerprint up and asks SQL whether its subject is live. Leaves a `Resolving`
/// context behind; callers replace or clear it.
pub(crate) fn resolve(credential: Credential, fingerprint: &[u8]) -> Resolution {
    if fingerprint.len() != 32 {
        return Resolution::Dead { reason: "malformed".into(), subject: None, site: None };
    }
    PRESENTED.with(|p| *p.borrow_mut() = Some(fingerprint.to_vec()));
    let found: Option<(Uuid, Uuid, Uuid)> = Spi::connect(|client| {
        let lookup = plan(client, credential.lookup(), pg_sys::BYTEAOID);
        let rows = client.select(&*lookup, Some(1), &[fingerprint.into()])?;
        if rows.is_empty() {
            return Ok(None);
        }
        match rows.first().get_three::<Uuid, Uuid, Uuid>()? {
            (Some(subject), Some(site), Some(org)) => Ok::<_, pgrx::spi::Error>(Some((subject, site, org))),
            _ => Ok(None),
        }
    })
    .unwrap_or_else(|e| error!("querylayer: credential lookup failed: {e}"));
    PRESENTED.with(|p| p.borrow_mut().take());

    let Some((subject, site, organization)) = found else {
        return Resolution::Dead { reason: "unknown".into(), subject: None, site: None };
    };
    set(RequestContext {
        kind: Kind::Resolving,
        lxid: current_lxid(),
        site_id: Some(site),
        organization_id: Some(organization),
        agent_id: None,
        connection_id: None,
        member_id: None,
        member_role: None,
        scopes: Vec::new(),
        harness: None,
        member_session_id: None,
    });
    let verdict: Option<JsonB> = Spi::connect(|client| {
        let resolver = plan(client, credential.resolver(), pg_sys::UUIDOID);
        client.select(&*resolver, Some(1), &[subject.into()])?.first().get_one::<JsonB>()
    })
    .unwrap_or_else(|e| error!("querylayer: credential resolution failed: {e}"));
    let verdict = verdict.map(|j| j.0).unwrap_or(Value::Null);
    if verdict.get("ok").and_then(Value::as_bool) == Some(true) {
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
    let acting = with_context(|c| matches!(c.kind, Kind::Connection | Kind::Member)).unwrap_or(false);
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

pub fn authenticate(credential: Credential, fingerprint: &[u8]) -> JsonB {
    refuse_if_established();
    match resolve(credential, fingerprint) {
        Resolution::Live(v) => establish(credential, v),
        Resolution::Dead { reason, subject, .. } => authentication_failed(credential, &reason, subject),
    }
}

/// Holds the context a live resolution describes; returns it without the internal fields.
pub(crate) fn establish(credential: Credential, verdict: Value) -> JsonB {
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
        member_session_id: uuid_field(&verdict, "session_id"),
    });
    let mut public = verdict;
    if let Some(obj) = public.as_object_mut() {
        obj.remove("ok");
    }
    JsonB(public)
}

/// Whether a did:key is bound to a live connection, without disturbing the caller's context.
pub(crate) fn did_key_is_live(did_sha256: &[u8]) -> bool {
    let saved = CONTEXT.with(|c| c.borrow().clone());
    let live = matches!(resolve(Credential::DidKey, did_sha256), Resolution::Live(_));
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
    let outcome = resolve(credential, fingerprint);
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
    Spi::run_with_args("SELECT querylayer.audit_failed_authentication($1)", &[JsonB(detail).into()])
        .unwrap_or_else(|e| error!("querylayer: could not record the failed authentication: {e}"));
    true
}

#[pg_schema]
mod querylayer_api {
    use super::{authenticate as establish, record_failure, Credential};
    use pgrx::prelude::*;
    use pgrx::JsonB;

    /// Resolves a connection from the SHA-256 fingerprint of its secret and holds its context
    /// (organization, site, agent, connection, scopes, harness) until this transaction ends.
    /// SECURITY DEFINER: reads the private credential and connection tables.
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn authenticate(fingerprint: &[u8]) -> JsonB {
        establish(Credential::Connection, fingerprint)
    }

    /// Resolves a member token the same way and holds the member's context for one site.
    /// SECURITY DEFINER: reads the private credential and member tables.
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn authenticate_member(fingerprint: &[u8]) -> JsonB {
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

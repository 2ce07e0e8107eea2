//! Statements the row triggers run through SPI, each prepared once per backend and kept (the
//! plan cache revalidates a kept plan after DDL), and what a trigger function is handed.

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;

thread_local! {
    static PLANS: RefCell<HashMap<String, usize>> = RefCell::new(HashMap::new());
}

/// A value of a statement's parameter or result column.
#[derive(Clone, Copy)]
pub(crate) struct Arg {
    pub(crate) oid: pg_sys::Oid,
    pub(crate) datum: pg_sys::Datum,
    pub(crate) null: bool,
}

impl Arg {
    pub(crate) fn of<T: pgrx::IntoDatum>(value: T) -> Arg {
        let oid = T::type_oid();
        match value.into_datum() {
            Some(datum) => Arg { oid, datum, null: false },
            None => Arg { oid, datum: pg_sys::Datum::from(0), null: true },
        }
    }
}

/// Runs `sql` (whose every name is qualified, operators included: no search_path can answer for
/// any of them) with `args`, and hands the first row, if any, to `read` while SPI still holds
/// it. Must be called inside `Spi::connect`.
pub(crate) unsafe fn first_row<R>(
    sql: &str,
    args: &[Arg],
    read: impl FnOnce(pg_sys::HeapTuple, pg_sys::TupleDesc) -> R,
) -> Option<R> {
    execute(sql, args, 1);
    if pg_sys::SPI_processed == 0 || pg_sys::SPI_tuptable.is_null() {
        return None;
    }
    let table = pg_sys::SPI_tuptable;
    Some(read(*(*table).vals, (*table).tupdesc))
}

/// Every row of `sql`, each read by `read`, as `first_row` does one.
pub(crate) unsafe fn rows<R>(
    sql: &str,
    args: &[Arg],
    mut read: impl FnMut(pg_sys::HeapTuple, pg_sys::TupleDesc) -> R,
) -> Vec<R> {
    execute(sql, args, 0);
    if pg_sys::SPI_tuptable.is_null() {
        return Vec::new();
    }
    let table = pg_sys::SPI_tuptable;
    (0..pg_sys::SPI_processed as usize).map(|i| read(*(*table).vals.add(i), (*table).tupdesc)).collect()
}

/// Runs the kept plan of `sql` (prepared at its first use) with `args`, at most `limit` rows (0:
/// all).
unsafe fn execute(sql: &str, args: &[Arg], limit: i64) {
    let plan = match PLANS.with(|p| p.borrow().get(sql).copied()) {
        Some(p) => p as pg_sys::SPIPlanPtr,
        None => {
            let text = std::ffi::CString::new(sql).expect("no NUL in SQL text");
            let mut types: Vec<pg_sys::Oid> = args.iter().map(|a| a.oid).collect();
            let plan = pg_sys::SPI_prepare(text.as_ptr(), types.len() as i32, types.as_mut_ptr());
            if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
                error!("querylayer: cannot prepare a statement of the extension's C functions");
            }
            PLANS.with(|p| p.borrow_mut().insert(sql.to_string(), plan as usize));
            plan
        }
    };
    let mut values: Vec<pg_sys::Datum> = args.iter().map(|a| a.datum).collect();
    let nulls: Vec<std::ffi::c_char> =
        args.iter().map(|a| if a.null { b'n' } else { b' ' } as std::ffi::c_char).collect();
    let rc = pg_sys::SPI_execute_plan(plan, values.as_mut_ptr(), nulls.as_ptr(), false, limit);
    if rc < 0 {
        error!("querylayer: a statement of the extension's C functions failed (SPI code {rc})");
    }
}

/// Runs `run` (statements over the pending queue) with `enable_seqscan` off, as a function's `SET
/// enable_seqscan = off` clause would: the queue's heap and indexes keep the pages of every entry
/// sealed since the last vacuum (at c=8 on one site, about 2,000 a second), and their statistics
/// (a few live rows on many pages) make a sequential scan of every page look cheaper than an index
/// that reaches the entries from where the queue begins in two or three (docs/ledger.md, "The
/// queue is read by its index"). Restored when `run` returns, or by the (sub)transaction's abort
/// if it raises.
pub(crate) unsafe fn by_index<R>(run: impl FnOnce() -> R) -> R {
    let level = pg_sys::NewGUCNestLevel();
    pg_sys::set_config_option(
        c"enable_seqscan".as_ptr(),
        c"off".as_ptr(),
        pg_sys::GucContext::PGC_USERSET,
        pg_sys::GucSource::PGC_S_SESSION,
        pg_sys::GucAction::GUC_ACTION_SAVE,
        true,
        0,
        false,
    );
    let result = run();
    pg_sys::AtEOXact_GUC(true, level);
    result
}

/// Column `n` (1-based) of a row `first_row` handed over.
pub(crate) unsafe fn column<T: pgrx::FromDatum>(
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
    n: i32,
) -> Option<T> {
    let mut isnull = false;
    let datum = pg_sys::SPI_getbinval(tuple, desc, n, &mut isnull);
    T::from_datum(datum, isnull)
}

/// The trigger data of a call that must be a trigger's (`name` in the error otherwise).
pub(crate) unsafe fn trigger_data(fcinfo: pg_sys::FunctionCallInfo, name: &str) -> *mut pg_sys::TriggerData {
    if !pgrx::trigger_support::called_as_trigger(fcinfo) {
        error!("querylayer: {name} is a trigger function");
    }
    (*fcinfo).context as *mut pg_sys::TriggerData
}

/// A C function of the extension, `$name` as SQL declares it (`LANGUAGE c AS 'MODULE_PATHNAME',
/// '$name'`), with the version-1 calling convention (PG_FUNCTION_INFO_V1), whose body `$body`
/// runs under pgrx's guard and whose `Refusal` is raised with its own SQLSTATE (`raised`).
macro_rules! c_function {
    ($(#[$doc:meta])* $name:ident, $finfo:ident, $body:path) => {
        #[no_mangle]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static pgrx::pg_sys::Pg_finfo_record {
            const V1: pgrx::pg_sys::Pg_finfo_record = pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }

        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C-unwind" fn $name(fcinfo: pgrx::pg_sys::FunctionCallInfo) -> pgrx::pg_sys::Datum {
            crate::spi::raised(|| $body(fcinfo))
        }
    };
}
pub(crate) use c_function;

thread_local! {
    /// `to_jsonb` for values of each type, for the backend's life.
    static TO_JSONB: RefCell<HashMap<pg_sys::Oid, usize>> = RefCell::new(HashMap::new());
}

/// `to_jsonb` for values of type `type_oid` (a row type included): the function reads its
/// argument's type from the call's expression, so each type has a call of its own.
pub(crate) unsafe fn to_jsonb(type_oid: pg_sys::Oid) -> *mut pg_sys::FmgrInfo {
    if let Some(f) = TO_JSONB.with(|m| m.borrow().get(&type_oid).copied()) {
        return f as *mut pg_sys::FmgrInfo;
    }
    let old = pg_sys::MemoryContextSwitchTo(pg_sys::TopMemoryContext);
    let finfo = pg_sys::palloc0(std::mem::size_of::<pg_sys::FmgrInfo>()) as *mut pg_sys::FmgrInfo;
    pg_sys::fmgr_info_cxt(pg_sys::Oid::from(pg_sys::F_TO_JSONB), finfo, pg_sys::TopMemoryContext);
    let arg = pg_sys::makeNullConst(type_oid, -1, pg_sys::InvalidOid);
    (*finfo).fn_expr = pg_sys::makeFuncExpr(
        pg_sys::Oid::from(pg_sys::F_TO_JSONB),
        pg_sys::JSONBOID,
        pg_sys::lappend(std::ptr::null_mut(), arg.cast()),
        pg_sys::InvalidOid,
        pg_sys::InvalidOid,
        pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
    )
    .cast();
    pg_sys::MemoryContextSwitchTo(old);
    TO_JSONB.with(|m| m.borrow_mut().insert(type_oid, finfo as usize));
    finfo
}

/// A refusal a row trigger raises with its SQLSTATE. pgrx carries the errors it relays as its
/// own error codes, which have no room for the project's (QL413, QL422, …): a trigger returns
/// its refusal out of pgrx's guard instead, and `raised` raises it from there.
pub(crate) struct Refusal {
    pub(crate) sqlstate: &'static str,
    pub(crate) message: String,
    pub(crate) hint: Option<&'static str>,
}

/// Runs a C function's body under pgrx's guard (its panics and the PostgreSQL errors it meets
/// are raised as pgrx raises them) and raises the `Refusal` it returns with its own SQLSTATE.
pub(crate) unsafe fn raised(body: impl FnOnce() -> Result<pg_sys::Datum, Refusal>) -> pg_sys::Datum {
    match pg_sys::panic::pgrx_extern_c_guard(body) {
        Ok(datum) => datum,
        Err(refusal) => raise(refusal),
    }
}

unsafe fn raise(refusal: Refusal) -> ! {
    unsafe extern "C-unwind" {
        fn errstart(elevel: std::ffi::c_int, domain: *const std::ffi::c_char) -> bool;
        fn errcode(sqlerrcode: std::ffi::c_int) -> std::ffi::c_int;
        fn errmsg(fmt: *const std::ffi::c_char, ...) -> std::ffi::c_int;
        fn errhint(fmt: *const std::ffi::c_char, ...) -> std::ffi::c_int;
        fn errfinish(
            filename: *const std::ffi::c_char,
            lineno: std::ffi::c_int,
            funcname: *const std::ffi::c_char,
        );
    }
    let code = refusal.sqlstate.as_bytes();
    let sixbit = |c: u8| ((c.wrapping_sub(b'0')) & 0x3f) as std::ffi::c_int;
    let sqlstate = sixbit(code[0])
        + (sixbit(code[1]) << 6)
        + (sixbit(code[2]) << 12)
        + (sixbit(code[3]) << 18)
        + (sixbit(code[4]) << 24);
    // Copies in PostgreSQL's memory, then nothing of Rust's is left to drop when errfinish jumps.
    let copy = |s: &str| {
        let c = std::ffi::CString::new(s.replace('\0', "")).expect("no NUL left");
        pg_sys::pstrdup(c.as_ptr())
    };
    let message = copy(&refusal.message);
    let hint = refusal.hint.map(copy).unwrap_or(std::ptr::null_mut());
    drop(refusal);
    if errstart(pgrx::PgLogLevel::ERROR as std::ffi::c_int, std::ptr::null()) {
        errcode(sqlstate);
        errmsg(c"%s".as_ptr(), message);
        if !hint.is_null() {
            errhint(c"%s".as_ptr(), hint);
        }
        errfinish(c"querylayer".as_ptr(), 0, c"row trigger".as_ptr());
    }
    unreachable!("an ERROR does not return")
}

//! `querylayer.enforce_value_limits()`: the first row trigger of every table that agents and
//! members fill (sql/150_limits.sql says what it does: each limited column's value, measured as
//! its caller sent it, against `querylayer.value_limits`, QL413 naming the argument). It was
//! PL/pgSQL, which turned the whole row into jsonb to read one or two columns of it; in C it
//! keeps each table's limits (catalogs.rs says when it lets go of them) and measures only the
//! limited columns.

use crate::catalogs::Kept;
use crate::spi::{trigger_data, Refusal};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::ffi::CStr;

#[derive(Clone)]
struct Limit {
    attnum: i32,
    type_oid: pg_sys::Oid,
    argument: String,
    max_bytes: i32,
}

thread_local! {
    static LIMITS: RefCell<Kept<std::rc::Rc<Vec<Limit>>>> = RefCell::new(Kept::default());
}

unsafe fn limits(rel: pg_sys::Relation) -> std::rc::Rc<Vec<Limit>> {
    let relid = (*rel).rd_id;
    let desc = (*rel).rd_att;
    let table = CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr()).to_string_lossy().into_owned();
    LIMITS.with(|l| {
        l.borrow_mut().get(relid, || {
            let rows: Vec<(String, String, i32)> = Spi::connect(|client| {
                client
                    .select(
                        "SELECT l.column_name, l.argument, l.max_bytes FROM querylayer.value_limits l
                          WHERE l.table_name OPERATOR(pg_catalog.=) $1 ORDER BY l.column_name",
                        None,
                        &[table.as_str().into()],
                    )?
                    .map(|r| {
                        Ok((
                            r.get::<String>(1)?.unwrap_or_default(),
                            r.get::<String>(2)?.unwrap_or_default(),
                            r.get::<i32>(3)?.unwrap_or(0),
                        ))
                    })
                    .collect::<Result<Vec<_>, pgrx::spi::Error>>()
            })
            .unwrap_or_else(|e| error!("querylayer: reading the value limits of {table} failed: {e}"));
            let limits = rows
                .into_iter()
                .map(|(name, argument, max_bytes)| {
                    let cname = std::ffi::CString::new(name.clone()).expect("a column name has no NUL");
                    let attnum = pg_sys::SPI_fnumber(desc, cname.as_ptr());
                    if attnum <= 0 {
                        error!("querylayer: value_limits names {table}.{name}, which does not exist");
                    }
                    let type_oid = (*(*desc).attrs.as_ptr().add(attnum as usize - 1)).atttypid;
                    Limit { attnum, type_oid, argument, max_bytes }
                })
                .collect();
            std::rc::Rc::new(limits)
        })
    })
}

/// The size of a value as its caller sent it (querylayer.value_bytes of its jsonb): a string's
/// bytes, nothing for null, any other value's JSON text.
unsafe fn size(datum: Option<pg_sys::Datum>, type_oid: pg_sys::Oid) -> i64 {
    let Some(datum) = datum else { return 0 };
    if type_oid == pg_sys::TEXTOID || type_oid == pg_sys::VARCHAROID {
        let v = pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr());
        return pgrx::varsize_any_exhdr(v) as i64;
    }
    let jsonb = if type_oid == pg_sys::JSONBOID {
        datum
    } else {
        pg_sys::FunctionCall1Coll(crate::spi::to_jsonb(type_oid), pg_sys::InvalidOid, datum)
    };
    let j = pg_sys::pg_detoast_datum(jsonb.cast_mut_ptr()) as *mut pg_sys::Jsonb;
    let root = &mut (*j).root;
    // A scalar is a one-element "raw scalar" array.
    let header = root.header;
    if header & pg_sys::JB_FSCALAR != 0 {
        let mut v: pg_sys::JsonbValue = std::mem::zeroed();
        let mut it = pg_sys::JsonbIteratorInit(root);
        pg_sys::JsonbIteratorNext(&mut it, &mut v, true); // the array
        pg_sys::JsonbIteratorNext(&mut it, &mut v, true); // its element
        match v.type_ {
            pg_sys::jbvType::jbvString => return v.val.string.len as i64,
            pg_sys::jbvType::jbvNull => return 0,
            _ => {}
        }
    }
    let text = pgrx::direct_function_call_as_datum(pg_sys::jsonb_out, &[Some(pg_sys::Datum::from(j))])
        .expect("jsonb's text");
    CStr::from_ptr(text.cast_mut_ptr()).to_bytes().len() as i64
}

crate::spi::c_function!(
    /// The trigger itself (sql/150_limits.sql declares it).
    enforce_value_limits,
    pg_finfo_enforce_value_limits,
    enforce
);

unsafe fn enforce(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    let trigger = trigger_data(fcinfo, "enforce_value_limits");
    let event = (*trigger).tg_event;
    let insert = event & pg_sys::TRIGGER_EVENT_OPMASK == pg_sys::TRIGGER_EVENT_INSERT;
    let update = event & pg_sys::TRIGGER_EVENT_OPMASK == pg_sys::TRIGGER_EVENT_UPDATE;
    if !(insert || update)
        || event & pg_sys::TRIGGER_EVENT_ROW == 0
        || event & pg_sys::TRIGGER_EVENT_BEFORE == 0
    {
        error!("querylayer: enforce_value_limits fires before each inserted or updated row");
    }
    let tuple = if insert { (*trigger).tg_trigtuple } else { (*trigger).tg_newtuple };
    // A restore brings rows back as they were dumped, even one stored before its limit existed.
    if insert
        && pg_sys::SessionReplicationRole == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32
        && Spi::get_one::<bool>("SELECT querylayer.restoring()").ok().flatten() == Some(true)
    {
        return Ok(pg_sys::Datum::from(tuple));
    }
    let rel = (*trigger).tg_relation;
    let desc = (*rel).rd_att;
    for limit in limits(rel).iter() {
        let mut isnull = false;
        let datum = pg_sys::heap_getattr(tuple, limit.attnum, desc, &mut isnull);
        let bytes = size((!isnull).then_some(datum), limit.type_oid);
        if bytes > limit.max_bytes as i64 {
            return Err(Refusal {
                sqlstate: "QL413",
                message: format!(
                    "{} is too large: {bytes} bytes, at most {} are stored",
                    limit.argument, limit.max_bytes
                ),
                hint: Some("store a reference (a URL, a content id, an artifact key) to larger material"),
            });
        }
    }
    Ok(pg_sys::Datum::from(tuple))
}

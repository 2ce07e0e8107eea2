//! `querylayer.chain_append()`: the insert trigger of every chained table (sql/020_ledger.sql
//! says what it does: the record's canonical form, its content hash, and its link to the site's
//! head, now or, when another writer holds the head, later by the sealer). It was PL/pgSQL; in C
//! it keeps, per table, the newest form and what the form leaves out (catalogs.rs says when it
//! lets go of them), builds the canonical text with the very routines the SQL called (to_jsonb,
//! jsonb - text[], jsonb's text, with the same settings), and runs two kept statements a record
//! where the SQL ran five: half of what a chained insert cost (docs/performance.md, "Row
//! triggers in C").

use crate::catalogs::Kept;
use crate::spi::{by_index, column, first_row, trigger_data, Arg, Refusal};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{IntoDatum, Uuid};
use sha2::{Digest, Sha256};
use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::CStr;

/// What the trigger keeps of a chained table.
#[derive(Clone)]
struct Table {
    /// `schema.table`, as `format('%I.%I', …)` writes it (ledger_forms, ledger_pending).
    name: String,
    form: i16,
    /// The columns its newest form does not hash.
    left_out: Vec<String>,
    attnums: Attnums,
}

#[derive(Clone, Copy)]
struct Attnums {
    id: i32,
    site_id: i32,
    ledger_form: i32,
    chain_seq: i32,
    prev_sha256: i32,
    content_sha256: i32,
    record_sha256: i32,
}

thread_local! {
    static TABLES: RefCell<Kept<Table>> = RefCell::new(Kept::default());
    /// The sites whose head this transaction holds (it took the row lock in this transaction
    /// and no subtransaction that took it has aborted since): (local transaction, sites).
    static HELD: RefCell<(u32, HashSet<Uuid>)> = RefCell::new((0, HashSet::new()));
}

/// Forgets the heads held: at the end of every transaction and subtransaction abort.
pub fn clear() {
    HELD.with(|h| h.borrow_mut().1.clear());
}

fn current_lxid() -> u32 {
    // SAFETY: MyProc is set for every regular backend before any SQL function can run.
    unsafe { (*pg_sys::MyProc).lxid }
}

fn holds_head(site: Uuid) -> bool {
    HELD.with(|h| {
        let h = h.borrow();
        h.0 == current_lxid() && h.1.contains(&site)
    })
}

fn took_head(site: Uuid) {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        let lxid = current_lxid();
        if h.0 != lxid {
            *h = (lxid, HashSet::new());
        }
        h.1.insert(site);
    });
}

unsafe fn table(rel: pg_sys::Relation) -> Result<Table, Refusal> {
    let relid = (*rel).rd_id;
    let desc = (*rel).rd_att;
    TABLES.with(|t| t.borrow_mut().try_get(relid, || load(relid, desc)))
}

unsafe fn load(relid: pg_sys::Oid, desc: pg_sys::TupleDesc) -> Result<Table, Refusal> {
    let (name, form) = Spi::connect(|_| {
        let name: String = first_row(
            "SELECT pg_catalog.format('%I.%I', n.nspname, c.relname)
               FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
              WHERE c.oid OPERATOR(pg_catalog.=) $1",
            &[Arg::of(relid)],
            |t, d| column::<String>(t, d, 1),
        )
        .flatten()
        .expect("a chained table has a name");
        let form = first_row(
            "SELECT f.form, f.fields FROM querylayer.ledger_forms f
              WHERE f.table_name OPERATOR(pg_catalog.=) $1 ORDER BY f.form DESC LIMIT 1",
            &[Arg::of(name.clone())],
            |t, d| (column::<i16>(t, d, 1), column::<Vec<String>>(t, d, 2)),
        );
        Ok::<_, pgrx::spi::Error>((name, form))
    })
    .unwrap_or_else(|e| error!("querylayer: reading a chained table's form failed: {e}"));
    let Some((Some(form), Some(fields))) = form else {
        // As querylayer.newest_ledger_form refuses it.
        return Err(Refusal {
            sqlstate: "QL422",
            message: format!("{name} has no ledger form"),
            hint: Some("make_chained registers form 1; querylayer.add_ledger_form registers the next"),
        });
    };
    let mut left_out = Vec::new();
    for i in 0..(*desc).natts as usize {
        let att = (*desc).attrs.as_ptr().add(i);
        if (*att).attisdropped {
            continue;
        }
        let column = CStr::from_ptr((*att).attname.data.as_ptr()).to_string_lossy().into_owned();
        if !fields.contains(&column) {
            left_out.push(column);
        }
    }
    let attnum = |column: &CStr| {
        let n = pg_sys::SPI_fnumber(desc, column.as_ptr());
        if n <= 0 {
            error!("querylayer: {name} lacks the chain column {column:?}");
        }
        n
    };
    let attnums = Attnums {
        id: attnum(c"id"),
        site_id: attnum(c"site_id"),
        ledger_form: attnum(c"ledger_form"),
        chain_seq: attnum(c"chain_seq"),
        prev_sha256: attnum(c"prev_sha256"),
        content_sha256: attnum(c"content_sha256"),
        record_sha256: attnum(c"record_sha256"),
    };
    Ok(Table { name, form, left_out, attnums })
}

/// The settings the canonical text is written under (the SQL trigger's SET clauses): timestamps
/// in UTC, intervals, bytea in hex, floats as they were.
const CANONICAL_SETTINGS: [(&CStr, &CStr); 4] = [
    (c"TimeZone", c"UTC"),
    (c"IntervalStyle", c"postgres"),
    (c"bytea_output", c"hex"),
    (c"extra_float_digits", c"1"),
];

/// The SHA-256 of the canonical form of `tuple`: `(to_jsonb(row) - <the columns the form does not
/// hash>)::text`, UTF-8, under `CANONICAL_SETTINGS`.
unsafe fn content_sha256(rel: pg_sys::Relation, tuple: pg_sys::HeapTuple, t: &Table) -> [u8; 32] {
    let desc = (*rel).rd_att;
    let mut level = None;
    for (name, value) in CANONICAL_SETTINGS {
        let current = pg_sys::GetConfigOption(name.as_ptr(), false, false);
        if current.is_null() || CStr::from_ptr(current) != value {
            level.get_or_insert_with(|| pg_sys::NewGUCNestLevel());
            pg_sys::set_config_option(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
        }
    }
    let row = pg_sys::heap_copy_tuple_as_datum(tuple, desc);
    let mut jsonb =
        pg_sys::FunctionCall1Coll(crate::spi::to_jsonb((*(*rel).rd_rel).reltype), pg_sys::InvalidOid, row);
    if !t.left_out.is_empty() {
        let mut keys: Vec<pg_sys::Datum> = t
            .left_out
            .iter()
            .map(|c| pg_sys::Datum::from(pg_sys::cstring_to_text_with_len(c.as_ptr().cast(), c.len() as i32)))
            .collect();
        let array = pg_sys::construct_array(
            keys.as_mut_ptr(),
            keys.len() as i32,
            pg_sys::TEXTOID,
            -1,
            false,
            pg_sys::TYPALIGN_INT as std::ffi::c_char,
        );
        jsonb = pgrx::direct_function_call_as_datum(
            pg_sys::jsonb_delete_array,
            &[Some(jsonb), Some(pg_sys::Datum::from(array))],
        )
        .expect("jsonb - text[] returns a value");
    }
    let text = pgrx::direct_function_call_as_datum(pg_sys::jsonb_out, &[Some(jsonb)]).expect("jsonb's text");
    if let Some(nest) = level {
        pg_sys::AtEOXact_GUC(true, nest);
    }
    let cstr = text.cast_mut_ptr::<std::ffi::c_char>();
    let len = CStr::from_ptr(cstr).to_bytes().len();
    let utf8 = if pg_sys::GetDatabaseEncoding() == pg_sys::pg_enc::PG_UTF8 as i32 {
        cstr
    } else {
        pg_sys::pg_server_to_any(cstr, len as i32, pg_sys::pg_enc::PG_UTF8 as i32)
    };
    Sha256::digest(CStr::from_ptr(utf8).to_bytes()).into()
}

unsafe fn attribute(tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc, attnum: i32) -> Option<pg_sys::Datum> {
    let mut isnull = false;
    let datum = pg_sys::heap_getattr(tuple, attnum, desc, &mut isnull);
    (!isnull).then_some(datum)
}

unsafe fn bytes(datum: Option<pg_sys::Datum>) -> Option<Vec<u8>> {
    datum.and_then(|d| <Vec<u8> as pgrx::FromDatum>::from_datum(d, false))
}

/// A restored record (a superuser's pg_restore in replica mode) keeps the chain it was dumped
/// with, and must carry it whole and linked (verify_ledger proves it against the heads).
unsafe fn check_restored(
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
    t: &Table,
) -> Result<(), Refusal> {
    let a = &t.attnums;
    let content = bytes(attribute(tuple, desc, a.content_sha256));
    let seq = attribute(tuple, desc, a.chain_seq);
    let prev = bytes(attribute(tuple, desc, a.prev_sha256));
    let record = bytes(attribute(tuple, desc, a.record_sha256));
    let linked = match (&prev, &content, &record) {
        (Some(p), Some(c), Some(r)) => {
            Sha256::new().chain_update(p).chain_update(c).finalize().as_slice() == r.as_slice()
        }
        (None, Some(_), None) => true,
        _ => false,
    };
    if content.is_none()
        || attribute(tuple, desc, a.ledger_form).is_none()
        || seq.is_some() != record.is_some()
        || seq.is_some() != prev.is_some()
        || !linked
    {
        return Err(Refusal {
            sqlstate: "QL423",
            message: format!("a restored record of {} must carry its chain columns, linked", t.name),
            hint: None,
        });
    }
    Ok(())
}

crate::spi::c_function!(
    /// The trigger itself (sql/020_ledger.sql declares it).
    chain_append,
    pg_finfo_chain_append,
    append
);

unsafe fn append(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    let trigger = trigger_data(fcinfo, "chain_append");
    let event = (*trigger).tg_event;
    if event & pg_sys::TRIGGER_EVENT_OPMASK != pg_sys::TRIGGER_EVENT_INSERT
        || event & pg_sys::TRIGGER_EVENT_ROW == 0
        || event & pg_sys::TRIGGER_EVENT_BEFORE == 0
    {
        error!("querylayer: chain_append fires before each inserted row");
    }
    let rel = (*trigger).tg_relation;
    let desc = (*rel).rd_att;
    let tuple = (*trigger).tg_trigtuple;
    let t = table(rel)?;

    if pg_sys::SessionReplicationRole == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32
        && Spi::get_one::<bool>("SELECT querylayer.restoring()").ok().flatten() == Some(true)
    {
        check_restored(tuple, desc, &t)?;
        return Ok(pg_sys::Datum::from(tuple));
    }

    let content = content_sha256(rel, tuple, &t);
    let site = attribute(tuple, desc, t.attnums.site_id)
        .and_then(|d| <Uuid as pgrx::FromDatum>::from_datum(d, false))
        .unwrap_or_else(|| error!("querylayer: a chained record of {} has no site", t.name));
    let id = attribute(tuple, desc, t.attnums.id)
        .and_then(|d| <Uuid as pgrx::FromDatum>::from_datum(d, false))
        .unwrap_or_else(|| error!("querylayer: a chained record of {} has no id", t.name));

    // The head, if nobody else holds it (this transaction may already): then what others left
    // pending and have committed is sealed first, and this record is linked now.
    let bounded = crate::ledger::queue_bounded();
    let link: Result<Option<(i64, Vec<u8>, Vec<u8>)>, Refusal> = Spi::connect(|_| {
        let site_arg = Arg::of(site);
        let cluster = Arg::of(crate::ledger::cluster());
        // Whether anything waits in the queue, read from where it begins (sql/020_ledger.sql,
        // ledger_heads: the dead entries before that are never walked).
        let pending = if holds_head(site) {
            by_index(|| first_row(
                if bounded {
                    concat!(
                        "SELECT EXISTS (SELECT 1 FROM querylayer.ledger_heads h, querylayer.ledger_pending p
                          WHERE h.site_id OPERATOR(pg_catalog.=) $1 AND p.site_id OPERATOR(pg_catalog.=) $1
                            AND p.xact OPERATOR(pg_catalog.>=) ",
                        crate::ledger::pending_from!(),
                        ")"
                    )
                } else {
                    "SELECT EXISTS (SELECT 1 FROM querylayer.ledger_pending p WHERE p.site_id OPERATOR(pg_catalog.=) $1)"
                },
                &[site_arg, cluster],
                |t, d| column::<bool>(t, d, 1),
            ))
            .flatten()
            .unwrap_or(false)
        } else {
            let taken = by_index(|| first_row(
                // The head is taken first (the CTE), and only a head taken is looked behind: a
                // row's SKIP LOCKED is decided above the scan that computes its select list, so
                // an EXISTS beside it would read the pending queue for every record that finds
                // the head held, which under concurrency is nearly all.
                if bounded {
                    concat!(
                        "WITH h AS MATERIALIZED (
                             SELECT h.site_id, ",
                        crate::ledger::pending_from!(),
                        " AS pending_from FROM querylayer.ledger_heads h WHERE h.site_id OPERATOR(pg_catalog.=) $1
                                FOR NO KEY UPDATE OF h SKIP LOCKED)
                         SELECT EXISTS (SELECT 1 FROM querylayer.ledger_pending p WHERE p.site_id OPERATOR(pg_catalog.=) h.site_id
                                           AND p.xact OPERATOR(pg_catalog.>=) h.pending_from)
                           FROM h"
                    )
                } else {
                    "WITH h AS MATERIALIZED (
                         SELECT h.site_id FROM querylayer.ledger_heads h WHERE h.site_id OPERATOR(pg_catalog.=) $1
                            FOR NO KEY UPDATE OF h SKIP LOCKED)
                     SELECT EXISTS (SELECT 1 FROM querylayer.ledger_pending p WHERE p.site_id OPERATOR(pg_catalog.=) h.site_id)
                       FROM h"
                },
                &[site_arg, cluster],
                |t, d| column::<bool>(t, d, 1),
            ));
            let Some(pending) = taken else {
                let exists = first_row(
                    "SELECT true FROM querylayer.ledger_heads h WHERE h.site_id OPERATOR(pg_catalog.=) $1",
                    &[site_arg],
                    |_, _| true,
                )
                .is_some();
                if !exists {
                    return Ok(Err(Refusal { sqlstate: "QL404", message: format!("site {site} has no ledger"), hint: None }));
                }
                // Another transaction holds it: no waiting; the record is sealed after this one
                // commits.
                first_row(
                    "INSERT INTO querylayer.ledger_pending (site_id, table_name, record_id) VALUES ($1, $2, $3)",
                    &[site_arg, Arg::of(t.name.clone()), Arg::of(id)],
                    |_, _| (),
                );
                return Ok::<_, pgrx::spi::Error>(Ok(None));
            };
            took_head(site);
            pending.unwrap_or(false)
        };
        if pending {
            first_row(
                "SELECT querylayer.seal_now($1, querylayer.seal_batch(), false)",
                &[site_arg],
                |_, _| (),
            );
        }
        let advanced = first_row(
            "UPDATE querylayer.ledger_heads h
                SET seq = h.seq OPERATOR(pg_catalog.+) 1, prev = h.head,
                    head = pg_catalog.sha256(h.head OPERATOR(pg_catalog.||) $2)
              WHERE h.site_id OPERATOR(pg_catalog.=) $1
             RETURNING h.seq, h.prev, h.head",
            &[site_arg, Arg::of(content.to_vec())],
            |t, d| (column::<i64>(t, d, 1), column::<Vec<u8>>(t, d, 2), column::<Vec<u8>>(t, d, 3)),
        );
        match advanced {
            Some((Some(seq), Some(prev), Some(head))) => Ok(Ok(Some((seq, prev, head)))),
            _ => error!("querylayer: the head of site {site} did not advance"),
        }
    })
    .unwrap_or_else(|e| error!("querylayer: linking a record of {} failed: {e}", t.name));
    let link = link?;

    let a = &t.attnums;
    let mut columns = [a.ledger_form, a.content_sha256, a.chain_seq, a.prev_sha256, a.record_sha256];
    let (seq, prev, record) = match &link {
        Some((seq, prev, head)) => (seq.into_datum(), prev.clone().into_datum(), head.clone().into_datum()),
        None => (None, None, None),
    };
    let mut values = [
        t.form.into_datum().expect("int2"),
        content.to_vec().into_datum().expect("bytea"),
        seq.unwrap_or(pg_sys::Datum::from(0)),
        prev.unwrap_or(pg_sys::Datum::from(0)),
        record.unwrap_or(pg_sys::Datum::from(0)),
    ];
    let pending = link.is_none();
    let mut nulls = [false, false, pending, pending, pending];
    let modified = pg_sys::heap_modify_tuple_by_cols(
        tuple,
        desc,
        columns.len() as i32,
        columns.as_mut_ptr(),
        values.as_mut_ptr(),
        nulls.as_mut_ptr(),
    );
    Ok(pg_sys::Datum::from(modified))
}

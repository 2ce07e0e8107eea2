//! `jsonb` to and from `serde_json::Value` without text in between. pgrx's own `JsonB` writes a
//! value out as text and has PostgreSQL parse it again (`jsonb_in`), and reads one by printing
//! it (`jsonb_out`) and parsing the text with serde: an answer's envelope, a semantic model or a
//! request context went through a JSON parser once more at every call (docs/performance.md,
//! "jsonb without text"). `Jsonb` builds the binary value with PostgreSQL's own `pushJsonbValue`
//! (the routine `jsonb_in` ends in) and reads it with its iterator, so what it makes is the very
//! value `jsonb_in` would have made of serde's text, and what it reads is what serde would have
//! read from `jsonb_out`'s (pg_tests/jsonb.rs holds the two paths to each other).

use pgrx::pg_sys;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::prelude::*;
use pgrx::{FromDatum, IntoDatum};
use serde_json::{Map, Number, Value};

/// A `jsonb` value, converted to and from binary `jsonb` directly.
#[derive(Debug, Clone, PartialEq)]
pub struct Jsonb(pub Value);

/// The `jsonb` datum of `value`: what `jsonb_in` makes of `serde_json::to_string(value)`.
pub fn to_datum(value: &Value) -> pg_sys::Datum {
    // SAFETY: the parse state and the values pushed live in the current memory context until
    // JsonbValueToJsonb has copied them into the result; the strings they point at are borrowed
    // from `value`, which outlives the call.
    unsafe {
        let mut state: *mut pg_sys::JsonbParseState = std::ptr::null_mut();
        let root = match value {
            Value::Object(_) | Value::Array(_) => {
                push(&mut state, value, pg_sys::JsonbIteratorToken::WJB_ELEM)
            }
            scalar => {
                // A scalar is stored as a one-element "raw scalar" array, as jsonb_in stores it.
                let mut array: pg_sys::JsonbValue = std::mem::zeroed();
                array.type_ = pg_sys::jbvType::jbvArray;
                array.val.array.rawScalar = true;
                array.val.array.nElems = 1;
                pg_sys::pushJsonbValue(&mut state, pg_sys::JsonbIteratorToken::WJB_BEGIN_ARRAY, &mut array);
                push(&mut state, scalar, pg_sys::JsonbIteratorToken::WJB_ELEM);
                pg_sys::pushJsonbValue(
                    &mut state,
                    pg_sys::JsonbIteratorToken::WJB_END_ARRAY,
                    std::ptr::null_mut(),
                )
            }
        };
        pg_sys::Datum::from(pg_sys::JsonbValueToJsonb(root))
    }
}

/// Pushes `value` (as an element or an object's value, `token`), returns the closed container.
unsafe fn push(
    state: &mut *mut pg_sys::JsonbParseState,
    value: &Value,
    token: pg_sys::JsonbIteratorToken::Type,
) -> *mut pg_sys::JsonbValue {
    use pg_sys::JsonbIteratorToken::*;
    match value {
        Value::Object(map) => {
            pg_sys::pushJsonbValue(state, WJB_BEGIN_OBJECT, std::ptr::null_mut());
            for (key, item) in map {
                let mut k = string(key);
                pg_sys::pushJsonbValue(state, WJB_KEY, &mut k);
                push(state, item, WJB_VALUE);
            }
            pg_sys::pushJsonbValue(state, WJB_END_OBJECT, std::ptr::null_mut())
        }
        Value::Array(items) => {
            pg_sys::pushJsonbValue(state, WJB_BEGIN_ARRAY, std::ptr::null_mut());
            for item in items {
                push(state, item, WJB_ELEM);
            }
            pg_sys::pushJsonbValue(state, WJB_END_ARRAY, std::ptr::null_mut())
        }
        scalar => {
            let mut v: pg_sys::JsonbValue = std::mem::zeroed();
            match scalar {
                Value::Null => v.type_ = pg_sys::jbvType::jbvNull,
                Value::Bool(b) => {
                    v.type_ = pg_sys::jbvType::jbvBool;
                    v.val.boolean = *b;
                }
                Value::Number(n) => {
                    v.type_ = pg_sys::jbvType::jbvNumeric;
                    v.val.numeric = numeric(n);
                }
                Value::String(s) => v = string(s),
                Value::Object(_) | Value::Array(_) => unreachable!("containers are pushed above"),
            }
            pg_sys::pushJsonbValue(state, token, &mut v)
        }
    }
}

/// A string value pointing at `s`, refused as `jsonb_in` refuses `\u0000`.
unsafe fn string(s: &str) -> pg_sys::JsonbValue {
    if s.as_bytes().contains(&0) {
        pgrx::pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_UNTRANSLATABLE_CHARACTER,
            "unsupported Unicode escape sequence",
            "querylayer",
        )
        .set_detail("\\u0000 cannot be converted to text.")
        .report(pgrx::PgLogLevel::ERROR);
    }
    let mut v: pg_sys::JsonbValue = std::mem::zeroed();
    v.type_ = pg_sys::jbvType::jbvString;
    v.val.string.len = s.len() as i32;
    v.val.string.val = s.as_ptr() as *mut std::ffi::c_char;
    v
}

/// The numeric `numeric_in` makes of the number's JSON text.
unsafe fn numeric(n: &Number) -> pg_sys::Numeric {
    if let Some(i) = n.as_i64() {
        return pg_sys::int64_to_numeric(i);
    }
    let text = std::ffi::CString::new(n.to_string()).expect("a number's text has no NUL");
    let datum = pgrx::direct_function_call_as_datum(
        pg_sys::numeric_in,
        &[
            Some(pg_sys::Datum::from(text.as_ptr())),
            Some(pg_sys::Datum::from(pg_sys::InvalidOid)),
            Some(pg_sys::Datum::from(-1i32)),
        ],
    )
    .expect("numeric_in returns a numeric");
    datum.cast_mut_ptr()
}

/// The value of a `jsonb` datum: what serde reads from `jsonb_out`'s text of it.
///
/// # Safety
/// `datum` is a non-NULL `jsonb` datum.
pub unsafe fn from_datum(datum: pg_sys::Datum) -> Value {
    use pg_sys::JsonbIteratorToken::*;
    let jsonb = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *mut pg_sys::Jsonb;
    let mut it = pg_sys::JsonbIteratorInit(&mut (*jsonb).root);
    let mut v: pg_sys::JsonbValue = std::mem::zeroed();
    // Open containers, innermost last, each with the key its value waits for.
    let mut open: Vec<(Value, Option<String>)> = Vec::new();
    let mut key: Option<String> = None;
    let mut done: Option<Value> = None;
    let mut raw_scalar = false;
    loop {
        let token = pg_sys::JsonbIteratorNext(&mut it, &mut v, false);
        let finished = match token {
            WJB_DONE => break,
            WJB_BEGIN_OBJECT => {
                open.push((Value::Object(Map::new()), key.take()));
                None
            }
            WJB_BEGIN_ARRAY => {
                if v.val.array.rawScalar {
                    raw_scalar = true;
                } else {
                    open.push((Value::Array(Vec::new()), key.take()));
                }
                None
            }
            WJB_KEY => {
                key = Some(text(&v));
                None
            }
            WJB_VALUE | WJB_ELEM => Some((scalar(&v), key.take())),
            WJB_END_OBJECT | WJB_END_ARRAY => {
                if token == WJB_END_ARRAY && raw_scalar && open.is_empty() {
                    None
                } else {
                    open.pop()
                }
            }
            other => error!("querylayer: unexpected jsonb iterator token {other}"),
        };
        let Some((value, its_key)) = finished else { continue };
        match open.last_mut() {
            Some((Value::Object(map), _)) => {
                map.insert(its_key.expect("an object's value follows its key"), value);
            }
            Some((Value::Array(items), _)) => items.push(value),
            Some(_) => unreachable!("only containers are open"),
            None => done = Some(value),
        }
    }
    if jsonb as *mut std::ffi::c_void != datum.cast_mut_ptr::<std::ffi::c_void>() {
        pg_sys::pfree(jsonb.cast());
    }
    done.unwrap_or(Value::Null)
}

unsafe fn text(v: &pg_sys::JsonbValue) -> String {
    let bytes = std::slice::from_raw_parts(v.val.string.val as *const u8, v.val.string.len as usize);
    String::from_utf8(bytes.to_vec())
        .unwrap_or_else(|_| error!("querylayer: a jsonb string is not valid UTF-8"))
}

unsafe fn scalar(v: &pg_sys::JsonbValue) -> Value {
    match v.type_ {
        pg_sys::jbvType::jbvNull => Value::Null,
        pg_sys::jbvType::jbvBool => Value::Bool(v.val.boolean),
        pg_sys::jbvType::jbvString => Value::String(text(v)),
        pg_sys::jbvType::jbvNumeric => {
            let out = pgrx::direct_function_call::<&std::ffi::CStr>(
                pg_sys::numeric_out,
                &[Some(pg_sys::Datum::from(v.val.numeric))],
            )
            .expect("numeric_out returns text");
            let number = serde_json::from_str::<Number>(out.to_str().expect("a number's text is ASCII"))
                .unwrap_or_else(|e| error!("querylayer: jsonb number {out:?} is out of range: {e}"));
            pg_sys::pfree(out.as_ptr() as *mut std::ffi::c_void);
            Value::Number(number)
        }
        other => error!("querylayer: unexpected jsonb scalar type {other}"),
    }
}

impl FromDatum for Jsonb {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Jsonb> {
        (!is_null).then(|| Jsonb(from_datum(datum)))
    }
}

impl IntoDatum for Jsonb {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(to_datum(&self.0))
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

unsafe impl SqlTranslatable for Jsonb {
    const TYPE_IDENT: &'static str = concat!(module_path!(), "::Jsonb");
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
}

unsafe impl<'fcx> pgrx::callconv::ArgAbi<'fcx> for Jsonb {
    unsafe fn unbox_arg_unchecked(arg: pgrx::callconv::Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        arg.unbox_arg_using_from_datum().unwrap_or_else(|| panic!("argument {index} must not be null"))
    }

    unsafe fn unbox_nullable_arg(arg: pgrx::callconv::Arg<'_, 'fcx>) -> pgrx::nullable::Nullable<Self> {
        arg.unbox_arg_using_from_datum().into()
    }
}

unsafe impl pgrx::callconv::BoxRet for Jsonb {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut pgrx::callconv::FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        fcinfo.return_raw_datum(to_datum(&self.0))
    }
}

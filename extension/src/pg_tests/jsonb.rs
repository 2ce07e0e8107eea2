//! `jsonb` without text (extension/src/jsonb.rs): the binary conversions make and read exactly
//! what pgrx's text round trip (serde's text through `jsonb_in`, `jsonb_out`'s text through
//! serde) makes and reads, to the byte, for every kind of value, and refuse what `jsonb_in`
//! refuses.

#[pgrx::pg_schema]
mod tests {
    use crate::jsonb::{from_datum, to_datum, Jsonb};
    use crate::pg_tests::helpers::failure;
    use pgrx::prelude::*;
    use pgrx::{IntoDatum, JsonB};
    use serde_json::{json, Value};

    /// The bytes of a `jsonb` datum (its varlena, detoasted).
    fn bytes(datum: pg_sys::Datum) -> Vec<u8> {
        unsafe {
            let v = pg_sys::pg_detoast_datum(datum.cast_mut_ptr());
            let len = pgrx::varsize_any_exhdr(v);
            std::slice::from_raw_parts(pgrx::vardata_any(v) as *const u8, len).to_vec()
        }
    }

    /// Documents of every kind: scalars at the top, nesting, keys jsonb orders by length then
    /// bytes, escapes, non-ASCII text, numbers of every form serde and numeric print.
    fn documents() -> Vec<Value> {
        let mut docs = vec![
            json!(null),
            json!(true),
            json!(false),
            json!(0),
            json!(-1),
            json!(1.5),
            json!(-0.0),
            json!(0.1),
            json!(1e10),
            json!(1e-7),
            json!(3.141592653589793),
            json!(1.5e300),
            json!(12345678901234567890u64),
            json!(i64::MIN),
            json!(""),
            json!("plain"),
            json!("quote \" backslash \\ slash / newline \n tab \t bell \u{7} del \u{7f}"),
            json!("é ü 漢字 🦀 \u{2028}"),
            json!({}),
            json!([]),
            json!([[], {}, [[]], {"": {}}]),
            json!({"b": 1, "a": 2, "aa": 3, "": 4, "ab": [1, 2, {"z": null}], "A": true, "é": "x"}),
            json!([1, "two", 3.0, null, true, {"k": [false]}]),
        ];
        let mut deep = json!("bottom");
        for i in 0..64 {
            deep = if i % 2 == 0 { json!([deep]) } else { json!({ "level": deep }) };
        }
        docs.push(deep);
        docs.push(serde_json::from_str(querylayer_semantics::demo::RIGHTS_JSON).unwrap());
        docs.push(
            querylayer_semantics::osi::parse_document(querylayer_semantics::demo::MODEL_YAML)
                .unwrap()
                .to_normalized_json(),
        );
        // Pseudo-random documents (a fixed seed: the same every run).
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        fn random(next: &mut dyn FnMut() -> u64, depth: u32) -> Value {
            match next() % if depth > 4 { 5 } else { 7 } {
                0 => Value::Null,
                1 => Value::Bool(next() % 2 == 0),
                2 => json!((next() as i64) >> (next() % 60)),
                3 => json!(
                    f64::from_bits(next() % 0x4700_0000_0000_0000) * if next() % 2 == 0 { 1.0 } else { -1.0 }
                ),
                4 => Value::String(
                    (0..next() % 12)
                        .map(|_| char::from_u32(1 + (next() % 0x2fff) as u32).unwrap_or('x'))
                        .collect(),
                ),
                5 => Value::Array((0..next() % 5).map(|_| random(next, depth + 1)).collect()),
                _ => Value::Object(
                    (0..next() % 6)
                        .map(|_| {
                            (
                                (0..next() % 4).map(|_| (b'a' + (next() % 3) as u8) as char).collect(),
                                random(next, depth + 1),
                            )
                        })
                        .collect(),
                ),
            }
        }
        for _ in 0..300 {
            docs.push(random(&mut next, 0));
        }
        docs
    }

    #[pg_test]
    fn a_value_becomes_the_jsonb_that_jsonb_in_makes_of_its_text() {
        for doc in documents() {
            let ours = bytes(to_datum(&doc));
            let theirs = bytes(JsonB(doc.clone()).into_datum().unwrap());
            assert_eq!(ours, theirs, "{doc}");
        }
    }

    #[pg_test]
    fn a_jsonb_reads_as_serde_reads_its_text() {
        for doc in documents() {
            let datum = JsonB(doc.clone()).into_datum().unwrap();
            let ours = unsafe { from_datum(datum) };
            let theirs = unsafe { <JsonB as pgrx::FromDatum>::from_datum(datum, false) }.unwrap().0;
            assert_eq!(ours, theirs, "{doc}");
        }
        // Stored values: toasted and compressed, and read back through SQL.
        let big = json!({"text": "x".repeat(100_000), "list": (0..2000).collect::<Vec<_>>()});
        Spi::run("CREATE TEMP TABLE docs (d jsonb)").unwrap();
        Spi::run_with_args("INSERT INTO docs VALUES ($1)", &[Jsonb(big.clone()).into()]).unwrap();
        assert_eq!(Spi::get_one::<Jsonb>("SELECT d FROM docs").unwrap().unwrap().0, big);
        assert_eq!(Spi::get_one::<Jsonb>("SELECT d->'list' FROM docs").unwrap().unwrap().0, big["list"]);
        // A duplicate key in the text keeps its last value, read the same way.
        assert_eq!(
            Spi::get_one::<Jsonb>(r#"SELECT '{"a": 1, "a": 2}'::jsonb"#).unwrap().unwrap().0,
            json!({"a": 2})
        );
    }

    /// A string with a NUL in it (`\0` in its text), as a `jsonb` value made without text.
    #[pg_extern]
    fn jsonb_with(text: &str) -> Jsonb {
        Jsonb(json!({"s": text.replace("\\0", "\0")}))
    }

    #[pg_test]
    fn a_nul_is_refused_as_jsonb_in_refuses_it() {
        let theirs = failure(r#"SELECT '{"s": "a\u0000b"}'::jsonb"#);
        let ours = failure(r"SELECT tests.jsonb_with('a\0b')");
        assert_eq!(theirs.0, "22P05");
        assert_eq!(ours, theirs);
        assert_eq!(
            Spi::get_one::<Jsonb>("SELECT tests.jsonb_with('ab')").unwrap().unwrap().0,
            json!({"s": "ab"})
        );
    }
}

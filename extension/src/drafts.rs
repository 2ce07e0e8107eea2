//! A draft's fields against its template, the common case in Rust. `check_draft_fields`
//! (sql/070_content.sql) names every problem of a draft in one statement; most drafts have none,
//! and for them that statement was 13 % of `create_draft`'s instructions (docs/performance.md,
//! "0.9.0: a draft that fits is vouched for in the extension"). `draft_fields_fit` answers only
//! "certainly no problem": when it says true the statement is skipped; when it says false (a
//! problem, or anything it is unsure of) the statement runs and remains the one source of the
//! rules' messages. So the two can disagree only in one direction, and pg_tests/content.rs holds
//! them to that over every shape of value the statement distinguishes.

use crate::jsonb::Jsonb;
use pgrx::prelude::*;
use serde_json::{Map, Value};

/// True when `fields` certainly satisfies `template_fields` as `draft_field_problems` reads it:
/// no missing required field, no unknown field, every value of its declared type, no string longer
/// than its `max_length`. False when there is a problem or when the answer is not certain here.
#[pg_extern(immutable, parallel_safe)]
fn draft_fields_fit(template_fields: Jsonb, fields: Jsonb) -> bool {
    fits(&template_fields.0, &fields.0) == Some(true)
}

/// `Some(true)`: no problem; `Some(false)`: a problem; `None`: not certain (the statement decides).
fn fits(template_fields: &Value, fields: &Value) -> Option<bool> {
    let (Value::Array(declared), Value::Object(fields)) = (template_fields, fields) else {
        return None;
    };
    let mut named = 0usize;
    for field in declared {
        let field = Field::read(field)?;
        let value = fields.get(field.name);
        if value.is_some() {
            named += 1;
        }
        match value {
            None | Some(Value::Null) => {
                if field.required {
                    return Some(false);
                }
            }
            Some(value) => {
                if field.required && is_empty(value) {
                    return Some(false);
                }
                if !value_fits(&field, value)? {
                    return Some(false);
                }
            }
        }
    }
    // Every key names a declared field unless there are more keys than declared names found.
    match named.cmp(&fields.len()) {
        std::cmp::Ordering::Equal => Some(true),
        std::cmp::Ordering::Less => Some(false),
        // More names found than keys: the template declares a name twice; not certain.
        std::cmp::Ordering::Greater => None,
    }
}

/// One declared field, read only when it has the shape `check_template_fields` lets in.
struct Field<'a> {
    name: &'a str,
    kind: &'a str,
    required: bool,
    max_length: Option<u64>,
}

impl<'a> Field<'a> {
    fn read(field: &'a Value) -> Option<Field<'a>> {
        let field: &Map<String, Value> = field.as_object()?;
        let max_length = match field.get("max_length") {
            None => None,
            // A whole number as check_template_fields requires; anything else (a template made
            // before 0.9.0 may hold 2.5) is the statement's call.
            Some(n) => Some(n.as_u64().filter(|n| (1..=i32::MAX as u64).contains(n))?),
        };
        Some(Field {
            name: field.get("name")?.as_str()?,
            kind: field.get("type")?.as_str()?,
            required: field.get("required")?.as_bool()?,
            max_length,
        })
    }
}

/// What the statement counts as a required field left empty.
fn is_empty(value: &Value) -> bool {
    matches!(value, Value::String(s) if s.is_empty()) || matches!(value, Value::Array(a) if a.is_empty())
}

fn value_fits(field: &Field, value: &Value) -> Option<bool> {
    let fits = match field.kind {
        "text" | "markdown" => value.is_string(),
        "url" => match value {
            Value::String(s) => is_url(s)?,
            _ => false,
        },
        "list" => matches!(value, Value::Array(items) if items.iter().all(Value::is_string)),
        _ => return None,
    };
    let too_long = match (field.max_length, value) {
        (Some(max), Value::String(s)) => s.chars().count() as u64 > max,
        _ => false,
    };
    Some(fits && !too_long)
}

/// `^https?://[^[:space:]]+$`, decided here only for printable ASCII: which other characters are
/// spaces is the database locale's call.
fn is_url(s: &str) -> Option<bool> {
    let Some(rest) = s.strip_prefix("https://").or_else(|| s.strip_prefix("http://")) else {
        return Some(false);
    };
    if rest.is_empty() {
        return Some(false);
    }
    rest.bytes().all(|b| (0x21..=0x7e).contains(&b)).then_some(true)
}

#[cfg(test)]
mod unit {
    use super::fits;
    use serde_json::json;

    #[test]
    fn only_a_draft_without_a_problem_is_vouched_for() {
        let template = json!([
            {"name": "title", "type": "text", "required": true, "max_length": 5},
            {"name": "body", "type": "markdown", "required": false},
            {"name": "link", "type": "url", "required": false},
            {"name": "tags", "type": "list", "required": false}
        ]);
        assert_eq!(fits(&template, &json!({"title": "héllo"})), Some(true), "five characters, six bytes");
        assert_eq!(fits(&template, &json!({"title": "hello!"})), Some(false), "too long");
        assert_eq!(fits(&template, &json!({"title": ""})), Some(false), "required and empty");
        assert_eq!(fits(&template, &json!({"title": null})), Some(false), "required and null");
        assert_eq!(fits(&template, &json!({"body": "x"})), Some(false), "required and absent");
        assert_eq!(fits(&template, &json!({"title": "a", "extra": 1})), Some(false), "unknown key");
        assert_eq!(fits(&template, &json!({"title": "a", "body": null, "tags": []})), Some(true));
        assert_eq!(fits(&template, &json!({"title": "a", "tags": ["x", 1]})), Some(false));
        assert_eq!(fits(&template, &json!({"title": "a", "link": "https://x.test/a?b"})), Some(true));
        assert_eq!(fits(&template, &json!({"title": "a", "link": "https://"})), Some(false));
        assert_eq!(fits(&template, &json!({"title": "a", "link": "ftp://x"})), Some(false));
        assert_eq!(
            fits(&template, &json!({"title": "a", "link": ""})),
            Some(false),
            "not required, still a URL"
        );
        assert_eq!(
            fits(&template, &json!({"title": "a", "link": "https://x.test/é"})),
            None,
            "the locale's call"
        );
        assert_eq!(fits(&template, &json!({"title": "a", "link": 3})), Some(false));
        assert_eq!(
            fits(&json!([{"name": "a", "type": "date", "required": false}]), &json!({"a": "x"})),
            None
        );
        assert_eq!(
            fits(
                &json!([{"name": "a", "type": "text", "required": false, "max_length": 2.5}]),
                &json!({"a": "x"})
            ),
            None
        );
        assert_eq!(
            fits(&json!([{"name": "a", "type": "text", "required": "yes"}]), &json!({"a": "x"})),
            None
        );
        assert_eq!(fits(&template, &json!(["title"])), None, "not an object");
    }
}

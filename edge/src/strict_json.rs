//! Reject, never alter: a request body is accepted only if what the database will store equals
//! what the client sent. JSON allows an object to repeat a name (parsers keep the last value
//! silently) and numbers of any precision (the edge holds integers of 64 bits and doubles, so
//! 2^64 would become 18446744073709552000). Both are refused here, in one pass over the bytes,
//! before anything is parsed for use.

use std::borrow::Cow;
use std::collections::HashSet;

/// Why a body is refused.
#[derive(Debug, PartialEq)]
pub enum Problem {
    /// Not JSON at all.
    Syntax(String),
    /// An object repeats a member name (the path of the repeated member).
    DuplicateKey(String),
    /// A number that would not survive the trip to the database unchanged (its path, its text).
    InexactNumber(String, String),
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Syntax(e) => write!(f, "the body is not valid JSON: {e}"),
            Problem::DuplicateKey(path) => write!(f, "`{path}` appears twice in one object; send each member once"),
            Problem::InexactNumber(path, text) => write!(
                f,
                "`{path}` is {text}, which does not fit exactly (integers of at most 64 bits, or numbers a double holds exactly); send it as a string"
            ),
        }
    }
}

impl Problem {
    /// Whether the problem lies inside `params` of a JSON-RPC message.
    pub fn in_params(&self) -> bool {
        match self {
            Problem::Syntax(_) => false,
            Problem::DuplicateKey(path) | Problem::InexactNumber(path, _) => {
                path == "params" || path.starts_with("params.") || path.starts_with("params[")
            }
        }
    }
}

/// An object's member names are the body's own bytes, but for a name with an escape (decoded).
enum Frame<'a> {
    Object { keys: HashSet<Cow<'a, str>>, current: Option<Cow<'a, str>>, expect_key: bool },
    Array { index: usize },
}

/// Checks a whole body. Syntax is serde_json's; the scan then assumes valid JSON.
pub fn check(bytes: &[u8]) -> Result<(), Problem> {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).map_err(|e| Problem::Syntax(e.to_string()))?;
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' => {
                stack.push(Frame::Object { keys: HashSet::new(), current: None, expect_key: true });
                i += 1;
            }
            b'[' => {
                stack.push(Frame::Array { index: 0 });
                i += 1;
            }
            b'}' | b']' => {
                stack.pop();
                i += 1;
            }
            b',' => {
                match stack.last_mut() {
                    Some(Frame::Object { expect_key, .. }) => *expect_key = true,
                    Some(Frame::Array { index }) => *index += 1,
                    None => {}
                }
                i += 1;
            }
            b'"' => {
                let end = string_end(bytes, i);
                if let Some(Frame::Object { keys, current, expect_key }) = stack.last_mut() {
                    if *expect_key {
                        let key = member_name(&bytes[i..end])?;
                        *expect_key = false;
                        *current = Some(key.clone());
                        if !keys.insert(key) {
                            return Err(Problem::DuplicateKey(path(&stack)));
                        }
                    }
                }
                i = end;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len() && matches!(bytes[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                    i += 1;
                }
                let text = std::str::from_utf8(&bytes[start..i]).unwrap_or_default();
                if !exact(text) {
                    return Err(Problem::InexactNumber(path(&stack), text.to_string()));
                }
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// The index just past the string that opens at `start` (a valid JSON string).
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while let Some(at) = memchr::memchr2(b'\\', b'"', &bytes[i..]) {
        i += at;
        match bytes[i] {
            b'"' => return i + 1,
            _ => i += 2,
        }
    }
    bytes.len()
}

/// A member name (a valid JSON string, quotes included): the bytes between the quotes, decoded
/// only when they hold an escape.
fn member_name(string: &[u8]) -> Result<Cow<'_, str>, Problem> {
    let inner = &string[1..string.len() - 1];
    if memchr::memchr(b'\\', inner).is_none() {
        return std::str::from_utf8(inner).map(Cow::Borrowed).map_err(|e| Problem::Syntax(e.to_string()));
    }
    serde_json::from_slice(string).map(Cow::Owned).map_err(|e| Problem::Syntax(e.to_string()))
}

fn path(stack: &[Frame<'_>]) -> String {
    let mut out = String::new();
    for frame in stack {
        match frame {
            Frame::Object { current: Some(key), .. } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Frame::Object { current: None, .. } => {}
            Frame::Array { index } => out.push_str(&format!("[{index}]")),
        }
    }
    if out.is_empty() {
        out.push_str("(the body)");
    }
    out
}

/// Whether the edge carries this number literal to the database unchanged: an integer that fits
/// 64 bits is kept as an integer; anything else becomes a double, which is written back as its
/// shortest form, and that must be the same number as the one sent.
pub fn exact(text: &str) -> bool {
    let integer = !text.contains(['.', 'e', 'E']);
    if integer && (text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok()) {
        return true;
    }
    let Ok(value) = text.parse::<f64>() else {
        return false;
    };
    if !value.is_finite() {
        return false;
    }
    let Ok(written) = serde_json::to_string(&value) else {
        return false;
    };
    decimal(text) == decimal(&written)
}

/// A decimal literal as (negative, significant digits, exponent of the last digit); zero is
/// (false, "", 0) whatever its sign or form.
fn decimal(text: &str) -> (bool, String, i64) {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], rest[at + 1..].parse::<i64>().unwrap_or(0)),
        None => (rest, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut digits = format!("{whole}{fraction}");
    let mut exponent = exponent - fraction.len() as i64;
    let leading = digits.len() - digits.trim_start_matches('0').len();
    digits.drain(..leading);
    while digits.ends_with('0') {
        digits.pop();
        exponent += 1;
    }
    if digits.is_empty() {
        return (false, String::new(), 0);
    }
    (negative, digits, exponent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_that_survive_unchanged_pass_and_the_others_are_named() {
        for ok in [
            "0",
            "-0",
            "42",
            "-9223372036854775808",
            "18446744073709551615",
            "0.1",
            "1.5e3",
            "1e20",
            "2.5E-3",
            "100.000",
        ] {
            assert!(exact(ok), "{ok}");
        }
        for bad in [
            "18446744073709551616",
            "-9223372036854775809",
            "0.1000000000000000000001",
            "1e400",
            "123456789012345678901234567890",
        ] {
            assert!(!exact(bad), "{bad}");
        }
        assert_eq!(
            check(br#"{"params": {"arguments": {"n": 18446744073709551616}}}"#),
            Err(Problem::InexactNumber("params.arguments.n".into(), "18446744073709551616".into()))
        );
    }

    #[test]
    fn a_repeated_member_is_refused_wherever_it_is() {
        assert_eq!(check(br#"{"a": 1, "a": 2}"#), Err(Problem::DuplicateKey("a".into())));
        assert_eq!(
            check(br#"{"params": {"arguments": {"items": [{"x": 1}, {"x": 1, "\u0078": 2}]}}}"#),
            Err(Problem::DuplicateKey("params.arguments.items[1].x".into()))
        );
        // Names with escapes, and values ending in one, are read to their closing quote.
        assert_eq!(check(br#"{"a\"b": "c\\", "a\u0022b": 2}"#), Err(Problem::DuplicateKey("a\"b".into())));
        assert_eq!(check(br#"{"q": "\"", "r": "\\", "s": {"q": 1}}"#), Ok(()));
        // The same name in sibling objects, or as a value, is fine.
        assert_eq!(check(br#"{"a": {"b": 1}, "c": {"b": "b"}, "d": ["a", "a"]}"#), Ok(()));
        assert!(matches!(check(b"{\"a\": 1,}"), Err(Problem::Syntax(_))));
        assert!(matches!(check(b""), Err(Problem::Syntax(_))));
    }

    #[test]
    fn problems_inside_params_are_told_apart() {
        assert!(Problem::DuplicateKey("params.arguments.x".into()).in_params());
        assert!(!Problem::DuplicateKey("id".into()).in_params());
        assert!(!Problem::Syntax("x".into()).in_params());
    }
}

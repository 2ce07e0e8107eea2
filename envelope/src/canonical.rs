//! Canonical payload bytes: what Python's `json.dumps(payload, sort_keys=True,
//! separators=(",", ":"))` writes (ensure_ascii on), byte for byte, for any JSON. The payload
//! hash is the lowercase hex SHA-256 of these bytes.
//!
//! Incoming JSON is parsed here rather than through `serde_json::Value`, because the canonical
//! form depends on the number as written: `1` is an integer (printed exactly, whatever its size)
//! while `1.0` and `1e2` are floats (printed as Python's `repr` prints a float: `1.0`, `100.0`).

use sha2::{Digest, Sha256};
use std::fmt::Write;

/// A parsed JSON value that remembers whether each number was an integer.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Null,
    Bool(bool),
    /// An integer literal, normalized (no sign on zero).
    Int(String),
    Float(f64),
    Str(String),
    Array(Vec<Node>),
    /// Members in document order; a repeated key keeps its last value, as in Python.
    Object(Vec<(String, Node)>),
}

impl Node {
    pub fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Object(members) => members.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// Parses JSON text (RFC 8259; one value, surrounding whitespace allowed).
pub fn parse(text: &str) -> Result<Node, String> {
    let mut p = Parser { s: text.as_bytes(), i: 0 };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.i != p.s.len() {
        return Err(format!("unexpected trailing data at byte {}", p.i));
    }
    Ok(v)
}

/// The canonical text of JSON text.
pub fn canonical_json(text: &str) -> Result<String, String> {
    parse(text).map(|n| canonical_node(&n))
}

/// The canonical text of a parsed value.
pub fn canonical_node(node: &Node) -> String {
    let mut out = String::new();
    write_node(&mut out, node);
    out
}

/// The canonical text of a `serde_json::Value` built in Rust (integers that fit i64/u64 are
/// integers, every other number is a float).
pub fn canonical_json_value(value: &serde_json::Value) -> String {
    canonical_node(&from_value(value))
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn from_value(v: &serde_json::Value) -> Node {
    match v {
        serde_json::Value::Null => Node::Null,
        serde_json::Value::Bool(b) => Node::Bool(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Node::Int(i.to_string())
            } else if let Some(u) = n.as_u64() {
                Node::Int(u.to_string())
            } else {
                Node::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Node::Str(s.clone()),
        serde_json::Value::Array(a) => Node::Array(a.iter().map(from_value).collect()),
        serde_json::Value::Object(o) => {
            Node::Object(o.iter().map(|(k, v)| (k.clone(), from_value(v))).collect())
        }
    }
}

fn write_node(out: &mut String, node: &Node) {
    match node {
        Node::Null => out.push_str("null"),
        Node::Bool(true) => out.push_str("true"),
        Node::Bool(false) => out.push_str("false"),
        Node::Int(i) => out.push_str(i),
        Node::Float(f) => out.push_str(&python_float_repr(*f)),
        Node::Str(s) => write_string(out, s),
        Node::Array(items) => {
            out.push('[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                write_node(out, item);
            }
            out.push(']');
        }
        Node::Object(members) => {
            // Last value wins for a repeated key; keys in code point order (= UTF-8 byte order).
            let mut unique: Vec<(&String, &Node)> = Vec::with_capacity(members.len());
            for (k, v) in members {
                match unique.iter_mut().find(|(uk, _)| *uk == k) {
                    Some(slot) => slot.1 = v,
                    None => unique.push((k, v)),
                }
            }
            unique.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (n, (k, v)) in unique.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                write_string(out, k);
                out.push(':');
                write_node(out, v);
            }
            out.push('}');
        }
    }
}

/// A JSON string with every character outside printable ASCII escaped, as ensure_ascii does.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that round-trip, in fixed notation when the
/// decimal exponent is in [-4, 16), otherwise in exponent notation with a signed exponent of at
/// least two digits; fixed notation always shows a fractional part.
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // Rust's `{:e}` is the shortest round-trip representation: d[.ddd]e<exp>.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').expect("exponent form");
    let exp: i32 = exp.parse().expect("integer exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if f < 0.0 { "-" } else { "" };
    if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    let point = exp + 1; // digits before the decimal point
    let body = if point <= 0 {
        format!("0.{}{digits}", "0".repeat((-point) as usize))
    } else if (point as usize) >= digits.len() {
        format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        let (int, frac) = digits.split_at(point as usize);
        format!("{int}.{frac}")
    };
    format!("{sign}{body}")
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

const MAX_DEPTH: usize = 128;

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn err<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("{what} at byte {}", self.i))
    }

    fn eat(&mut self, lit: &[u8]) -> bool {
        if self.s[self.i..].starts_with(lit) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Node, String> {
        if depth > MAX_DEPTH {
            return self.err("nesting too deep");
        }
        match self.s.get(self.i) {
            None => self.err("unexpected end"),
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => self.string().map(Node::Str),
            Some(b't') if self.eat(b"true") => Ok(Node::Bool(true)),
            Some(b'f') if self.eat(b"false") => Ok(Node::Bool(false)),
            Some(b'n') if self.eat(b"null") => Ok(Node::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => self.err("unexpected character"),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Node, String> {
        self.i += 1;
        let mut members = Vec::new();
        self.ws();
        if self.eat(b"}") {
            return Ok(Node::Object(members));
        }
        loop {
            self.ws();
            if self.s.get(self.i) != Some(&b'"') {
                return self.err("expected a string key");
            }
            let key = self.string()?;
            self.ws();
            if !self.eat(b":") {
                return self.err("expected ':'");
            }
            self.ws();
            let value = self.value(depth + 1)?;
            members.push((key, value));
            self.ws();
            if self.eat(b",") {
                continue;
            }
            if self.eat(b"}") {
                return Ok(Node::Object(members));
            }
            return self.err("expected ',' or '}'");
        }
    }

    fn array(&mut self, depth: usize) -> Result<Node, String> {
        self.i += 1;
        let mut items = Vec::new();
        self.ws();
        if self.eat(b"]") {
            return Ok(Node::Array(items));
        }
        loop {
            self.ws();
            items.push(self.value(depth + 1)?);
            self.ws();
            if self.eat(b",") {
                continue;
            }
            if self.eat(b"]") {
                return Ok(Node::Array(items));
            }
            return self.err("expected ',' or ']'");
        }
    }

    fn hex4(&mut self) -> Result<u16, String> {
        let h = self.s.get(self.i..self.i + 4).ok_or_else(|| "truncated \\u escape".to_string())?;
        let h = std::str::from_utf8(h).map_err(|_| "bad \\u escape".to_string())?;
        let v = u16::from_str_radix(h, 16).map_err(|_| format!("bad \\u escape at byte {}", self.i))?;
        self.i += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, String> {
        self.i += 1;
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.i < self.s.len() && self.s[self.i] != b'"' && self.s[self.i] != b'\\' {
                if self.s[self.i] < 0x20 {
                    return self.err("control character in string");
                }
                self.i += 1;
            }
            out.push_str(
                std::str::from_utf8(&self.s[start..self.i]).map_err(|_| "invalid UTF-8".to_string())?,
            );
            match self.s.get(self.i) {
                None => return self.err("unterminated string"),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                _ => {
                    self.i += 1;
                    let esc = *self.s.get(self.i).ok_or_else(|| "truncated escape".to_string())?;
                    self.i += 1;
                    match esc {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{08}'),
                        b'f' => out.push('\u{0c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let c = if (0xd800..0xdc00).contains(&hi) && self.s[self.i..].starts_with(b"\\u")
                            {
                                let save = self.i;
                                self.i += 2;
                                let lo = self.hex4()?;
                                if (0xdc00..0xe000).contains(&lo) {
                                    char::from_u32(
                                        0x10000 + ((u32::from(hi) - 0xd800) << 10) + (u32::from(lo) - 0xdc00),
                                    )
                                } else {
                                    self.i = save;
                                    None
                                }
                            } else {
                                char::from_u32(u32::from(hi))
                            };
                            // A lone surrogate cannot be UTF-8; Python would keep it, we refuse it.
                            out.push(c.ok_or_else(|| "lone surrogate in \\u escape".to_string())?);
                        }
                        _ => return self.err("bad escape"),
                    }
                }
            }
        }
    }

    fn number(&mut self) -> Result<Node, String> {
        let start = self.i;
        self.eat(b"-");
        match self.s.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                while matches!(self.s.get(self.i), Some(b'0'..=b'9')) {
                    self.i += 1;
                }
            }
            _ => return self.err("bad number"),
        }
        let mut float = false;
        if self.s.get(self.i) == Some(&b'.') {
            float = true;
            self.i += 1;
            if !matches!(self.s.get(self.i), Some(b'0'..=b'9')) {
                return self.err("bad fraction");
            }
            while matches!(self.s.get(self.i), Some(b'0'..=b'9')) {
                self.i += 1;
            }
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            float = true;
            self.i += 1;
            if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if !matches!(self.s.get(self.i), Some(b'0'..=b'9')) {
                return self.err("bad exponent");
            }
            while matches!(self.s.get(self.i), Some(b'0'..=b'9')) {
                self.i += 1;
            }
        }
        let lexeme = std::str::from_utf8(&self.s[start..self.i]).expect("ASCII");
        if float {
            lexeme.parse::<f64>().map(Node::Float).map_err(|e| format!("bad number {lexeme}: {e}"))
        } else if lexeme.trim_start_matches('-').trim_start_matches('0').is_empty() {
            Ok(Node::Int("0".into()))
        } else {
            Ok(Node::Int(lexeme.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (1e-05, "1e-05"),
            (1e15, "1000000000000000.0"),
            (9999999999999998.0, "9999999999999998.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e20, "1e+20"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (2.5e-10, "2.5e-10"),
            (5e-324, "5e-324"),
            (1e308, "1e+308"),
            (300.0, "300.0"),
            (-0.0, "-0.0"),
            (-1.5, "-1.5"),
            (123.456, "123.456"),
            (0.001, "0.001"),
        ] {
            assert_eq!(python_float_repr(f), s, "{f:e}");
        }
    }

    #[test]
    fn canonical_text_sorts_escapes_and_keeps_integers_exact() {
        let text = r#"{"z":1,"a":1.0,"int_big":12345678901234567890,"neg":-0,"s":"é☕😀\u007f/\"","n":null,"e":[],"o":{}, "z":2}"#;
        assert_eq!(
            canonical_json(text).unwrap(),
            r#"{"a":1.0,"e":[],"int_big":12345678901234567890,"n":null,"neg":0,"o":{},"s":"\u00e9\u2615\ud83d\ude00\u007f/\"","z":2}"#
        );
    }

    #[test]
    fn rejects_malformed_json() {
        for bad in ["", "{", "[1,]", "01", "1.", "\"\\x\"", "{\"a\" 1}", "nul", "\"\u{1}\"", "[] x"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}

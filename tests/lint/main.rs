//! A lint over the extension's SQL (`sql/`, upgrade fragments included): every call of a
//! `querylayer.*` or `querylayer_api.*` function names the exact type of each literal argument
//! (`NULL::uuid`, `'querylayer.runs'::regclass`, `'runs:write'::text`). An untyped literal or
//! NULL lets PostgreSQL choose among overloads, so an overload added later (by mistake, or by
//! whoever could create one) could capture the call; a typed one cannot.

use std::path::{Path, PathBuf};

/// One offending argument: file, line, the call and the argument.
#[derive(Debug)]
struct Finding {
    file: String,
    line: usize,
    call: String,
    argument: String,
}

fn sql_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sql_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "sql") {
            out.push(path);
        }
    }
}

/// The text with comments blanked (newlines kept, so line numbers hold). String literals and
/// dollar-quoted bodies stay: function bodies are code, and format strings may hold calls.
fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut in_string = false;
    while i < b.len() {
        let c = b[i] as char;
        if in_string {
            out.push(c);
            if c == '\'' {
                if i + 1 < b.len() && b[i + 1] == b'\'' {
                    out.push('\'');
                    i += 2;
                    continue;
                }
                in_string = false;
            }
            i += 1;
            continue;
        }
        if c == '\'' {
            in_string = true;
            out.push(c);
            i += 1;
        } else if c == '-' && i + 1 < b.len() && b[i + 1] == b'-' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == '/' && i + 1 < b.len() && b[i + 1] == b'*' {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                if b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Splits the argument list that starts after `open` (the index of `(`) at depth 1; returns the
/// arguments and the index of the closing parenthesis.
fn arguments(text: &str, open: usize) -> (Vec<String>, usize) {
    let b = text.as_bytes();
    let (mut depth, mut i, mut start) = (0usize, open, open + 1);
    let mut args = Vec::new();
    let mut in_string = false;
    while i < b.len() {
        let c = b[i];
        if in_string {
            if c == b'\'' {
                if i + 1 < b.len() && b[i + 1] == b'\'' {
                    i += 2;
                    continue;
                }
                in_string = false;
            }
        } else if c == b'\'' {
            in_string = true;
        } else if c == b'(' || c == b'[' {
            depth += 1;
        } else if c == b')' || c == b']' {
            depth -= 1;
            if depth == 0 {
                let last = text[start..i].trim();
                if !last.is_empty() || !args.is_empty() {
                    args.push(last.to_string());
                }
                return (args, i);
            }
        } else if c == b',' && depth == 1 {
            args.push(text[start..i].trim().to_string());
            start = i + 1;
        }
        i += 1;
    }
    (args, b.len())
}

/// True for an argument that is one bare literal (a quoted string or NULL) with no cast.
fn untyped_literal(argument: &str) -> bool {
    // A named argument: `p_x => value`.
    let value = match argument.split_once("=>") {
        Some((name, value)) if name.trim().chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => {
            value.trim()
        }
        _ => argument.trim(),
    };
    if value.eq_ignore_ascii_case("null") {
        return true;
    }
    let body = value.strip_prefix('E').or_else(|| value.strip_prefix('e')).unwrap_or(value);
    if !body.starts_with('\'') {
        return false;
    }
    // One literal from the first quote to the last, with nothing (no cast) after it.
    let inner = &body[1..];
    let mut chars = inner.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '\'' {
            if chars.peek().is_some_and(|(_, n)| *n == '\'') {
                chars.next();
                continue;
            }
            return inner[i + 1..].trim().is_empty();
        }
    }
    false
}

fn lint(file: &str, text: &str) -> Vec<Finding> {
    let code = strip_comments(text);
    let mut findings = Vec::new();
    for prefix in ["querylayer.", "querylayer_api."] {
        let mut from = 0;
        while let Some(pos) = code[from..].find(prefix) {
            let at = from + pos;
            from = at + prefix.len();
            // A whole identifier: not part of a longer name.
            if at > 0 {
                let before = code.as_bytes()[at - 1] as char;
                if before.is_ascii_alphanumeric() || before == '_' || before == '.' || before == '"' {
                    continue;
                }
            }
            let rest = &code[from..];
            let name_len = rest.bytes().take_while(|c| c.is_ascii_alphanumeric() || *c == b'_').count();
            let after = &rest[name_len..];
            let spaces = after.len() - after.trim_start().len();
            if name_len == 0 || !after.trim_start().starts_with('(') {
                continue;
            }
            // Not a declaration: `CREATE FUNCTION name(`, `ON FUNCTION name(`, `DROP FUNCTION name(`,
            // `EXECUTE FUNCTION name(` (trigger arguments are always text) and the like.
            let head = code[..at].trim_end();
            let keyword = head.rsplit(|c: char| c.is_whitespace()).next().unwrap_or("");
            if ["FUNCTION", "PROCEDURE", "TABLE", "INTO", "ON", "REFERENCES", "EXISTS"]
                .iter()
                .any(|k| keyword.eq_ignore_ascii_case(k))
            {
                continue;
            }
            let open = from + name_len + spaces;
            let (args, _) = arguments(&code, open);
            for argument in args {
                if untyped_literal(&argument) {
                    findings.push(Finding {
                        file: file.to_string(),
                        line: code[..at].matches('\n').count() + 1,
                        call: format!("{prefix}{}", &rest[..name_len]),
                        argument,
                    });
                }
            }
        }
    }
    findings
}

#[test]
fn every_call_of_an_extension_function_names_the_types_of_its_literals() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sql");
    let mut files = Vec::new();
    sql_files(&root, &mut files);
    files.sort();
    assert!(files.len() > 15, "found {} SQL files under {}", files.len(), root.display());
    let mut findings = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let name = path.strip_prefix(&root).unwrap().display().to_string();
        findings.extend(lint(&name, &text));
    }
    let report: Vec<String> = findings
        .iter()
        .map(|f| {
            format!(
                "sql/{}:{}: {}(… {} …): cast it to the parameter's type",
                f.file, f.line, f.call, f.argument
            )
        })
        .collect();
    assert!(report.is_empty(), "{} untyped literal argument(s):\n{}", report.len(), report.join("\n"));
}

#[test]
fn the_lint_sees_what_it_must() {
    let found = lint(
        "t.sql",
        "PERFORM querylayer.enter_operator(NULL);\n\
         SELECT querylayer.isolate_by_site('querylayer.runs');\n\
         PERFORM querylayer.audit('x', p_detail => '{}', p_target => v.id::text);\n\
         -- querylayer.require_connection('commented out')\n\
         PERFORM querylayer.require_connection('runs:write'::text);\n\
         SELECT querylayer_api.create_site(E'acme', 'b' || 'c', ARRAY['x', 'y']);\n\
         CREATE FUNCTION querylayer.f(p text DEFAULT 'x') RETURNS void;\n\
         EXECUTE format('SELECT querylayer.g(%L)', x);",
    );
    let got: Vec<(usize, &str, &str)> =
        found.iter().map(|f| (f.line, f.call.as_str(), f.argument.as_str())).collect();
    assert_eq!(
        got,
        vec![
            (1, "querylayer.enter_operator", "NULL"),
            (2, "querylayer.isolate_by_site", "'querylayer.runs'"),
            (3, "querylayer.audit", "'x'"),
            (3, "querylayer.audit", "p_detail => '{}'"),
            (6, "querylayer_api.create_site", "E'acme'"),
        ]
    );
}

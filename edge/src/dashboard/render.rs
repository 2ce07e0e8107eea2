//! What the dashboard shows of content: a revision's fields rendered as HTML (Markdown with any
//! raw HTML escaped, so a draft can never script the reviewer's page) and line diffs between two
//! revisions, field by field. Pure functions; the templates place their output.

use pulldown_cmark::{html, Event, Options, Parser};
use serde_json::{json, Map, Value};
use similar::{ChangeTag, TextDiff};

/// Markdown to HTML. Raw HTML in the source is shown as text, links keep only http(s), mailto
/// and relative targets.
pub fn markdown(source: &str) -> String {
    let parser =
        Parser::new_ext(source, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH).map(|event| {
            match event {
                Event::Html(raw) | Event::InlineHtml(raw) => Event::Text(raw),
                Event::Start(pulldown_cmark::Tag::Link { link_type, dest_url, title, id }) => {
                    let safe = dest_url.starts_with("http://")
                        || dest_url.starts_with("https://")
                        || dest_url.starts_with("mailto:")
                        || dest_url.starts_with('/')
                        || dest_url.starts_with('#');
                    let dest_url = if safe { dest_url } else { "#".into() };
                    Event::Start(pulldown_cmark::Tag::Link { link_type, dest_url, title, id })
                }
                Event::Start(pulldown_cmark::Tag::Image { link_type, dest_url, title, id }) => {
                    // Images would load from anywhere; the content security policy blocks them, so
                    // show their text instead.
                    let _ = (link_type, title, id);
                    Event::Text(format!("[image: {dest_url}]").into())
                }
                other => other,
            }
        });
    let mut out = String::new();
    html::push_html(&mut out, parser);
    out
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The fields of a revision in template order, each with its type and its value rendered as
/// HTML: `[{name, type, required, html, text}]`. Fields the template does not know come last.
pub fn fields(template_fields: &Value, values: &Value) -> Vec<Value> {
    let empty = Map::new();
    let values = values.as_object().unwrap_or(&empty);
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for f in template_fields.as_array().into_iter().flatten() {
        let Some(name) = f["name"].as_str() else { continue };
        seen.push(name.to_string());
        let kind = f["type"].as_str().unwrap_or("text");
        out.push(field(name, kind, f["required"].as_bool().unwrap_or(false), values.get(name)));
    }
    for (name, v) in values {
        if !seen.contains(name) {
            out.push(field(name, "text", false, Some(v)));
        }
    }
    out
}

fn text_of(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string).unwrap_or_else(|| i.to_string()))
            .collect::<Vec<_>>()
            .join("\n"),
        Some(other) => other.to_string(),
    }
}

fn field(name: &str, kind: &str, required: bool, value: Option<&Value>) -> Value {
    let text = text_of(value);
    let html = match (kind, value) {
        (_, None | Some(Value::Null)) => String::new(),
        ("markdown", _) => markdown(&text),
        ("list", Some(Value::Array(items))) => format!(
            "<ul>{}</ul>",
            items.iter().map(|i| format!("<li>{}</li>", escape(&text_of(Some(i))))).collect::<String>()
        ),
        ("url", _) if text.starts_with("http://") || text.starts_with("https://") => {
            format!("<a href=\"{0}\" rel=\"noopener noreferrer\">{0}</a>", escape(&text))
        }
        _ => format!("<p>{}</p>", escape(&text)),
    };
    json!({"name": name, "type": kind, "required": required, "html": html, "text": text, "present": value.is_some_and(|v| !v.is_null())})
}

/// A line diff of every field between `before` (what is live, or the previous revision; null
/// for none) and `after`: `[{name, changed, lines: [{tag: "add"|"del"|"same", text}]}]`.
pub fn diff(template_fields: &Value, before: &Value, after: &Value) -> Vec<Value> {
    let mut names: Vec<String> = template_fields
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["name"].as_str().map(str::to_string))
        .collect();
    for source in [before, after] {
        for key in source.as_object().into_iter().flat_map(|o| o.keys()) {
            if !names.contains(key) {
                names.push(key.clone());
            }
        }
    }
    names
        .into_iter()
        .map(|name| {
            let old = text_of(before.get(&name));
            let new = text_of(after.get(&name));
            let lines: Vec<Value> = TextDiff::from_lines(&old, &new)
                .iter_all_changes()
                .map(|change| {
                    let tag = match change.tag() {
                        ChangeTag::Insert => "add",
                        ChangeTag::Delete => "del",
                        ChangeTag::Equal => "same",
                    };
                    json!({"tag": tag, "text": change.value().trim_end_matches('\n')})
                })
                .collect();
            json!({"name": name, "changed": old != new, "lines": lines})
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_renders_but_never_passes_html_or_script_links_through() {
        let html = markdown("# Title\n\n*hello* <script>alert(1)</script>\n\n[x](javascript:alert(1)) [y](https://e.example/)");
        assert!(html.contains("<h1>Title</h1>") && html.contains("<em>hello</em>"), "{html}");
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;"), "{html}");
        assert!(html.contains("href=\"#\"") && html.contains("href=\"https://e.example/\""), "{html}");
    }

    #[test]
    fn fields_follow_the_template_and_escape_text() {
        let template = json!([{"name": "title", "type": "text", "required": true},
                              {"name": "body", "type": "markdown", "required": true},
                              {"name": "tags", "type": "list", "required": false}]);
        let out = fields(&template, &json!({"title": "<b>T</b>", "body": "**B**", "tags": ["a", "<c>"]}));
        assert_eq!(out[0]["html"], "<p>&lt;b&gt;T&lt;/b&gt;</p>");
        assert!(out[1]["html"].as_str().unwrap().contains("<strong>B</strong>"));
        assert_eq!(out[2]["html"], "<ul><li>a</li><li>&lt;c&gt;</li></ul>");
    }

    #[test]
    fn the_diff_marks_added_and_removed_lines_per_field() {
        let template = json!([{"name": "title"}, {"name": "body"}]);
        let d = diff(
            &template,
            &json!({"title": "Same", "body": "one\ntwo"}),
            &json!({"title": "Same", "body": "one\nthree"}),
        );
        assert_eq!(d[0]["changed"], false);
        assert_eq!(d[1]["changed"], true);
        let tags: Vec<&str> =
            d[1]["lines"].as_array().unwrap().iter().map(|l| l["tag"].as_str().unwrap()).collect();
        assert_eq!(tags, ["same", "del", "add"]);
        // Nothing live yet: everything is added.
        let first = diff(&template, &Value::Null, &json!({"title": "New"}));
        assert_eq!(first[0]["lines"][0]["tag"], "add");
    }
}

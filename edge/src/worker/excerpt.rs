//! What a reviewer sees of a fetched source: the first characters of a textual body, markup,
//! scripts and styles stripped.

/// Characters of text kept as the excerpt reviewers see.
pub(crate) const EXCERPT_CHARS: usize = 500;
/// Bytes of the body read for the excerpt (markup included).
pub(crate) const EXCERPT_SOURCE_BYTES: usize = 64 * 1024;
/// Whether a body is text a reviewer can read, and whether it is markup.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum TextKind {
    Plain,
    Markup,
    Binary,
}

impl TextKind {
    pub fn of(content_type: Option<&reqwest::header::HeaderValue>) -> Self {
        let Some(value) = content_type.and_then(|v| v.to_str().ok()) else {
            return TextKind::Binary;
        };
        let mime = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        if mime == "text/html"
            || mime == "application/xhtml+xml"
            || mime.ends_with("/xml")
            || mime.ends_with("+xml")
        {
            TextKind::Markup
        } else if mime.starts_with("text/") || mime == "application/json" || mime.ends_with("+json") {
            TextKind::Plain
        } else {
            TextKind::Binary
        }
    }
}

/// The first ~500 characters of a textual body, without markup, scripts or styles, whitespace
/// collapsed. None for binary bodies.
pub(crate) fn excerpt(kind: TextKind, head: &[u8]) -> Option<String> {
    if kind == TextKind::Binary {
        return None;
    }
    let text = String::from_utf8_lossy(head);
    let text = if kind == TextKind::Markup { strip_markup(&text) } else { text.into_owned() };
    let mut out = String::new();
    let mut count = 0;
    for word in text.split_whitespace() {
        let word: String = word.chars().filter(|c| !c.is_control() && *c != '\u{fffd}').collect();
        if word.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push(' ');
            count += 1;
        }
        for c in word.chars() {
            if count == EXCERPT_CHARS {
                return Some(out);
            }
            out.push(c);
            count += 1;
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Text outside tags, comments, scripts and styles, with the common entities decoded.
fn strip_markup(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let lower = html.to_ascii_lowercase();
    let mut i = 0;
    while i < html.len() {
        let rest = &lower[i..];
        if rest.starts_with("<!--") {
            i += rest.find("-->").map_or(rest.len(), |end| end + 3);
        } else if let Some(tag) = ["<script", "<style"].iter().find(|t| rest.starts_with(**t)) {
            let close = format!("</{}", &tag[1..]);
            i += rest
                .find(&close)
                .and_then(|end| rest[end..].find('>').map(|gt| end + gt + 1))
                .unwrap_or(rest.len());
            out.push(' ');
        } else if rest.starts_with('<') {
            i += rest.find('>').map_or(rest.len(), |end| end + 1);
            out.push(' ');
        } else {
            let next = rest.find('<').unwrap_or(rest.len());
            out.push_str(&html[i..i + next]);
            i += next;
        }
    }
    out.replace("&nbsp;", " ")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_are_short_text_without_markup() {
        let html = b"<html><head><style>p{color:red}</style><script>var s='x';</script></head>\
                     <body><!-- note --><h1>Prices</h1>\n<p>Plans &amp; what   they include.</p></body></html>";
        assert_eq!(excerpt(TextKind::Markup, html).as_deref(), Some("Prices Plans & what they include."));
        assert_eq!(excerpt(TextKind::Binary, b"\x89PNG"), None);
        let long = "word ".repeat(400);
        let cut = excerpt(TextKind::Plain, long.as_bytes()).unwrap();
        assert_eq!(cut.chars().count(), EXCERPT_CHARS);
        let ct = reqwest::header::HeaderValue::from_static("text/html; charset=utf-8");
        assert_eq!(TextKind::of(Some(&ct)), TextKind::Markup);
        assert_eq!(TextKind::of(None), TextKind::Binary);
    }
}

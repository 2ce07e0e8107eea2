//! The dashboard's templates, compiled into the binary and loaded once. Names ending in `.html`
//! are auto-escaped: only values the edge rendered itself (Markdown, diffs) are marked safe.

use std::sync::OnceLock;

use minijinja::Environment;
use serde_json::Value;

macro_rules! templates {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("templates/", $name)))),*]
    };
}

const TEMPLATES: &[(&str, &str)] = templates![
    "base.html",
    "error.html",
    "sign_in.html",
    "invite.html",
    "invite_done.html",
    "inbox.html",
    "proposal.html",
    "content_list.html",
    "content_item.html",
    "content_form.html",
    "revision.html",
    "runs.html",
    "run.html",
    "connections.html",
    "secret.html",
    "agents.html",
    "console.html",
    "turn.html",
    "audit.html",
    "evidence.html",
    "forms.html",
    "members.html",
    "delivery.html",
    "docs.html",
];

fn environment() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        for (name, source) in TEMPLATES {
            env.add_template(name, source).unwrap_or_else(|e| panic!("template {name}: {e}"));
        }
        env
    })
}

pub fn render(name: &str, context: &Value) -> Result<String, minijinja::Error> {
    environment().get_template(name)?.render(minijinja::Value::from_serialize(context))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_template_compiles_and_escapes_what_it_is_given() {
        for (name, _) in TEMPLATES {
            environment().get_template(name).unwrap();
        }
        let out = render(
            "error.html",
            &json!({"title": "Refused", "error": {"code": "forbidden", "message": "<script>x</script>"}, "back": "/"}),
        )
        .unwrap();
        assert!(out.contains("&lt;script&gt;") && !out.contains("<script>x"), "{out}");
        assert!(out.contains("<html lang=\"en\">"));
    }
}

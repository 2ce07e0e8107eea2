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
    "consent.html",
];

fn environment() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.add_filter("truncate", truncate);
        for (name, source) in TEMPLATES {
            env.add_template(name, source).unwrap_or_else(|e| panic!("template {name}: {e}"));
        }
        env
    })
}

/// `{{ text | truncate(n) }}`: at most `n` characters, an ellipsis when cut.
fn truncate(text: String, length: Option<usize>) -> String {
    let length = length.unwrap_or(255);
    if text.chars().count() <= length {
        return text;
    }
    let mut cut: String = text.chars().take(length.saturating_sub(1)).collect();
    cut.push('…');
    cut
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

    #[test]
    fn long_requests_are_truncated_in_lists() {
        let out = render(
            "console.html",
            &json!({"title": "Agent Console", "conversations": [{"title": "C", "conversation_id": "x", "turns": [
                {"turn_id": "t", "request": "r".repeat(300), "state": "queued"}]}]}),
        )
        .unwrap();
        assert!(out.contains(&format!("{}…", "r".repeat(119))), "{out}");
        assert_eq!(truncate("short".into(), Some(10)), "short");
    }

    /// Pages whose data the browser tests do not always reach, rendered with every branch filled.
    #[test]
    fn pages_render_with_plans_reviews_and_decisions() {
        let me = json!({"member": "m", "role": "owner", "site": "demo", "csrf_token": "c"});
        let step = json!({"step_id": "s", "key": "draft", "operation": "draft", "risk": "medium",
                          "depends_on": ["research"], "state": "failed", "failure_reason": "x", "retry_count": 2});
        let turn = json!({"turn_id": "t", "request": "write".repeat(40), "state": "failed", "outcome": "failed",
                          "failure_reason": "profile gone", "conversation_title": "C", "session_id": "s",
                          "created_at": "now", "runs": ["r1"],
                          "plans": [{"plan_id": "p", "version": 1, "goal": "g", "state": "active", "failure_reason": null,
                                     "steps": [step]}],
                          "proposals": [{"proposal_id": "p", "type": "revision", "state": "pending"}]});
        render("turn.html", &json!({"title": "Turn", "me": me, "turn": turn, "can_edit": true})).unwrap();
        let review = json!({"review_id": "r", "reason": "changed", "state": "open", "opened_at": "now",
                            "evidence": {"claim": "c".repeat(200), "source_url": "https://e.example/", "quoted_span": "q"},
                            "observed": {"http_status": 200, "excerpt": "e".repeat(400), "attempted_at": "now"},
                            "reviewer_note": "n"});
        render(
            "evidence.html",
            &json!({"title": "E", "me": me, "reviews": [review], "state": "open", "can_edit": true}),
        )
        .unwrap();
        let p = json!({"proposal_id": "p", "type": "publish_lifecycle", "risk": "high", "state": "failed",
                       "summary": null, "decider_roles": ["owner"], "agent": "a", "created_at": "now",
                       "run": {"run_id": "r", "run_type": "t", "state": "finished", "outcome": "completed"},
                       "decision": {"decision": "approved", "member_role": "owner", "decided_at": "now", "note": "n"},
                       "execution": {"status": "failed", "detail": {"problems": [{"message": "stale"}]}},
                       "stale": false, "stale_problems": []});
        let detail = json!({"content_id": "c", "slug": "s", "state": "draft", "action": "unpublish", "live": null,
                            "problem": {"message": "nothing is live"}});
        render(
            "proposal.html",
            &json!({"title": "P", "me": me, "p": p, "details": [detail],
                                         "refusal": {"message": "m", "hint": "h"}}),
        )
        .unwrap();
    }
}

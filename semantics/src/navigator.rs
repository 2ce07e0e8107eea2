//! The pure part of the governed navigator loop: for a question, a principal and a purpose —
//! search the model, gate every matched dataset through RBAC + ODRL (one receipt each), plan SQL
//! over the allowed sources only, and produce the deterministic answer text and the LLM prompt.
//! Signing and recording the result is [`crate::signing`]; calling an LLM is the edge's job, which
//! then swaps the text in with [`NavigatorAnswer::with_llm_answer`] (the governance is unchanged).
//!
//! # Planning
//!
//! * Matched datasets are the dataset matches plus the datasets of field matches. They are gated
//!   in model order with action `read`; a denied source is listed in `denied_sources`, never
//!   planned, and named in the prompt as off-limits (by dataset name, never by location).
//! * For each allowed dataset: the columns are the fields that matched — or, when no field matched
//!   anywhere in the question, all of its fields — in declaration order. A column is the field's
//!   expression in the target dialect (else in `ANSI_SQL`), else its name quoted for the target
//!   dialect ([`crate::metrics::quote_identifier`]: backticks for `SAIL_SQL` and Spark-like
//!   dialects, double quotes for `ANSI_SQL`, `SNOWFLAKE` and the rest). No column means
//!   `SELECT *`. The plan is `SELECT <columns> FROM <source>`.
//! * When metrics matched but no source is allowed yet, the unmatched datasets are gated in model
//!   order until one is allowed (each with its receipt), so a metric-only question can be planned.
//! * Each matched metric, in match order, resolved for the target dialect with fallback
//!   ([`crate::metrics::resolve_metric`]), is planned as `SELECT <expression> FROM <first allowed
//!   source>`; a metric with no expression, or with no allowed source, is not planned.
//!
//! # Text
//!
//! With no plan: `No governed sources matched <question as Python repr>; no data may be
//! consulted.` Otherwise: `Answerable from governed sources <distinct plan sources, sorted> via
//! <n> planned quer(y|ies).`, plus ` Restricted sources were denied with receipts: <denied>.` when
//! something was denied. The prompt lists the question, model, instructions, matches, plans and
//! a `Denied sources (policy receipts issued; do NOT use): …` line. Both are the reference's
//! templates, word for word.

use crate::metrics::{expression_for, quote_identifier, resolve_metric, Fallback};
use crate::osi::OsiDocument;
use crate::rights::{decide, AccessRequest, Action, Receipt, RightsDocument};
use crate::search::{search_matches, Match, MatchKind};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The dialect plans are written in unless another is asked for.
pub const DEFAULT_DIALECT: &str = "SAIL_SQL";
/// `synthesized_by` of an answer written without a model.
pub const DETERMINISTIC: &str = "deterministic";

/// A question to answer on behalf of a principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NavigatorRequest<'a> {
    pub question: &'a str,
    /// The RBAC/ODRL subject (an agent's DID).
    pub principal: &'a str,
    /// The purpose stated for ODRL `purpose` constraints.
    pub purpose: Option<&'a str>,
    /// The SQL dialect to plan in, e.g. [`DEFAULT_DIALECT`].
    pub dialect: &'a str,
}

/// One planned query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The dataset name, or the metric name for a metric plan.
    pub dataset: String,
    pub source: String,
    pub sql: String,
    /// The metric of a metric plan; `null` otherwise.
    pub metric: Option<String>,
}

/// The governed answer, before signing. It deserializes too, so that an answer prepared for an
/// LLM can be stored and signed later with the text the LLM wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NavigatorAnswer {
    pub question: String,
    pub answer: String,
    pub synthesized_by: String,
    pub matches: Vec<Match>,
    pub plans: Vec<Plan>,
    pub receipts: Vec<Receipt>,
    pub denied_sources: Vec<String>,
    /// What an LLM is sent; it contains no denied source beyond the "do NOT use" line.
    pub prompt: String,
}

impl NavigatorAnswer {
    /// The same answer with text written by an LLM from [`NavigatorAnswer::prompt`]; matches,
    /// plans, receipts and denials are untouched.
    pub fn with_llm_answer(
        mut self,
        text: impl Into<String>,
        synthesized_by: impl Into<String>,
    ) -> NavigatorAnswer {
        self.answer = text.into();
        self.synthesized_by = synthesized_by.into();
        self
    }

    /// The distinct sources the plans read, in plan order.
    pub fn planned_sources(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for p in &self.plans {
            if !out.contains(&p.source) {
                out.push(p.source.clone());
            }
        }
        out
    }
}

/// Runs the pure navigator loop. Every receipt carries `now`.
pub fn answer_question(
    model: &OsiDocument,
    rights: &RightsDocument,
    req: &NavigatorRequest,
    now: DateTime<Utc>,
) -> NavigatorAnswer {
    let matches = search_matches(model, req.question);
    let (plans, receipts, denied) = plan_governed(model, rights, req, &matches, now);
    let prompt = build_prompt(model, req.question, &matches, &plans, &denied);
    let answer = deterministic_answer(req.question, &plans, &denied);
    NavigatorAnswer {
        question: req.question.to_string(),
        answer,
        synthesized_by: DETERMINISTIC.to_string(),
        matches,
        plans,
        receipts,
        denied_sources: denied,
        prompt,
    }
}

/// Gates and plans (see the module documentation): plans, receipts in decision order, denied
/// sources in decision order.
pub fn plan_governed(
    model: &OsiDocument,
    rights: &RightsDocument,
    req: &NavigatorRequest,
    matches: &[Match],
    now: DateTime<Utc>,
) -> (Vec<Plan>, Vec<Receipt>, Vec<String>) {
    let m = &model.semantic_model;
    let mut matched_datasets: Vec<&str> = Vec::new();
    let mut matched_fields: Vec<(&str, &str)> = Vec::new();
    let mut matched_metrics: Vec<&str> = Vec::new();
    for x in matches {
        match x.kind {
            MatchKind::Dataset => matched_datasets.push(&x.name),
            MatchKind::Field => {
                if let Some(d) = &x.dataset {
                    matched_datasets.push(d);
                    matched_fields.push((d, &x.name));
                }
            }
            MatchKind::Metric => matched_metrics.push(&x.name),
        }
    }

    let mut plans = Vec::new();
    let mut receipts = Vec::new();
    let mut denied = Vec::new();
    let mut allowed_sources: Vec<String> = Vec::new();
    let gate = |source: &str, receipts: &mut Vec<Receipt>, denied: &mut Vec<String>| -> bool {
        let request = AccessRequest {
            principal: req.principal,
            resource: source,
            action: Action::Read,
            purpose: req.purpose,
        };
        let decision = decide(rights, &request, now);
        receipts.push(decision.receipt);
        if !decision.allowed {
            denied.push(source.to_string());
        }
        decision.allowed
    };

    for d in m.datasets.iter().filter(|d| matched_datasets.contains(&d.name.as_str())) {
        if !gate(&d.source, &mut receipts, &mut denied) {
            continue;
        }
        allowed_sources.push(d.source.clone());
        let columns: Vec<String> = d
            .fields
            .iter()
            .filter(|f| {
                matched_fields.is_empty() || matched_fields.contains(&(d.name.as_str(), f.name.as_str()))
            })
            .map(|f| {
                match f.expression.as_ref().and_then(|e| expression_for(e, req.dialect)) {
                    // A field takes its own dialect or ANSI text; another dialect's text would not run.
                    Some((x, Fallback::Requested | Fallback::AnsiSql)) => x.expression.clone(),
                    _ => quote_identifier(&f.name, req.dialect),
                }
            })
            .collect();
        let select = if columns.is_empty() { "*".to_string() } else { columns.join(", ") };
        plans.push(Plan {
            dataset: d.name.clone(),
            source: d.source.clone(),
            sql: format!("SELECT {select} FROM {}", d.source),
            metric: None,
        });
    }

    if !matched_metrics.is_empty() && allowed_sources.is_empty() {
        for d in m.datasets.iter().filter(|d| !matched_datasets.contains(&d.name.as_str())) {
            if gate(&d.source, &mut receipts, &mut denied) {
                allowed_sources.push(d.source.clone());
                break;
            }
        }
    }

    for name in matched_metrics {
        let (Ok(r), Some(source)) = (resolve_metric(model, name, req.dialect), allowed_sources.first())
        else {
            continue;
        };
        plans.push(Plan {
            dataset: name.to_string(),
            source: source.clone(),
            sql: format!("SELECT {} FROM {source}", r.expression),
            metric: Some(name.to_string()),
        });
    }
    (plans, receipts, denied)
}

/// The deterministic answer text (the reference's template).
pub fn deterministic_answer(question: &str, plans: &[Plan], denied: &[String]) -> String {
    if plans.is_empty() {
        return format!("No governed sources matched {}; no data may be consulted.", python_repr(question));
    }
    let mut sources: Vec<&str> = plans.iter().map(|p| p.source.as_str()).collect();
    // Rust's str order is code-point order, as Python's sorted() on str.
    sources.sort_unstable();
    sources.dedup();
    let n = plans.len();
    let mut text = format!(
        "Answerable from governed sources {} via {n} planned quer{}.",
        sources.join(", "),
        if n == 1 { "y" } else { "ies" }
    );
    if !denied.is_empty() {
        text.push_str(&format!(" Restricted sources were denied with receipts: {}.", denied.join(", ")));
    }
    text
}

/// The prompt an LLM is given (the reference's lines, joined with `\n`).
pub fn build_prompt(
    model: &OsiDocument,
    question: &str,
    matches: &[Match],
    plans: &[Plan],
    denied: &[String],
) -> String {
    let m = &model.semantic_model;
    let mut lines = vec![
        "Answer using only the governed semantic context below.".to_string(),
        format!("Question: {question}"),
        String::new(),
        format!("Semantic model: {}", m.name),
    ];
    if let Some(instructions) =
        m.ai_context.as_ref().and_then(|c| c.instructions.as_deref()).filter(|s| !s.is_empty())
    {
        lines.push(format!("Instructions: {instructions}"));
    }
    if !matches.is_empty() {
        lines.push("Matched semantics:".into());
        lines.extend(matches.iter().map(|x| format!("- {}: {}", x.kind.as_str(), x.name)));
    }
    if !plans.is_empty() {
        lines.push("Governed SQL plans (allowed under RBAC+ODRL):".into());
        lines.extend(plans.iter().map(|p| format!("- {}", p.sql)));
    }
    if !denied.is_empty() {
        // Named by their semantic (dataset) names: the physical location of a denied source is
        // itself governed and never leaves the database, not even to the model that is told to
        // keep away from it.
        let names: Vec<&str> = denied
            .iter()
            .map(|source| {
                m.datasets
                    .iter()
                    .find(|d| &d.source == source)
                    .map(|d| d.name.as_str())
                    .unwrap_or("an unnamed restricted dataset")
            })
            .collect();
        lines.push(format!("Denied datasets (policy receipts issued; do NOT use): {}", names.join(", ")));
    }
    lines.join("\n")
}

/// Characters Python's `str.isprintable()` rejects beyond the C0/C1 controls: separators other
/// than the ASCII space, format characters, private use and noncharacters. (Unassigned code points
/// are the only gap; they stay raw here.)
fn python_unprintable(c: char) -> bool {
    let u = c as u32;
    c.is_control()
        || (c.is_whitespace() && c != ' ')
        || matches!(u,
            0xAD | 0x600..=0x605 | 0x61C | 0x6DD | 0x70F | 0x890..=0x891 | 0x8E2 | 0x180E
            | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064 | 0x2066..=0x206F | 0xFEFF | 0xFFF9..=0xFFFB
            | 0x110BD | 0x110CD | 0x13430..=0x1343F | 0x1BCA0..=0x1BCA3 | 0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F
            | 0xE000..=0xF8FF | 0xF0000..=0xFFFFD | 0x100000..=0x10FFFD | 0xFDD0..=0xFDEF)
        || (u & 0xFFFE) == 0xFFFE
}

/// Python's `repr()` of a string, which the reference's "no sources" sentence embeds.
fn python_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7F => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_ascii() => out.push(c),
            c if python_unprintable(c) => {
                let u = c as u32;
                if u <= 0xFF {
                    out.push_str(&format!("\\x{u:02x}"));
                } else if u <= 0xFFFF {
                    out.push_str(&format!("\\u{u:04x}"));
                } else {
                    out.push_str(&format!("\\U{u:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// One dataset of a navigator bundle, with the principal's access decision. A denied dataset
/// shows no fields: there is nothing in it to navigate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleDataset {
    pub name: String,
    pub description: Option<String>,
    pub source: String,
    pub fields: Vec<BundleField>,
    pub access: BundleAccess,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleField {
    pub name: String,
    pub description: Option<String>,
    pub semantic_type: Option<String>,
}

/// A metric of a navigator bundle: computable only when some dataset is readable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleMetric {
    pub name: String,
    pub description: Option<String>,
    pub dialects: Vec<String>,
    pub access: BundleAccess,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleAccess {
    pub allowed: bool,
    pub reason: String,
    pub policy_id: Option<String>,
}

/// The governed, per-principal view of a model an agent navigates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NavigatorBundle {
    pub model: String,
    pub principal: String,
    pub purpose: Option<String>,
    pub datasets: Vec<BundleDataset>,
    pub metrics: Vec<BundleMetric>,
    /// One receipt per dataset, in model order.
    pub receipts: Vec<Receipt>,
}

/// Gates every dataset of the model for `principal` (read, with `purpose`) and returns the view.
pub fn navigator_bundle(
    model: &OsiDocument,
    rights: &RightsDocument,
    principal: &str,
    purpose: Option<&str>,
    now: DateTime<Utc>,
) -> NavigatorBundle {
    let m = &model.semantic_model;
    let mut receipts = Vec::new();
    let datasets: Vec<BundleDataset> = m
        .datasets
        .iter()
        .map(|d| {
            let decision = decide(
                rights,
                &AccessRequest { principal, resource: &d.source, action: Action::Read, purpose },
                now,
            );
            let access = BundleAccess {
                allowed: decision.allowed,
                reason: decision.receipt.reason.clone(),
                policy_id: decision.receipt.policy_id.clone(),
            };
            receipts.push(decision.receipt);
            BundleDataset {
                name: d.name.clone(),
                description: d.description.clone(),
                source: d.source.clone(),
                fields: if access.allowed {
                    d.fields
                        .iter()
                        .map(|f| BundleField {
                            name: f.name.clone(),
                            description: f.description.clone(),
                            semantic_type: f.semantic_type.clone(),
                        })
                        .collect()
                } else {
                    Vec::new()
                },
                access,
            }
        })
        .collect();
    let readable = datasets.iter().any(|d| d.access.allowed);
    let metrics = m
        .metrics
        .iter()
        .map(|x| BundleMetric {
            name: x.name.clone(),
            description: x.description.clone(),
            dialects: x.expression.dialects.iter().map(|d| d.dialect.clone()).collect(),
            access: BundleAccess {
                allowed: readable,
                reason: if readable {
                    "computable over the readable datasets".into()
                } else {
                    "no dataset of the model is readable for this principal".into()
                },
                policy_id: None,
            },
        })
        .collect();
    NavigatorBundle {
        model: m.name.clone(),
        principal: principal.to_string(),
        purpose: purpose.map(str::to_string),
        datasets,
        metrics,
        receipts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo;
    use chrono::TimeZone;
    use serde_json::{json, Value};

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 3, 1, 41).unwrap()
    }

    fn ask(question: &str) -> NavigatorAnswer {
        let req = NavigatorRequest {
            question,
            principal: demo::PRINCIPAL,
            purpose: None,
            dialect: DEFAULT_DIALECT,
        };
        answer_question(&demo::model(), &demo::rights(), &req, now())
    }

    #[test]
    fn the_demo_question_reproduces_the_reference_run() {
        let reference: Value =
            serde_json::from_str(include_str!("../testdata/reference_demo_answer.json")).unwrap();
        let ours = ask(demo::QUESTION);
        let got = serde_json::to_value(&ours).unwrap();
        for key in ["question", "answer", "synthesized_by", "matches", "plans", "denied_sources"] {
            assert_eq!(got[key], reference[key], "{key}");
        }
        let decisions = |v: &Value| -> Vec<(Value, Value, Value, Value, Value)> {
            v["receipts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r["principal"].clone(),
                        r["resource"].clone(),
                        r["action"].clone(),
                        r["allowed"].clone(),
                        r["policy_id"].clone(),
                    )
                })
                .collect()
        };
        assert_eq!(decisions(&got), decisions(&reference));
        // Allowed receipts carry the reference's exact reason; the denial says why.
        assert_eq!(got["receipts"][0]["reason"], reference["receipts"][0]["reason"]);
        assert_eq!(
            ours.receipts[2].reason,
            "RBAC or ODRL denied action: RBAC: no role of did:example:qg-navigator (navigator) grants odrl:read on sail.qg_lakehouse.haalsi_baseline__restricted_raw"
        );
        assert_eq!(ours.receipts[2].issued_at, "2026-11-30T03:01:41.000000Z");
        let sql: Vec<&str> = ours.plans.iter().map(|p| p.sql.as_str()).collect();
        assert_eq!(
            sql,
            [
                "SELECT * FROM sail.qg_lakehouse.government_finance__countydata",
                "SELECT `monthly_cost` FROM sail.qg_lakehouse.access_2018__access_data",
                "SELECT SUM(total_revenue - mandated_spend) FROM sail.qg_lakehouse.government_finance__countydata",
            ]
        );
        assert!(ours
            .prompt
            .ends_with("Denied datasets (policy receipts issued; do NOT use): restricted_health"));
        // The restricted source's location never reaches the model: it is named by its dataset.
        assert!(!ours.prompt.contains("haalsi_baseline__restricted_raw"));
    }

    #[test]
    fn every_reference_loop_case_gives_the_same_matches_plans_decisions_text_and_prompt() {
        let cases: Value =
            serde_json::from_str(include_str!("../testdata/reference_loop_cases.json")).unwrap();
        for case in cases.as_array().unwrap() {
            let q = case["question"].as_str().unwrap();
            let ours = ask(q);
            let got = serde_json::to_value(&ours).unwrap();
            assert_eq!(got["matches"], case["matches"], "matches for {q:?}");
            assert_eq!(got["plans"], case["plans"], "plans for {q:?}");
            assert_eq!(got["denied_sources"], case["denied"], "denied for {q:?}");
            assert_eq!(ours.answer, case["answer"].as_str().unwrap(), "answer for {q:?}");
            // The reference names denied sources by location; we name them by dataset.
            let reference = case["prompt"].as_str().unwrap();
            let (ours_head, theirs_head) = (
                ours.prompt.split("\nDenied ").next().unwrap(),
                reference.split("\nDenied ").next().unwrap(),
            );
            assert_eq!(ours_head, theirs_head, "prompt for {q:?}");
            assert_eq!(
                ours.prompt.contains("\nDenied datasets"),
                reference.contains("\nDenied sources"),
                "{q:?}"
            );
            let decisions: Vec<Value> =
                ours.receipts.iter().map(|r| json!([r.resource, r.allowed])).collect();
            let expected: Vec<Value> =
                case["receipts"].as_array().unwrap().iter().map(|r| json!([r[0], r[1]])).collect();
            assert_eq!(decisions, expected, "receipts for {q:?}");
        }
    }

    #[test]
    fn plans_quote_for_the_target_dialect() {
        let req = NavigatorRequest {
            question: "Show monthly cost",
            principal: demo::PRINCIPAL,
            purpose: None,
            dialect: "ANSI_SQL",
        };
        let a = answer_question(&demo::model(), &demo::rights(), &req, now());
        assert_eq!(a.plans[0].sql, "SELECT \"monthly_cost\" FROM sail.qg_lakehouse.access_2018__access_data");
        // total_revenue has only a SAIL_SQL expression, which is not used for Snowflake.
        let req = NavigatorRequest {
            question: "county revenue totals",
            principal: demo::PRINCIPAL,
            purpose: None,
            dialect: "SNOWFLAKE",
        };
        let a = answer_question(&demo::model(), &demo::rights(), &req, now());
        assert_eq!(
            a.plans[0].sql,
            "SELECT \"total_revenue\" FROM sail.qg_lakehouse.government_finance__countydata"
        );
        assert_eq!(
            a.plans[1].sql,
            "SELECT SUM(total_revenue - mandated_spend) FROM sail.qg_lakehouse.government_finance__countydata"
        );
    }

    #[test]
    fn a_denied_principal_gets_no_plans_and_only_receipts() {
        let req = NavigatorRequest {
            question: demo::QUESTION,
            principal: "did:example:stranger",
            purpose: None,
            dialect: DEFAULT_DIALECT,
        };
        let a = answer_question(&demo::model(), &demo::rights(), &req, now());
        assert!(a.plans.is_empty());
        // Three matched datasets gated, then the metric-only fallback finds nothing else to gate.
        assert_eq!(a.receipts.len(), 3);
        assert!(a.receipts.iter().all(|r| !r.allowed));
        assert_eq!(a.denied_sources.len(), 3);
        assert!(a.answer.starts_with("No governed sources matched 'Where do"));
        assert!(!a.prompt.contains("Governed SQL plans"));
    }

    #[test]
    fn llm_text_replaces_only_the_answer() {
        let a = ask(demo::QUESTION);
        let b = a.clone().with_llm_answer("model text", "openai-compatible:m");
        assert_eq!((b.answer.as_str(), b.synthesized_by.as_str()), ("model text", "openai-compatible:m"));
        assert_eq!((a.receipts, a.plans, a.prompt), (b.receipts, b.plans, b.prompt));
    }

    #[test]
    fn python_repr_matches_python() {
        assert_eq!(python_repr("health"), "'health'");
        assert_eq!(python_repr("What's the health risk?"), "\"What's the health risk?\"");
        assert_eq!(python_repr("it's \"x\""), "'it\\'s \"x\"'");
        assert_eq!(python_repr("a\\b\tc\nd\u{7f}e\u{1}"), "'a\\\\b\\tc\\nd\\x7fe\\x01'");
        assert_eq!(python_repr("café ☕ 😀"), "'café ☕ 😀'");
        assert_eq!(python_repr("nbsp\u{a0}zw\u{200b}ls\u{2028}"), "'nbsp\\xa0zw\\u200bls\\u2028'");
        assert_eq!(python_repr(""), "''");
    }

    #[test]
    fn the_bundle_hides_what_is_denied_and_gates_every_dataset() {
        let now = chrono::TimeZone::with_ymd_and_hms(&Utc, 2026, 11, 30, 3, 1, 41).unwrap();
        let b = navigator_bundle(&demo::model(), &demo::rights(), demo::PRINCIPAL, None, now);
        assert_eq!(b.receipts.len(), b.datasets.len());
        let restricted = b.datasets.iter().find(|d| d.name == "restricted_health").unwrap();
        assert!(!restricted.access.allowed);
        assert!(restricted.fields.is_empty());
        assert!(b.datasets.iter().filter(|d| d.access.allowed).count() == 2);
        assert!(b.metrics.iter().all(|m| m.access.allowed));
    }
}

//! Metric resolution for a requested dialect, with fallback, and the SQL identifier quoting each
//! dialect needs.
//!
//! # Fallback
//!
//! A metric's expression is taken in the requested dialect; failing that in `ANSI_SQL`; failing
//! that in the first dialect the metric lists. The result says which dialect was used and why
//! ([`Fallback`]). Dialect names compare case-insensitively; when a dialect is listed twice the
//! first entry wins. When several metrics share a name, the one with the best fallback level wins,
//! then the first declared.
//!
//! # Quoting
//!
//! | dialects | identifier quote |
//! |---|---|
//! | `SAIL_SQL`, `SPARK`, `SPARK_SQL`, `DATABRICKS`, `HIVE`, `BIGQUERY`, `MYSQL`, `MARIADB` | `` `name` `` (a backtick inside is doubled) |
//! | `TSQL`, `MSSQL`, `SQLSERVER`, `MDX`, `TABLEAU` | `[name]` (`]` inside is doubled) |
//! | `ANSI_SQL`, `SNOWFLAKE`, `POSTGRES`, `DUCKDB`, `TRINO`, … and any other | `"name"` (`"` inside is doubled) |

use crate::osi::{DialectExpression, Expression, OsiDocument};
use serde::Serialize;
use std::fmt;

/// The dialect every fallback tries second.
pub const ANSI_SQL: &str = "ANSI_SQL";

/// Which rung of the fallback produced an expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// The requested dialect itself.
    Requested,
    /// `ANSI_SQL`, because the requested dialect was not listed.
    AnsiSql,
    /// The first listed dialect, because neither the requested one nor `ANSI_SQL` was.
    Any,
}

/// A resolved metric: `{metric, requested_dialect, dialect, fallback, expression}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MetricResolution {
    pub metric: String,
    pub requested_dialect: String,
    /// The dialect the expression is written in.
    pub dialect: String,
    pub fallback: Fallback,
    pub expression: String,
}

/// Why a metric could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum MetricError {
    /// No metric has this name.
    UnknownMetric { metric: String, known: Vec<String> },
    /// The metric lists no expression at all.
    NoExpression { metric: String },
}

impl fmt::Display for MetricError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricError::UnknownMetric { metric, known } => {
                write!(f, "no metric {metric:?}; known: {}", known.join(", "))
            }
            MetricError::NoExpression { metric } => {
                write!(f, "metric {metric:?} has no expression in any dialect")
            }
        }
    }
}

impl std::error::Error for MetricError {}

/// The expression for `dialect` with the requested → `ANSI_SQL` → first-listed fallback.
pub fn expression_for<'a>(expr: &'a Expression, dialect: &str) -> Option<(&'a DialectExpression, Fallback)> {
    if let Some(d) = expr.exact(dialect) {
        return Some((d, Fallback::Requested));
    }
    if let Some(d) = expr.exact(ANSI_SQL) {
        return Some((d, Fallback::AnsiSql));
    }
    expr.dialects.first().map(|d| (d, Fallback::Any))
}

/// Resolves the metric called `name` (exactly, else ASCII case-insensitively) for `dialect`.
pub fn resolve_metric(
    model: &OsiDocument,
    name: &str,
    dialect: &str,
) -> Result<MetricResolution, MetricError> {
    let metrics = &model.semantic_model.metrics;
    let mut candidates: Vec<_> = metrics.iter().filter(|m| m.name == name).collect();
    if candidates.is_empty() {
        candidates = metrics.iter().filter(|m| m.name.eq_ignore_ascii_case(name)).collect();
    }
    if candidates.is_empty() {
        return Err(MetricError::UnknownMetric {
            metric: name.to_string(),
            known: metrics.iter().map(|m| m.name.clone()).collect(),
        });
    }
    // min_by_key keeps the first of equal keys: best fallback, then declaration order.
    let best = candidates
        .iter()
        .filter_map(|m| expression_for(&m.expression, dialect).map(|(d, f)| (f, *m, d)))
        .min_by_key(|(f, _, _)| *f);
    match best {
        Some((fallback, m, d)) => Ok(MetricResolution {
            metric: m.name.clone(),
            requested_dialect: dialect.to_string(),
            dialect: d.dialect.clone(),
            fallback,
            expression: d.expression.clone(),
        }),
        None => Err(MetricError::NoExpression { metric: candidates[0].name.clone() }),
    }
}

/// How a dialect quotes identifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QuoteStyle {
    Backtick,
    Bracket,
    DoubleQuote,
}

/// The quoting `dialect` uses (see the module table).
pub fn quote_style(dialect: &str) -> QuoteStyle {
    match dialect.trim().to_ascii_uppercase().as_str() {
        "SAIL_SQL" | "SAIL" | "SPARK" | "SPARK_SQL" | "SPARKSQL" | "DATABRICKS" | "HIVE" | "HIVEQL"
        | "BIGQUERY" | "MYSQL" | "MARIADB" => QuoteStyle::Backtick,
        "TSQL" | "T_SQL" | "MSSQL" | "SQLSERVER" | "SQL_SERVER" | "MDX" | "TABLEAU" => QuoteStyle::Bracket,
        _ => QuoteStyle::DoubleQuote,
    }
}

/// Quotes an identifier for `dialect`, escaping the closing quote character by doubling it.
pub fn quote_identifier(name: &str, dialect: &str) -> String {
    match quote_style(dialect) {
        QuoteStyle::Backtick => format!("`{}`", name.replace('`', "``")),
        QuoteStyle::Bracket => format!("[{}]", name.replace(']', "]]")),
        QuoteStyle::DoubleQuote => format!("\"{}\"", name.replace('"', "\"\"")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::osi::parse_value;
    use serde_json::json;

    fn model() -> OsiDocument {
        parse_value(&json!({"semantic_model": {"name": "m", "metrics": [
            {"name": "rev", "expression": {"dialects": [
                {"dialect": "SNOWFLAKE", "expression": "SUM(\"rev\")"},
                {"dialect": "ANSI_SQL", "expression": "SUM(rev)"},
                {"dialect": "SAIL_SQL", "expression": "SUM(`rev`)"}]}},
            {"name": "mdx_only", "expression": {"dialects": [{"dialect": "MDX", "expression": "[Measures].[X]"}, {"dialect": "TABLEAU", "expression": "SUM([X])"}]}},
            {"name": "empty", "expression": {"dialects": []}},
            {"name": "dup", "expression": {"dialects": [{"dialect": "MDX", "expression": "first"}]}},
            {"name": "dup", "expression": {"dialects": [{"dialect": "ANSI_SQL", "expression": "second"}]}}
        ]}}))
        .unwrap()
    }

    #[test]
    fn requested_then_ansi_then_any_and_the_result_says_which() {
        let m = model();
        let r = resolve_metric(&m, "rev", "sail_sql").unwrap();
        assert_eq!(
            (r.dialect.as_str(), r.fallback, r.expression.as_str()),
            ("SAIL_SQL", Fallback::Requested, "SUM(`rev`)")
        );
        let r = resolve_metric(&m, "rev", "DATABRICKS").unwrap();
        assert_eq!(
            (r.dialect.as_str(), r.fallback, r.requested_dialect.as_str()),
            ("ANSI_SQL", Fallback::AnsiSql, "DATABRICKS")
        );
        let r = resolve_metric(&m, "mdx_only", "SAIL_SQL").unwrap();
        assert_eq!(
            (r.dialect.as_str(), r.fallback, r.expression.as_str()),
            ("MDX", Fallback::Any, "[Measures].[X]")
        );
        let r = resolve_metric(&m, "dup", "SAIL_SQL").unwrap();
        assert_eq!(
            r.expression, "second",
            "an ANSI expression beats a first-listed one among same-named metrics"
        );
        assert_eq!(
            resolve_metric(&m, "empty", "SAIL_SQL").unwrap_err(),
            MetricError::NoExpression { metric: "empty".into() }
        );
        let e = resolve_metric(&m, "nope", "MDX").unwrap_err();
        assert!(matches!(e, MetricError::UnknownMetric { .. }));
        assert_eq!(e.to_string(), "no metric \"nope\"; known: rev, mdx_only, empty, dup, dup");
        assert_eq!(resolve_metric(&m, "REV", "ANSI_SQL").unwrap().metric, "rev");
    }

    #[test]
    fn the_demo_metric_resolves_to_its_ansi_expression() {
        let r = resolve_metric(&crate::demo::model(), "fiscal_capacity", "SAIL_SQL").unwrap();
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"metric": "fiscal_capacity", "requested_dialect": "SAIL_SQL", "dialect": "ANSI_SQL", "fallback": "ansi_sql",
                   "expression": "SUM(total_revenue - mandated_spend)"})
        );
    }

    #[test]
    fn identifiers_are_quoted_per_dialect() {
        assert_eq!(quote_identifier("monthly_cost", "SAIL_SQL"), "`monthly_cost`");
        assert_eq!(quote_identifier("a`b", "databricks"), "`a``b`");
        assert_eq!(quote_identifier("monthly_cost", "ANSI_SQL"), "\"monthly_cost\"");
        assert_eq!(quote_identifier("a\"b", "SNOWFLAKE"), "\"a\"\"b\"");
        assert_eq!(quote_identifier("x]y", "TSQL"), "[x]]y]");
        assert_eq!(quote_identifier("x", "SOMETHING_NEW"), "\"x\"");
    }
}

//! OSI (Open Semantic Interchange) semantic models: parsing JSON or YAML, validating with every
//! error named by its path, and the normalized JSON form that is stored.
//!
//! Accepted input (a superset of what the OSI core spec and the published QueryGraph package
//! accept):
//!
//! * The document is a JSON or YAML object with `semantic_model` (required) and `version`
//!   (optional string or number, default `"0.2.0.dev0"`). `semantic_model` is an object or a list
//!   holding exactly one object; an empty list and lists of several models are errors.
//! * `ai_context` (on the model, datasets, fields, metrics and relationships) is a string — taken
//!   as the instructions — or an object `{instructions?, synonyms?: [string], examples?: [string]}`.
//! * Dialects are free strings (`ANSI_SQL`, `SAIL_SQL`, `SNOWFLAKE`, …); none is refused.
//! * Field time dimensions may be written `is_time_dimension: bool` or the spec's
//!   `dimension: {is_time: bool}`; the normalized form carries both.
//! * Relationships use `from`/`to` (the spec); `from_dataset`/`to_dataset` are also read.
//! * `primary_key` is a list of column names, or the spec's list of column lists (flattened).
//! * Unknown keys are ignored at every level (the raw document is kept by the caller if needed).
//!
//! Validation never stops at the first problem: [`parse_document`] returns every error, each as
//! `path: message`, for example `semantic_model.datasets[0].source: required`. A model given as a
//! one-item list is addressed as `semantic_model[0]…`, which is where the offending value is.

use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::HashSet;
use std::fmt;

/// The version written when a document does not give one (what the reference writes).
pub const DEFAULT_VERSION: &str = "0.2.0.dev0";

/// One validation error: where, and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OsiError {
    /// Dotted path with list indices, e.g. `semantic_model.datasets[0].source`; empty for the
    /// document itself.
    pub path: String,
    /// What is wrong, e.g. `required` or `must be a string`.
    pub message: String,
}

impl fmt::Display for OsiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "<document>: {}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// A validated OSI document. Serializing it gives the normalized JSON form that is stored: every
/// list present (possibly empty), `ai_context` expanded to an object, absent optional scalars
/// omitted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OsiDocument {
    pub version: String,
    pub semantic_model: SemanticModel,
}

/// The one semantic model of a document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SemanticModel {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ai_context: Option<AiContext>,
    pub datasets: Vec<Dataset>,
    pub relationships: Vec<Relationship>,
    pub metrics: Vec<Metric>,
    pub ontology_terms: Vec<OntologyTerm>,
    /// Vendor extensions, kept as the objects given (`{vendor_name, data}` in the spec).
    pub custom_extensions: Vec<Value>,
}

/// Hints for AI tools: free instructions, synonyms (used by search) and examples.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct AiContext {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    pub synonyms: Vec<String>,
    pub examples: Vec<String>,
}

/// A logical dataset over one physical source.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dataset {
    pub name: String,
    /// The physical table, view or query; this string is what rights are granted on.
    pub source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ai_context: Option<AiContext>,
    pub primary_key: Vec<String>,
    pub unique_keys: Vec<Vec<String>>,
    pub fields: Vec<Field>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub custom_extensions: Vec<Value>,
}

/// A row-level attribute of a dataset.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Field {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub semantic_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expression: Option<Expression>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ai_context: Option<AiContext>,
    pub is_time_dimension: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dimension: Option<Dimension>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub custom_extensions: Vec<Value>,
}

/// The spec's dimension block of a field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Dimension {
    pub is_time: bool,
}

/// A quantitative measure with per-dialect expressions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metric {
    pub name: String,
    pub expression: Expression,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ai_context: Option<AiContext>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub custom_extensions: Vec<Value>,
}

/// A foreign-key relationship between two datasets.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Relationship {
    pub name: String,
    pub from: String,
    pub to: String,
    pub from_columns: Vec<String>,
    pub to_columns: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ai_context: Option<AiContext>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub custom_extensions: Vec<Value>,
}

/// A term of an external ontology the model refers to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OntologyTerm {
    pub id: String,
    pub label: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// An expression written in one or more dialects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Expression {
    pub dialects: Vec<DialectExpression>,
}

/// One dialect's text of an expression.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DialectExpression {
    pub dialect: String,
    pub expression: String,
}

impl Expression {
    /// The expression for exactly `dialect` (compared case-insensitively; the first listed wins).
    pub fn exact(&self, dialect: &str) -> Option<&DialectExpression> {
        let wanted = dialect.trim();
        self.dialects.iter().find(|d| d.dialect.trim().eq_ignore_ascii_case(wanted))
    }
}

impl OsiDocument {
    /// The normalized JSON form (what is stored, and what [`parse_value`] reads back unchanged).
    pub fn to_normalized_json(&self) -> Value {
        serde_json::to_value(self).expect("OSI documents serialize")
    }

    /// The dataset called `name`.
    pub fn dataset(&self, name: &str) -> Option<&Dataset> {
        self.semantic_model.datasets.iter().find(|d| d.name == name)
    }
}

/// Parses an OSI document from JSON or YAML text and validates it.
///
/// JSON is tried first; text that is not JSON is read as YAML (YAML 1.2, of which JSON is a
/// subset). Syntax errors are reported at the empty path with the parser's message.
pub fn parse_document(text: &str) -> Result<OsiDocument, Vec<OsiError>> {
    let value = parse_text(text).map_err(|message| vec![OsiError { path: String::new(), message }])?;
    parse_value(&value)
}

/// Reads JSON or YAML text into a JSON value, without validating it as OSI.
pub fn parse_text(text: &str) -> Result<Value, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(v) => Ok(v),
        Err(json_err) => match serde_norway::from_str::<Value>(text) {
            Ok(v) => Ok(v),
            Err(yaml_err) => {
                // Report in the syntax the author most likely meant.
                let looks_json = matches!(text.trim_start().chars().next(), Some('{') | Some('['));
                if looks_json {
                    Err(format!("not valid JSON: {json_err}"))
                } else {
                    Err(format!("not valid YAML: {yaml_err}"))
                }
            }
        },
    }
}

/// Validates an already parsed document (JSON value) and builds the typed model.
pub fn parse_value(value: &Value) -> Result<OsiDocument, Vec<OsiError>> {
    let mut v = Validator { errors: Vec::new() };
    let doc = v.document(value);
    match doc {
        Some(doc) if v.errors.is_empty() => Ok(doc),
        _ => {
            if v.errors.is_empty() {
                // Defensive: a failed build always records why; never return an empty error list.
                v.err("", "invalid OSI document");
            }
            Err(v.errors)
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Walks the document, recording errors and building what is valid. Each method returns `None`
/// when its part could not be built; errors for it are already recorded.
struct Validator {
    errors: Vec<OsiError>,
}

impl Validator {
    fn err(&mut self, path: &str, message: impl Into<String>) {
        self.errors.push(OsiError { path: path.to_string(), message: message.into() });
    }

    fn object<'a>(&mut self, v: &'a Value, path: &str) -> Option<&'a Map<String, Value>> {
        match v {
            Value::Object(m) => Some(m),
            other => {
                self.err(path, format!("must be an object, not {}", type_name(other)));
                None
            }
        }
    }

    /// A required, non-empty string.
    fn required_str(&mut self, m: &Map<String, Value>, key: &str, path: &str) -> Option<String> {
        self.required_str_any(m, &[key], path)
    }

    /// A required, non-empty string under the first of `keys` present; errors name `keys[0]`.
    fn required_str_any(&mut self, m: &Map<String, Value>, keys: &[&str], path: &str) -> Option<String> {
        let found = keys.iter().find_map(|k| m.get(*k).filter(|v| !v.is_null()).map(|v| (*k, v)));
        match found {
            None => {
                self.err(&join(path, keys[0]), "required");
                None
            }
            Some((k, Value::String(s))) => {
                if s.trim().is_empty() {
                    self.err(&join(path, k), "must not be empty");
                    None
                } else {
                    Some(s.clone())
                }
            }
            Some((k, other)) => {
                self.err(&join(path, k), format!("must be a string, not {}", type_name(other)));
                None
            }
        }
    }

    fn optional_str(&mut self, m: &Map<String, Value>, key: &str, path: &str) -> Option<String> {
        match m.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                self.err(&join(path, key), format!("must be a string, not {}", type_name(other)));
                None
            }
        }
    }

    fn optional_bool(&mut self, m: &Map<String, Value>, key: &str, path: &str) -> Option<bool> {
        match m.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(other) => {
                self.err(&join(path, key), format!("must be a boolean, not {}", type_name(other)));
                None
            }
        }
    }

    /// An optional list (absent or null → empty).
    fn list<'a>(&mut self, m: &'a Map<String, Value>, key: &str, path: &str) -> &'a [Value] {
        match m.get(key) {
            None | Some(Value::Null) => &[],
            Some(Value::Array(items)) => items,
            Some(other) => {
                self.err(&join(path, key), format!("must be a list, not {}", type_name(other)));
                &[]
            }
        }
    }

    fn string_list(&mut self, m: &Map<String, Value>, key: &str, path: &str) -> Vec<String> {
        let p = join(path, key);
        let items = self.list(m, key, path);
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) => out.push(s.clone()),
                other => self.err(&index(&p, i), format!("must be a string, not {}", type_name(other))),
            }
        }
        out
    }

    fn document(&mut self, value: &Value) -> Option<OsiDocument> {
        let m = self.object(value, "")?;
        let version = match m.get("version") {
            None | Some(Value::Null) => DEFAULT_VERSION.to_string(),
            Some(Value::String(s)) => s.clone(),
            // YAML reads `version: 1.0` as a number; keep what was written.
            Some(Value::Number(n)) => n.to_string(),
            Some(other) => {
                self.err("version", format!("must be a string, not {}", type_name(other)));
                DEFAULT_VERSION.to_string()
            }
        };
        let model = match m.get("semantic_model") {
            None => {
                self.err("semantic_model", "required");
                None
            }
            Some(Value::Array(items)) => match items.len() {
                0 => {
                    self.err("semantic_model", "must not be an empty list");
                    None
                }
                1 => self.model(&items[0], "semantic_model[0]"),
                n => {
                    self.err(
                        "semantic_model",
                        format!("holds {n} models; multi-model documents are not supported"),
                    );
                    None
                }
            },
            Some(other) => self.model(other, "semantic_model"),
        };
        Some(OsiDocument { version, semantic_model: model? })
    }

    fn ai_context(&mut self, m: &Map<String, Value>, path: &str) -> Option<AiContext> {
        let p = join(path, "ai_context");
        match m.get("ai_context") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => {
                Some(AiContext { instructions: Some(s.clone()), ..AiContext::default() })
            }
            Some(Value::Object(c)) => Some(AiContext {
                instructions: self.optional_str(c, "instructions", &p),
                synonyms: self.string_list(c, "synonyms", &p),
                examples: self.string_list(c, "examples", &p),
            }),
            Some(other) => {
                self.err(&p, format!("must be a string or an object, not {}", type_name(other)));
                None
            }
        }
    }

    fn extensions(&mut self, m: &Map<String, Value>, path: &str) -> Vec<Value> {
        let p = join(path, "custom_extensions");
        let items = self.list(m, "custom_extensions", path);
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            if item.is_object() {
                out.push(item.clone());
            } else {
                self.err(&index(&p, i), format!("must be an object, not {}", type_name(item)));
            }
        }
        out
    }

    fn expression(&mut self, v: &Value, path: &str) -> Option<Expression> {
        let m = self.object(v, path)?;
        let dp = join(path, "dialects");
        let items = match m.get("dialects") {
            None | Some(Value::Null) => {
                self.err(&dp, "required");
                return None;
            }
            Some(Value::Array(items)) => items,
            Some(other) => {
                self.err(&dp, format!("must be a list, not {}", type_name(other)));
                return None;
            }
        };
        let mut dialects = Vec::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let ip = index(&dp, i);
            let Some(d) = self.object(item, &ip) else {
                ok = false;
                continue;
            };
            let dialect = self.required_str(d, "dialect", &ip);
            let expression = match d.get("expression") {
                None | Some(Value::Null) => {
                    self.err(&join(&ip, "expression"), "required");
                    None
                }
                Some(Value::String(s)) => Some(s.clone()),
                Some(other) => {
                    self.err(&join(&ip, "expression"), format!("must be a string, not {}", type_name(other)));
                    None
                }
            };
            match (dialect, expression) {
                (Some(dialect), Some(expression)) => dialects.push(DialectExpression { dialect, expression }),
                _ => ok = false,
            }
        }
        ok.then_some(Expression { dialects })
    }

    fn model(&mut self, v: &Value, path: &str) -> Option<SemanticModel> {
        let m = self.object(v, path)?;
        let name = self.required_str(m, "name", path);
        let description = self.optional_str(m, "description", path);
        let ai_context = self.ai_context(m, path);

        let dp = join(path, "datasets");
        let mut datasets = Vec::new();
        let mut seen = HashSet::new();
        let mut datasets_ok = true;
        for (i, item) in self.list(m, "datasets", path).iter().enumerate() {
            let ip = index(&dp, i);
            let built = self.dataset(item, &ip);
            // Datasets are gated and planned by name; two with one name would be ambiguous.
            if let Some(name) = item.get("name").and_then(Value::as_str) {
                if !seen.insert(name) {
                    self.err(&join(&ip, "name"), format!("duplicate dataset name {name:?}"));
                    datasets_ok = false;
                }
            }
            match built {
                Some(d) => datasets.push(d),
                None => datasets_ok = false,
            }
        }

        let rp = join(path, "relationships");
        let mut relationships = Vec::new();
        let mut rel_ok = true;
        for (i, item) in self.list(m, "relationships", path).iter().enumerate() {
            match self.relationship(item, &index(&rp, i)) {
                Some(r) => relationships.push(r),
                None => rel_ok = false,
            }
        }

        let mp = join(path, "metrics");
        let mut metrics = Vec::new();
        let mut metrics_ok = true;
        for (i, item) in self.list(m, "metrics", path).iter().enumerate() {
            match self.metric(item, &index(&mp, i)) {
                Some(x) => metrics.push(x),
                None => metrics_ok = false,
            }
        }

        let op = join(path, "ontology_terms");
        let mut ontology_terms = Vec::new();
        let mut terms_ok = true;
        for (i, item) in self.list(m, "ontology_terms", path).iter().enumerate() {
            let ip = index(&op, i);
            let Some(t) = self.object(item, &ip) else {
                terms_ok = false;
                continue;
            };
            let id = self.required_str(t, "id", &ip);
            let label = self.required_str(t, "label", &ip);
            let source = self.optional_str(t, "source", &ip);
            match (id, label) {
                (Some(id), Some(label)) => ontology_terms.push(OntologyTerm { id, label, source }),
                _ => terms_ok = false,
            }
        }
        let custom_extensions = self.extensions(m, path);

        if !(datasets_ok && rel_ok && metrics_ok && terms_ok) {
            return None;
        }
        Some(SemanticModel {
            name: name?,
            description,
            ai_context,
            datasets,
            relationships,
            metrics,
            ontology_terms,
            custom_extensions,
        })
    }

    fn dataset(&mut self, v: &Value, path: &str) -> Option<Dataset> {
        let m = self.object(v, path)?;
        let name = self.required_str(m, "name", path);
        let source = self.required_str(m, "source", path);
        let description = self.optional_str(m, "description", path);
        let ai_context = self.ai_context(m, path);

        // `[a, b]` (columns) or the spec's `[[a, b]]` (one composite key): both mean columns a, b.
        let pp = join(path, "primary_key");
        let mut primary_key = Vec::new();
        for (i, item) in self.list(m, "primary_key", path).iter().enumerate() {
            match item {
                Value::String(s) => primary_key.push(s.clone()),
                Value::Array(cols) => {
                    for (j, c) in cols.iter().enumerate() {
                        match c {
                            Value::String(s) => primary_key.push(s.clone()),
                            other => self.err(
                                &index(&index(&pp, i), j),
                                format!("must be a string, not {}", type_name(other)),
                            ),
                        }
                    }
                }
                other => {
                    self.err(&index(&pp, i), format!("must be a string or a list, not {}", type_name(other)))
                }
            }
        }
        let up = join(path, "unique_keys");
        let mut unique_keys = Vec::new();
        for (i, item) in self.list(m, "unique_keys", path).iter().enumerate() {
            match item {
                Value::String(s) => unique_keys.push(vec![s.clone()]),
                Value::Array(cols) => {
                    let mut key = Vec::new();
                    for (j, c) in cols.iter().enumerate() {
                        match c {
                            Value::String(s) => key.push(s.clone()),
                            other => self.err(
                                &index(&index(&up, i), j),
                                format!("must be a string, not {}", type_name(other)),
                            ),
                        }
                    }
                    unique_keys.push(key);
                }
                other => self.err(&index(&up, i), format!("must be a list, not {}", type_name(other))),
            }
        }

        let fp = join(path, "fields");
        let mut fields = Vec::new();
        let mut fields_ok = true;
        for (i, item) in self.list(m, "fields", path).iter().enumerate() {
            match self.field(item, &index(&fp, i)) {
                Some(f) => fields.push(f),
                None => fields_ok = false,
            }
        }
        let custom_extensions = self.extensions(m, path);
        if !fields_ok {
            return None;
        }
        Some(Dataset {
            name: name?,
            source: source?,
            description,
            ai_context,
            primary_key,
            unique_keys,
            fields,
            custom_extensions,
        })
    }

    fn field(&mut self, v: &Value, path: &str) -> Option<Field> {
        let m = self.object(v, path)?;
        let name = self.required_str(m, "name", path);
        let description = self.optional_str(m, "description", path);
        let semantic_type = self.optional_str(m, "semantic_type", path);
        let mut expr_ok = true;
        let expression = match m.get("expression") {
            None | Some(Value::Null) => None,
            Some(e) => {
                let x = self.expression(e, &join(path, "expression"));
                expr_ok = x.is_some();
                x
            }
        };
        let ai_context = self.ai_context(m, path);
        let flag = self.optional_bool(m, "is_time_dimension", path);
        let dimension = match m.get("dimension") {
            None | Some(Value::Null) => None,
            Some(d) => {
                let dpath = join(path, "dimension");
                self.object(d, &dpath).map(|dm| Dimension {
                    is_time: self.optional_bool(dm, "is_time", &dpath).unwrap_or(false),
                })
            }
        };
        let is_time_dimension = flag.unwrap_or(false) || dimension.as_ref().is_some_and(|d| d.is_time);
        let label = self.optional_str(m, "label", path);
        let custom_extensions = self.extensions(m, path);
        if !expr_ok {
            return None;
        }
        Some(Field {
            name: name?,
            description,
            semantic_type,
            expression,
            ai_context,
            is_time_dimension,
            dimension,
            label,
            custom_extensions,
        })
    }

    fn metric(&mut self, v: &Value, path: &str) -> Option<Metric> {
        let m = self.object(v, path)?;
        let name = self.required_str(m, "name", path);
        let expression = match m.get("expression") {
            None | Some(Value::Null) => {
                self.err(&join(path, "expression"), "required");
                None
            }
            Some(e) => self.expression(e, &join(path, "expression")),
        };
        let description = self.optional_str(m, "description", path);
        let ai_context = self.ai_context(m, path);
        let custom_extensions = self.extensions(m, path);
        Some(Metric { name: name?, expression: expression?, description, ai_context, custom_extensions })
    }

    fn relationship(&mut self, v: &Value, path: &str) -> Option<Relationship> {
        let m = self.object(v, path)?;
        let name = self.required_str(m, "name", path);
        let from = self.required_str_any(m, &["from", "from_dataset"], path);
        let to = self.required_str_any(m, &["to", "to_dataset"], path);
        let from_columns = self.string_list(m, "from_columns", path);
        let to_columns = self.string_list(m, "to_columns", path);
        let ai_context = self.ai_context(m, path);
        let custom_extensions = self.extensions(m, path);
        Some(Relationship {
            name: name?,
            from: from?,
            to: to?,
            from_columns,
            to_columns,
            ai_context,
            custom_extensions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errors(v: Value) -> Vec<String> {
        parse_value(&v).unwrap_err().iter().map(|e| e.to_string()).collect()
    }

    fn minimal() -> Value {
        json!({"semantic_model": {"name": "m", "datasets": [{"name": "d", "source": "s"}]}})
    }

    #[test]
    fn object_and_one_item_list_are_the_same_model() {
        let a = parse_value(&minimal()).unwrap();
        let b = parse_value(
            &json!({"semantic_model": [{"name": "m", "datasets": [{"name": "d", "source": "s"}]}]}),
        )
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(
            a.to_normalized_json(),
            json!({"version": "0.2.0.dev0", "semantic_model": {"name": "m", "datasets": [
                {"name": "d", "source": "s", "primary_key": [], "unique_keys": [], "fields": []}],
                "relationships": [], "metrics": [], "ontology_terms": [], "custom_extensions": []}})
        );
    }

    #[test]
    fn empty_and_multi_model_lists_are_refused() {
        assert_eq!(errors(json!({"semantic_model": []})), ["semantic_model: must not be an empty list"]);
        let two = json!({"semantic_model": [{"name": "a"}, {"name": "b"}]});
        assert_eq!(errors(two), ["semantic_model: holds 2 models; multi-model documents are not supported"]);
        assert_eq!(errors(json!({"version": "1"})), ["semantic_model: required"]);
        assert_eq!(errors(json!({"semantic_model": null})), ["semantic_model: must be an object, not null"]);
        assert_eq!(errors(json!([1])), ["<document>: must be an object, not a list"]);
    }

    #[test]
    fn errors_name_the_offending_path_and_all_are_collected() {
        let doc = json!({"semantic_model": {
            "name": "m",
            "ai_context": {"synonyms": "x"},
            "datasets": [
                {"name": "d"},
                {"name": "e", "source": "s", "fields": [{"description": "no name"}, {"name": "f", "expression": {"dialects": [{"dialect": "ANSI_SQL"}]}}]},
                {"name": "d", "source": "t"}
            ],
            "metrics": [{"name": "x"}],
            "relationships": [{"name": "r", "from": "d"}]
        }});
        assert_eq!(
            errors(doc),
            [
                "semantic_model.ai_context.synonyms: must be a list, not a string",
                "semantic_model.datasets[0].source: required",
                "semantic_model.datasets[1].fields[0].name: required",
                "semantic_model.datasets[1].fields[1].expression.dialects[0].expression: required",
                "semantic_model.datasets[2].name: duplicate dataset name \"d\"",
                "semantic_model.relationships[0].to: required",
                "semantic_model.metrics[0].expression: required",
            ]
        );
        let listed = json!({"semantic_model": [{"name": "m", "datasets": [{"name": "d"}]}]});
        assert_eq!(errors(listed), ["semantic_model[0].datasets[0].source: required"]);
    }

    #[test]
    fn ai_context_string_or_object_and_type_errors() {
        let doc = parse_value(&json!({"semantic_model": {"name": "m", "ai_context": "Be terse."}})).unwrap();
        assert_eq!(doc.semantic_model.ai_context.unwrap().instructions.as_deref(), Some("Be terse."));
        let doc = parse_value(&json!({"semantic_model": {"name": "m", "ai_context": {"instructions": "x", "synonyms": ["a"], "examples": ["e"], "other": 1}}})).unwrap();
        assert_eq!(
            doc.semantic_model.ai_context.unwrap(),
            AiContext {
                instructions: Some("x".into()),
                synonyms: vec!["a".into()],
                examples: vec!["e".into()]
            }
        );
        assert_eq!(
            errors(json!({"semantic_model": {"name": "m", "ai_context": [1]}})),
            ["semantic_model.ai_context: must be a string or an object, not a list"]
        );
        assert_eq!(
            errors(json!({"semantic_model": {"name": 7}})),
            ["semantic_model.name: must be a string, not a number"]
        );
    }

    #[test]
    fn any_dialect_is_accepted_including_sail_sql() {
        let doc = parse_value(&json!({"semantic_model": {"name": "m", "metrics": [
            {"name": "x", "expression": {"dialects": [{"dialect": "SAIL_SQL", "expression": "1"}, {"dialect": "FOO", "expression": "2"}]}}]}}))
        .unwrap();
        let e = &doc.semantic_model.metrics[0].expression;
        assert_eq!(e.exact("sail_sql").unwrap().expression, "1");
        assert_eq!(e.exact("FOO").unwrap().expression, "2");
    }

    #[test]
    fn yaml_and_json_text_both_parse_and_syntax_errors_are_reported() {
        let yaml = "semantic_model:\n  - name: m\n    datasets:\n      - name: d\n        source: s\n";
        let json_text = serde_json::to_string(&minimal()).unwrap();
        assert_eq!(parse_document(yaml).unwrap(), parse_document(&json_text).unwrap());
        let bad = parse_document("{\"semantic_model\": ").unwrap_err();
        assert_eq!(bad.len(), 1);
        assert!(bad[0].message.starts_with("not valid JSON"), "{}", bad[0]);
        let bad = parse_document("semantic_model: [unclosed").unwrap_err();
        assert!(bad[0].message.starts_with("not valid YAML"), "{}", bad[0]);
    }

    #[test]
    fn relationship_aliases_time_dimensions_and_keys_normalize() {
        let doc = parse_value(&json!({"version": 1.0, "semantic_model": {"name": "m",
            "datasets": [{"name": "d", "source": "s", "primary_key": [["a", "b"]], "unique_keys": [["a"], "c"],
                "fields": [{"name": "t", "dimension": {"is_time": true}, "label": "filter"}]}],
            "relationships": [{"name": "r", "from_dataset": "d", "to_dataset": "e"}]}}))
        .unwrap();
        assert_eq!(doc.version, "1.0");
        let d = &doc.semantic_model.datasets[0];
        assert_eq!(d.primary_key, ["a", "b"]);
        assert_eq!(d.unique_keys, vec![vec!["a".to_string()], vec!["c".to_string()]]);
        assert!(d.fields[0].is_time_dimension);
        let r = &doc.semantic_model.relationships[0];
        assert_eq!((r.from.as_str(), r.to.as_str()), ("d", "e"));
        // The normalized form reads back to the same document.
        assert_eq!(parse_value(&doc.to_normalized_json()).unwrap(), doc);
    }

    #[test]
    fn the_vendored_tpcds_example_parses() {
        let doc = parse_document(include_str!("../testdata/osi-example-tpcds.yaml")).unwrap();
        let m = &doc.semantic_model;
        assert_eq!(m.name, "tpcds_retail_model");
        assert_eq!(m.datasets.len(), 5);
        assert_eq!(m.relationships.len(), 4);
        assert_eq!(m.metrics.len(), 5);
        assert_eq!(m.custom_extensions.len(), 2);
        assert_eq!(m.datasets[0].primary_key, ["ss_item_sk", "ss_ticket_number"]);
        assert!(m
            .ai_context
            .as_ref()
            .unwrap()
            .instructions
            .as_deref()
            .unwrap()
            .starts_with("Use this semantic model"));
        assert_eq!(parse_value(&doc.to_normalized_json()).unwrap(), doc);
    }

    #[test]
    fn the_demo_model_parses_to_the_reference_shape() {
        let doc = parse_document(include_str!("../demo/resilience_desk.yaml")).unwrap();
        let reference: Value =
            serde_json::from_str(include_str!("../testdata/reference_demo_model.json")).unwrap();
        assert_eq!(doc.to_normalized_json(), reference);
    }
}

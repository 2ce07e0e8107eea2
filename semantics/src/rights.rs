//! Rights: RBAC (principals → roles → resource and action) and ODRL 2.2 policies, evaluated
//! together into a decision and an access receipt. A request is allowed only when RBAC allows it
//! AND ODRL allows it; anything the engine cannot resolve denies, with a reason that says why.
//!
//! # Accepted rights document
//!
//! One JSON object (the published QueryGraph shape, `qg_demo_rights.json`, is accepted as is):
//!
//! ```json
//! {
//!   "rbac": {
//!     "grants":      [{"principal": "did:example:a", "role": "navigator"}],
//!     "permissions": [{"role": "navigator", "resource": "sail.db.table", "action": "odrl:read"}]
//!   },
//!   "odrl": { …one policy… }            // or a list of policies, or "policies": [ … ]
//! }
//! ```
//!
//! A document that is itself an ODRL policy (it has `permission`/`prohibition`) is read as a
//! document with that one policy and no RBAC section.
//!
//! **RBAC.** `grants[]`: `principal` (alias `agent`) and `role`, or `roles: [..]`.
//! `permissions[]`: `role`, `resource` (alias `target`), and `action` (one action or a list).
//! A resource matches exactly, or through a pattern: `*` matches anything and `prefix.*` (any
//! pattern ending in `*`) matches resources starting with the prefix. An RBAC permission for
//! `use` also grants every action `use` includes (see actions below).
//!
//! **ODRL policies.** Keys may be bare (`permission`), prefixed (`odrl:permission`) or full IRIs
//! (`http://www.w3.org/ns/odrl/2/permission`); `permissions`/`prohibitions` (plural) are read too.
//! * `uid` (or `@id`, `id`): required.
//! * `target`: the asset(s) the rules apply to; a string, `{"@id": …}`, or a list. A rule may
//!   carry its own `target`, which replaces the policy's. Every rule needs a target from one or
//!   the other. A target covers a resource when it is equal to it, is `*`, or is a dotted, slashed
//!   or colon-separated prefix of it (`sail.qg_lakehouse` covers `sail.qg_lakehouse.t`).
//! * `assigner`: kept, not evaluated. `assignee` on the policy is inherited by rules without one.
//! * `conflict`: `perm`, `prohibit` or `invalid` (default `invalid`, as ODRL 2.2 says).
//! * `permission`/`prohibition`: rules with `action` (a string such as `read`, `odrl:read`,
//!   `querygraph:read`, an `{"@id"}`/`{"rdf:value"}` object, or a list), `assignee` (string,
//!   `{"@id"}`/`{"uid"}` object or list; absent means any principal), optional `target`, and
//!   `constraint` (one object or a list, all of which must hold).
//! * Constraints: `leftOperand` `purpose`; `operator` `eq`, `neq`, `isAnyOf`, `isNoneOf`;
//!   `rightOperand` a value or a list (`{"@value"}`/`{"@id"}` objects are unwrapped). The purpose
//!   is the one the request states.
//!
//! **What makes a policy unresolvable** (it then denies every request on its targets, or every
//! request at all when its targets cannot be read): a missing `uid`, a rule without action or
//! target, an unknown action, an unknown `leftOperand` or `operator`, a missing or ill-typed
//! `rightOperand`, `rightOperandReference`, logical constraints (`and`/`or`/`xone`), action
//! refinements, duties and obligations (they cannot be discharged here), `inheritFrom`, a
//! `profile` (ODRL forbids processing a profile one does not understand), a constraint that is not
//! an object, and an unknown conflict strategy. An ill-formed RBAC section denies every request.
//!
//! # Evaluation
//!
//! * Actions form the ODRL hierarchy: `use` includes every action except `transfer` (so `read ⊂
//!   use`). A permission applies to the requested action when its action equals or includes it. A
//!   prohibition applies when its action and the requested one overlap (either includes the
//!   other), so prohibiting `use` forbids `read` and prohibiting `read` forbids a request to `use`.
//! * A rule applies when its target covers the resource, its action fits as above, its assignee
//!   is the principal (or absent) and every constraint holds. When the request states no purpose,
//!   a purpose constraint is unknown: a permission then does not apply, a prohibition does (fail
//!   closed).
//! * Per policy: only permissions apply → permit; only prohibitions → prohibit; both → the
//!   conflict strategy decides (`perm` permits, `prohibit` prohibits, `invalid` makes the policy
//!   invalid for the request, which denies); none → not applicable.
//! * Across policies: any unresolvable or invalid policy denies, then any prohibition denies,
//!   then any permission allows; with no applicable permission ODRL denies.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

/// The exact reason of an allowed receipt (the reference's wording).
pub const ALLOWED_REASON: &str = "RBAC and ODRL permitted action";
/// The first words of every denied receipt's reason; the details follow after `": "`.
pub const DENIED_REASON: &str = "RBAC or ODRL denied action";

/// An ODRL action. The vocabulary is ODRL 2.2's core and common actions that make sense for a
/// content plane; [`Action::parse`] refuses anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Use,
    Transfer,
    Read,
    Derive,
    Index,
    Translate,
    Modify,
    Delete,
    Aggregate,
    Annotate,
    Anonymize,
    Archive,
    Distribute,
    Reproduce,
    Display,
    Print,
    Execute,
}

const ACTIONS: [(Action, &str); 17] = [
    (Action::Use, "use"),
    (Action::Transfer, "transfer"),
    (Action::Read, "read"),
    (Action::Derive, "derive"),
    (Action::Index, "index"),
    (Action::Translate, "translate"),
    (Action::Modify, "modify"),
    (Action::Delete, "delete"),
    (Action::Aggregate, "aggregate"),
    (Action::Annotate, "annotate"),
    (Action::Anonymize, "anonymize"),
    (Action::Archive, "archive"),
    (Action::Distribute, "distribute"),
    (Action::Reproduce, "reproduce"),
    (Action::Display, "display"),
    (Action::Print, "print"),
    (Action::Execute, "execute"),
];

/// Prefixes under which action and operand names are written; stripped case-insensitively.
const NAME_PREFIXES: [&str; 6] = [
    "http://www.w3.org/ns/odrl/2/",
    "https://www.w3.org/ns/odrl/2/",
    "odrl:",
    "querygraph:",
    "querylayer:",
    "ql:",
];

fn strip_prefix(text: &str) -> String {
    let lower = text.trim().to_ascii_lowercase();
    match NAME_PREFIXES.iter().find_map(|p| lower.strip_prefix(p)) {
        Some(rest) => rest.to_string(),
        None => lower,
    }
}

impl Action {
    /// Reads `read`, `READ`, `odrl:read`, `querygraph:read` or the full ODRL IRI.
    pub fn parse(text: &str) -> Option<Action> {
        let name = strip_prefix(text);
        ACTIONS.iter().find(|(_, n)| *n == name).map(|(a, _)| *a)
    }

    /// The bare name, e.g. `read`.
    pub fn name(self) -> &'static str {
        ACTIONS.iter().find(|(a, _)| *a == self).map(|(_, n)| *n).expect("every action is listed")
    }

    /// The compact IRI written in receipts, e.g. `odrl:read`.
    pub fn iri(self) -> String {
        format!("odrl:{}", self.name())
    }

    /// True when `self` is `other` or includes it in the ODRL hierarchy (`use` ⊃ all but
    /// `transfer`).
    pub fn includes(self, other: Action) -> bool {
        self == other || (self == Action::Use && other != Action::Transfer)
    }

    /// True when either action includes the other.
    pub fn overlaps(self, other: Action) -> bool {
        self.includes(other) || other.includes(self)
    }

    /// Every known action name, for error messages.
    pub fn known_names() -> Vec<&'static str> {
        ACTIONS.iter().map(|(_, n)| *n).collect()
    }
}

impl Serialize for Action {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.iri())
    }
}

/// How a policy resolves a permission and a prohibition that both apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConflictStrategy {
    /// The permission prevails.
    Perm,
    /// The prohibition prevails.
    Prohibit,
    /// The policy is void for the request (the ODRL 2.2 default).
    Invalid,
}

/// A constraint's comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Operator {
    #[serde(rename = "eq")]
    Eq,
    #[serde(rename = "neq")]
    Neq,
    #[serde(rename = "isAnyOf")]
    IsAnyOf,
    #[serde(rename = "isNoneOf")]
    IsNoneOf,
}

impl Operator {
    fn parse(text: &str) -> Option<Operator> {
        match strip_prefix(text).as_str() {
            "eq" => Some(Operator::Eq),
            "neq" => Some(Operator::Neq),
            "isanyof" => Some(Operator::IsAnyOf),
            "isnoneof" => Some(Operator::IsNoneOf),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Operator::Eq => "eq",
            Operator::Neq => "neq",
            Operator::IsAnyOf => "isAnyOf",
            Operator::IsNoneOf => "isNoneOf",
        }
    }
}

/// A resolvable constraint. The only left operand is `purpose`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Constraint {
    pub left_operand: &'static str,
    pub operator: Operator,
    pub right_operand: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Truth {
    Met,
    Unmet,
    Unknown,
}

impl Constraint {
    fn evaluate(&self, purpose: Option<&str>) -> Truth {
        let Some(p) = purpose else {
            return Truth::Unknown;
        };
        let listed = self.right_operand.iter().any(|v| v == p);
        let met = match self.operator {
            Operator::Eq | Operator::IsAnyOf => listed,
            Operator::Neq | Operator::IsNoneOf => !listed,
        };
        if met {
            Truth::Met
        } else {
            Truth::Unmet
        }
    }

    fn describe(&self) -> String {
        let rhs = if self.right_operand.len() == 1 && matches!(self.operator, Operator::Eq | Operator::Neq) {
            format!("{:?}", self.right_operand[0])
        } else {
            format!("{:?}", self.right_operand)
        };
        format!("{} {} {}", self.left_operand, self.operator.as_str(), rhs)
    }
}

/// Whether a rule permits or prohibits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleKind {
    Permission,
    Prohibition,
}

/// One permission or prohibition, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rule {
    pub kind: RuleKind,
    /// `permission[0]`, `prohibition[1]`: how reasons name the rule.
    pub label: String,
    /// The rule's own targets, or the policy's when it has none.
    pub targets: Vec<String>,
    pub actions: Vec<Action>,
    /// Empty: any principal.
    pub assignees: Vec<String>,
    pub constraints: Vec<Constraint>,
}

/// An ODRL policy as read. `problems` non-empty means it cannot be resolved and denies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub id: Option<String>,
    pub targets: Vec<String>,
    pub assigner: Option<String>,
    pub conflict: ConflictStrategy,
    pub permissions: Vec<Rule>,
    pub prohibitions: Vec<Rule>,
    pub problems: Vec<String>,
}

/// A principal holding a role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RoleGrant {
    pub principal: String,
    pub role: String,
}

/// A role allowed some actions on a resource (or resource pattern).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RolePermission {
    pub role: String,
    pub resource: String,
    pub actions: Vec<Action>,
}

/// The RBAC section. `problems` non-empty means RBAC denies every request.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Rbac {
    pub grants: Vec<RoleGrant>,
    pub permissions: Vec<RolePermission>,
    pub problems: Vec<String>,
}

/// A parsed rights document. Parsing never fails: what cannot be read is recorded as a problem
/// and makes the affected part deny (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct RightsDocument {
    pub rbac: Rbac,
    pub policies: Vec<Policy>,
    /// Problems with the document as a whole; any makes every decision deny.
    pub problems: Vec<String>,
}

/// What is asked: may `principal` perform `action` on `resource`, for `purpose`?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessRequest<'a> {
    pub principal: &'a str,
    pub resource: &'a str,
    pub action: Action,
    /// The purpose the caller states, matched against `purpose` constraints.
    pub purpose: Option<&'a str>,
}

/// The append-only record of one decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub principal: String,
    pub resource: String,
    /// Compact IRI, e.g. `odrl:read`.
    pub action: String,
    pub allowed: bool,
    /// [`ALLOWED_REASON`], or [`DENIED_REASON`] followed by `": "` and why.
    pub reason: String,
    /// The policy that decided (or the only policy of the document); `null` when none did.
    pub policy_id: Option<String>,
    /// When the decision was made, formatted by [`crate::format_timestamp`].
    pub issued_at: String,
}

/// A decision with both halves exposed (what `check_access` returns).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub principal: String,
    pub resource: String,
    pub action: String,
    pub rbac_allowed: bool,
    pub odrl_allowed: bool,
    pub allowed: bool,
    pub rbac_reason: String,
    pub odrl_reason: String,
    pub policy_id: Option<String>,
    pub receipt: Receipt,
}

impl RightsDocument {
    /// Reads a rights document from JSON text; text that is not JSON is a document problem.
    pub fn parse(text: &str) -> RightsDocument {
        match serde_json::from_str::<Value>(text) {
            Ok(v) => RightsDocument::from_value(&v),
            Err(e) => RightsDocument {
                problems: vec![format!("<document>: not valid JSON: {e}")],
                ..Default::default()
            },
        }
    }

    /// Reads a rights document from a JSON value.
    pub fn from_value(value: &Value) -> RightsDocument {
        let Value::Object(m) = value else {
            return RightsDocument {
                problems: vec!["<document>: must be a JSON object".into()],
                ..Default::default()
            };
        };
        let mut doc = RightsDocument::default();
        match m.get("rbac") {
            None | Some(Value::Null) => {}
            Some(r) => doc.rbac = read_rbac(r),
        }
        let policy_values: Vec<(String, &Value)> = if let Some(o) = m.get("odrl").filter(|v| !v.is_null()) {
            match o {
                Value::Array(items) => {
                    items.iter().enumerate().map(|(i, v)| (format!("odrl[{i}]"), v)).collect()
                }
                other => vec![("odrl".to_string(), other)],
            }
        } else if let Some(p) = m.get("policies").filter(|v| !v.is_null()) {
            match p {
                Value::Array(items) => {
                    items.iter().enumerate().map(|(i, v)| (format!("policies[{i}]"), v)).collect()
                }
                _ => {
                    doc.problems.push("policies: must be a list".into());
                    Vec::new()
                }
            }
        } else if ["permission", "prohibition", "permissions", "prohibitions"]
            .iter()
            .any(|k| get(m, k).is_some())
        {
            vec![(String::new(), value)]
        } else {
            Vec::new()
        };
        doc.policies = policy_values.into_iter().map(|(path, v)| read_policy(v, &path)).collect();
        doc
    }

    /// Every problem found, each prefixed with where it is; empty for a fully resolvable document.
    pub fn problems(&self) -> Vec<String> {
        let mut out = self.problems.clone();
        out.extend(self.rbac.problems.iter().cloned());
        for p in &self.policies {
            out.extend(p.problems.iter().cloned());
        }
        out
    }
}

/// Looks up an ODRL term under its bare, `odrl:` and IRI spellings.
fn get<'a>(m: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    m.get(name)
        .or_else(|| m.get(&format!("odrl:{name}")))
        .or_else(|| m.get(&format!("http://www.w3.org/ns/odrl/2/{name}")))
        .filter(|v| !v.is_null())
}

fn get_any<'a>(m: &'a Map<String, Value>, names: &[&str]) -> Option<(&'a Value, String)> {
    names.iter().find_map(|n| get(m, n).map(|v| (v, n.to_string())))
}

/// The identifier a JSON-LD-ish value stands for: a string, or an object's `@id`, `uid`, `id`,
/// `@value`, `rdf:value` or `value`.
fn ident(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Object(o) => ["@id", "uid", "id", "@value", "rdf:value", "value"]
            .iter()
            .find_map(|k| o.get(*k))
            .and_then(ident),
        _ => None,
    }
}

/// One identifier or a list of them.
fn idents(v: &Value, path: &str, problems: &mut Vec<String>) -> Vec<String> {
    let items: Vec<&Value> = match v {
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    let mut out = Vec::new();
    for item in items {
        match ident(item) {
            Some(s) => out.push(s),
            None => problems.push(format!("{path}: cannot read an identifier from {item}")),
        }
    }
    out
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn read_actions(v: &Value, path: &str, problems: &mut Vec<String>) -> Vec<Action> {
    let items: Vec<&Value> = match v {
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    let mut out = Vec::new();
    for item in items {
        if let Value::Object(o) = item {
            if get(o, "refinement").is_some() {
                problems.push(format!("{path}: action refinements are not supported"));
                continue;
            }
        }
        match ident(item) {
            Some(name) => match Action::parse(&name) {
                Some(a) => out.push(a),
                None => problems.push(format!(
                    "{path}: unknown action {name:?}; known: {}",
                    Action::known_names().join(", ")
                )),
            },
            None => problems.push(format!("{path}: cannot read an action from {item}")),
        }
    }
    if out.is_empty() && problems.is_empty() {
        problems.push(format!("{path}: at least one action is required"));
    }
    out
}

fn read_rbac(v: &Value) -> Rbac {
    let mut rbac = Rbac::default();
    let Value::Object(m) = v else {
        rbac.problems.push("rbac: must be an object".into());
        return rbac;
    };
    let list = |key: &str, problems: &mut Vec<String>| -> Vec<Value> {
        match m.get(key) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items.clone(),
            Some(_) => {
                problems.push(format!("rbac.{key}: must be a list"));
                Vec::new()
            }
        }
    };
    let grants = list("grants", &mut rbac.problems);
    for (i, g) in grants.iter().enumerate() {
        let path = format!("rbac.grants[{i}]");
        let Value::Object(o) = g else {
            rbac.problems.push(format!("{path}: must be an object"));
            continue;
        };
        let principal = o.get("principal").or_else(|| o.get("agent")).and_then(Value::as_str);
        let Some(principal) = principal else {
            rbac.problems.push(format!("{path}.principal: required (a string)"));
            continue;
        };
        let roles: Vec<String> = match (o.get("role"), o.get("roles")) {
            (Some(Value::String(r)), _) => vec![r.clone()],
            (_, Some(Value::Array(rs))) if rs.iter().all(Value::is_string) => {
                rs.iter().filter_map(Value::as_str).map(str::to_string).collect()
            }
            _ => {
                rbac.problems
                    .push(format!("{path}.role: required (a string, or `roles` as a list of strings)"));
                continue;
            }
        };
        for role in roles {
            rbac.grants.push(RoleGrant { principal: principal.to_string(), role });
        }
    }
    let perms = list("permissions", &mut rbac.problems);
    for (i, p) in perms.iter().enumerate() {
        let path = format!("rbac.permissions[{i}]");
        let Value::Object(o) = p else {
            rbac.problems.push(format!("{path}: must be an object"));
            continue;
        };
        let role = o.get("role").and_then(Value::as_str);
        let resource = o.get("resource").or_else(|| o.get("target")).and_then(Value::as_str);
        let mut problems = Vec::new();
        let actions = match o.get("action").or_else(|| o.get("actions")) {
            Some(a) if !a.is_null() => read_actions(a, &format!("{path}.action"), &mut problems),
            _ => {
                problems.push(format!("{path}.action: required"));
                Vec::new()
            }
        };
        if role.is_none() {
            problems.push(format!("{path}.role: required (a string)"));
        }
        if resource.is_none() {
            problems.push(format!("{path}.resource: required (a string)"));
        }
        if problems.is_empty() {
            rbac.permissions.push(RolePermission {
                role: role.unwrap_or_default().to_string(),
                resource: resource.unwrap_or_default().to_string(),
                actions,
            });
        } else {
            rbac.problems.extend(problems);
        }
    }
    rbac
}

fn read_constraints(v: &Value, path: &str, problems: &mut Vec<String>) -> Vec<Constraint> {
    let items: Vec<(String, &Value)> = match v {
        Value::Array(items) => items.iter().enumerate().map(|(i, c)| (format!("{path}[{i}]"), c)).collect(),
        Value::Object(_) => vec![(path.to_string(), v)],
        other => {
            problems.push(format!("{path}: must be an object or a list of objects, not {other}"));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (cpath, c) in items {
        let Value::Object(o) = c else {
            problems.push(format!("{cpath}: must be an object, not {c}"));
            continue;
        };
        if let Some((_, k)) = get_any(o, &["and", "or", "xone", "andSequence"]) {
            problems.push(format!("{cpath}: logical constraints ({k}) are not supported"));
            continue;
        }
        if get(o, "rightOperandReference").is_some() {
            problems.push(format!("{cpath}: rightOperandReference is not supported"));
            continue;
        }
        let left = get(o, "leftOperand").and_then(ident);
        let op = get(o, "operator").and_then(ident);
        let mut ok = true;
        let left_operand = match left.as_deref().map(strip_prefix).as_deref() {
            Some("purpose") => Some("purpose"),
            Some(_) => {
                problems.push(format!(
                    "{cpath}.leftOperand: unknown left operand {:?}; known: purpose",
                    left.unwrap_or_default()
                ));
                ok = false;
                None
            }
            None => {
                problems.push(format!("{cpath}.leftOperand: required"));
                ok = false;
                None
            }
        };
        let operator = match op.as_deref() {
            Some(text) => match Operator::parse(text) {
                Some(o) => Some(o),
                None => {
                    problems.push(format!(
                        "{cpath}.operator: unknown operator {text:?}; known: eq, neq, isAnyOf, isNoneOf"
                    ));
                    ok = false;
                    None
                }
            },
            None => {
                problems.push(format!("{cpath}.operator: required"));
                ok = false;
                None
            }
        };
        let right = match get(o, "rightOperand") {
            Some(r) => {
                let before = problems.len();
                let values = idents(r, &format!("{cpath}.rightOperand"), problems);
                ok &= problems.len() == before;
                values
            }
            None => {
                problems.push(format!("{cpath}.rightOperand: required"));
                ok = false;
                Vec::new()
            }
        };
        if let (true, Some(left_operand), Some(operator)) = (ok, left_operand, operator) {
            if matches!(operator, Operator::Eq | Operator::Neq) && right.len() != 1 {
                problems.push(format!(
                    "{cpath}.rightOperand: {} takes exactly one value, got {}",
                    operator.as_str(),
                    right.len()
                ));
                continue;
            }
            if right.is_empty() {
                problems.push(format!("{cpath}.rightOperand: must list at least one value"));
                continue;
            }
            out.push(Constraint { left_operand, operator, right_operand: right });
        }
    }
    out
}

fn read_rule(
    v: &Value,
    kind: RuleKind,
    label: String,
    path: &str,
    policy_targets: &[String],
    policy_assignees: &[String],
    problems: &mut Vec<String>,
) -> Option<Rule> {
    let Value::Object(o) = v else {
        problems.push(format!("{path}: must be an object"));
        return None;
    };
    let before = problems.len();
    let actions = match get(o, "action") {
        Some(a) => read_actions(a, &join(path, "action"), problems),
        None => {
            problems.push(format!("{}: required", join(path, "action")));
            Vec::new()
        }
    };
    let targets = match get(o, "target") {
        Some(t) => idents(t, &join(path, "target"), problems),
        None => policy_targets.to_vec(),
    };
    if targets.is_empty() {
        problems.push(format!("{}: required (on the rule or on the policy)", join(path, "target")));
    }
    let assignees = match get(o, "assignee") {
        Some(a) => idents(a, &join(path, "assignee"), problems),
        None => policy_assignees.to_vec(),
    };
    let constraints = match get(o, "constraint").or_else(|| o.get("constraints").filter(|c| !c.is_null())) {
        Some(c) => read_constraints(c, &join(path, "constraint"), problems),
        None => Vec::new(),
    };
    // A duty must be fulfilled for the permission to hold; nothing here can fulfil one.
    if get(o, "duty").is_some() {
        problems.push(format!("{}: duties are not supported", join(path, "duty")));
    }
    (problems.len() == before).then_some(Rule { kind, label, targets, actions, assignees, constraints })
}

fn read_policy(v: &Value, path: &str) -> Policy {
    let mut policy = Policy {
        id: None,
        targets: Vec::new(),
        assigner: None,
        conflict: ConflictStrategy::Invalid,
        permissions: Vec::new(),
        prohibitions: Vec::new(),
        problems: Vec::new(),
    };
    let at = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    let Value::Object(o) = v else {
        policy.problems.push(format!(
            "{}: a policy must be an object",
            if path.is_empty() { "<document>" } else { path }
        ));
        return policy;
    };
    let mut problems = Vec::new();
    policy.id = ["uid", "@id", "id"].iter().find_map(|k| get(o, k)).and_then(ident);
    if policy.id.is_none() {
        problems.push(format!("{}: required (every ODRL policy has a uid)", at("uid")));
    }
    if let Some(t) = get(o, "target") {
        policy.targets = idents(t, &at("target"), &mut problems);
    }
    policy.assigner = get(o, "assigner").and_then(ident);
    let assignees = match get(o, "assignee") {
        Some(a) => idents(a, &at("assignee"), &mut problems),
        None => Vec::new(),
    };
    if let Some(c) = get(o, "conflict") {
        match ident(c).as_deref().map(strip_prefix).as_deref() {
            Some("perm") => policy.conflict = ConflictStrategy::Perm,
            Some("prohibit") => policy.conflict = ConflictStrategy::Prohibit,
            Some("invalid") => policy.conflict = ConflictStrategy::Invalid,
            _ => problems.push(format!(
                "{}: unknown conflict strategy {c}; known: perm, prohibit, invalid",
                at("conflict")
            )),
        }
    }
    for (key, what) in [
        ("obligation", "obligations are not supported"),
        ("inheritFrom", "policy inheritance is not supported"),
        (
            "profile",
            "ODRL profiles are not supported, and a policy under an unknown profile must not be processed",
        ),
    ] {
        if get(o, key).is_some() {
            problems.push(format!("{}: {what}", at(key)));
        }
    }
    for (kind, names, label) in [
        (RuleKind::Permission, ["permission", "permissions"], "permission"),
        (RuleKind::Prohibition, ["prohibition", "prohibitions"], "prohibition"),
    ] {
        let Some((rules, key)) = get_any(o, &names) else {
            continue;
        };
        let items: Vec<&Value> = match rules {
            Value::Array(items) => items.iter().collect(),
            other => vec![other],
        };
        for (i, r) in items.into_iter().enumerate() {
            let rpath = format!("{}[{i}]", at(&key));
            if let Some(rule) = read_rule(
                r,
                kind,
                format!("{label}[{i}]"),
                &rpath,
                &policy.targets,
                &assignees,
                &mut problems,
            ) {
                match kind {
                    RuleKind::Permission => policy.permissions.push(rule),
                    RuleKind::Prohibition => policy.prohibitions.push(rule),
                }
            }
        }
    }
    policy.problems = problems;
    policy
}

/// True when a policy target covers a resource: equal, `*`, or a prefix ending at a separator.
pub fn target_covers(target: &str, resource: &str) -> bool {
    if target == "*" || target == resource {
        return true;
    }
    resource.strip_prefix(target).is_some_and(|rest| rest.starts_with(['.', '/', ':', '#']))
}

/// True when an RBAC resource pattern matches a resource: equal, or a `*`-terminated prefix.
pub fn rbac_pattern_matches(pattern: &str, resource: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => resource.starts_with(prefix),
        None => pattern == resource,
    }
}

fn rbac_decide(rbac: &Rbac, req: &AccessRequest) -> (bool, String) {
    if !rbac.problems.is_empty() {
        return (false, format!("the RBAC section cannot be resolved: {}", rbac.problems.join("; ")));
    }
    let roles: Vec<&str> =
        rbac.grants.iter().filter(|g| g.principal == req.principal).map(|g| g.role.as_str()).collect();
    if roles.is_empty() {
        return (false, format!("{} holds no role", req.principal));
    }
    let hit = rbac.permissions.iter().find(|p| {
        roles.contains(&p.role.as_str())
            && rbac_pattern_matches(&p.resource, req.resource)
            && p.actions.iter().any(|a| a.includes(req.action))
    });
    match hit {
        Some(p) => (true, format!("role {} grants {} on {}", p.role, req.action.iri(), p.resource)),
        None => (
            false,
            format!(
                "no role of {} ({}) grants {} on {}",
                req.principal,
                roles.join(", "),
                req.action.iri(),
                req.resource
            ),
        ),
    }
}

enum PolicyOutcome {
    NotApplicable { note: Option<String> },
    Permit(String),
    Prohibit(String),
    Invalid(String),
}

fn policy_name(p: &Policy, index: usize) -> String {
    match &p.id {
        Some(id) => id.clone(),
        None => format!("policy #{index}"),
    }
}

fn rule_fits(rule: &Rule, req: &AccessRequest) -> bool {
    let action_fits = match rule.kind {
        RuleKind::Permission => rule.actions.iter().any(|a| a.includes(req.action)),
        RuleKind::Prohibition => rule.actions.iter().any(|a| a.overlaps(req.action)),
    };
    action_fits
        && rule.targets.iter().any(|t| target_covers(t, req.resource))
        && (rule.assignees.is_empty() || rule.assignees.iter().any(|a| a == req.principal))
}

/// Whether a rule that fits applies given its constraints; the note says why not, or why a
/// prohibition applies without evidence.
fn constraints_hold(rule: &Rule, req: &AccessRequest) -> (bool, Option<String>) {
    for c in &rule.constraints {
        match (c.evaluate(req.purpose), rule.kind) {
            (Truth::Met, _) => {}
            (Truth::Unmet, _) => {
                let note = format!(
                    "{} needs {} (purpose {:?})",
                    rule.label,
                    c.describe(),
                    req.purpose.unwrap_or_default()
                );
                return (false, Some(note));
            }
            (Truth::Unknown, RuleKind::Permission) => {
                return (
                    false,
                    Some(format!("{} needs {} and no purpose was given", rule.label, c.describe())),
                );
            }
            (Truth::Unknown, RuleKind::Prohibition) => {
                // Without a purpose the prohibition cannot be shown not to apply: fail closed.
                return (
                    true,
                    Some(format!(
                        "{} applies unless {} is shown, and no purpose was given",
                        rule.label,
                        c.describe()
                    )),
                );
            }
        }
    }
    (true, None)
}

fn evaluate_policy(p: &Policy, index: usize, req: &AccessRequest) -> PolicyOutcome {
    let name = policy_name(p, index);
    if !p.problems.is_empty() {
        let mut targets: Vec<&String> = p.targets.iter().collect();
        targets.extend(p.permissions.iter().chain(&p.prohibitions).flat_map(|r| &r.targets));
        // With no readable target the policy might govern anything: it denies everything.
        if targets.is_empty() || targets.iter().any(|t| target_covers(t, req.resource)) {
            return PolicyOutcome::Invalid(format!(
                "policy {name} cannot be resolved: {}",
                p.problems.join("; ")
            ));
        }
        return PolicyOutcome::NotApplicable { note: None };
    }
    let mut note = None;
    let mut applying = |rules: &[Rule]| -> Vec<String> {
        let mut hits = Vec::new();
        for r in rules.iter().filter(|r| rule_fits(r, req)) {
            let (holds, why) = constraints_hold(r, req);
            if holds {
                hits.push(match why {
                    Some(w) => format!("{} ({w})", r.label),
                    None => r.label.clone(),
                });
            } else if note.is_none() {
                note = why;
            }
        }
        hits
    };
    let permits = applying(&p.permissions);
    let prohibits = applying(&p.prohibitions);
    let action = req.action.iri();
    match (permits.is_empty(), prohibits.is_empty()) {
        (true, true) => PolicyOutcome::NotApplicable { note: note.map(|n| format!("policy {name}: {n}")) },
        (false, true) => PolicyOutcome::Permit(format!("policy {name} permits {action} ({})", permits[0])),
        (true, false) => {
            PolicyOutcome::Prohibit(format!("policy {name} prohibits {action} ({})", prohibits[0]))
        }
        (false, false) => {
            let both = format!("{} and {} both apply", permits[0], prohibits[0]);
            match p.conflict {
                ConflictStrategy::Perm => {
                    PolicyOutcome::Permit(format!("policy {name} permits {action}: {both}; conflict strategy perm lets the permission prevail"))
                }
                ConflictStrategy::Prohibit => PolicyOutcome::Prohibit(format!(
                    "policy {name} prohibits {action}: {both}; conflict strategy prohibit lets the prohibition prevail"
                )),
                ConflictStrategy::Invalid => PolicyOutcome::Invalid(format!(
                    "policy {name} is void for this request: {both} and the conflict strategy is invalid (the ODRL default)"
                )),
            }
        }
    }
}

fn odrl_decide(doc: &RightsDocument, req: &AccessRequest) -> (bool, String, Option<String>) {
    let only = if doc.policies.len() == 1 { doc.policies[0].id.clone() } else { None };
    if doc.policies.is_empty() {
        return (false, "no ODRL policy is in force".into(), None);
    }
    let mut invalid = None;
    let mut prohibit = None;
    let mut permit = None;
    let mut notes = Vec::new();
    for (i, p) in doc.policies.iter().enumerate() {
        match evaluate_policy(p, i, req) {
            PolicyOutcome::Invalid(r) => {
                invalid.get_or_insert((r, p.id.clone()));
            }
            PolicyOutcome::Prohibit(r) => {
                prohibit.get_or_insert((r, p.id.clone()));
            }
            PolicyOutcome::Permit(r) => {
                permit.get_or_insert((r, p.id.clone()));
            }
            PolicyOutcome::NotApplicable { note } => notes.extend(note),
        }
    }
    if let Some((r, id)) = invalid.or(prohibit) {
        return (false, r, id.or(only));
    }
    if let Some((r, id)) = permit {
        return (true, r, id.or(only));
    }
    let mut reason =
        format!("no ODRL permission grants {} on {} to {}", req.action.iri(), req.resource, req.principal);
    if !notes.is_empty() {
        reason.push_str(&format!(" ({})", notes.join("; ")));
    }
    (false, reason, only)
}

/// Decides one request: RBAC AND ODRL, with a receipt issued at `issued_at`.
pub fn decide(rights: &RightsDocument, req: &AccessRequest, issued_at: DateTime<Utc>) -> Decision {
    let (rbac_allowed, rbac_reason, odrl_allowed, odrl_reason, policy_id) = if rights.problems.is_empty() {
        let (ra, rr) = rbac_decide(&rights.rbac, req);
        let (oa, or, pid) = odrl_decide(rights, req);
        (ra, rr, oa, or, pid)
    } else {
        let why = format!("the rights document cannot be resolved: {}", rights.problems.join("; "));
        (false, why.clone(), false, why, None)
    };
    let allowed = rbac_allowed && odrl_allowed;
    let reason = if allowed {
        ALLOWED_REASON.to_string()
    } else {
        let mut parts = Vec::new();
        if !rbac_allowed {
            parts.push(format!("RBAC: {rbac_reason}"));
        }
        if !odrl_allowed {
            parts.push(format!("ODRL: {odrl_reason}"));
        }
        format!("{DENIED_REASON}: {}", parts.join("; "))
    };
    let receipt = Receipt {
        principal: req.principal.to_string(),
        resource: req.resource.to_string(),
        action: req.action.iri(),
        allowed,
        reason,
        policy_id: policy_id.clone(),
        issued_at: crate::format_timestamp(issued_at),
    };
    Decision {
        principal: req.principal.to_string(),
        resource: req.resource.to_string(),
        action: req.action.iri(),
        rbac_allowed,
        odrl_allowed,
        allowed,
        rbac_reason,
        odrl_reason,
        policy_id,
        receipt,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;

    const P: &str = "did:example:agent";
    const R: &str = "sail.lake.table";

    fn at() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap()
    }

    /// RBAC always allows read and use on R for P, so these documents test ODRL alone.
    fn doc(policy: Value) -> RightsDocument {
        RightsDocument::from_value(&json!({
            "rbac": {"grants": [{"principal": P, "role": "r"}], "permissions": [{"role": "r", "resource": R, "action": ["use"]}]},
            "odrl": policy
        }))
    }

    fn ask(d: &RightsDocument, action: Action, purpose: Option<&str>) -> Decision {
        decide(d, &AccessRequest { principal: P, resource: R, action, purpose }, at())
    }

    fn conflicting(conflict: Option<&str>) -> Value {
        let mut p = json!({
            "uid": "urn:p", "target": "sail.lake",
            "permission": [{"action": "read", "assignee": P}],
            "prohibition": [{"action": "odrl:read", "assignee": P}]
        });
        if let Some(c) = conflict {
            p["conflict"] = json!(c);
        }
        p
    }

    #[test]
    fn conflict_strategy_perm_lets_the_permission_prevail() {
        let d = ask(&doc(conflicting(Some("perm"))), Action::Read, None);
        assert!(d.allowed, "{d:?}");
        assert_eq!(d.receipt.reason, ALLOWED_REASON);
        assert!(d.odrl_reason.contains("conflict strategy perm"), "{}", d.odrl_reason);
        assert_eq!(d.receipt.policy_id.as_deref(), Some("urn:p"));
    }

    #[test]
    fn conflict_strategy_prohibit_lets_the_prohibition_prevail() {
        let d = ask(&doc(conflicting(Some("odrl:prohibit"))), Action::Read, None);
        assert!(!d.allowed && d.rbac_allowed && !d.odrl_allowed);
        assert!(
            d.receipt
                .reason
                .starts_with("RBAC or ODRL denied action: ODRL: policy urn:p prohibits odrl:read"),
            "{}",
            d.receipt.reason
        );
        assert!(d.receipt.reason.contains("conflict strategy prohibit"));
    }

    #[test]
    fn conflict_strategy_invalid_is_the_default_and_denies() {
        for c in [None, Some("invalid")] {
            let d = ask(&doc(conflicting(c)), Action::Read, None);
            assert!(!d.allowed);
            assert!(d.receipt.reason.contains("void for this request"), "{}", d.receipt.reason);
            assert!(d.receipt.reason.contains("conflict strategy is invalid"));
        }
        // Without the conflict the same policy's permission alone allows.
        let mut only_perm = conflicting(None);
        only_perm.as_object_mut().unwrap().remove("prohibition");
        assert!(ask(&doc(only_perm), Action::Read, None).allowed);
    }

    #[test]
    fn use_includes_read_for_permissions_and_prohibitions() {
        let perm_use =
            json!({"uid": "urn:p", "target": R, "permission": [{"action": "odrl:use", "assignee": P}]});
        assert!(ask(&doc(perm_use.clone()), Action::Read, None).allowed);
        assert!(ask(&doc(perm_use), Action::Use, None).allowed);
        // Permitting read does not permit use.
        let perm_read =
            json!({"uid": "urn:p", "target": R, "permission": [{"action": "read", "assignee": P}]});
        assert!(ask(&doc(perm_read.clone()), Action::Read, None).allowed);
        assert!(!ask(&doc(perm_read), Action::Use, None).allowed);
        // Prohibiting use prohibits read (with conflict strategy perm the permission would win, so
        // use `prohibit` to see the hierarchy at work).
        let proh_use = json!({"uid": "urn:p", "target": R, "conflict": "prohibit",
            "permission": [{"action": "read", "assignee": P}],
            "prohibition": [{"action": {"@id": "http://www.w3.org/ns/odrl/2/use"}, "assignee": P}]});
        let d = ask(&doc(proh_use), Action::Read, None);
        assert!(!d.allowed);
        assert!(d.odrl_reason.contains("prohibition[0]"), "{}", d.odrl_reason);
        // A prohibition of derive does not touch read (the demo's policy).
        let proh_derive = json!({"uid": "urn:p", "target": R,
            "permission": [{"action": "read", "assignee": P}], "prohibition": [{"action": "derive", "assignee": P}]});
        assert!(ask(&doc(proh_derive), Action::Read, None).allowed);
        assert!(
            Action::Use.includes(Action::Read)
                && !Action::Read.includes(Action::Use)
                && !Action::Use.includes(Action::Transfer)
        );
    }

    fn purpose_policy(op: &str, rhs: Value) -> Value {
        json!({"uid": "urn:p", "target": "sail.lake", "permission": [{
            "action": "read", "assignee": {"@id": P},
            "constraint": [{"leftOperand": "odrl:purpose", "operator": op, "rightOperand": rhs}]}]})
    }

    #[test]
    fn purpose_constraint_met_and_unmet() {
        let d = doc(purpose_policy("eq", json!("research")));
        assert!(ask(&d, Action::Read, Some("research")).allowed);
        let unmet = ask(&d, Action::Read, Some("marketing"));
        assert!(!unmet.allowed);
        assert!(
            unmet
                .receipt
                .reason
                .contains("permission[0] needs purpose eq \"research\" (purpose \"marketing\")"),
            "{}",
            unmet.receipt.reason
        );
        let none = ask(&d, Action::Read, None);
        assert!(!none.allowed && none.receipt.reason.contains("no purpose was given"));

        let any = doc(purpose_policy("isAnyOf", json!(["research", {"@value": "audit"}])));
        assert!(ask(&any, Action::Read, Some("audit")).allowed);
        assert!(!ask(&any, Action::Read, Some("ads")).allowed);
        let none_of = doc(purpose_policy("odrl:isNoneOf", json!(["ads"])));
        assert!(ask(&none_of, Action::Read, Some("audit")).allowed);
        assert!(!ask(&none_of, Action::Read, Some("ads")).allowed);
        let neq = doc(purpose_policy("neq", json!("ads")));
        assert!(ask(&neq, Action::Read, Some("audit")).allowed);
        assert!(!ask(&neq, Action::Read, Some("ads")).allowed);
    }

    #[test]
    fn a_prohibition_with_an_unknown_purpose_fails_closed() {
        let p = json!({"uid": "urn:p", "target": R, "conflict": "perm",
            "permission": [{"action": "read"}],
            "prohibition": [{"action": "read", "constraint": {"leftOperand": "purpose", "operator": "eq", "rightOperand": "ads"}}]});
        // conflict=perm: with no purpose the prohibition applies, and perm resolves the conflict.
        assert!(ask(&doc(p.clone()), Action::Read, None).allowed);
        let mut strict = p;
        strict["conflict"] = json!("prohibit");
        let d = ask(&doc(strict.clone()), Action::Read, None);
        assert!(!d.allowed && d.odrl_reason.contains("no purpose was given"), "{}", d.odrl_reason);
        assert!(ask(&doc(strict), Action::Read, Some("research")).allowed);
    }

    #[test]
    fn malformed_and_unresolvable_policies_deny_with_a_reason() {
        let cases = [
            (
                json!({"uid": "urn:p", "target": R, "permission": [{"action": "read", "constraint": [{"leftOperand": "spatial", "operator": "eq", "rightOperand": "EU"}]}]}),
                "unknown left operand \"spatial\"",
            ),
            (
                json!({"uid": "urn:p", "target": R, "permission": [{"action": "read", "constraint": [{"leftOperand": "purpose", "operator": "lt", "rightOperand": "x"}]}]}),
                "unknown operator \"lt\"",
            ),
            (
                json!({"uid": "urn:p", "target": R, "permission": [{"action": "fly"}]}),
                "unknown action \"fly\"",
            ),
            (json!({"target": R, "permission": [{"action": "read"}]}), "uid: required"),
            (json!({"uid": "urn:p", "permission": [{"action": "read"}]}), "target: required"),
            (
                json!({"uid": "urn:p", "target": R, "permission": [{"action": "read", "constraint": "weekdays only"}]}),
                "must be an object or a list of objects",
            ),
            (
                json!({"uid": "urn:p", "target": R, "permission": [{"action": "read", "duty": [{"action": "compensate"}]}]}),
                "duties are not supported",
            ),
            (
                json!({"uid": "urn:p", "target": R, "conflict": "maybe", "permission": [{"action": "read"}]}),
                "unknown conflict strategy",
            ),
            (
                json!({"uid": "urn:p", "target": R, "permission": [{"action": "read", "constraint": {"or": []}}]}),
                "logical constraints",
            ),
            (json!("not a policy"), "a policy must be an object"),
        ];
        for (policy, why) in cases {
            let rights = doc(policy);
            assert!(!rights.problems().is_empty());
            let d = ask(&rights, Action::Read, Some("research"));
            assert!(!d.allowed);
            assert!(
                d.receipt.reason.starts_with("RBAC or ODRL denied action: ODRL:"),
                "{}",
                d.receipt.reason
            );
            assert!(d.receipt.reason.contains(why), "{why} not in {}", d.receipt.reason);
        }
        // An unresolvable policy on another target does not affect this one.
        let other = RightsDocument::from_value(&json!({
        "rbac": {"grants": [{"principal": P, "role": "r"}], "permissions": [{"role": "r", "resource": "*", "action": "read"}]},
        "policies": [
            {"uid": "urn:ok", "target": R, "permission": [{"action": "read"}]},
            {"uid": "urn:bad", "target": "other.place", "permission": [{"action": "fly"}]}
        ]}));
        assert!(ask(&other, Action::Read, None).allowed);
        let whole = RightsDocument::parse("{not json");
        let d = ask(&whole, Action::Read, None);
        assert!(!d.allowed && d.receipt.reason.contains("not valid JSON"));
    }

    #[test]
    fn rbac_and_odrl_are_both_required() {
        let rights = RightsDocument::from_value(&json!({
            "rbac": {"grants": [{"principal": P, "role": "r"}], "permissions": [{"role": "r", "resource": "sail.lake.*", "action": "odrl:read"}]},
            "odrl": {"uid": "urn:p", "target": "sail", "permission": [{"action": "read", "assignee": P}]}
        }));
        assert!(ask(&rights, Action::Read, None).allowed);
        let d = decide(
            &rights,
            &AccessRequest { principal: P, resource: "sail.other.t", action: Action::Read, purpose: None },
            at(),
        );
        assert!(!d.allowed && !d.rbac_allowed && d.odrl_allowed);
        assert!(d.receipt.reason.starts_with(
            "RBAC or ODRL denied action: RBAC: no role of did:example:agent (r) grants odrl:read on sail.other.t"
        ));
        let d = decide(
            &rights,
            &AccessRequest {
                principal: "did:example:stranger",
                resource: R,
                action: Action::Read,
                purpose: None,
            },
            at(),
        );
        assert!(!d.rbac_allowed && !d.odrl_allowed);
        assert!(
            d.receipt.reason.contains("RBAC: did:example:stranger holds no role; ODRL: no ODRL permission"),
            "{}",
            d.receipt.reason
        );
        let no_odrl = RightsDocument::from_value(
            &json!({"rbac": {"grants": [{"principal": P, "role": "r"}], "permissions": [{"role": "r", "resource": R, "action": "read"}]}}),
        );
        let d = ask(&no_odrl, Action::Read, None);
        assert!(!d.allowed && d.odrl_reason == "no ODRL policy is in force");
        let bad_rbac = RightsDocument::from_value(
            &json!({"rbac": {"grants": [{"principal": P}]}, "odrl": {"uid": "u", "target": R, "permission": [{"action": "read"}]}}),
        );
        assert!(ask(&bad_rbac, Action::Read, None).rbac_reason.contains("rbac.grants[0].role: required"));
    }

    #[test]
    fn the_reference_rights_shape_is_read_and_receipts_keep_its_fields() {
        let rights = RightsDocument::parse(include_str!("../demo/rights.json"));
        assert!(rights.problems().is_empty(), "{:?}", rights.problems());
        let d = decide(
            &rights,
            &AccessRequest {
                principal: "did:example:qg-navigator",
                resource: "sail.qg_lakehouse.access_2018__access_data",
                action: Action::Read,
                purpose: None,
            },
            at(),
        );
        assert!(d.allowed);
        assert_eq!(
            serde_json::to_value(&d.receipt).unwrap(),
            json!({"principal": "did:example:qg-navigator", "resource": "sail.qg_lakehouse.access_2018__access_data",
                   "action": "odrl:read", "allowed": true, "reason": "RBAC and ODRL permitted action",
                   "policy_id": "urn:querygraph:policy:navigator-demo", "issued_at": "2026-01-02T03:04:05.000000Z"})
        );
        // A bare ODRL JSON-LD policy as the whole document: no RBAC section, so RBAC denies.
        let jsonld = RightsDocument::from_value(&json!({
            "@context": "http://www.w3.org/ns/odrl.jsonld", "@type": "Set", "uid": "urn:set",
            "permission": [{"target": R, "action": "use"}]}));
        assert!(jsonld.problems().is_empty());
        let d = ask(&jsonld, Action::Read, None);
        assert!(d.odrl_allowed && !d.rbac_allowed);
        assert_eq!(Action::parse(" READ "), Some(Action::Read));
        assert_eq!(Action::parse("querygraph:translate"), Some(Action::Translate));
        assert_eq!(Action::parse("fly"), None);
    }

    #[test]
    fn targets_cover_by_segment_prefix_only() {
        assert!(target_covers("sail.qg_lakehouse", "sail.qg_lakehouse.t"));
        assert!(!target_covers("sail.qg_lake", "sail.qg_lakehouse.t"));
        assert!(target_covers("*", "x"));
        assert!(rbac_pattern_matches("sail.*", "sail.a"));
        assert!(!rbac_pattern_matches("sail.a", "sail.ab"));
    }
}

//! The governed semantics plane inside the database: thin SQL wrappers over the pure
//! `querylayer-semantics` crate (OSI parsing, RBAC + ODRL decisions, search, metric resolution,
//! the navigator loop, signing with the server key, the story). The SQL in
//! `sql/140_semantics.sql` decides what is loaded, stores every receipt, answer, lineage event
//! and attestation append-only, and is the only caller; these functions are granted to the
//! owner role alone, and the server key never leaves the database.

use crate::jsonb::Jsonb;
use chrono::{DateTime, Utc};
use pgrx::prelude::*;

use querylayer_semantics::{attestation, demo, navigator, osi, rights, search, signing, story, Signer};
use serde_json::{json, Value};

fn time(now: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(now)
        .unwrap_or_else(|e| error!("querylayer: bad timestamp {now:?}: {e}"))
        .with_timezone(&Utc)
}

fn model(doc: &Jsonb) -> osi::OsiDocument {
    osi::parse_value(&doc.0).unwrap_or_else(|errors| {
        error!(
            "querylayer: a stored semantic model no longer parses: {}",
            errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ")
        )
    })
}

thread_local! {
    /// The server keys this backend signed with, expanded (an Ed25519 key is expanded from its
    /// secret, and its public half computed, before it can sign): a key is expanded once.
    static SIGNERS: std::cell::RefCell<Vec<([u8; 32], std::rc::Rc<Signer>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
    /// Stored semantic models and rights documents, parsed, by row id. Both tables are
    /// append-only: a row's document never changes, so neither does what it parses to.
    static MODELS: std::cell::RefCell<Kept<osi::OsiDocument>> = std::cell::RefCell::new(Kept::default());
    static RIGHTS: std::cell::RefCell<Kept<rights::RightsDocument>> = std::cell::RefCell::new(Kept::default());
}

/// Parsed documents by row id, at most `KEPT_DOCUMENTS` (then all are dropped and kept anew).
struct Kept<T>(std::collections::HashMap<pgrx::Uuid, std::rc::Rc<T>>);

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Kept(std::collections::HashMap::new())
    }
}

const KEPT_DOCUMENTS: usize = 32;

/// The kept parse of the document of row `id` of `table`, or `parse` of it read now.
fn kept<T>(
    cache: &'static std::thread::LocalKey<std::cell::RefCell<Kept<T>>>,
    id: pgrx::Uuid,
    table: &str,
    parse: impl FnOnce(&Value) -> T,
) -> std::rc::Rc<T> {
    if let Some(found) = cache.with(|c| c.borrow().0.get(&id).cloned()) {
        return found;
    }
    let document = Spi::get_one_with_args::<Jsonb>(
        &format!("SELECT document FROM querylayer.{table} WHERE id = $1"),
        &[id.into()],
    )
    .unwrap_or_else(|e| error!("querylayer: reading {table} {id} failed: {e}"))
    .unwrap_or_else(|| error!("querylayer: no {table} row {id}"));
    let parsed = std::rc::Rc::new(parse(&document.0));
    cache.with(|c| {
        let mut c = c.borrow_mut();
        if c.0.len() >= KEPT_DOCUMENTS {
            c.0.clear();
        }
        c.0.insert(id, parsed.clone());
    });
    parsed
}

fn signer(secret: &[u8]) -> std::rc::Rc<Signer> {
    let secret: [u8; 32] =
        secret.try_into().unwrap_or_else(|_| error!("querylayer: a server key must be 32 bytes"));
    SIGNERS.with(|s| {
        let mut s = s.borrow_mut();
        if let Some((_, found)) = s.iter().find(|(k, _)| *k == secret) {
            return found.clone();
        }
        if s.len() >= 8 {
            s.clear();
        }
        let made = std::rc::Rc::new(Signer::from_secret(secret));
        s.push((secret, made.clone()));
        made
    })
}

fn to_json<T: serde::Serialize>(v: &T) -> Jsonb {
    Jsonb(serde_json::to_value(v).expect("serializable"))
}

/// Parses and validates an OSI document (JSON or YAML): `{ok, name, model, errors}`, where every
/// error names its path.
#[pg_extern(immutable, parallel_safe)]
fn osi_parse(text: &str) -> Jsonb {
    match osi::parse_document(text) {
        Ok(doc) => Jsonb(json!({
            "ok": true,
            "name": doc.semantic_model.name,
            "model": doc.to_normalized_json(),
            "errors": [],
        })),
        Err(errors) => Jsonb(json!({
            "ok": false,
            "errors": errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        })),
    }
}

/// Reads a rights document: `{document, problems}` (problems mean every decision denies).
#[pg_extern(immutable, parallel_safe)]
fn rights_parse(text: &str) -> Jsonb {
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return Jsonb(json!({"document": null, "problems": [format!("<document>: not valid JSON: {e}")]}))
        }
    };
    let problems = rights::RightsDocument::from_value(&value).problems();
    Jsonb(json!({"document": value, "problems": problems}))
}

/// One RBAC AND ODRL decision (the check_access answer, with its receipt).
#[pg_extern(immutable, parallel_safe)]
fn rights_decide(
    document: Jsonb,
    principal: &str,
    resource: &str,
    action: &str,
    purpose: Option<&str>,
    now: &str,
) -> Jsonb {
    let Some(action) = rights::Action::parse(action) else {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "action: unknown ODRL action {action:?}; known: {}",
                rights::Action::known_names().join(", ")
            )
        );
    };
    let doc = rights::RightsDocument::from_value(&document.0);
    to_json(&rights::decide(&doc, &rights::AccessRequest { principal, resource, action, purpose }, time(now)))
}

/// Ranked search of a model.
#[pg_extern(immutable, parallel_safe)]
fn model_search(document: Jsonb, text: &str) -> Jsonb {
    to_json(&search::search(&model(&document), text))
}

/// A metric's expression for a dialect (requested → ANSI_SQL → first listed), or `{error}`.
#[pg_extern(immutable, parallel_safe)]
fn model_resolve_metric(document: Jsonb, name: &str, dialect: &str) -> Jsonb {
    match querylayer_semantics::metrics::resolve_metric(&model(&document), name, dialect) {
        Ok(r) => to_json(&r),
        Err(e) => Jsonb(json!({"error": e.to_string()})),
    }
}

/// The per-principal view of a model.
#[pg_extern(immutable, parallel_safe)]
fn model_bundle(
    document: Jsonb,
    rights_document: Jsonb,
    principal: &str,
    purpose: Option<&str>,
    now: &str,
) -> Jsonb {
    let doc = rights::RightsDocument::from_value(&rights_document.0);
    to_json(&navigator::navigator_bundle(&model(&document), &doc, principal, purpose, time(now)))
}

/// The pure navigator loop: search, gate, plan, deterministic text, prompt.
#[pg_extern(immutable, parallel_safe)]
fn navigate(
    document: Jsonb,
    rights_document: Jsonb,
    principal: &str,
    question: &str,
    purpose: Option<&str>,
    dialect: &str,
    now: &str,
) -> Jsonb {
    let doc = rights::RightsDocument::from_value(&rights_document.0);
    navigated(&model(&document), &doc, principal, question, purpose, dialect, now)
}

/// The navigator loop's answer, as `navigate` and `navigate_stored` return it.
fn navigated(
    model: &osi::OsiDocument,
    rights: &rights::RightsDocument,
    principal: &str,
    question: &str,
    purpose: Option<&str>,
    dialect: &str,
    now: &str,
) -> Jsonb {
    let request = navigator::NavigatorRequest { question, principal, purpose, dialect };
    to_json(&navigator::answer_question(model, rights, &request, time(now)))
}

/// `navigate` over the model and the rights document stored in rows `model_id` and `rights_id`
/// (NULL: no rights document, so every decision denies): each row is read and parsed once in a
/// backend, not at every answer.
#[pg_extern(stable, parallel_restricted)]
fn navigate_stored(
    model_id: pgrx::Uuid,
    rights_id: Option<pgrx::Uuid>,
    principal: &str,
    question: &str,
    purpose: Option<&str>,
    dialect: &str,
    now: &str,
) -> Jsonb {
    let model = kept(&MODELS, model_id, "semantic_models", |d| model(&Jsonb(d.clone())));
    let rights = match rights_id {
        Some(id) => kept(&RIGHTS, id, "rights_documents", rights::RightsDocument::from_value),
        None => std::rc::Rc::new(rights::RightsDocument::from_value(&json!({}))),
    };
    navigated(&model, &rights, principal, question, purpose, dialect, now)
}

/// Signs a navigator answer with the server key (optionally with text an LLM wrote): the
/// envelope, the OpenLineage event — also as its exact text, since the attestation signs the hash
/// of those bytes — and the attestation.
#[pg_extern(immutable, parallel_safe)]
fn sign_answer(
    answer: Jsonb,
    llm_text: Option<&str>,
    llm_name: Option<&str>,
    model_name: &str,
    principal: &str,
    recipient: &str,
    secret: &[u8],
    now: &str,
) -> Jsonb {
    let mut answer: navigator::NavigatorAnswer = serde_json::from_value(answer.0)
        .unwrap_or_else(|e| error!("querylayer: not a navigator answer: {e}"));
    if let Some(text) = llm_text {
        answer = answer.with_llm_answer(text, llm_name.unwrap_or("llm"));
    }
    let ctx = signing::AnswerContext { model_name, principal, recipient };
    let signed = signing::sign_answer(answer, &ctx, &signer(secret), time(now));
    let event_text = signed.openlineage_json();
    let mut out = serde_json::to_value(&signed).expect("serializable");
    out["openlineage_text"] = Value::String(event_text.clone());
    out["event_sha256"] = Value::String(querylayer_envelope::canonical::sha256_hex(event_text.as_bytes()));
    Jsonb(out)
}

/// The resilience-desk story under `rights_document` (NULL: the story's own rights), signed with
/// the server key; each specialist's event also comes as its exact text.
#[pg_extern(immutable, parallel_safe)]
fn run_story(rights_document: Option<Jsonb>, secret: &[u8], now: &str) -> Jsonb {
    let doc =
        rights_document.map(|d| rights::RightsDocument::from_value(&d.0)).unwrap_or_else(demo::story_rights);
    let run = story::run_qglake_story(&demo::story_roster(), &doc, &signer(secret), time(now));
    let texts: Vec<String> = run.responses.iter().map(|r| r.openlineage.to_json()).collect();
    let mut out = serde_json::to_value(&run).expect("serializable");
    out["openlineage_texts"] = json!(texts);
    Jsonb(out)
}

/// The story's roster (question, purpose, agents and their resources).
#[pg_extern(immutable, parallel_safe)]
fn story_roster() -> Jsonb {
    to_json(&demo::story_roster())
}

/// Verifies an attestation against the exact event text and a did:key.
#[pg_extern(immutable, parallel_safe)]
fn attestation_valid(attestation: Jsonb, event_text: &str, did_key: &str) -> bool {
    let Ok(att) = serde_json::from_value::<attestation::Attestation>(attestation.0) else {
        return false;
    };
    attestation::verify_attestation_with_key(&att, event_text, did_key)
}

/// A fresh 32-byte Ed25519 secret from the operating system's RNG.
#[pg_extern(volatile, parallel_unsafe)]
fn new_key_secret() -> Vec<u8> {
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).unwrap_or_else(|e| error!("querylayer: the operating system RNG failed: {e}"));
    raw.to_vec()
}

/// The did:key of a secret.
#[pg_extern(immutable, parallel_safe)]
fn key_did(secret: &[u8]) -> String {
    signer(secret).did_key()
}

/// The embedded demo: the resilience-desk model (YAML) and rights (JSON), as text.
#[pg_extern(immutable, parallel_safe)]
fn demo_documents() -> Jsonb {
    Jsonb(
        json!({"model": demo::MODEL_YAML, "rights": demo::RIGHTS_JSON, "story_rights": demo::STORY_RIGHTS_JSON}),
    )
}

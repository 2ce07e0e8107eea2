//! The governed answer flow, shared by the MCP tool `answer_question` and `POST /v1/answer`:
//! inside the caller's transaction (as the connection), deterministic in the database, or, with
//! an LLM configured, prepared in the database, written by the model, then signed and recorded
//! in the database.

use serde_json::Value;
use uuid::Uuid;

use crate::db::Call;
use crate::error::Error;

/// The navigator loop inside the caller's transaction (as the connection): deterministic in
/// the database, or — with an LLM configured — prepared in the database (search, gate, plan,
/// prompt), written by the model, then signed and recorded in the database.
pub async fn answer(
    tx: &deadpool_postgres::Transaction<'_>,
    llm: Option<&crate::llm::Llm>,
    question: String,
    purpose: Option<String>,
    dialect: Option<String>,
) -> Result<Value, Error> {
    answer_with(tx, llm, question_call(llm.is_some(), question, purpose, dialect)).await
}

/// The database's part of answering `question`: the whole answer (`answer_question`), or, for an
/// LLM to write, its preparation (`prepare_answer`). Without an LLM the answer is this one call,
/// so a caller may run it as a single governed statement (the MCP tool does).
pub fn question_call(
    with_llm: bool,
    question: String,
    purpose: Option<String>,
    dialect: Option<String>,
) -> Call {
    let name = if with_llm { "prepare_answer" } else { "answer_question" };
    Call::new(name).arg("p_question", question).opt("p_purpose", purpose).opt("p_dialect", dialect)
}

/// `POST /v1/answer`'s call under its envelope: the database reads the question from the exact
/// body the sender signed, so what runs is what was signed. Without an LLM it is the whole answer
/// (`answer_signed_request`, one call, which `/v1` runs as one statement with its envelope);
/// with one, its preparation (`prepare_signed_answer`).
pub fn signed_call(with_llm: bool, body: String) -> Call {
    let name = if with_llm { "prepare_signed_answer" } else { "answer_signed_request" };
    Call::new(name).arg("p_body", body)
}

/// `POST /v1/answer` with an LLM: the signed body's answer prepared, written by the model, then
/// signed and recorded, inside the envelope's transaction.
pub async fn answer_signed(
    tx: &deadpool_postgres::Transaction<'_>,
    llm: &crate::llm::Llm,
    body: String,
) -> Result<Value, Error> {
    answer_with(tx, Some(llm), signed_call(true, body)).await
}

/// Without an LLM, `call` is the deterministic answer and its result is the answer. With one,
/// `call` prepares the answer (its prompt and draft), the model writes the text, and
/// `complete_answer` signs and records it.
async fn answer_with(
    tx: &deadpool_postgres::Transaction<'_>,
    llm: Option<&crate::llm::Llm>,
    call: Call,
) -> Result<Value, Error> {
    let Some(llm) = llm else {
        return call.run(tx).await;
    };
    let prepared = call.run(tx).await?;
    let prompt = prepared["prompt"].as_str().unwrap_or_default();
    let draft: Uuid = serde_json::from_value(prepared["draft_id"].clone())
        .map_err(|e| Error::internal(format!("{} returned no draft id: {e}", call.function())))?;
    let text = llm.complete(prompt).await?;
    Call::new("complete_answer")
        .arg("p_draft_id", draft)
        .arg("p_text", text)
        .arg("p_synthesized_by", llm.name())
        .run(tx)
        .await
}

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
    let name = if llm.is_none() { "answer_question" } else { "prepare_answer" };
    let call =
        Call::new(name).arg("p_question", question).opt("p_purpose", purpose).opt("p_dialect", dialect);
    answer_with(tx, llm, call).await
}

/// `POST /v1/answer` under its envelope: the same loop, but the database reads the question from
/// the exact body the sender signed (`answer_signed_request`, `prepare_signed_answer`), so what
/// runs is what was signed.
pub async fn answer_signed(
    tx: &deadpool_postgres::Transaction<'_>,
    llm: Option<&crate::llm::Llm>,
    body: String,
) -> Result<Value, Error> {
    let name = if llm.is_none() { "answer_signed_request" } else { "prepare_signed_answer" };
    answer_with(tx, llm, Call::new(name).arg("p_body", body)).await
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

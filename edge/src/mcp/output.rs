//! A tool's result, written once.
//!
//! rmcp's `Json<T>` turns the tool's output into a `serde_json::Value` tree, writes the tree as
//! the result's one text block, and the response then writes the tree again as
//! `structuredContent`: three passes and a tree of allocations for every answer. Here the output
//! is written once, as the text block, from the output type (`Json::typed`), or not at all: an
//! answer that is exactly what its type writes is the database's own text (`Json::answer`). The
//! structured content is that same text:
//!
//! * on the direct path (`direct.rs`, a stateless `tools/call`), the response writes the text
//!   as `structuredContent` unchanged ([`response_body`]);
//! * on every other path (rmcp's service, stdio), `call_tool` reads the text back into the
//!   structured content before rmcp answers ([`fill_structured`]).
//!
//! Either way a client receives the same result as with rmcp's `Json<T>`: one text block holding
//! the output as compact JSON, and that JSON as `structuredContent`. The tool macro derives the
//! output schema from any return type named `Json<T>`, so the tools declare theirs as before.

use std::marker::PhantomData;

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, RequestId, ServerResult};
use rmcp::ErrorData as McpError;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::db::{unexpected_shape, JsonText};
use crate::error::Error;

/// In a request's extensions: the direct path serves it, and writes its result (`response_body`).
#[derive(Clone, Copy)]
pub struct Direct;

/// A tool's structured output (in place of rmcp's wrapper of the same name): the JSON text of
/// its result. `T`, the edge's typed view of it, declares the tool's output schema.
pub struct Json<T> {
    text: String,
    output: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> Json<T> {
    /// The database's answer, passed on as the database wrote it: not read into `T` and written
    /// again. A debug build (every test tier's) does read it into `T`, and refuses an answer
    /// that `T` would not write back the same, key for key: so the tests hold every answer
    /// they see to the output schema the tool declares.
    pub fn answer(text: JsonText) -> Result<Self, Error> {
        #[cfg(debug_assertions)]
        same_as_typed::<T>(text.as_str())?;
        Ok(Json { text: text.into_string(), output: PhantomData })
    }

    /// The database's answer read into `T` and written from it (`call`, most tools): a tool's
    /// answer then holds every key `T` writes (null where the database left one out), and none
    /// that `T` does not declare.
    pub fn typed(text: JsonText) -> Result<Self, Error> {
        let value: T = serde_json::from_str(text.as_str()).map_err(unexpected_shape)?;
        let text = serde_json::to_string(&value).map_err(unexpected_shape)?;
        Ok(Json { text, output: PhantomData })
    }

    /// A typed value's output.
    #[cfg(test)]
    pub fn of(value: &T) -> Self {
        Json { text: serde_json::to_string(value).unwrap(), output: PhantomData }
    }
}

/// The check of `Json::answer` in a debug build.
#[cfg(debug_assertions)]
fn same_as_typed<T: Serialize + DeserializeOwned>(text: &str) -> Result<(), Error> {
    let answer: serde_json::Value = serde_json::from_str(text).map_err(unexpected_shape)?;
    let typed: T = serde_json::from_str(text).map_err(unexpected_shape)?;
    let written = serde_json::to_value(&typed).map_err(unexpected_shape)?;
    if written != answer {
        return Err(Error::internal(format!(
            "the answer is not what the tool's output type writes (give the type what the database \
             writes, or call the tool with `call_typed`): the database wrote {answer}, the type {written}"
        )));
    }
    Ok(())
}

impl<T: schemars::JsonSchema + 'static> IntoCallToolResult for Json<T> {
    fn into_call_tool_result(self) -> Result<CallToolResponse, McpError> {
        Ok(CallToolResult::success(vec![ContentBlock::text(self.text)]).into())
    }
}

/// The text of a successful result whose structured content is still its one text block, as a
/// [`Json`] output leaves it.
fn pending_text(result: &CallToolResult) -> Option<&str> {
    if result.is_error != Some(false) || result.structured_content.is_some() || result.content.len() != 1 {
        return None;
    }
    result.content[0].as_text().map(|t| t.text.as_str())
}

/// For a path that rmcp writes: the structured content read back from the text block.
pub fn fill_structured(response: CallToolResponse) -> CallToolResponse {
    let CallToolResponse::Complete(mut result) = response else {
        return response;
    };
    if let Some(value) = pending_text(&result).and_then(|text| serde_json::from_str(text).ok()) {
        result.structured_content = Some(value);
    }
    CallToolResponse::Complete(result)
}

/// The direct path's response to a successful tool call whose structured content is its text
/// (`None` for any other result: rmcp's own serialisation writes it). The text is a [`Json`]'s,
/// so JSON (every tool returns one: each declares an output schema, which only a `Json` return
/// type gives, `every_tool_has_an_object_output_schema_and_honest_annotations`), and it is
/// written in as it is, without being read again.
pub fn response_body(result: &ServerResult, id: &RequestId) -> Option<Vec<u8>> {
    let ServerResult::CallToolResult(result) = result else {
        return None;
    };
    let structured = pending_text(result)?;
    debug_assert!(serde_json::from_str::<&RawValue>(structured).is_ok(), "a tool's text is JSON");
    let mut body = Vec::with_capacity(2 * structured.len() + 128);
    body.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    serde_json::to_writer(&mut body, id).ok()?;
    body.extend_from_slice(br#","result":"#);
    serde_json::to_writer(&mut body, result).ok()?;
    // The result is an object ("content" at least): its members, then the structured content.
    (body.pop() == Some(b'}')).then_some(())?;
    body.extend_from_slice(br#","structuredContent":"#);
    body.extend_from_slice(structured.as_bytes());
    body.extend_from_slice(b"}}");
    Some(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[derive(Serialize, serde::Deserialize, schemars::JsonSchema)]
    struct Out {
        name: String,
        items: Vec<u32>,
        note: Option<String>,
    }

    fn output() -> CallToolResult {
        let out = Out { name: "a \"quoted\" name".into(), items: vec![1, 2], note: None };
        match Json::of(&out).into_call_tool_result().unwrap() {
            CallToolResponse::Complete(result) => result,
            _ => panic!("a complete result"),
        }
    }

    /// A result as a client reads it: its text block read as JSON. (rmcp's `Json<T>` writes the
    /// text from a `Value` tree, whose keys are sorted; this module in the output's own order.)
    fn as_read(mut result: Value) -> Value {
        let text = result["content"][0]["text"].as_str().expect("one text block").to_string();
        result["content"][0]["text"] = serde_json::from_str(&text).unwrap();
        result
    }

    /// What rmcp's own `Json<T>` answers for the same output.
    fn rmcp_result() -> Value {
        let out = Out { name: "a \"quoted\" name".into(), items: vec![1, 2], note: None };
        match rmcp::handler::server::wrapper::Json(out).into_call_tool_result().unwrap() {
            CallToolResponse::Complete(result) => as_read(serde_json::to_value(result).unwrap()),
            _ => panic!("a complete result"),
        }
    }

    #[test]
    fn both_paths_answer_what_rmcps_json_answers() {
        // rmcp's path: the structured content is read back before rmcp writes the result.
        let CallToolResponse::Complete(filled) = fill_structured(output().into()) else { panic!() };
        assert_eq!(as_read(serde_json::to_value(&filled).unwrap()), rmcp_result());
        // The direct path: the text is written as the structured content, byte for byte.
        let id = RequestId::Number(7);
        let body = response_body(&ServerResult::CallToolResult(output()), &id).unwrap();
        // Written into the result's members: once, as its last (a JSON reader would keep a
        // repeated member silently, so count it in the bytes).
        let written = String::from_utf8(body.clone()).unwrap();
        assert_eq!(written.matches(r#""structuredContent":"#).count(), 1, "{written}");
        assert!(written
            .ends_with(r#","structuredContent":{"name":"a \"quoted\" name","items":[1,2],"note":null}}}"#));
        let mut body: Value = serde_json::from_slice(&body).unwrap();
        let text = body["result"]["content"][0]["text"].as_str().unwrap().to_string();
        assert_eq!(text, r#"{"name":"a \"quoted\" name","items":[1,2],"note":null}"#);
        body["result"] = as_read(body["result"].take());
        assert_eq!(body, json!({"jsonrpc": "2.0", "id": 7, "result": rmcp_result()}));
        assert_eq!(body["result"]["content"][0]["text"], body["result"]["structuredContent"]);
    }

    /// A debug build holds the database's answer to the output type: what the type would not
    /// write back the same is refused.
    #[cfg(debug_assertions)]
    #[test]
    fn an_answer_the_output_type_would_not_write_is_refused() {
        let answer = |text: &str| {
            let bytes = [&[1u8][..], text.as_bytes()].concat();
            let text = <JsonText as tokio_postgres::types::FromSql>::from_sql(
                &tokio_postgres::types::Type::JSONB,
                &bytes,
            )
            .unwrap();
            Json::<Out>::answer(text).map(|json| json.text)
        };
        assert_eq!(
            answer(r#"{"items": [1, 2], "name": "a", "note": null}"#).unwrap(),
            r#"{"items":[1,2],"name":"a","note":null}"#
        );
        for refused in [
            r#"{"items": [1, 2], "name": "a"}"#,
            r#"{"items": [1, 2], "name": "a", "note": null, "secret": "x"}"#,
            r#"{"items": [1, "2"], "name": "a", "note": null}"#,
        ] {
            let error = answer(refused).unwrap_err();
            assert_eq!(error.code, crate::error::Code::Internal, "{refused}");
        }
    }

    #[test]
    fn other_results_are_left_to_rmcp() {
        let id = RequestId::Number(1);
        let error = CallToolResult::error(vec![ContentBlock::text("refused")]);
        assert!(response_body(&ServerResult::CallToolResult(error.clone()), &id).is_none());
        let CallToolResponse::Complete(kept) = fill_structured(error.clone().into()) else { panic!() };
        assert_eq!(kept, error);
        // A result that already carries its structured content is rmcp's to write.
        let done = CallToolResult::structured(json!({"a": 1}));
        assert!(response_body(&ServerResult::CallToolResult(done), &id).is_none());
    }
}

//! A tool's result, written once.
//!
//! rmcp's `Json<T>` turns the tool's output into a `serde_json::Value` tree, writes the tree as
//! the result's one text block, and the response then writes the tree again as
//! `structuredContent`: three passes and a tree of allocations for every answer. Here the output
//! is written once, as the text block; the structured content is that same text:
//!
//! * on the direct path (`direct.rs`, a stateless `tools/call`), the response writes the text
//!   as `structuredContent` unchanged ([`response_body`]);
//! * on every other path (rmcp's service, stdio), `call_tool` reads the text back into the
//!   structured content before rmcp answers ([`fill_structured`]).
//!
//! Either way a client receives the same result as with rmcp's `Json<T>`: one text block holding
//! the output as compact JSON, and that JSON as `structuredContent`. The tool macro derives the
//! output schema from any return type named `Json<T>`, so the tools declare theirs as before.

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, JsonRpcVersion2_0, RequestId, ServerResult,
};
use rmcp::ErrorData as McpError;
use serde::Serialize;
use serde_json::value::RawValue;

/// In a request's extensions: the direct path serves it, and writes its result (`response_body`).
#[derive(Clone, Copy)]
pub struct Direct;

/// A tool's structured output (in place of rmcp's wrapper of the same name).
pub struct Json<T>(pub T);

impl<T: Serialize + schemars::JsonSchema + 'static> IntoCallToolResult for Json<T> {
    fn into_call_tool_result(self) -> Result<CallToolResponse, McpError> {
        let text = serde_json::to_string(&self.0).map_err(|e| {
            McpError::internal_error(format!("Failed to serialize structured content: {e}"), None)
        })?;
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
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
/// (`None` for any other result: rmcp's own serialisation writes it).
pub fn response_body(result: &ServerResult, id: &RequestId) -> Option<Vec<u8>> {
    #[derive(Serialize)]
    struct Response<'a> {
        jsonrpc: JsonRpcVersion2_0,
        id: &'a RequestId,
        result: WithStructured<'a>,
    }
    #[derive(Serialize)]
    struct WithStructured<'a> {
        #[serde(flatten)]
        result: &'a CallToolResult,
        #[serde(rename = "structuredContent")]
        structured: &'a RawValue,
    }
    let ServerResult::CallToolResult(result) = result else {
        return None;
    };
    let structured: &RawValue = serde_json::from_str(pending_text(result)?).ok()?;
    let response = Response { jsonrpc: JsonRpcVersion2_0, id, result: WithStructured { result, structured } };
    serde_json::to_vec(&response).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[derive(Serialize, schemars::JsonSchema)]
    struct Out {
        name: String,
        items: Vec<u32>,
        note: Option<String>,
    }

    fn output() -> CallToolResult {
        let out = Out { name: "a \"quoted\" name".into(), items: vec![1, 2], note: None };
        match Json(out).into_call_tool_result().unwrap() {
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
        let mut body: Value = serde_json::from_slice(&body).unwrap();
        let text = body["result"]["content"][0]["text"].as_str().unwrap().to_string();
        assert_eq!(text, r#"{"name":"a \"quoted\" name","items":[1,2],"note":null}"#);
        body["result"] = as_read(body["result"].take());
        assert_eq!(body, json!({"jsonrpc": "2.0", "id": 7, "result": rmcp_result()}));
        assert_eq!(body["result"]["content"][0]["text"], body["result"]["structuredContent"]);
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

//! The optional LLM: an OpenAI-compatible chat endpoint (`--llm-url`, `--llm-model`) that writes
//! the answer text from the prompt the database prepared. The database decides everything
//! else — what may be read, which sources are denied, what is signed and recorded — and the
//! prompt it hands out already names denied datasets only as off-limits.

use std::time::Duration;

use serde_json::{json, Value};

use crate::error::Error;

#[derive(Clone, Debug)]
pub struct LlmConfig {
    /// Base URL; `/v1/chat/completions` is appended unless the URL already ends with it.
    pub url: String,
    pub model: String,
    pub timeout: Duration,
}

#[derive(Clone)]
pub struct Llm {
    config: LlmConfig,
    client: reqwest::Client,
}

impl std::fmt::Debug for Llm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Llm").field("url", &self.config.url).field("model", &self.config.model).finish()
    }
}

impl Llm {
    pub fn new(config: LlmConfig) -> Result<Llm, String> {
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build the LLM client: {e}"))?;
        Ok(Llm { config, client })
    }

    /// `synthesized_by` of answers written by this model.
    pub fn name(&self) -> String {
        format!("openai-compatible:{}", self.config.model)
    }

    fn endpoint(&self) -> String {
        let base = self.config.url.trim_end_matches('/');
        if base.ends_with("/chat/completions") {
            base.to_string()
        } else if base.ends_with("/v1") {
            format!("{base}/chat/completions")
        } else {
            format!("{base}/v1/chat/completions")
        }
    }

    /// The model's answer to `prompt`. Failures are a 502 to the caller, with the cause logged.
    pub async fn complete(&self, prompt: &str) -> Result<String, Error> {
        let body = json!({"model": self.config.model, "messages": [{"role": "user", "content": prompt}]});
        let response = self
            .client
            .post(self.endpoint())
            .json(&body)
            .send()
            .await
            .map_err(|e| Error::upstream(format!("the LLM endpoint did not answer: {e}")))?;
        let status = response.status();
        let value: Value = response
            .json()
            .await
            .map_err(|e| Error::upstream(format!("the LLM endpoint answered {status} without JSON: {e}")))?;
        if !status.is_success() {
            return Err(Error::upstream(format!("the LLM endpoint answered {status}")));
        }
        value
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .filter(|text| !text.trim().is_empty())
            .map(str::to_string)
            .ok_or_else(|| Error::upstream("the LLM endpoint's answer has no choices[0].message.content"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llm(url: &str) -> Llm {
        Llm::new(LlmConfig { url: url.into(), model: "m".into(), timeout: Duration::from_secs(1) }).unwrap()
    }

    #[test]
    fn the_endpoint_is_the_openai_chat_path() {
        assert_eq!(llm("http://127.0.0.1:11434").endpoint(), "http://127.0.0.1:11434/v1/chat/completions");
        assert_eq!(llm("http://h/v1/").endpoint(), "http://h/v1/chat/completions");
        assert_eq!(llm("http://h/v1/chat/completions").endpoint(), "http://h/v1/chat/completions");
        assert_eq!(llm("http://h").name(), "openai-compatible:m");
    }
}

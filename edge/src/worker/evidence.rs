//! Re-verification of evidence sources: one fetch of the source (the address rules and limits of
//! `crate::fetch`), its body hashed whole; the head becomes the excerpt (`excerpt`).

use sha2::{Digest, Sha256};

use super::excerpt::{excerpt, TextKind, EXCERPT_SOURCE_BYTES};
use crate::fetch::Fetcher;

/// What one fetch saw. `http_status` is None when no response arrived; `sha256` is None when the
/// body could not be read whole (the database then records an error attempt).
#[derive(Debug, Default)]
pub(crate) struct Observation {
    pub http_status: Option<i32>,
    pub sha256: Option<String>,
    pub excerpt: Option<String>,
    /// Why the fetch fell short, for the log (never a URL or body).
    pub problem: Option<&'static str>,
}

impl Observation {
    fn failed(problem: &'static str) -> Self {
        Observation { problem: Some(problem), ..Observation::default() }
    }
}

/// Fetches an evidence source and observes it.
pub(crate) async fn observe(fetcher: &Fetcher, url: &str) -> Observation {
    let mut response = match fetcher.get(url, None).await {
        Ok(r) => r,
        Err(problem) => return Observation::failed(problem),
    };
    let http_status = Some(i32::from(response.status().as_u16()));
    let kind = TextKind::of(response.headers().get(reqwest::header::CONTENT_TYPE));
    let mut hasher = Sha256::new();
    let mut size = 0usize;
    let mut head = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                size += chunk.len();
                if size > fetcher.max_body_bytes {
                    return Observation {
                        http_status,
                        problem: Some("body larger than --max-body-bytes"),
                        ..Observation::default()
                    };
                }
                hasher.update(&chunk);
                let room = EXCERPT_SOURCE_BYTES.saturating_sub(head.len());
                head.extend_from_slice(&chunk[..room.min(chunk.len())]);
            }
            Ok(None) => break,
            Err(e) => {
                return Observation {
                    http_status,
                    problem: Some(if e.is_timeout() { "timeout" } else { "body read failed" }),
                    ..Observation::default()
                }
            }
        }
    }
    Observation {
        http_status,
        sha256: Some(hex(&hasher.finalize())),
        excerpt: excerpt(kind, &head),
        problem: None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_lowercase_hex() {
        assert_eq!(
            hex(&Sha256::digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

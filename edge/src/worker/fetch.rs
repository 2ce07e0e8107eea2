//! The evidence fetcher and its address rules: http(s) only, no non-public address (as a
//! literal, after resolution, or after a redirect) unless the operator allows private networks,
//! bounded redirects, time and body size. What it reads is hashed whole; the head becomes the
//! excerpt (`excerpt`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::excerpt::{excerpt, TextKind, EXCERPT_SOURCE_BYTES};

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

/// What the fetcher may do: the worker's `--allow-private-networks`, `--max-redirects`,
/// `--fetch-timeout-secs` and `--max-body-bytes`.
pub(crate) struct FetchLimits {
    pub allow_private_networks: bool,
    pub max_redirects: usize,
    pub fetch_timeout_secs: u64,
    pub max_body_bytes: usize,
}

/// Fetches evidence sources: http(s) only, public addresses only (unless allowed), bounded in
/// redirects, time and size.
pub(crate) struct Fetcher {
    client: reqwest::Client,
    max_body_bytes: usize,
    allow_private: bool,
}

impl Fetcher {
    pub fn new(args: &FetchLimits) -> Result<Self, reqwest::Error> {
        let allow_private = args.allow_private_networks;
        let max_redirects = args.max_redirects;
        let redirects = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > max_redirects {
                attempt.error("too many redirects")
            } else if !allow_private && names_non_public_address(attempt.url().host_str()) {
                attempt.error("a redirect to a non-public address")
            } else {
                attempt.follow()
            }
        });
        let timeout = Duration::from_secs(args.fetch_timeout_secs.max(1));
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .redirect(redirects)
            // Connect directly: a proxy would resolve names where the address check cannot see.
            .no_proxy()
            .user_agent(concat!("querylayer-evidence-worker/", env!("CARGO_PKG_VERSION")));
        if !allow_private {
            builder = builder.dns_resolver(Arc::new(PublicAddressesOnly));
        }
        Ok(Fetcher { client: builder.build()?, max_body_bytes: args.max_body_bytes, allow_private })
    }

    pub async fn fetch(&self, url: &str) -> Observation {
        let Ok(parsed) = reqwest::Url::parse(url) else {
            return Observation::failed("not a URL");
        };
        if !matches!(parsed.scheme(), "http" | "https") {
            return Observation::failed("not an http(s) URL");
        }
        if !self.allow_private && names_non_public_address(parsed.host_str()) {
            return Observation::failed("a non-public address");
        }
        let mut response = match self.client.get(parsed).send().await {
            Ok(r) => r,
            Err(e) if e.is_timeout() => return Observation::failed("timeout"),
            Err(e) if e.is_redirect() => return Observation::failed("redirects refused or too many"),
            Err(e) if e.is_connect() => return Observation::failed("cannot connect"),
            Err(_) => return Observation::failed("request failed"),
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
                    if size > self.max_body_bytes {
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
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Resolves names to their public addresses only; a name with none fails to resolve.
struct PublicAddressesOnly;

impl reqwest::dns::Resolve for PublicAddressesOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let public: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.filter(|a| is_public(a.ip())).collect();
            if public.is_empty() {
                return Err("the name resolves to no public address".into());
            }
            Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// True when a URL's host is an IP literal outside the public internet. Names are checked when
/// they resolve.
fn names_non_public_address(host: Option<&str>) -> bool {
    let Some(host) = host else { return true };
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    literal.parse::<IpAddr>().is_ok_and(|ip| !is_public(ip))
}

fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // unique local
        || (s[0] & 0xffc0) == 0xfe80 // link local
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || (s[0] == 0x0064 && s[1] == 0xff9b)) // NAT64: could reach any IPv4 address
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_fetched_by_default() {
        for private in [
            "127.0.0.1",
            "[::1]",
            "10.1.2.3",
            "192.168.0.1",
            "169.254.169.254",
            "100.64.0.1",
            "[fd00::1]",
            "[::ffff:127.0.0.1]",
            "0.0.0.0",
        ] {
            assert!(names_non_public_address(Some(private)), "{private}");
        }
        for public in ["93.184.216.34", "[2606:4700::1]", "example.com"] {
            assert!(!names_non_public_address(Some(public)), "{public}");
        }
    }

    #[test]
    fn hashes_are_lowercase_hex() {
        assert_eq!(
            hex(&Sha256::digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

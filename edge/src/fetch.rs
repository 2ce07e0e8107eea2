//! Fetching from the open internet on behalf of others, with the address rules that keep it from
//! reaching inside: http(s) only, no non-public address (as a literal, after resolution, or after
//! a redirect) unless the operator allows private networks, bounded redirects, time and body
//! size, no proxy. Used by the worker's evidence re-verification (`worker::evidence`) and by the
//! OAuth authorization server for Client ID Metadata Documents (`oauth::documents`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// What a fetcher may do: the worker's `--allow-private-networks`, `--max-redirects`,
/// `--fetch-timeout-secs` and `--max-body-bytes`, or the edge's limits for client documents.
pub(crate) struct FetchLimits {
    pub allow_private_networks: bool,
    pub max_redirects: usize,
    pub fetch_timeout_secs: u64,
    pub max_body_bytes: usize,
    /// PEM certificates trusted besides the system's web roots (a private CA).
    pub extra_roots_pem: Option<Vec<u8>>,
    pub user_agent: &'static str,
}

/// An HTTP client bound by `FetchLimits`.
pub(crate) struct Fetcher {
    client: reqwest::Client,
    pub max_body_bytes: usize,
    allow_private: bool,
}

/// Why a fetch fell short, for logs and refusals (never a URL or body).
pub(crate) type Shortfall = &'static str;

impl Fetcher {
    pub fn new(args: &FetchLimits) -> Result<Self, String> {
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
            .user_agent(args.user_agent);
        if let Some(pem) = &args.extra_roots_pem {
            for cert in reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| format!("a trusted certificate: {e}"))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        if !allow_private {
            builder = builder.dns_resolver(Arc::new(PublicAddressesOnly));
        }
        Ok(Fetcher {
            client: builder.build().map_err(|e| format!("the HTTP client: {e}"))?,
            max_body_bytes: args.max_body_bytes,
            allow_private,
        })
    }

    /// Sends a GET to `url` under the address rules: the response, or why there is none.
    pub async fn get(&self, url: &str, accept: Option<&str>) -> Result<reqwest::Response, Shortfall> {
        let Ok(parsed) = reqwest::Url::parse(url) else {
            return Err("not a URL");
        };
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err("not an http(s) URL");
        }
        if !self.allow_private && names_non_public_address(parsed.host_str()) {
            return Err("a non-public address");
        }
        let mut request = self.client.get(parsed);
        if let Some(accept) = accept {
            request = request.header(reqwest::header::ACCEPT, accept);
        }
        match request.send().await {
            Ok(r) => Ok(r),
            Err(e) if e.is_timeout() => Err("timeout"),
            Err(e) if e.is_redirect() => Err("redirects refused or too many"),
            Err(e) if e.is_connect() => Err("cannot connect"),
            Err(_) => Err("request failed"),
        }
    }

    /// The whole body of `response`, at most `max` bytes (`max_body_bytes` when None).
    pub async fn body(
        &self,
        mut response: reqwest::Response,
        max: Option<usize>,
    ) -> Result<Vec<u8>, Shortfall> {
        let max = max.unwrap_or(self.max_body_bytes);
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > max {
                        return Err("body larger than allowed");
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => return Ok(body),
                Err(e) => return Err(if e.is_timeout() { "timeout" } else { "body read failed" }),
            }
        }
    }
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
}

//! TLS to PostgreSQL with rustls, configured from the connection string as libpq reads it:
//! `sslmode` (`disable`, `prefer` (the default), `require`, `verify-ca`, `verify-full`) and
//! `sslrootcert` (a PEM file of the CA certificates to trust), in a URL's query
//! (`postgresql://…?sslmode=verify-full&sslrootcert=/etc/ql/ca.pem`) or as key/value pairs
//! (`host=db sslmode=verify-full sslrootcert=/etc/ql/ca.pem`); `PGSSLMODE` and `PGSSLROOTCERT`
//! apply when the string names neither. And `describe`, which says what failed when a connection
//! cannot be made: TLS, authentication, refused, unreachable.
//!
//! | sslmode | encrypted | server certificate checked |
//! |---|---|---|
//! | `disable` | no | — |
//! | `prefer` | if the server offers TLS | no |
//! | `require` | yes | no; with `sslrootcert`, as `verify-ca` (as libpq) |
//! | `verify-ca` | yes | signed by a CA in `sslrootcert` |
//! | `verify-full` | yes | signed by a CA in `sslrootcert` and issued for the host connected to |

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The connector the pool and the readiness check hand to tokio-postgres.
pub type MakeTls = tokio_postgres_rustls::MakeRustlsConnect;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(value: &str) -> Result<SslMode, String> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(format!(
                    "sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full"
                ))
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// A connection string read for TLS: tokio-postgres's configuration (with the TLS options it
/// does not know taken out) and the connector that carries them out.
#[derive(Clone)]
pub struct PgConnect {
    pub config: tokio_postgres::Config,
    pub tls: MakeTls,
    pub mode: SslMode,
    pub root_cert: Option<PathBuf>,
}

impl std::fmt::Debug for PgConnect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConnect").field("mode", &self.mode).field("root_cert", &self.root_cert).finish()
    }
}

/// Reads `url` (a libpq URL or key/value string). Errors name the option at fault, never the
/// password.
pub fn parse(url: &str) -> Result<PgConnect, String> {
    let (rest, sslmode, sslrootcert) = take_tls_options(url);
    let mut config = tokio_postgres::Config::from_str(&rest)
        .map_err(|e| format!("DATABASE_URL is not a valid PostgreSQL connection string: {e}"))?;
    let sslmode = sslmode.or_else(|| std::env::var("PGSSLMODE").ok().filter(|v| !v.is_empty()));
    let sslrootcert = sslrootcert.or_else(|| std::env::var("PGSSLROOTCERT").ok().filter(|v| !v.is_empty()));
    let mode = match sslmode.as_deref() {
        Some(value) => SslMode::parse(value).map_err(|e| format!("DATABASE_URL: {e}"))?,
        None => SslMode::Prefer,
    };
    let root_cert = sslrootcert.map(PathBuf::from);
    config.ssl_mode(match mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    let client = client_config(mode, root_cert.as_ref())?;
    Ok(PgConnect { config, tls: MakeTls::new(client), mode, root_cert })
}

/// One connection outside the pool (`querylayer ledger`, the PostgreSQL witnesses), with the
/// TLS the string asks for; an error says what failed (`describe`).
pub async fn connect(target: &PgConnect) -> Result<tokio_postgres::Client, String> {
    let (client, connection) = target.config.connect(target.tls.clone()).await.map_err(|e| describe(&e))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn client_config(mode: SslMode, root_cert: Option<&PathBuf>) -> Result<ClientConfig, String> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up: {e}"))?;
    // libpq: `require` with a root certificate verifies the chain, as `verify-ca`.
    let verify = match (mode, root_cert) {
        (SslMode::VerifyCa | SslMode::VerifyFull, _) => true,
        (SslMode::Require, Some(_)) => true,
        _ => false,
    };
    if !verify {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
            .with_no_client_auth());
    }
    let Some(path) = root_cert.cloned().or_else(default_root_cert) else {
        return Err(format!(
            "DATABASE_URL: sslmode={} checks the server's certificate: give the CA that signed it with \
             sslrootcert=/path/to/ca.pem (or PGSSLROOTCERT)",
            mode.as_str()
        ));
    };
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(&path)
        .map_err(|e| format!("sslrootcert {}: cannot read it: {e}", path.display()))?;
    for cert in certs {
        let cert =
            cert.map_err(|e| format!("sslrootcert {}: not a PEM certificate file: {e}", path.display()))?;
        roots.add(cert).map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("sslrootcert {}: holds no certificate", path.display()));
    }
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
    let verifier: Arc<dyn ServerCertVerifier> =
        if mode == SslMode::VerifyFull { webpki } else { Arc::new(ChainOnly(webpki)) };
    Ok(builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth())
}

/// libpq's default root certificate, `~/.postgresql/root.crt`, when it exists.
fn default_root_cert() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let path = PathBuf::from(home).join(".postgresql/root.crt");
    path.is_file().then_some(path)
}

/// Takes `sslmode` and `sslrootcert` out of a connection string (tokio-postgres refuses
/// `verify-ca`, `verify-full` and `sslrootcert`): (the rest, sslmode, sslrootcert).
fn take_tls_options(url: &str) -> (String, Option<String>, Option<String>) {
    let (mut mode, mut root) = (None, None);
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_string(), None, None);
        };
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "sslmode" => mode = Some(percent_decode(value)),
                "sslrootcert" => root = Some(percent_decode(value)),
                _ => kept.push(pair),
            }
        }
        let rest = if kept.is_empty() { base.to_string() } else { format!("{base}?{}", kept.join("&")) };
        return (rest, mode, root);
    }
    let mut kept = Vec::new();
    for (key, value) in key_values(url) {
        match key.as_str() {
            "sslmode" => mode = Some(value),
            "sslrootcert" => root = Some(value),
            _ => kept.push(format!("{key}='{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))),
        }
    }
    (kept.join(" "), mode, root)
}

/// `key = value` pairs of a libpq key/value string (values may be single-quoted, with `\`
/// escapes).
fn key_values(s: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        if key.is_empty() {
            return pairs;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next_if_eq(&'=').is_none() {
            // Not key/value: leave it for tokio-postgres to refuse.
            pairs.push((key, String::new()));
            return pairs;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '\'' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `prefer` and `require` without a CA: encrypted, the certificate unchecked (as libpq). The
/// handshake's signatures are still verified.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted CA; the name in the certificate is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the chain before the name: a name error means the chain was good.
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// What failed when a connection could not be made or was lost, in an operator's terms:
/// `TLS: …`, `authentication failed: …`, `refused: …`, `unreachable: …`, or the error itself.
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        return match code {
            "28000" if db.message().contains("no encryption") => format!(
                "TLS required: the server accepts only encrypted connections ({}); use sslmode=require or stronger",
                db.message()
            ),
            "28P01" | "28000" => format!("authentication failed: {} (SQLSTATE {code})", db.message()),
            "3D000" => format!("the database does not exist: {} (SQLSTATE {code})", db.message()),
            "53300" => format!("the server has no connection slot left: {} (SQLSTATE {code})", db.message()),
            "57P03" => format!("the server does not accept connections yet: {} (SQLSTATE {code})", db.message()),
            _ => format!("SQLSTATE {code}: {}", db.message()),
        };
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(tls) = s.downcast_ref::<rustls::Error>() {
            return format!("TLS: {}", tls_reason(tls));
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if let Some(tls) = io.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
                return format!("TLS: {}", tls_reason(tls));
            }
            use std::io::ErrorKind::*;
            match io.kind() {
                ConnectionRefused => {
                    return format!("refused: nothing accepts connections at that host and port ({io})")
                }
                TimedOut | HostUnreachable | NetworkUnreachable | AddrNotAvailable => {
                    return format!("unreachable: {io}")
                }
                NotFound if e.to_string().contains("connecting") => {
                    return format!("refused: no server socket at that path ({io})")
                }
                _ => {}
            }
        }
        source = s.source();
    }
    let text = e.to_string();
    if text.contains("TLS") {
        format!("TLS: {text}")
    } else if text.contains("timeout") || text.contains("timed out") {
        format!("unreachable: {text}")
    } else if text.contains("password") || text.contains("authentication") {
        format!("authentication failed: {text}")
    } else {
        text
    }
}

fn tls_reason(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "the server's certificate is not signed by a CA in sslrootcert (wrong CA file?)".into()
        }
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => "the server's certificate is not issued for the host connected to (sslmode=verify-full checks \
              the name; connect by a name the certificate lists)"
            .into(),
        rustls::Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => "the server's certificate has expired".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_options_are_taken_out_of_urls_and_key_values() {
        let (rest, mode, root) = take_tls_options(
            "postgresql://u:p@h:5/db?sslmode=verify-full&application_name=x&sslrootcert=%2Ftmp%2Fca.pem",
        );
        assert_eq!(rest, "postgresql://u:p@h:5/db?application_name=x");
        assert_eq!((mode.as_deref(), root.as_deref()), (Some("verify-full"), Some("/tmp/ca.pem")));
        let (rest, mode, root) = take_tls_options("postgres://h/db?sslmode=require");
        assert_eq!((rest.as_str(), mode.as_deref(), root), ("postgres://h/db", Some("require"), None));
        let (rest, mode, root) = take_tls_options(
            "host=/tmp port = 5432 password='a b\\'c' sslmode=verify-ca sslrootcert='/x y/ca.pem'",
        );
        assert_eq!(rest, "host='/tmp' port='5432' password='a b\\'c'");
        assert_eq!((mode.as_deref(), root.as_deref()), (Some("verify-ca"), Some("/x y/ca.pem")));
        let config = tokio_postgres::Config::from_str(&rest).unwrap();
        assert_eq!(config.get_password(), Some(&b"a b'c"[..]));
    }

    #[test]
    fn each_sslmode_is_read_and_verifying_ones_need_a_ca() {
        for (url, mode) in [
            ("postgres://h/db?sslmode=disable", SslMode::Disable),
            ("postgres://h/db", SslMode::Prefer),
            ("host=h sslmode=require", SslMode::Require),
        ] {
            assert_eq!(parse(url).unwrap().mode, mode, "{url}");
        }
        assert!(parse("postgres://h/db?sslmode=sometimes").unwrap_err().contains("is not one of"));
        if default_root_cert().is_none() {
            let refused = parse("postgres://h/db?sslmode=verify-full").unwrap_err();
            assert!(refused.contains("sslrootcert"), "{refused}");
        }
        let missing = parse("postgres://h/db?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem").unwrap_err();
        assert!(missing.contains("/nonexistent/ca.pem"), "{missing}");
    }
}

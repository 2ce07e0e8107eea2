//! The OAuth token endpoint's entry into the database: an authorization code or a refresh token
//! is the only credential a token request carries, so, like a sign-in, the extension finds the
//! one row of the presented SHA-256 (row-level security shows it only while it is presented),
//! holds a resolving context for that row's site (nothing is granted), and lets
//! `sql/190_oauth.sql` decide. A refusal is an answer (`{ok: false, error: "invalid_grant"}`),
//! not an error, so that what it revoked (a reused code or refresh token ends its grant) and its
//! audit record are committed.

use crate::jsonb::Jsonb;
use pgrx::prelude::*;
use pgrx::Uuid;
use serde_json::{json, Value};

use crate::context;

/// The (site, organization) of the row of `table` whose `column` is the presented fingerprint.
fn site_of(table: &str, column: &str, fingerprint: &[u8]) -> Option<(Uuid, Uuid)> {
    context::presented_row(
        fingerprint,
        &format!(
            "SELECT site_id, organization_id FROM querylayer.{table}
              WHERE {column} = querylayer.ctx_presented_fingerprint()"
        ),
        "OAuth lookup",
        context::site_and_organization,
    )
}

fn unknown() -> Jsonb {
    let detail = json!({"credential": "oauth", "reason": "unknown", "channel": "oauth"});
    Spi::run_with_args("SELECT querylayer.audit_failed_authentication($1)", &[Jsonb(detail).into()])
        .unwrap_or_else(|e| error!("querylayer: could not record the failed token request: {e}"));
    Jsonb(json!({"ok": false, "error": "invalid_grant", "reason": "unknown"}))
}

/// Runs `sql` in a resolving context for (site, organization), then drops the context.
fn in_site(site: (Uuid, Uuid), sql: &str, args: &[pgrx::datum::DatumWithOid]) -> Jsonb {
    context::resolving(site.0, site.1);
    let answer = Spi::get_one_with_args::<Jsonb>(sql, args)
        .unwrap_or_else(|e| error!("querylayer: {sql} failed: {e}"))
        .map(|j| j.0)
        .unwrap_or(Value::Null);
    context::clear();
    Jsonb(answer)
}

#[pg_schema]
mod querylayer_api {
    use super::*;

    /// `grant_type=authorization_code`: redeems the code whose SHA-256 is `fingerprint` for the
    /// client, redirect URI, PKCE verifier and resource of the request. `{ok: true,
    /// access_token, refresh_token, expires_in, scope, …}` or `{ok: false, error, reason}`.
    /// SECURITY DEFINER: reads the private code table and issues the connection.
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn oauth_redeem_code(
        fingerprint: &[u8],
        client_id: &str,
        redirect_uri: &str,
        code_verifier: &str,
        resource: &str,
    ) -> Jsonb {
        context::refuse_if_established();
        let Some(site) = site_of("oauth_codes", "code_sha256", fingerprint) else {
            return unknown();
        };
        in_site(
            site,
            "SELECT querylayer.oauth_redeem_code($1, $2, $3, $4, $5)",
            &[
                fingerprint.into(),
                client_id.into(),
                redirect_uri.into(),
                code_verifier.into(),
                resource.into(),
            ],
        )
    }

    /// `grant_type=refresh_token`: spends the refresh token whose SHA-256 is `fingerprint`; a
    /// spent one presented again ends its grant. Answers as `oauth_redeem_code`.
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn oauth_refresh(fingerprint: &[u8], client_id: &str, resource: Option<&str>) -> Jsonb {
        context::refuse_if_established();
        let Some(site) = site_of("oauth_refresh_tokens", "token_sha256", fingerprint) else {
            return unknown();
        };
        in_site(
            site,
            "SELECT querylayer.oauth_use_refresh($1, $2, $3)",
            &[fingerprint.into(), client_id.into(), resource.into()],
        )
    }

    /// Revocation (RFC 7009) of a refresh token: its grant and connection end. Always `{ok: true}`
    /// (an unknown token is not an error, RFC 7009 §2.2).
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn oauth_revoke_refresh(fingerprint: &[u8], client_id: Option<&str>) -> Jsonb {
        context::refuse_if_established();
        let Some(site) = site_of("oauth_refresh_tokens", "token_sha256", fingerprint) else {
            return Jsonb(json!({"ok": true}));
        };
        in_site(
            site,
            "SELECT querylayer.oauth_revoke_by_refresh($1, $2)",
            &[fingerprint.into(), client_id.into()],
        )
    }
}

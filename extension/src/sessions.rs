//! Members in the browser: passwords, sign-in and dashboard sessions. A password is set only by
//! redeeming a one-time invitation and is stored only as an argon2id hash; hashing and checking
//! happen here, inside the database, so the hash never leaves it (no role, the edge included,
//! can read `member_passwords`, and no function returns a hash). A good password opens a new
//! session whose cookie secret is kept like every credential (prefix plus SHA-256). Each request
//! of a session carries its CSRF token; a request without one runs read-only.

use crate::jsonb::Jsonb;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use pgrx::prelude::*;
use pgrx::Uuid;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::context::{self, Credential, Resolution};

/// argon2id with the parameters OWASP recommends (19 MiB, two passes, one lane).
fn hasher() -> Argon2<'static> {
    let params = Params::new(19_456, 2, 1, None).expect("valid argon2 parameters");
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
}

/// A salted argon2id hash in PHC form. Pure (no PostgreSQL call), so unit tests can run it.
fn try_hash_password(password: &str) -> Result<String, String> {
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt).map_err(|e| format!("the operating system RNG failed: {e}"))?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| format!("salt: {e}"))?;
    hasher()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| format!("hashing: {e}"))
}

fn hash_password(password: &str) -> String {
    try_hash_password(password).unwrap_or_else(|e| error!("querylayer: a password could not be hashed: {e}"))
}

fn verify_password(password: &str, hash: &str) -> bool {
    match PasswordHash::new(hash) {
        Ok(parsed) => hasher().verify_password(password.as_bytes(), &parsed).is_ok(),
        Err(_) => false,
    }
}

thread_local! {
    /// A hash of a random password, checked when no member matches, so that an unknown site or
    /// handle takes as long to refuse as a wrong password.
    static DECOY: String = {
        let mut raw = [0u8; 24];
        let _ = getrandom::fill(&mut raw);
        try_hash_password(&crate::secrets::base64url(&raw)).unwrap_or_default()
    };
}

/// The key a member's password row is found by: what the person types, never stored in clear.
fn sign_in_key(site: &str, handle: &str) -> Vec<u8> {
    let site = site.trim().to_ascii_lowercase();
    let handle = handle.trim().to_ascii_lowercase();
    Sha256::digest(format!("querylayer-sign-in-v1\n{site}\n{handle}").as_bytes()).to_vec()
}

/// The CSRF token of a session: derived from the SHA-256 of its cookie secret, so it changes
/// with every sign-in, and a page that shows it reveals nothing that opens the session.
fn csrf_token(fingerprint: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"querylayer-csrf-v1:");
    h.update(fingerprint);
    crate::secrets::base64url(&h.finalize())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The password rules, with an error naming the argument.
fn check_password(password: &str, handle: &str) {
    let chars = password.chars().count();
    if chars < 12 {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "password: at least 12 characters are required"
        );
    }
    if chars > 256 {
        ereport!(ERROR, PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, "password: at most 256 characters");
    }
    if password.trim().is_empty() || password.to_ascii_lowercase().contains(&handle.to_ascii_lowercase()) {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "password: it must not be blank or contain the member's handle"
        );
    }
}

fn json_call(sql: &str, args: &[pgrx::datum::DatumWithOid]) -> Value {
    Spi::get_one_with_args::<Jsonb>(sql, args)
        .unwrap_or_else(|e| error!("querylayer: {sql} failed: {e}"))
        .map(|j| j.0)
        .unwrap_or(Value::Null)
}

/// The password row of (site, handle): (site_id, organization_id, member_id, hash).
fn password_row(site: &str, handle: &str) -> Option<(Uuid, Uuid, Uuid, String)> {
    context::presented_row(
        &sign_in_key(site, handle),
        "SELECT site_id, organization_id, member_id, password_hash FROM querylayer.member_passwords
          WHERE lookup_sha256 = querylayer.ctx_presented_fingerprint()",
        "password lookup",
        |row| {
            Ok(match (row.get::<Uuid>(1)?, row.get::<Uuid>(2)?, row.get::<Uuid>(3)?, row.get::<String>(4)?) {
                (Some(s), Some(o), Some(m), Some(h)) => Some((s, o, m, h)),
                _ => None,
            })
        },
    )
}

/// Resolves a session cookie and holds the member's context. Without a CSRF token the
/// transaction becomes read-only: a request that does not prove it comes from the dashboard's
/// own page changes nothing. A token that is not this session's is reported as `mismatch`
/// (the calling SQL function refuses with QL403) and no context is held.
#[pg_extern(volatile, parallel_unsafe)]
#[search_path(pg_catalog, pg_temp)]
fn session_authenticate(fingerprint: Option<&[u8]>, csrf: Option<&str>) -> Jsonb {
    context::refuse_if_established();
    let fingerprint = fingerprint.unwrap_or_default();
    let verdict = match context::resolve(Credential::MemberSession, fingerprint, true) {
        Resolution::Live(v) => v,
        Resolution::Dead { reason, subject, .. } => {
            context::authentication_failed(Credential::MemberSession, &reason, subject)
        }
    };
    let expected = csrf_token(fingerprint);
    let Jsonb(mut public) = context::establish(Credential::MemberSession, verdict, None);
    let csrf_state = match csrf {
        None => {
            // SAFETY: a plain flag of the current transaction; PostgreSQL resets it at the next
            // transaction start. Turning a transaction read-only is always allowed.
            unsafe { pg_sys::XactReadOnly = true };
            "none"
        }
        Some(given) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => "ok",
        Some(_) => {
            context::clear();
            "mismatch"
        }
    };
    if let Some(obj) = public.as_object_mut() {
        obj.insert("csrf_token".into(), json!(expected));
        obj.insert("csrf".into(), json!(csrf_state));
    }
    Jsonb(public)
}

#[pg_schema]
mod querylayer_api {
    use super::*;

    /// Signs a member in to one site with the password an invitation let them set. Never raises
    /// for a wrong site, handle or password (the attempt must be recorded, so this transaction
    /// commits): `{ok: false}` then, whatever the reason; `{ok: true, session_id, secret,
    /// expires_at}` with a new session otherwise. Five failures in fifteen minutes lock the
    /// member's sign-in on the site until the window passes, on every edge alike.
    /// SECURITY DEFINER: reads the private password table and opens a session.
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn sign_in(site: &str, handle: &str, password: &str) -> Jsonb {
        context::refuse_if_established();
        let refused = |reason: &str| Jsonb(json!({"ok": false, "reason": reason}));
        if password.len() > 1024 {
            return refused("unknown");
        }
        let Some((site_id, organization_id, member_id, hash)) = password_row(site, handle) else {
            DECOY.with(|decoy| verify_password(password, decoy));
            let detail = json!({"credential": "password", "reason": "unknown", "channel": "dashboard"});
            Spi::run_with_args("SELECT querylayer.audit_failed_authentication($1)", &[Jsonb(detail).into()])
                .unwrap_or_else(|e| error!("querylayer: could not record the failed sign-in: {e}"));
            return refused("unknown");
        };
        context::resolving(site_id, organization_id);
        let gate = json_call("SELECT querylayer.sign_in_gate($1, $2)", &[site_id.into(), member_id.into()]);
        let fail = |reason: &str| {
            Spi::run_with_args(
                "SELECT querylayer.record_sign_in_failure($1, $2, $3)",
                &[site_id.into(), member_id.into(), reason.into()],
            )
            .unwrap_or_else(|e| error!("querylayer: could not record the failed sign-in: {e}"));
            context::clear();
        };
        if gate.get("locked").and_then(Value::as_bool) == Some(true) {
            fail("locked");
            return Jsonb(json!({"ok": false, "reason": "locked",
                                "retry_after_seconds": gate.get("retry_after_seconds")}));
        }
        if !verify_password(password, &hash) {
            fail("wrong_password");
            return refused("wrong_password");
        }
        if gate.get("has_role").and_then(Value::as_bool) != Some(true) {
            fail("no_site_role");
            return refused("no_site_role");
        }
        let session =
            json_call("SELECT querylayer.open_member_session($1, $2)", &[site_id.into(), member_id.into()]);
        context::clear();
        Jsonb(session)
    }

    /// What an invitation link is for (site, member, expiry), so the page can say it; 28000 for a
    /// link that is unknown, used, revoked or expired. Changes nothing.
    /// SECURITY DEFINER: reads the private invitation and credential tables.
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn invitation(fingerprint: &[u8]) -> Jsonb {
        context::refuse_if_established();
        let info = match context::resolve(Credential::Invitation, fingerprint, true) {
            Resolution::Live(v) => v,
            Resolution::Dead { reason, subject, .. } => {
                context::authentication_failed(Credential::Invitation, &reason, subject)
            }
        };
        context::clear();
        Jsonb(json!({
            "site": info["site"], "site_name": info["site_name"], "member": info["member"],
            "display_name": info["display_name"], "role": info["role"], "expires_at": info["expires_at"],
        }))
    }

    /// Redeems an invitation: checks the password's rules, stores its argon2id hash as the
    /// member's password on the invitation's site, spends the invitation and ends the member's
    /// open sessions there. 28000 for a dead link, 22023 for a password the rules refuse.
    /// SECURITY DEFINER: writes the private password and invitation tables.
    #[pg_extern(security_definer, volatile, parallel_unsafe)]
    #[search_path(pg_catalog, pg_temp)]
    fn accept_invitation(fingerprint: &[u8], password: &str) -> Jsonb {
        context::refuse_if_established();
        let info = match context::resolve(Credential::Invitation, fingerprint, true) {
            Resolution::Live(v) => v,
            Resolution::Dead { reason, subject, .. } => {
                context::authentication_failed(Credential::Invitation, &reason, subject)
            }
        };
        let site = info["site"].as_str().unwrap_or_default().to_string();
        let member = info["member"].as_str().unwrap_or_default().to_string();
        check_password(password, &member);
        let invitation = info["invitation_id"].as_str().unwrap_or_default().to_string();
        let done = json_call(
            "SELECT querylayer.set_member_password($1::text::uuid, $2, $3)",
            &[
                invitation.as_str().into(),
                hash_password(password).as_str().into(),
                sign_in_key(&site, &member).as_slice().into(),
            ],
        );
        context::clear();
        Jsonb(json!({"site": site, "member": member, "sessions_ended": done["sessions_ended"]}))
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn a_password_verifies_against_its_own_argon2id_hash_only() {
        let hash = try_hash_password("correct horse battery staple").unwrap();
        assert!(hash.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"));
        assert!(verify_password("correct horse battery staple", &hash));
        assert!(!verify_password("correct horse battery stapler", &hash));
        assert!(!verify_password("anything", "not a hash"));
        assert_ne!(
            hash,
            try_hash_password("correct horse battery staple").unwrap(),
            "every hash has its own salt"
        );
    }

    #[test]
    fn the_csrf_token_is_per_session_and_reveals_nothing_of_the_secret() {
        let a = csrf_token(&[1u8; 32]);
        assert_eq!(a.len(), 43);
        assert_ne!(a, csrf_token(&[2u8; 32]));
        assert!(constant_time_eq(a.as_bytes(), csrf_token(&[1u8; 32]).as_bytes()));
        assert!(!constant_time_eq(a.as_bytes(), &a.as_bytes()[..42]));
    }

    #[test]
    fn the_sign_in_key_ignores_case_and_surrounding_space() {
        assert_eq!(sign_in_key(" Demo ", "Dana"), sign_in_key("demo", "dana"));
        assert_ne!(sign_in_key("demo", "dana"), sign_in_key("demo2", "dana"));
    }
}

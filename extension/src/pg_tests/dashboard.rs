//! The reviewer's desk (`sql/175_dashboard.sql`, `sessions.rs`): invitations, argon2id passwords,
//! sign-in and lock-out, sessions and their CSRF rule.

#[pgrx::pg_schema]
mod tests {
    use crate::pg_tests::helpers::{
        as_member, content_site, error_message, expect_sqlstate, fingerprint, json, member_token, text,
    };
    use pgrx::prelude::*;
    use serde_json::Value;

    /// An invitation for a new member with `role` on demo (as the operator); returns its token.
    fn invite(handle: &str, role: &str) -> String {
        let invited = json(&format!("SELECT querylayer_api.invite_member('demo', '{handle}', '{role}')"));
        assert_eq!(invited["path"], format!("/invite?token={}", invited["token"].as_str().unwrap()));
        invited["token"].as_str().unwrap().to_string()
    }

    fn sign_in(handle: &str, password: &str) -> Value {
        json(&format!("SELECT querylayer_api.sign_in('demo', '{handle}', '{password}')"))
    }

    /// The CSRF token a session's pages carry: base64url(SHA-256("querylayer-csrf-v1:" || SHA-256(secret))).
    fn csrf_of(secret: &str) -> String {
        text(&format!(
            "SELECT rtrim(translate(encode(sha256('querylayer-csrf-v1:'::bytea || {}), 'base64'), '+/', '-_'), '=')",
            fingerprint(secret)
        ))
    }

    #[pg_test]
    fn an_invitation_sets_an_argon2id_password_once_and_sign_in_opens_a_new_session() {
        content_site();
        let token = invite("dana", "editor");
        let info = json(&format!("SELECT querylayer_api.invitation({})", fingerprint(&token)));
        assert_eq!(
            (info["site"].as_str(), info["member"].as_str(), info["role"].as_str()),
            (Some("demo"), Some("dana"), Some("editor"))
        );
        let short = error_message(
            &format!("SELECT querylayer_api.accept_invitation({}, 'short')", fingerprint(&token)),
            "22023",
        );
        assert!(short.starts_with("password:"), "{short}");
        expect_sqlstate(
            &format!(
                "SELECT querylayer_api.accept_invitation({}, 'dana-is-my-password')",
                fingerprint(&token)
            ),
            "22023",
        );
        json(&format!(
            "SELECT querylayer_api.accept_invitation({}, 'correct horse battery')",
            fingerprint(&token)
        ));
        // Spent: the link works once.
        expect_sqlstate(&format!("SELECT querylayer_api.invitation({})", fingerprint(&token)), "28000");
        expect_sqlstate(
            &format!("SELECT querylayer_api.accept_invitation({}, 'another good one')", fingerprint(&token)),
            "28000",
        );
        // Only a salted argon2id hash is stored.
        let stored = text("SELECT password_hash FROM querylayer.member_passwords p JOIN querylayer.members m ON m.id = p.member_id WHERE m.handle = 'dana'");
        assert!(stored.starts_with("$argon2id$v=19$") && !stored.contains("correct horse"), "{stored}");

        assert_eq!(sign_in("dana", "wrong password!")["ok"], false);
        assert_eq!(sign_in("nobody", "correct horse battery")["ok"], false);
        let first = sign_in("Dana", "correct horse battery");
        let second = sign_in("dana", "correct horse battery");
        assert_eq!((first["ok"].as_bool(), second["ok"].as_bool()), (Some(true), Some(true)));
        assert!(first["secret"].as_str().unwrap().starts_with("qls_"));
        assert_ne!(first["session_id"], second["session_id"], "every sign-in is a new session");

        let secret = first["secret"].as_str().unwrap();
        expect_sqlstate(
            &format!("SELECT querylayer_api.authenticate_session({}, 'forged')", fingerprint(secret)),
            "QL403",
        );
        let csrf = csrf_of(secret);
        let me =
            json(&format!("SELECT querylayer_api.authenticate_session({}, '{csrf}')", fingerprint(secret)));
        assert_eq!((me["member"].as_str(), me["role"].as_str()), (Some("dana"), Some("editor")));
        assert_eq!(me["csrf_token"], csrf.as_str());
        // With its CSRF token the session may act: sign out, after which it is dead.
        assert_eq!(json("SELECT querylayer_api.sign_out()")["ended"], true);
        expect_sqlstate(
            &format!("SELECT querylayer_api.authenticate_session({}, '{csrf}')", fingerprint(secret)),
            "28000",
        );
        // The other session still works.
        let other = json(&format!(
            "SELECT querylayer_api.authenticate_session({}, NULL)",
            fingerprint(second["secret"].as_str().unwrap())
        ));
        assert_eq!(other["member"], "dana");
    }

    #[pg_test]
    fn a_session_without_its_csrf_token_changes_nothing() {
        content_site();
        let token = invite("erin", "owner");
        json(&format!(
            "SELECT querylayer_api.accept_invitation({}, 'correct horse battery')",
            fingerprint(&token)
        ));
        let secret = sign_in("erin", "correct horse battery")["secret"].as_str().unwrap().to_string();
        json(&format!("SELECT querylayer_api.authenticate_session({}, NULL)", fingerprint(&secret)));
        // Reads work; the first write is refused by PostgreSQL itself (read-only transaction).
        json("SELECT querylayer_api.console_inbox()");
        expect_sqlstate("SELECT querylayer_api.sign_out()", "25006");
    }

    #[pg_test]
    fn five_failed_sign_ins_lock_the_member_out_even_with_the_right_password() {
        content_site();
        let token = invite("fay", "viewer");
        json(&format!(
            "SELECT querylayer_api.accept_invitation({}, 'correct horse battery')",
            fingerprint(&token)
        ));
        for _ in 0..5 {
            assert_eq!(sign_in("fay", "not the password")["reason"], "wrong_password");
        }
        let locked = sign_in("fay", "correct horse battery");
        assert_eq!((locked["ok"].as_bool(), locked["reason"].as_str()), (Some(false), Some("locked")));
        assert!(locked["retry_after_seconds"].as_i64().unwrap() > 0);
        let audited = Spi::get_one::<i64>(
            "SELECT count(*) FROM querylayer.audit_events WHERE action = 'session.sign_in' AND outcome = 'denied'",
        )
        .unwrap()
        .unwrap();
        assert_eq!(audited, 6);
    }

    #[pg_test]
    fn an_admin_invites_but_only_an_owner_grants_the_owner_role() {
        let site = content_site();
        let admin = member_token("adele", "admin");
        as_member(&admin);
        let invited = json("SELECT querylayer_api.console_invite_member('gus', 'editor', 'Gus')");
        assert!(invited["token"].as_str().unwrap().starts_with("qli_"));
        expect_sqlstate("SELECT querylayer_api.console_invite_member('hal', 'owner')", "QL403");
        expect_sqlstate("SELECT querylayer_api.console_invite_member('demo-owner', 'viewer')", "QL403");
        let editor = member_token("ed", "editor");
        as_member(&editor);
        expect_sqlstate("SELECT querylayer_api.console_invite_member('ivy', 'viewer')", "QL403");
        as_member(&site.owner_token);
        json("SELECT querylayer_api.console_invite_member('hal', 'owner')");
    }
}

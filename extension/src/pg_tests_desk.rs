// In-database tests of the reviewer's desk (issue 17): reading content, stale requests, member
// passwords, sessions and their CSRF rule, invitations, and delivery. Included into
// `pg_tests::tests`, so they share its helpers; each runs in one transaction that is rolled back.

/// The message of the error `sql` raises with `sqlstate` (which it must raise).
fn error_message(sql: &str, sqlstate: &str) -> String {
    Spi::get_one::<String>(&format!(
        "DO $t$ BEGIN EXECUTE $q${sql}$q$;
           RAISE EXCEPTION 'expected SQLSTATE {sqlstate}, but the statement succeeded' USING ERRCODE = 'XX000';
         EXCEPTION WHEN SQLSTATE '{sqlstate}' THEN PERFORM set_config('ql.test', SQLERRM, true); END $t$;
         SELECT current_setting('ql.test')"
    ))
    .unwrap()
    .unwrap()
}

/// An invitation for a new member with `role` on demo (as the operator); returns its token.
fn invite(handle: &str, role: &str) -> String {
    let invited = json(&format!("SELECT querylayer_api.invite_member('demo', '{handle}', '{role}')"));
    assert_eq!(invited["path"], format!("/invite?token={}", invited["token"].as_str().unwrap()));
    invited["token"].as_str().unwrap().to_string()
}

fn fingerprint(secret: &str) -> String {
    format!("sha256(convert_to('{secret}', 'UTF8'))")
}

fn sign_in(handle: &str, password: &str) -> Value {
    json(&format!("SELECT querylayer_api.sign_in('demo', '{handle}', '{password}')"))
}

#[pg_test]
fn a_draft_without_template_or_on_a_site_without_templates_names_the_argument() {
    let site = content_site();
    authenticate(&site.secret);
    let run = json("SELECT querylayer_api.begin_run('article.draft')")["run_id"].as_str().unwrap().to_string();
    let missing = error_message(
        &format!("SELECT querylayer_api.create_draft('{run}', NULL, '{{\"title\": \"T\"}}', NULL, 'no-template')"),
        "22023",
    );
    assert!(missing.starts_with("template is required for a new item (one of: article)"), "{missing}");
    let unknown = error_message(
        &format!("SELECT querylayer_api.create_draft('{run}', 'page', '{{\"title\": \"T\"}}', NULL, 'x')"),
        "QL404",
    );
    assert!(unknown.contains("template: no template named 'page'"), "{unknown}");

    // A site with no template at all: a clear refusal, not "RAISE statement option cannot be null".
    Spi::run("SELECT querylayer_api.create_site('demo', 'bare')").unwrap();
    Spi::run("SELECT querylayer_api.grant_agent_scopes('bare', 'demo-agent', '{content:write,runs:write,site:read}')")
        .unwrap();
    let bare = json(
        "SELECT querylayer_api.create_connection('bare', 'demo-agent', 'bare', '{content:write,runs:write,site:read}',
                                                 now() + interval '1 hour')",
    );
    authenticate(bare["secret"].as_str().unwrap());
    assert_eq!(json("SELECT querylayer_api.site_context()")["templates"], serde_json::json!([]));
    let run = json("SELECT querylayer_api.begin_run('article.draft')")["run_id"].as_str().unwrap().to_string();
    let none = error_message(
        &format!("SELECT querylayer_api.create_draft('{run}', 'article', '{{\"title\": \"T\"}}', NULL, 'x')"),
        "QL422",
    );
    assert!(none.starts_with("template: this site has no templates yet"), "{none}");
}

#[pg_test]
fn agents_read_revisions_their_history_and_the_templates() {
    let site = content_site();
    let (run_id, content_id, first) = draft(&site.secret, "readable");
    let second = redraft(&run_id, &content_id);
    let revision = json(&format!("SELECT querylayer_api.get_revision('{second}')"));
    assert_eq!(revision["fields"]["title"], "T2");
    assert_eq!((revision["template"].as_str(), revision["template_version"].as_i64()), (Some("article"), Some(1)));
    assert_eq!(revision["author"]["agent"], "demo-agent");
    assert_eq!(revision["author"]["run_id"], run_id.as_str());
    assert_eq!(revision["author"]["run_type"], "article.draft");
    assert_eq!((revision["is_draft"].as_bool(), revision["is_live"].as_bool()), (Some(true), Some(false)));

    let history = json(&format!("SELECT querylayer_api.list_revisions('{content_id}', 1)"));
    assert_eq!(history["revisions"][0]["revision_id"], second.as_str());
    let cursor = history["next_cursor"].as_str().expect("a next_cursor while older revisions remain");
    let older = json(&format!("SELECT querylayer_api.list_revisions('{content_id}', 1, '{cursor}')"));
    assert_eq!(older["revisions"][0]["revision_id"], first.as_str());
    assert_eq!(older["next_cursor"], Value::Null);
    assert_eq!(revision["previous_revision_id"], first.as_str());

    let templates = json("SELECT querylayer_api.list_templates()");
    assert_eq!(templates["next_cursor"], Value::Null);
    let templates = &templates["templates"];
    assert_eq!(templates[0]["name"], "article");
    assert!(templates[0]["fields"].as_array().unwrap().iter().any(|f| f["name"] == "body"));
    assert_eq!(json("SELECT querylayer_api.site_context()")["templates"], serde_json::json!(["article"]));

    let item = json(&format!("SELECT querylayer_api.get_content('{content_id}')"));
    assert_eq!(item["draft"]["revision_id"], second.as_str());
    assert_eq!(item["live"], Value::Null);

    // Without content:read a connection reads nothing.
    let narrow = json(
        "SELECT querylayer_api.create_connection('demo', 'demo-agent', 'narrow', '{runs:write}', now() + interval '1 hour')",
    );
    authenticate(narrow["secret"].as_str().unwrap());
    expect_sqlstate(&format!("SELECT querylayer_api.get_revision('{second}')"), "QL403");
    expect_sqlstate(&format!("SELECT querylayer_api.list_revisions('{content_id}')"), "QL403");
    expect_sqlstate("SELECT querylayer_api.list_templates()", "QL403");
}

#[pg_test]
fn a_stale_publish_request_is_flagged_before_anyone_decides() {
    let site = content_site();
    let (run_id, content_id, revision_id) = draft(&site.secret, "moving");
    let proposal = request_publish(&run_id, &content_id, &revision_id);
    let fresh = json(&format!("SELECT querylayer_api.get_proposal('{proposal}')"));
    assert_eq!(fresh["stale"], false);
    assert_eq!(fresh["details"][0]["requested"]["fields"]["title"], "T");
    assert_eq!(fresh["details"][0]["live"], Value::Null);
    assert_eq!(fresh["run"]["run_id"], run_id.as_str());
    assert_eq!(fresh["agent"], "demo-agent");

    let newer = redraft(&run_id, &content_id);
    as_member(&site.owner_token);
    let listed = json("SELECT querylayer_api.console_list_proposals('pending')");
    let card = listed["proposals"].as_array().unwrap().iter().find(|p| p["proposal_id"] == proposal.as_str()).unwrap();
    assert_eq!(card["stale"], true);
    assert_eq!(card["stale_problems"][0]["reason"], "stale_revision");
    let runs = json("SELECT querylayer_api.console_list_runs('open', 'demo-agent', now() - interval '1 hour')");
    assert_eq!(runs["runs"][0]["agent"], "demo-agent");
    assert_eq!(
        json("SELECT querylayer_api.console_list_runs('failed')"),
        serde_json::json!({"runs": [], "next_cursor": null})
    );
    let inbox = json("SELECT querylayer_api.console_inbox()");
    assert_eq!(inbox["proposals"][0]["risk"], "high");
    assert_eq!(inbox["proposals"][0]["stale"], true);
    let detail = json(&format!("SELECT querylayer_api.get_proposal('{proposal}')"));
    assert_eq!(detail["details"][0]["current_draft_revision_id"], newer.as_str());
    assert_eq!(detail["details"][0]["problem"]["reason"], "stale_revision");

    // Approving it anyway is recorded, executes nothing, and is no longer called stale (decided).
    let decided = json(&format!("SELECT querylayer_api.decide_proposal('{proposal}', 'approve')"));
    assert_eq!((decided["state"].as_str(), decided["stale"].as_bool()), (Some("failed"), Some(false)));
    assert_eq!(live_pointer(&content_id), None);
}

#[pg_test]
fn an_invitation_sets_an_argon2id_password_once_and_sign_in_opens_a_new_session() {
    content_site();
    let token = invite("dana", "editor");
    let info = json(&format!("SELECT querylayer_api.invitation({})", fingerprint(&token)));
    assert_eq!((info["site"].as_str(), info["member"].as_str(), info["role"].as_str()), (Some("demo"), Some("dana"), Some("editor")));
    let short = error_message(&format!("SELECT querylayer_api.accept_invitation({}, 'short')", fingerprint(&token)), "22023");
    assert!(short.starts_with("password:"), "{short}");
    expect_sqlstate(&format!("SELECT querylayer_api.accept_invitation({}, 'dana-is-my-password')", fingerprint(&token)), "22023");
    json(&format!("SELECT querylayer_api.accept_invitation({}, 'correct horse battery')", fingerprint(&token)));
    // Spent: the link works once.
    expect_sqlstate(&format!("SELECT querylayer_api.invitation({})", fingerprint(&token)), "28000");
    expect_sqlstate(&format!("SELECT querylayer_api.accept_invitation({}, 'another good one')", fingerprint(&token)), "28000");
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
    expect_sqlstate(&format!("SELECT querylayer_api.authenticate_session({}, 'forged')", fingerprint(secret)), "QL403");
    let csrf = csrf_of(secret);
    let me = json(&format!("SELECT querylayer_api.authenticate_session({}, '{csrf}')", fingerprint(secret)));
    assert_eq!((me["member"].as_str(), me["role"].as_str()), (Some("dana"), Some("editor")));
    assert_eq!(me["csrf_token"], csrf.as_str());
    // With its CSRF token the session may act: sign out, after which it is dead.
    assert_eq!(json("SELECT querylayer_api.sign_out()")["ended"], true);
    expect_sqlstate(&format!("SELECT querylayer_api.authenticate_session({}, '{csrf}')", fingerprint(secret)), "28000");
    // The other session still works.
    let other = json(&format!("SELECT querylayer_api.authenticate_session({}, NULL)", fingerprint(second["secret"].as_str().unwrap())));
    assert_eq!(other["member"], "dana");
}

/// The CSRF token a session's pages carry: base64url(SHA-256("querylayer-csrf-v1:" || SHA-256(secret))).
fn csrf_of(secret: &str) -> String {
    text(&format!(
        "SELECT rtrim(translate(encode(sha256('querylayer-csrf-v1:'::bytea || {}), 'base64'), '+/', '-_'), '=')",
        fingerprint(secret)
    ))
}

#[pg_test]
fn a_session_without_its_csrf_token_changes_nothing() {
    content_site();
    let token = invite("erin", "owner");
    json(&format!("SELECT querylayer_api.accept_invitation({}, 'correct horse battery')", fingerprint(&token)));
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
    json(&format!("SELECT querylayer_api.accept_invitation({}, 'correct horse battery')", fingerprint(&token)));
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

#[pg_test]
fn delivery_serves_only_what_is_live_and_nothing_else() {
    let site = content_site();
    let (run_id, content_id, revision_id) = draft(&site.secret, "hello");
    let token = json("SELECT querylayer_api.create_delivery_token('demo', 'website', now() + interval '30 days')");
    let token = token["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("qld_"));
    let as_website = || json(&format!("SELECT querylayer_api.authenticate_delivery('demo', {})", fingerprint(&token)));
    as_website();
    expect_sqlstate("SELECT querylayer_api.delivery_item('hello')", "QL404");
    assert_eq!(json("SELECT querylayer_api.delivery_items()")["items"], serde_json::json!([]));
    // The token reads nothing but delivery.
    expect_sqlstate("SELECT querylayer_api.list_content()", "QL401");
    expect_sqlstate(&format!("SELECT querylayer_api.get_revision('{revision_id}')"), "QL401");
    expect_sqlstate("SELECT querylayer_api.console_inbox()", "QL401");

    authenticate(&site.secret);
    let proposal = request_publish(&run_id, &content_id, &revision_id);
    as_member(&site.owner_token);
    json(&format!("SELECT querylayer_api.decide_proposal('{proposal}', 'approve')"));
    authenticate(&site.secret);
    redraft(&run_id, &content_id);

    as_website();
    let live = json("SELECT querylayer_api.delivery_item('hello')");
    assert_eq!((live["revision_id"].as_str(), live["fields"]["title"].as_str()), (Some(revision_id.as_str()), Some("T")));
    assert!(live["etag"].as_str().unwrap().starts_with('"'));
    let page = json("SELECT querylayer_api.delivery_items(1)");
    assert_eq!(page["items"][0]["slug"], "hello");
    assert!(page["last_modified"].is_string());

    // Another site's token, and no token while the site is not public, fail alike.
    expect_sqlstate(&format!("SELECT querylayer_api.authenticate_delivery('other', {})", fingerprint(&token)), "28000");
    expect_sqlstate("SELECT querylayer_api.authenticate_delivery('demo', NULL)", "28000");
    as_member(&site.owner_token);
    json("SELECT querylayer_api.console_set_delivery_public(true)");
    json("SELECT querylayer_api.authenticate_delivery('demo', NULL)");
    assert_eq!(json("SELECT querylayer_api.delivery_item('hello')")["revision_id"], revision_id.as_str());

    // Unpublished: gone at once.
    authenticate(&site.secret);
    let unpublish = json(&format!(
        "SELECT querylayer_api.request_publish_approval('{run_id}', '[{{\"content_id\": \"{content_id}\", \"action\": \"unpublish\"}}]')"
    ))["proposal_id"]
        .as_str()
        .unwrap()
        .to_string();
    as_member(&site.owner_token);
    json(&format!("SELECT querylayer_api.decide_proposal('{unpublish}', 'approve')"));
    as_website();
    expect_sqlstate("SELECT querylayer_api.delivery_item('hello')", "QL404");
    // A revoked token is dead at once.
    as_member(&site.owner_token);
    let tokens = json("SELECT querylayer_api.console_list_delivery()");
    let id = tokens["tokens"][0]["delivery_token_id"].as_str().unwrap().to_string();
    json(&format!("SELECT querylayer_api.console_revoke_delivery_token('{id}')"));
    expect_sqlstate(&format!("SELECT querylayer_api.authenticate_delivery('demo', {})", fingerprint(&token)), "28000");
}

#[pg_test]
fn only_an_owner_makes_delivery_public() {
    content_site();
    let admin = member_token("ada", "admin");
    as_member(&admin);
    json("SELECT querylayer_api.console_create_delivery_token('build', now() + interval '1 day')");
    expect_sqlstate("SELECT querylayer_api.console_set_delivery_public(true)", "QL403");
    let editor = member_token("eli", "editor");
    as_member(&editor);
    expect_sqlstate("SELECT querylayer_api.console_list_delivery()", "QL403");
}

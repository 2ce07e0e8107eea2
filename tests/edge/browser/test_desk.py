"""The reviewer's desk in a real browser: the scenarios of the issue, end to end."""

import uuid
from email.utils import format_datetime
from datetime import datetime, timezone

import httpx2
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

import harness
from conftest import DESK, click_and_wait, agent_draft, axe, new_member, request_publish, shot, sign_in, tool


def test_an_invited_member_approves_what_they_read_and_the_website_gets_it(browser):
    # An operator invites a member; the member sets a password through the link and signs in.
    handle = f"own-{uuid.uuid4().hex[:10]}"
    invited = harness.admin("invite-member", "--site", "demo", "--member", handle, "--role", "owner",
                            "--display-name", "Rita Reviewer")
    harness.issued(invited["token"])
    d = browser()
    d.get(DESK + invited["path"])
    assert "Rita Reviewer" in d.page_source
    axe(d)
    shot(d, "01-invitation")
    password = f"tidal passphrase {uuid.uuid4().hex[:8]}"
    harness.issued(password)
    d.find_element(By.ID, "password").send_keys(password)
    d.find_element(By.ID, "confirm").send_keys(password)
    click_and_wait(d, d.find_element(By.CSS_SELECTOR, "main form button[type=submit]"))
    assert "Password set" in d.page_source
    shot(d, "02-password-set")
    # The link is spent.
    d.get(DESK + invited["path"])
    assert "not valid" in d.page_source
    sign_in(d, handle, password)
    axe(d)
    shot(d, "03-inbox-empty-or-not")

    # An agent drafts and asks for publication.
    secret = harness.mint()["secret"]
    run, draft = agent_draft(secret, "Tide tables", "# High water\n\nThe **spring** tide peaks at noon.\n\n<script>alert(1)</script>")
    proposal = request_publish(secret, run, draft, f"Publish tide tables {uuid.uuid4().hex[:6]}")

    d.get(f"{DESK}/inbox")
    link = d.find_element(By.LINK_TEXT, proposal["summary"])
    shot(d, "04-inbox-pending")
    click_and_wait(d, link)
    # What would go live, rendered (HTML in the draft stays text), and its diff against live.
    article = d.find_element(By.CSS_SELECTOR, "article.rendered")
    assert article.find_element(By.TAG_NAME, "h1").text == "High water"
    assert article.find_element(By.TAG_NAME, "strong").text == "spring"
    assert "<script>alert(1)</script>" in article.text
    assert d.find_elements(By.CSS_SELECTOR, ".diff .add")
    assert "agent demo-agent" in d.page_source and f"/runs/{run['run_id']}" in d.page_source
    axe(d)
    shot(d, "05-proposal-rendered-with-diff")
    d.find_element(By.ID, "note").send_keys("Read it; good to go.")
    click_and_wait(d, d.find_element(By.ID, "approve"))
    assert d.find_element(By.ID, "state").text == "applied"
    shot(d, "06-approved")

    # The delivery API now serves exactly that revision.
    token = harness.admin("create-delivery-token", "--site", "demo", "--name", f"web {uuid.uuid4().hex[:8]}")["token"]
    harness.issued(token)
    url = f"{DESK}/delivery/v1/sites/demo/content/{draft['slug']}"
    r = httpx2.get(url, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    assert r.json()["revision_id"] == draft["revision_id"] and r.json()["fields"]["title"] == "Tide tables"
    assert r.headers["etag"] and r.headers["last-modified"]
    again = httpx2.get(url, headers={"Authorization": f"Bearer {token}", "If-None-Match": r.headers["etag"]})
    assert again.status_code == 304 and again.headers["etag"] == r.headers["etag"]
    since = httpx2.get(url, headers={"Authorization": f"Bearer {token}",
                                     "If-Modified-Since": r.headers["last-modified"]})
    assert since.status_code == 304
    assert httpx2.get(url).status_code == 401, "not public: a token is required"


def test_a_stale_request_is_flagged_before_anyone_approves_it(browser):
    handle, password = new_member("editor")
    secret = harness.mint()["secret"]
    run, draft = agent_draft(secret, "Moving target", "First body.")
    proposal = request_publish(secret, run, draft, f"Publish moving target {uuid.uuid4().hex[:6]}")
    # The agent writes again after asking: the request now names an old draft.
    tool(secret, "querylayer_create_draft", {"run_id": run["run_id"], "content_id": draft["content_id"],
                                             "fields": {"title": "Moving target", "body": "Second body."}})
    d = browser()
    sign_in(d, handle, password)
    card = d.find_element(By.LINK_TEXT, proposal["summary"]).find_element(By.XPATH, "ancestor::li")
    assert "Stale" in card.text and "no longer the current draft" in card.text
    shot(d, "07-inbox-stale-flag")
    click_and_wait(d, d.find_element(By.LINK_TEXT, proposal["summary"]))
    assert "This request is stale" in d.find_element(By.ID, "stale-warning").text
    axe(d)
    shot(d, "08-proposal-stale-warning")
    click_and_wait(d, d.find_element(By.ID, "approve"))
    # Approving it anyway is a refusal that says why, and nothing went live.
    error = d.find_element(By.CSS_SELECTOR, ".error").text
    assert "stale" in error and "nothing changed" in error
    assert d.find_element(By.ID, "state").text == "failed"
    shot(d, "09-stale-approval-refused")
    assert tool(secret, "querylayer_get_revision", {"revision_id": draft["revision_id"]})["is_live"] is False


def test_an_editor_is_refused_an_archive(browser):
    handle, password = new_member("editor")
    secret = harness.mint()["secret"]
    run, draft = agent_draft(secret, "Old page", "To be archived.")
    archive = tool(secret, "querylayer_create_proposal", {
        "run_id": run["run_id"], "type": "content_lifecycle", "summary": f"Archive old page {uuid.uuid4().hex[:6]}",
        "payload": {"items": [{"content_id": draft["content_id"], "action": "archive", "archived_at": None}]}})
    d = browser()
    sign_in(d, handle, password)
    d.get(f"{DESK}/proposals/{archive['proposal_id']}")
    assert "owner, admin" in d.page_source
    click_and_wait(d, d.find_element(By.ID, "approve"))
    error = d.find_element(By.CSS_SELECTOR, ".error").text
    assert "role editor may not do this (requires one of: owner, admin)" in error, error
    assert d.find_element(By.ID, "state").text == "pending"
    axe(d)
    shot(d, "10-editor-refused-archive")


def test_a_new_connection_secret_is_shown_once_with_client_configurations(browser):
    handle, password = new_member("admin")
    d = browser()
    sign_in(d, handle, password)
    d.get(f"{DESK}/connections")
    axe(d)
    name = f"desk {uuid.uuid4().hex[:8]}"
    Select(d.find_element(By.ID, "agent")).select_by_value("demo-agent")
    d.find_element(By.ID, "name").send_keys(name)
    for scope in ("site:read", "content:read"):
        d.find_element(By.CSS_SELECTOR, f"input[name=scopes][value='{scope}']").click()
    click_and_wait(d, d.find_element(By.CSS_SELECTOR, "form[action='/connections'] button[type=submit]"))
    assert d.find_elements(By.ID, "secret-value"), d.find_element(By.TAG_NAME, "main").text
    secret = d.find_element(By.ID, "secret-value").get_attribute("value")
    harness.issued(secret)
    assert secret.startswith("qlc_")
    for shape in ("Claude Desktop", "Cursor", "VS Code", '"servers"', "mcpServers"):
        assert shape in d.page_source, shape
    axe(d)
    shot(d, "11-connection-secret-once")
    # It works, and a reload shows the list, never the secret again.
    assert harness.raw_post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, secret).status_code == 200
    d.refresh()
    assert d.current_url == f"{DESK}/connections"
    assert secret not in d.page_source and name in d.page_source
    shot(d, "12-connection-after-reload")


def test_sign_out_ends_the_session(browser):
    handle, password = new_member("viewer")
    d = browser()
    sign_in(d, handle, password)
    cookie = d.get_cookie("ql_session")["value"]
    click_and_wait(d, d.find_element(By.CSS_SELECTOR, "header form button[type=submit]"))
    assert d.current_url.startswith(f"{DESK}/sign-in") and "signed out" in d.page_source
    assert d.get_cookie("ql_session") is None
    shot(d, "13-signed-out")
    # The old cookie, replayed, opens nothing.
    r = httpx2.get(f"{DESK}/inbox", headers={"Cookie": f"ql_session={cookie}"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/sign-in"


def test_open_in_hermes_links_exactly_and_is_refused_once_the_session_ends(browser):
    owner = harness.Console(harness.member_token())
    session_id = f"sess-{uuid.uuid4().hex[:10]}"
    assert owner.post("/sessions", {"profile_id": "demo-profile-0001", "session_id": session_id}).status_code == 201
    conv = owner.post("/conversations", {"profile_id": "demo-profile-0001", "session_id": session_id,
                                          "title": f"Desk check {session_id}"}).json()
    turn = owner.post(f"/conversations/{conv['conversation_id']}/turns", {"request": "Draft a page on tides " * 10})
    assert turn.status_code == 201, turn.text
    handle, password = new_member("editor")
    d = browser()
    sign_in(d, handle, password)
    d.get(f"{DESK}/console")
    assert f"Desk check {session_id}" in d.page_source
    axe(d)
    shot(d, "14-agent-console")
    d.get(f"{DESK}/console/turns/{turn.json()['turn_id']}")
    assert "queued" in d.page_source and "No plan yet" in d.page_source
    axe(d)
    shot(d, "14-agent-console-turn")
    cookie = {"Cookie": f"ql_session={d.get_cookie('ql_session')['value']}"}
    opened = httpx2.get(f"{DESK}/console/conversations/{conv['conversation_id']}/open", headers=cookie,
                        follow_redirects=False)
    assert opened.status_code == 303
    assert opened.headers["location"] == f"hermes://sessions/{session_id}?profile_id=demo-profile-0001"
    assert owner.post(f"/sessions/{session_id}/end", {"reason": "closed in Hermes"}).status_code == 200
    d.get(f"{DESK}/console/conversations/{conv['conversation_id']}/open")
    assert "missing or ended" in d.page_source
    shot(d, "15-open-in-hermes-refused")


def test_every_page_is_accessible_and_fits_at_1280_and_390_pixels(browser):
    handle, password = new_member("owner")
    secret = harness.mint()["secret"]
    run, draft = agent_draft(secret, "Layout check", "A paragraph.\n\n- one\n- two")
    tool(secret, "querylayer_record_artifact", {"run_id": run["run_id"], "key": "draft_id", "value": draft["revision_id"]})
    pages = ["/inbox", "/content", f"/content/{draft['content_id']}", f"/revisions/{draft['revision_id']}",
             "/content/new?template=article", f"/content/{draft['content_id']}/edit", "/runs",
             f"/runs/{run['run_id']}", "/connections", "/agents", "/console", "/audit?verify=1", "/evidence",
             "/forms", "/members", "/delivery", "/docs", "/docs/dashboard"]
    for width, height in ((1280, 900), (390, 844)):
        d = browser(width, height)
        sign_in(d, handle, password)
        for path in pages:
            d.get(DESK + path)
            assert d.title.endswith("QueryLayer"), (path, d.title)
            axe(d)
            overflow = d.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 1, f"{path} overflows {overflow}px at {width}px"
            shot(d, f"20-{width}{path.replace('/', '-').replace('?', '-').replace('=', '-')}")
            d.set_window_size(width, height)
    # Keyboard: the first Tab reaches the skip link, which moves focus to the main content.
    d.get(f"{DESK}/inbox")
    d.find_element(By.TAG_NAME, "body").send_keys(Keys.TAB)
    assert d.switch_to.active_element.text == "Skip to content"
    d.switch_to.active_element.send_keys(Keys.ENTER)
    assert d.switch_to.active_element.get_attribute("id") == "main"
    # The ledger's status is on the audit page.
    d.get(f"{DESK}/audit?verify=1")
    assert "Verified" in d.find_element(By.ID, "ledger-status").text


def test_a_member_drafts_through_the_template_contract(browser):
    handle, password = new_member("editor")
    d = browser()
    sign_in(d, handle, password)
    d.get(f"{DESK}/content/new?template=article")
    slug = f"member-{uuid.uuid4().hex[:8]}"
    d.find_element(By.ID, "slug").send_keys(slug)
    d.find_element(By.ID, "f-title").send_keys("Written by a person")
    # Leaving out the required body: the database names the field (the browser's own check is
    # bypassed to reach it).
    d.execute_script("document.getElementById('f-body').removeAttribute('required')")
    click_and_wait(d, d.find_element(By.CSS_SELECTOR, "main form button[type=submit]"))
    assert "missing required fields: body" in d.find_element(By.CSS_SELECTOR, ".error").text
    shot(d, "16-member-draft-refused")
    d.find_element(By.ID, "f-body").send_keys("Body text.")
    click_and_wait(d, d.find_element(By.CSS_SELECTOR, "main form button[type=submit]"))
    assert "Draft saved" in d.page_source and "member " + handle in d.page_source
    shot(d, "17-member-draft-saved")


def test_an_admin_cancels_an_open_run_from_its_page_and_an_editor_sees_no_button(browser):
    secret = harness.mint()["secret"]
    run = tool(secret, "querylayer_begin_run", {"run_type": "article.draft"})
    editor, editor_password = new_member("editor", "Eddie Editor")
    d = browser()
    sign_in(d, editor, editor_password)
    d.get(f"{DESK}/runs/{run['run_id']}")
    assert "article.draft" in d.page_source
    assert not d.find_elements(By.CSS_SELECTOR, f"form[action='/runs/{run['run_id']}/cancel']")

    admin, admin_password = new_member("admin", "Ada Admin")
    d = browser()
    sign_in(d, admin, admin_password)
    d.get(f"{DESK}/runs/{run['run_id']}")
    form = d.find_element(By.CSS_SELECTOR, f"form[action='/runs/{run['run_id']}/cancel']")
    axe(d)
    form.find_element(By.ID, "reason").send_keys("the agent is gone")
    click_and_wait(d, form.find_element(By.CSS_SELECTOR, "button[type=submit]"))
    assert "Run cancelled" in d.page_source
    assert not d.find_elements(By.CSS_SELECTOR, f"form[action='/runs/{run['run_id']}/cancel']")
    shot(d, "20-run-cancelled")
    # The run's history says that a member cancelled it.
    facts = d.find_element(By.CSS_SELECTOR, "dl.facts").text
    assert "finished" in facts and "cancelled_by_member" in facts, facts

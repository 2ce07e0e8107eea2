"""Reading content (agents through the official SDK, members through the console API), stale
publish requests, and the delivery API."""

import uuid

import httpx2
import pytest

from harness import EDGE, Console, issued, mcp, member_token, mint, structured, tool_error

pytestmark = pytest.mark.anyio


async def draft_and_request(client, title="Readable", body="# Heading\n\nBody.") -> tuple[dict, dict, dict]:
    run = structured(await client.call_tool("querylayer_begin_run", {"run_type": "article.draft"}))
    draft = structured(await client.call_tool("querylayer_create_draft", {
        "run_id": run["run_id"], "template": "article", "slug": f"read-{uuid.uuid4().hex[:10]}",
        "fields": {"title": title, "body": body}}))
    proposal = structured(await client.call_tool("querylayer_request_publish_approval", {
        "run_id": run["run_id"],
        "items": [{"content_id": draft["content_id"], "action": "publish", "revision_id": draft["revision_id"]}]}))
    return run, draft, proposal


async def test_an_agent_reads_revisions_their_history_and_the_templates():
    async with mcp(mint()["secret"]) as client:
        context = structured(await client.call_tool("querylayer_site_context", {}))
        assert "article" in context["templates"]
        templates = structured(await client.call_tool("querylayer_list_templates", {}))["templates"]
        article = next(t for t in templates if t["name"] == "article")
        assert {f["name"]: f["required"] for f in article["fields"]}["body"] is True
        run, draft, _ = await draft_and_request(client, "First")
        second = structured(await client.call_tool("querylayer_create_draft", {
            "run_id": run["run_id"], "content_id": draft["content_id"], "fields": {"title": "Second", "body": "B2"}}))
        item = structured(await client.call_tool("querylayer_get_content", {"content_id": draft["content_id"]}))
        assert item["content_id"] == draft["content_id"] and item["state"] == "draft" and item["live"] is None
        assert item["draft"]["revision_id"] == second["revision_id"] == item["draft_revision_id"]
        assert item["draft"]["fields"] == {"title": "Second", "body": "B2"} and item["draft"]["is_draft"] is True
        assert item["draft_revision_number"] == 2 and item["title"] == "Second"
        assert item["template_fields"] == article["fields"]
        revision = structured(await client.call_tool("querylayer_get_revision", {"revision_id": draft["revision_id"]}))
        assert revision["fields"] == {"title": "First", "body": "# Heading\n\nBody."}
        assert revision["author"]["agent"] == "demo-agent" and revision["author"]["run_id"] == run["run_id"]
        assert revision["template"] == "article" and revision["is_draft"] is False
        history = structured(await client.call_tool("querylayer_list_revisions",
                                                     {"content_id": draft["content_id"], "limit": 1}))
        assert [r["revision_id"] for r in history["revisions"]] == [second["revision_id"]]
        assert isinstance(history["next_cursor"], str)
        older = structured(await client.call_tool("querylayer_list_revisions", {
            "content_id": draft["content_id"], "limit": 1, "cursor": history["next_cursor"]}))
        assert [r["revision_id"] for r in older["revisions"]] == [draft["revision_id"]]
        assert older.get("next_cursor") is None
        unknown = tool_error(await client.call_tool("querylayer_get_content", {"content_id": str(uuid.uuid4())}))
        assert unknown["code"] == "not_found" and unknown["message"].startswith("content_id: no content item")
        # Leaving out the template of a new item names the argument and the templates there are.
        error = tool_error(await client.call_tool("querylayer_create_draft", {
            "run_id": run["run_id"], "slug": f"x-{uuid.uuid4().hex[:8]}", "fields": {"title": "T"}}))
    assert error["code"] == "invalid_argument"
    assert error["message"].startswith("template is required for a new item (one of: article")


async def test_members_read_what_they_decide_and_a_stale_approval_is_a_409():
    async with mcp(mint()["secret"]) as client:
        run, draft, proposal = await draft_and_request(client, "Moving")
        owner = Console(member_token())
        detail = owner.get(f"/proposals/{proposal['proposal_id']}").json()
        assert detail["details"][0]["requested"]["fields"]["title"] == "Moving"
        assert detail["stale"] is False and detail["agent"] == "demo-agent"
        await client.call_tool("querylayer_create_draft", {
            "run_id": run["run_id"], "content_id": draft["content_id"], "fields": {"title": "Moved", "body": "B"}})
    pending = owner.get("/proposals", state="pending").json()["proposals"]
    card = next(p for p in pending if p["proposal_id"] == proposal["proposal_id"])
    assert card["stale"] is True and card["stale_problems"][0]["reason"] == "stale_revision"
    refused = owner.post(f"/proposals/{proposal['proposal_id']}/approve", {"note": "too late"})
    assert refused.status_code == 409, refused.text
    body = refused.json()
    assert body["error"]["code"] == "stale_request" and "no longer the current draft" in body["error"]["message"]
    assert body["proposal"]["state"] == "failed" and body["proposal"]["decision"]["note"] == "too late"
    # Recorded: a second decision is a conflict.
    assert owner.post(f"/proposals/{proposal['proposal_id']}/reject").status_code == 409


def test_members_read_content_and_draft_through_the_template_contract():
    editor = Console(member_token(role="editor"))
    templates = editor.get("/templates").json()["templates"]
    assert any(t["name"] == "article" for t in templates)
    slug = f"member-{uuid.uuid4().hex[:8]}"
    created = editor.post("/content", {"template": "article", "slug": slug, "fields": {"title": "By hand", "body": "B"}})
    assert created.status_code == 201, created.text
    item = created.json()
    refused = editor.post("/content", {"content_id": item["content_id"], "fields": {"title": "No body"}})
    assert refused.status_code == 422 and "missing required fields: body" in refused.json()["error"]["message"]
    listed = editor.get("/content", state="draft", limit=200).json()
    assert {"draft", "published", "archived"} <= set(listed["counts"])
    got = editor.get(f"/content/{item['content_id']}").json()
    assert got["draft"]["author"]["kind"] == "member" and got["live"] is None
    history = editor.get(f"/content/{item['content_id']}/revisions").json()
    assert history["revisions"][0]["revision_id"] == item["revision_id"]
    assert editor.get(f"/revisions/{item['revision_id']}").json()["fields"]["title"] == "By hand"
    viewer = Console(member_token(role="viewer"))
    assert viewer.post("/content", {"template": "article", "slug": f"v-{slug}", "fields": {"title": "T", "body": "B"}}).status_code == 403
    assert viewer.get(f"/revisions/{uuid.uuid4()}").status_code == 404


async def test_delivery_serves_only_live_content_with_a_token_or_publicly():
    owner = Console(member_token())
    created = owner.post("/delivery/tokens", {"name": f"site {uuid.uuid4().hex[:8]}", "expires_in": "30 days"})
    assert created.status_code == 201, created.text
    token = created.json()["token"]
    issued(token)
    auth = {"Authorization": f"Bearer {token}"}
    async with mcp(mint()["secret"]) as client:
        run, draft, proposal = await draft_and_request(client, "Delivered")
        url = f"{EDGE}/delivery/v1/sites/demo/content/{draft['slug']}"
        assert httpx2.get(url, headers=auth).status_code == 404, "a draft never leaks"
        assert owner.post(f"/proposals/{proposal['proposal_id']}/approve").json()["state"] == "applied"
        # A newer draft after publishing: the website still gets the live revision.
        await client.call_tool("querylayer_create_draft", {
            "run_id": run["run_id"], "content_id": draft["content_id"], "fields": {"title": "Unpublished", "body": "B"}})
        live = httpx2.get(url, headers=auth)
        assert live.status_code == 200 and live.json()["fields"]["title"] == "Delivered"
        page = httpx2.get(f"{EDGE}/delivery/v1/sites/demo/content", params={"limit": 100}, headers=auth)
        assert page.status_code == 200 and page.headers["etag"]
        assert all(i["revision_id"] != draft["revision_id"] or i["fields"]["title"] == "Delivered"
                   for i in page.json()["items"])
        assert httpx2.get(f"{EDGE}/delivery/v1/sites/demo/content", headers={"If-None-Match": page.headers["etag"], **auth}).status_code in (200, 304)
        # Another site's name, no token, a bogus token: the same 401.
        for headers, site in ((auth, "other"), ({}, "demo"), ({"Authorization": "Bearer qld_" + "x" * 43}, "demo")):
            r = httpx2.get(f"{EDGE}/delivery/v1/sites/{site}/content/{draft['slug']}", headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        # Only the owner makes delivery public; then no token is needed, until it is turned off.
        admin = Console(member_token(role="admin"))
        assert admin.post("/delivery/public", {"public": True}).status_code == 403
        assert owner.post("/delivery/public", {"public": True}).status_code == 200
        assert httpx2.get(url).status_code == 200
        assert owner.post("/delivery/public", {"public": False}).status_code == 200
        assert httpx2.get(url).status_code == 401
        # Unpublished: gone at the next request.
        unpublish = structured(await client.call_tool("querylayer_request_publish_approval", {
            "run_id": run["run_id"], "items": [{"content_id": draft["content_id"], "action": "unpublish"}]}))
        assert owner.post(f"/proposals/{unpublish['proposal_id']}/approve").json()["state"] == "applied"
        assert httpx2.get(url, headers=auth).status_code == 404
    # A revoked token is dead at once.
    assert owner.post(f"/delivery/tokens/{created.json()['delivery_token_id']}/revoke").status_code == 200
    assert httpx2.get(f"{EDGE}/delivery/v1/sites/demo/content", headers=auth).status_code == 401


def test_the_new_console_writes_take_an_idempotency_key_and_never_replay_a_secret():
    owner = Console(member_token())
    # A delivery token: one token for two requests with one key; the replay carries no token.
    key = {"Idempotency-Key": str(uuid.uuid4())}
    body = {"name": f"idem {uuid.uuid4().hex[:8]}", "expires_in": "1 hour"}
    first = owner.http.post("/delivery/tokens", json=body, headers=key)
    assert first.status_code == 201, first.text
    issued(first.json()["token"])
    again = owner.http.post("/delivery/tokens", json=body, headers=key)
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["delivery_token_id"] == first.json()["delivery_token_id"]
    assert again.json()["token"] is None
    tokens = [t for t in owner.get("/delivery").json()["tokens"] if t["name"] == body["name"]]
    assert len(tokens) == 1, "one token"
    # The same key with another body is refused, and so is a malformed key.
    other = owner.http.post("/delivery/tokens", json={**body, "expires_in": "2 hours"}, headers=key)
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    bad = owner.http.post("/delivery/tokens", json=body, headers={"Idempotency-Key": "a b"})
    assert bad.status_code == 400
    # A member's draft, an invitation and a revocation replay their first answer.
    for path, payload in [
        ("/content", {"template": "article", "slug": f"idem-{uuid.uuid4().hex[:10]}",
                      "fields": {"title": "Once", "body": "B"}}),
        ("/invitations", {"member": f"idem-{uuid.uuid4().hex[:10]}", "role": "viewer"}),
        (f"/delivery/tokens/{first.json()['delivery_token_id']}/revoke", {"reason": "done"}),
    ]:
        key = {"Idempotency-Key": str(uuid.uuid4())}
        a = owner.http.post(path, json=payload, headers=key)
        assert a.status_code in (200, 201), (path, a.text)
        if "token" in a.json():
            issued(a.json()["token"])
        b = owner.http.post(path, json=payload, headers=key)
        assert b.status_code == a.status_code and b.headers["idempotent-replayed"] == "true", path
        secret = a.json().get("token")
        assert not secret or secret not in b.text, f"{path}: a replay never carries the secret"
        kept = {k: v for k, v in a.json().items() if k not in ("token", "path")}
        assert {k: v for k, v in b.json().items() if k not in ("token", "path")} == kept, path

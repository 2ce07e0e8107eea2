"""The member console API: roles decided by the database, secrets shown once."""

import uuid

import pytest

from harness import Console, issued, mcp, member_token, mint, raw_post, structured

pytestmark = pytest.mark.anyio

TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


def test_a_missing_or_dead_member_token_gets_401():
    for token in ("qlm_" + "x" * 43, "garbage"):
        r = Console(token).get("/proposals")
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
        assert r.headers["www-authenticate"].startswith("Bearer")
    # A connection secret is not a member token.
    r = Console(mint()["secret"]).get("/me")
    assert r.status_code == 401


def test_me_names_the_member_role_and_site():
    me = Console(member_token()).get("/me").json()
    assert (me["member"], me["role"], me["site"]) == ("demo-owner", "owner", "demo")


def test_owner_creates_lists_and_revokes_connections_and_the_secret_appears_only_at_creation():
    console = Console(member_token())
    created = console.post("/connections", {
        "agent": "demo-agent", "name": f"console {uuid.uuid4().hex[:12]}",
        "scopes": ["site:read", "content:read"], "expires_in": "2 hours", "harness": "codex"})
    assert created.status_code == 201, created.text
    assert created.headers["cache-control"] == "no-store"
    connection = created.json()
    issued(connection["secret"])
    assert connection["secret"].startswith(connection["prefix"])
    assert raw_post(TOOLS_LIST, connection["secret"]).status_code == 200

    listed = console.get("/connections")
    assert listed.status_code == 200
    row = next(c for c in listed.json()["connections"] if c["connection_id"] == connection["connection_id"])
    assert row["state"] == "active" and row["harness"] == "codex"
    assert connection["secret"] not in listed.text and "secret" not in listed.text and "fingerprint" not in listed.text

    revoked = console.post(f"/connections/{connection['connection_id']}/revoke", {"reason": "rotated"})
    assert revoked.status_code == 200 and revoked.json()["already_revoked"] is False
    assert raw_post(TOOLS_LIST, connection["secret"]).status_code == 401


def test_editors_and_viewers_cannot_manage_connections():
    for role in ("editor", "viewer"):
        console = Console(member_token(role=role))
        assert console.get("/connections").status_code == 403
        r = console.post("/connections", {"agent": "demo-agent", "name": f"nope {uuid.uuid4().hex[:8]}",
                                           "scopes": ["site:read"], "expires_in": "1 hour"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"


async def test_a_viewer_cannot_decide_and_an_owner_can_reject_with_a_note():
    async with mcp(mint()["secret"]) as client:
        run = structured(await client.call_tool("querylayer_begin_run", {"run_type": "article.draft"}))
        draft = structured(await client.call_tool("querylayer_create_draft", {
            "run_id": run["run_id"], "template": "article", "slug": f"reject-{uuid.uuid4().hex[:10]}",
            "fields": {"title": "Not yet", "body": "Draft."}}))
        proposal = structured(await client.call_tool("querylayer_request_publish_approval", {
            "run_id": run["run_id"],
            "items": [{"content_id": draft["content_id"], "action": "publish", "revision_id": draft["revision_id"]}]}))
    pid = proposal["proposal_id"]

    viewer = Console(member_token(role="viewer"))
    assert any(p["proposal_id"] == pid for p in viewer.get("/proposals").json()["proposals"])
    refused = viewer.post(f"/proposals/{pid}/approve")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"

    owner = Console(member_token())
    rejected = owner.post(f"/proposals/{pid}/reject", {"note": "needs sources"})
    assert rejected.status_code == 200 and rejected.json()["state"] == "rejected"
    assert rejected.json()["decision"]["note"] == "needs sources"
    again = owner.post(f"/proposals/{pid}/approve")
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"


def test_console_lists_runs_and_refuses_bad_input():
    console = Console(member_token())
    runs = console.get("/runs", limit=5)
    assert runs.status_code == 200 and len(runs.json()["runs"]) <= 5
    assert console.get("/runs/not-a-uuid").status_code == 400
    assert console.get(f"/runs/{uuid.uuid4()}").status_code == 404
    assert console.get("/runs", limit="many").status_code == 400
    assert console.post("/connections", {"agent": "demo-agent", "bogus": 1}).status_code == 400

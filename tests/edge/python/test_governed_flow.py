"""The governed flow through the official Python SDK, in both protocol generations: begin a run,
draft, record artifacts, request publish approval; a member approves through the console API;
the live pointer moves."""

import uuid

import pytest

from harness import (ALL_SCOPES, READ_TOOLS, WRITE_TOOLS, Console, admin, issued, mcp, member_token, mint, structured,
                     superuser_sql)

pytestmark = pytest.mark.anyio


async def draft_and_request_publishing(client, slug: str) -> dict:
    """The agent's half of the flow; returns the ids it produced."""
    run = structured(await client.call_tool("querylayer_begin_run", {
        "run_type": "article.draft",
        "input": {"topic": "pricing"},
        "required_outputs": ["draft_id", "publish_request"],
        "completion_conditions": ["a draft exists", "publishing was requested"],
    }))
    assert run["state"] == "open" and run["required_outputs"] == ["draft_id", "publish_request"]
    run_id = run["run_id"]

    draft = structured(await client.call_tool("querylayer_create_draft", {
        "run_id": run_id, "template": "article", "slug": slug,
        "fields": {"title": "Pricing, explained", "body": "# Pricing\n\nPlans and what they include."},
    }))
    assert draft["state"] == "draft" and draft["published_revision_id"] is None
    assert draft["revision_number"] == 1 and draft["draft_revision_id"] == draft["revision_id"]

    artifact = structured(await client.call_tool("querylayer_record_artifact", {
        "run_id": run_id, "key": "draft_id", "value": draft["revision_id"],
        "affected_objects": [{"type": "content_revision", "id": draft["revision_id"]}],
    }))
    assert artifact["key"] == "draft_id" and len(artifact["record_sha256"]) == 64

    proposal = structured(await client.call_tool("querylayer_request_publish_approval", {
        "run_id": run_id, "summary": "Publish the pricing page",
        "items": [{"content_id": draft["content_id"], "action": "publish", "revision_id": draft["revision_id"]}],
    }))
    assert proposal["type"] == "publish_lifecycle" and proposal["risk"] == "high"
    assert proposal["state"] == "pending" and proposal["decision"] is None
    assert proposal["author"]["run_id"] == run_id

    structured(await client.call_tool("querylayer_record_artifact", {
        "run_id": run_id, "key": "publish_request", "value": {"proposal_id": proposal["proposal_id"]},
    }))
    finished = structured(await client.call_tool("querylayer_finish_run", {
        "run_id": run_id, "outcome": "completed", "summary": "draft written, publishing requested",
    }))
    assert finished["state"] == "finished" and finished["outcome"] == "completed"
    assert finished["artifact_keys"] == ["draft_id", "publish_request"]

    # A draft and a pending request publish nothing.
    items = structured(await client.call_tool("querylayer_list_content", {}))["items"]
    item = next(i for i in items if i["content_id"] == draft["content_id"])
    assert item["published_revision_id"] is None and item["state"] == "draft"
    return {"run_id": run_id, "draft": draft, "proposal_id": proposal["proposal_id"]}


def approve_in_console(token: str, proposal_id: str) -> dict:
    console = Console(token)
    pending = console.get("/proposals").json()["proposals"]
    mine = next(p for p in pending if p["proposal_id"] == proposal_id)
    assert mine["items"][0]["action"] == "publish"
    response = console.post(f"/proposals/{proposal_id}/approve", {"note": "reviewed: ship it"})
    assert response.status_code == 200, response.text
    decided = response.json()
    assert decided["decision"]["decision"] == "approved" and decided["decision"]["note"] == "reviewed: ship it"
    assert decided["state"] == "applied", decided["execution"]
    return decided


async def assert_live(client, draft: dict, proposal_id: str) -> None:
    items = structured(await client.call_tool("querylayer_list_content", {"state": "published"}))["items"]
    item = next(i for i in items if i["content_id"] == draft["content_id"])
    assert item["published_revision_id"] == draft["revision_id"]
    assert item["has_unpublished_changes"] is False
    applied = structured(await client.call_tool("querylayer_list_proposals", {"state": "applied"}))["proposals"]
    assert proposal_id in [p["proposal_id"] for p in applied]


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_governed_flow_moves_the_live_pointer_only_after_a_member_approves(mode):
    connection = mint(ALL_SCOPES)
    async with mcp(connection["secret"], mode=mode) as client:
        assert client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        tools = [t.name for t in (await client.list_tools()).tools]
        assert tools == sorted(tools) and set(tools) == READ_TOOLS | WRITE_TOOLS
        context = structured(await client.call_tool("querylayer_site_context", {}))
        assert context["site"]["slug"] == "demo" and context["agent"]["handle"] == "demo-agent"
        assert context["connection"]["prefix"] == connection["prefix"] and "secret" not in str(context)
        produced = await draft_and_request_publishing(client, f"pricing-{uuid.uuid4().hex[:10]}")

    token = member_token()
    approve_in_console(token, produced["proposal_id"])

    async with mcp(connection["secret"], mode=mode) as client:
        await assert_live(client, produced["draft"], produced["proposal_id"])

    run = Console(token).get(f"/runs/{produced['run_id']}").json()
    assert run["outcome"] == "completed"
    assert [a["key"] for a in run["artifacts"]] == ["draft_id", "publish_request"]
    assert [e["kind"] for e in run["events"]] == ["started", "finished"]


async def test_tools_publish_schemas_annotations_and_structured_output():
    async with mcp(mint(ALL_SCOPES)["secret"], mode="legacy") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    for name, tool in tools.items():
        assert tool.description and tool.output_schema and tool.output_schema["type"] == "object", name
        assert tool.input_schema.get("additionalProperties") is False, name
        assert tool.annotations.read_only_hint is (name in READ_TOOLS), name
        assert tool.annotations.destructive_hint is False and tool.annotations.open_world_hint is False, name
    assert tools["querylayer_begin_run"].input_schema["required"] == ["run_type"]
    assert "run_id" in tools["querylayer_finish_run"].input_schema["required"]


async def test_seed_demo_is_idempotent_and_issues_fresh_working_credentials():
    census = (
        "SELECT (SELECT count(*) FROM querylayer.organizations WHERE slug = 'demo'),"
        " (SELECT count(*) FROM querylayer.sites WHERE slug = 'demo'),"
        " (SELECT count(*) FROM querylayer.agents WHERE handle = 'demo-agent'),"
        " (SELECT count(*) FROM querylayer.members WHERE handle = 'demo-owner'),"
        " (SELECT count(*) FROM querylayer.semantic_models m JOIN querylayer.sites s ON s.id = m.site_id"
        "   WHERE s.slug = 'demo'),"
        " (SELECT count(*) FROM querylayer.rights_documents r JOIN querylayer.sites s ON s.id = r.site_id"
        "   WHERE s.slug = 'demo')")
    before = superuser_sql(census)
    first, second = admin("seed-demo"), admin("seed-demo")
    assert superuser_sql(census) == before and before.startswith("1|1|1|1|")
    secrets = [first["connection"]["secret"], second["connection"]["secret"]]
    tokens = [first["member_token"]["token"], second["member_token"]["token"]]
    for credential in secrets + tokens:
        issued(credential)
    assert len(set(secrets)) == 2 and len(set(tokens)) == 2
    for secret in secrets:
        async with mcp(secret) as client:
            context = structured(await client.call_tool("querylayer_site_context", {}))
            assert context["site"]["slug"] == "demo" and context["agent"]["handle"] == "demo-agent"
    for token in tokens:
        assert Console(token).get("/proposals").status_code == 200

"""Reading runs through the official SDK: querylayer_list_runs lists the site's runs, newest
first, by status and agent, in pages, and querylayer_get_run reads one run with its events and
artifacts, to a connection holding runs:read only."""

import uuid

import pytest

from harness import admin, issued, mcp, mint, structured, tool_error

pytestmark = pytest.mark.anyio


def agent_of_its_own() -> str:
    """A generic agent on the demo site whose runs no other test begins."""
    handle = f"r-{uuid.uuid4().hex[:10]}"
    admin("create-agent", "--organization", "demo", "--handle", handle)
    admin("grant-scopes", "--site", "demo", "--agent", handle, "--scopes", "runs:read,runs:write")
    return handle


async def test_an_agent_lists_the_sites_runs_by_status_and_agent_newest_first():
    agent = agent_of_its_own()
    async with mcp(mint(["runs:read", "runs:write"], agent=agent)["secret"]) as client:
        begun = [structured(await client.call_tool("querylayer_begin_run", {"run_type": f"listed.{i}"}))["run_id"]
                 for i in range(3)]
        structured(await client.call_tool("querylayer_finish_run", {"run_id": begun[0], "outcome": "failed"}))

        async def ids(arguments: dict) -> tuple[list, dict]:
            page = structured(await client.call_tool("querylayer_list_runs", arguments))
            return [r["run_id"] for r in page["runs"]], page

        mine, page = await ids({"agent": agent})
        assert mine == begun[::-1], "newest first"
        assert {r["agent"] for r in page["runs"]} == {agent} and page["next_cursor"] is None
        assert (await ids({"agent": agent, "status": "open"}))[0] == [begun[2], begun[1]]
        failed, page = await ids({"agent": agent, "status": "failed"})
        assert failed == [begun[0]] and page["runs"][0]["outcome"] == "failed"
        first, page = await ids({"agent": agent, "limit": 2})
        rest, _ = await ids({"agent": agent, "limit": 2, "cursor": page["next_cursor"]})
        assert first + rest == begun[::-1]
        # The site's runs are everyone's: the demo agent's run is listed too.
        async with mcp(mint(["runs:write"])["secret"]) as demo:
            theirs = structured(await demo.call_tool("querylayer_begin_run", {"run_type": "listed.demo"}))["run_id"]
        newest, page = await ids({"limit": 1})
        assert newest == [theirs] and page["runs"][0]["agent"] == "demo-agent"
        error = tool_error(await client.call_tool("querylayer_list_runs", {"status": "done"}))
        assert error["code"] == "invalid_argument" and "status" in error["message"]

    # runs:write alone neither shows the tool nor reads runs.
    async with mcp(mint(["runs:write"], agent=agent)["secret"]) as writer:
        assert "querylayer_list_runs" not in {t.name for t in (await writer.list_tools()).tools}
        error = tool_error(await writer.call_tool("querylayer_list_runs", {}))
        assert error["code"] == "forbidden" and "runs:read" in error["message"]


async def test_an_agent_reads_one_run_with_its_events_and_artifacts():
    agent = agent_of_its_own()
    value = {"draft": "pricing-page", "sections": [1, 2, 3], "note": None}
    touched = [{"type": "content_item", "id": "pricing"}]
    async with mcp(mint(["runs:read", "runs:write"], agent=agent)["secret"]) as client:
        run = structured(await client.call_tool("querylayer_begin_run", {
            "run_type": "read.back", "input": {"topic": "pricing"}, "required_outputs": ["draft_id"]}))
        run_id = run["run_id"]
        artifact = structured(await client.call_tool("querylayer_record_artifact", {
            "run_id": run_id, "key": "draft_id", "value": value, "affected_objects": touched}))
        finished = structured(await client.call_tool("querylayer_finish_run", {
            "run_id": run_id, "outcome": "completed", "summary": "drafted"}))

        read = structured(await client.call_tool("querylayer_get_run", {"run_id": run_id}))
        assert read["run_id"] == run_id and read["run_type"] == "read.back"
        assert read["input"] == {"topic": "pricing"} and read["required_outputs"] == ["draft_id"]
        assert read["state"] == "finished" and read["outcome"] == "completed" and read["summary"] == "drafted"
        assert read["finished_at"] == finished["finished_at"] and read["artifact_keys"] == ["draft_id"]
        assert [(e["kind"], e["outcome"]) for e in read["events"]] == [("started", None), ("finished", "completed")]
        assert all(uuid.UUID(e["event_id"]) and e["at"] for e in read["events"])
        (stored,) = read["artifacts"]
        assert stored["artifact_id"] == artifact["artifact_id"] and stored["key"] == "draft_id"
        assert stored["value"] == value and stored["affected_objects"] == touched
        assert stored["recorded_at"] == artifact["recorded_at"]

        # An open run reads as open, with its start only; an unknown run is not found.
        begun = structured(await client.call_tool("querylayer_begin_run", {"run_type": "read.open"}))
        still = structured(await client.call_tool("querylayer_get_run", {"run_id": begun["run_id"]}))
        assert still["state"] == "open" and still["outcome"] is None and still["artifacts"] == []
        assert [e["kind"] for e in still["events"]] == ["started"]
        error = tool_error(await client.call_tool("querylayer_get_run", {"run_id": str(uuid.uuid4())}))
        assert error["code"] == "not_found"
        error = tool_error(await client.call_tool("querylayer_get_run", {"run_id": "not-a-uuid"}))
        assert error["code"] == "invalid_argument" and "run_id" in error["message"]

    # Another site's connection of the same agent does not find the run.
    site = f"runs-{uuid.uuid4().hex[:10]}"
    admin("create-site", "--organization", "demo", "--slug", site)
    admin("grant-scopes", "--site", site, "--agent", agent, "--scopes", "runs:read")
    elsewhere = admin("create-connection", "--site", site, "--agent", agent, "--scopes", "runs:read",
                      "--expires-in", "1 hour", "--name", f"e2e {uuid.uuid4().hex[:16]}", "--harness", "pytest")
    issued(elsewhere["secret"])
    async with mcp(elsewhere["secret"]) as other:
        error = tool_error(await other.call_tool("querylayer_get_run", {"run_id": run_id}))
        assert error["code"] == "not_found"

    # runs:write alone neither shows the tool nor reads the run.
    async with mcp(mint(["runs:write"], agent=agent)["secret"]) as writer:
        assert "querylayer_get_run" not in {t.name for t in (await writer.list_tools()).tools}
        error = tool_error(await writer.call_tool("querylayer_get_run", {"run_id": run_id}))
        assert error["code"] == "forbidden" and "runs:read" in error["message"]

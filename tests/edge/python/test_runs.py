"""Reading runs through the official SDK: querylayer_list_runs lists the site's runs, newest
first, by status and agent, in pages, to a connection holding runs:read only."""

import uuid

import pytest

from harness import admin, mcp, mint, structured, tool_error

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

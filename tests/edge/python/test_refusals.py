"""Refusals: dead credentials fail before tool discovery, alike; scopes bound what is listed and
what is done; arguments never name a site, organization or agent; governed rules come back as
tool errors with stable codes; every call leaves an audit row."""

import time
import uuid

import pytest
from mcp import MCPError

from harness import (admin, mcp, mint, raw_post, structured, tool_error, tools_for)

pytestmark = pytest.mark.anyio

TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


def assert_same_401(response, reference=None):
    assert response.status_code == 401
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer resource_metadata=")
    assert response.json() == {"error": {
        "code": "unauthenticated", "message": "authentication failed",
        "hint": response.json()["error"]["hint"],
    }}
    for leak in ("demo", "revoked", "expired", "unknown", "agent", "site"):
        assert leak not in response.text.replace("Authorization: Bearer", ""), leak
    if reference is not None:
        assert response.text == reference.text and challenge == reference.headers["www-authenticate"]


async def assert_sdk_cannot_list_tools(secret):
    with pytest.raises(BaseException):  # the SDK wraps the 401 in an exception group
        async with mcp(secret, mode="legacy") as client:
            await client.list_tools()


async def test_revoked_connection_fails_before_tool_discovery():
    connection = mint()
    assert raw_post(TOOLS_LIST, connection["secret"]).status_code == 200
    admin("revoke-connection", "--id", connection["connection_id"], "--reason", "e2e: laptop lost")
    reference = raw_post(TOOLS_LIST, "qlc_" + "x" * 43)
    assert_same_401(raw_post(TOOLS_LIST, connection["secret"]), reference)
    # The operator's audit (records of no site) knows which credential failed and why.
    newest = admin("list-audit", "--limit", "1")[0]
    assert (newest["action"], newest["outcome"]) == ("authenticate", "denied")
    assert newest["detail"]["reason"] == "revoked" and newest["detail"]["channel"] == "mcp"
    assert newest["detail"]["subject_id"] == connection["connection_id"]
    await assert_sdk_cannot_list_tools(connection["secret"])


async def test_expired_connection_fails_before_tool_discovery():
    connection = mint(expires_in="2 seconds")
    assert raw_post(TOOLS_LIST, connection["secret"]).status_code == 200
    time.sleep(2.5)
    reference = raw_post(TOOLS_LIST, "qlc_" + "x" * 43)
    assert_same_401(raw_post(TOOLS_LIST, connection["secret"]), reference)
    await assert_sdk_cannot_list_tools(connection["secret"])


def test_missing_malformed_and_unknown_secrets_get_the_same_401():
    reference = raw_post(TOOLS_LIST, "qlc_" + "y" * 43)
    assert_same_401(reference)
    assert_same_401(raw_post(TOOLS_LIST), reference)
    assert_same_401(raw_post(TOOLS_LIST, headers={"authorization": "Basic dXNlcjpwYXNz"}), reference)
    assert_same_401(raw_post(TOOLS_LIST, headers={"authorization": "Bearer"}), reference)
    assert_same_401(raw_post(TOOLS_LIST, "not-a-secret"), reference)


async def test_a_read_only_connection_sees_only_read_tools_and_gets_a_tool_error_on_a_write():
    connection = mint(["site:read", "content:read"])
    async with mcp(connection["secret"]) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == tools_for(["site:read", "content:read"])
        assert "querylayer_list_content" in names and "querylayer_begin_run" not in names
        structured(await client.call_tool("querylayer_list_content", {}))
        error = tool_error(await client.call_tool("querylayer_begin_run", {"run_type": "article.draft"}))
    assert error["code"] == "forbidden"
    assert "runs:write" in error["message"] and error["hint"]


async def test_a_connection_without_site_read_cannot_see_the_site_context():
    async with mcp(mint(["runs:write"])["secret"], mode="legacy") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == tools_for(["runs:write"])
        assert "querylayer_begin_run" in names and "querylayer_site_context" not in names
        assert tool_error(await client.call_tool("querylayer_site_context", {}))["code"] == "forbidden"


async def test_a_missing_required_output_ends_blocked():
    async with mcp(mint()["secret"]) as client:
        run = structured(await client.call_tool("querylayer_begin_run", {
            "run_type": "article.draft", "required_outputs": ["draft_id", "summary"]}))
        structured(await client.call_tool("querylayer_record_artifact", {
            "run_id": run["run_id"], "key": "summary", "value": "partial work"}))
        finished = structured(await client.call_tool("querylayer_finish_run", {
            "run_id": run["run_id"], "outcome": "completed", "summary": "all done, honestly"}))
        assert finished["outcome"] == "blocked"
        assert finished["requested_outcome"] == "completed"
        assert finished["reason_code"] == "missing_required_outputs"
        assert finished["missing_outputs"] == ["draft_id"]
        late = tool_error(await client.call_tool("querylayer_record_artifact", {
            "run_id": run["run_id"], "key": "draft_id", "value": "too late"}))
        assert late["code"] == "run_finished"


@pytest.mark.parametrize("field", ["site", "site_id", "organization", "organization_id", "agent", "agent_id"])
async def test_arguments_naming_a_site_organization_or_agent_are_rejected(field):
    async with mcp(mint()["secret"]) as client:
        for tool, args in [
            ("querylayer_list_content", {}),
            ("querylayer_site_context", {}),
            ("querylayer_begin_run", {"run_type": "article.draft"}),
        ]:
            error = tool_error(await client.call_tool(tool, {**args, field: "other"}))
            assert error["code"] == "invalid_argument", (tool, error)
            assert f"unknown field `{field}`" in error["message"]


async def test_bad_arguments_and_governed_refusals_are_tool_errors_with_stable_codes():
    async with mcp(mint()["secret"]) as client:
        assert tool_error(await client.call_tool("querylayer_begin_run", {}))["code"] == "invalid_argument"
        assert tool_error(await client.call_tool("querylayer_begin_run", {"run_type": "Not A Type"}))["code"] == "invalid_argument"
        malformed = tool_error(await client.call_tool("querylayer_record_artifact", {
            "run_id": "not-a-uuid", "key": "k", "value": 1}))
        assert malformed["code"] == "invalid_argument" and "`run_id`" in malformed["message"], malformed
        missing = tool_error(await client.call_tool("querylayer_record_artifact", {
            "run_id": str(uuid.uuid4()), "key": "k", "value": 1}))
        assert missing["code"] == "not_found"
        run = structured(await client.call_tool("querylayer_begin_run", {"run_type": "article.draft"}))
        structured(await client.call_tool("querylayer_record_artifact", {"run_id": run["run_id"], "key": "k", "value": 1}))
        again = tool_error(await client.call_tool("querylayer_record_artifact", {"run_id": run["run_id"], "key": "k", "value": 2}))
        assert again["code"] == "conflict" and again["hint"]
        with pytest.raises(MCPError):
            await client.call_tool("querylayer_drop_everything", {})


async def test_another_agents_run_is_refused_and_the_agents_other_connection_may_finish_it():
    async with mcp(mint()["secret"]) as first:
        run = structured(await first.call_tool("querylayer_begin_run", {"run_type": "article.draft"}))
        other_run = structured(await first.call_tool("querylayer_begin_run", {"run_type": "article.draft"}))
    agent = f"other-{uuid.uuid4().hex[:8]}"
    admin("create-agent", "--organization", "demo", "--handle", agent)
    admin("grant-scopes", "--site", "demo", "--agent", agent, "--scopes", "runs:write,runs:read")
    async with mcp(mint(["runs:write", "runs:read"], agent=agent)["secret"]) as stranger:
        error = tool_error(await stranger.call_tool("querylayer_finish_run", {"run_id": run["run_id"], "outcome": "cancelled"}))
        assert error["code"] == "forbidden" and "another agent" in error["message"]
    # The same agent through another connection (the first one lost, revoked or expired) may.
    async with mcp(mint()["secret"]) as second:
        done = structured(await second.call_tool("querylayer_finish_run", {"run_id": run["run_id"], "outcome": "failed"}))
        assert done["outcome"] == "failed"
        # It may not add to a run it did not begin.
        refused = tool_error(await second.call_tool("querylayer_record_artifact", {
            "run_id": other_run["run_id"], "key": "k", "value": 1}))
        assert refused["code"] == "forbidden"


async def test_every_tool_call_leaves_an_audit_row_without_argument_values():
    marker = f"audit-{uuid.uuid4().hex}"
    async with mcp(mint()["secret"]) as client:
        structured(await client.call_tool("querylayer_begin_run", {"run_type": "audit.check", "input": {"marker": marker}}))
        tool_error(await client.call_tool("querylayer_list_content", {"state": "nonsense"}))
    rows = admin("list-audit", "--site", "demo", "--limit", "20")
    calls = [r for r in rows if r["action"] == "tool.call"]
    ok = next(r for r in calls if r["target"] == "querylayer_begin_run" and r["outcome"] == "ok")
    refused = next(r for r in calls if r["target"] == "querylayer_list_content" and r["outcome"] == "error")
    assert refused["detail"]["error_code"] == "invalid_argument"
    assert isinstance(ok["detail"]["duration_ms"], int) and ok["principal_kind"] == "connection"
    assert marker not in str(rows)

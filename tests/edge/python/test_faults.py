"""Staying up and telling the truth, through the official Python SDK and raw HTTP: idempotent
writes, runs that end, "retry later" as one JSON-RPC error the SDK surfaces, bounded values, and
input that is refused rather than altered. (The fault tier, scripts/test-faults, injects the
faults themselves: floods, held locks, crashes.)"""

import subprocess
import time
import uuid

import httpx2
import pytest
from mcp import MCPError

from harness import (EDGE, PG_PORT, TEST_DIR, Console, admin, issued, mcp, member_token, mint, structured,
                     superuser_sql, tool_error)

pytestmark = pytest.mark.anyio

RETRY_LATER = -32010


def headers(secret):
    return {"authorization": f"Bearer {secret}", "content-type": "application/json",
            "accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}


def call(name, arguments, id=1):
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


async def test_every_write_tool_takes_an_idempotency_key_and_no_read_tool_does():
    async with mcp(mint()["secret"]) as client:
        tools = (await client.list_tools()).tools
    for tool in tools:
        takes = "idempotency_key" in tool.input_schema.get("properties", {})
        assert takes is (not tool.annotations.read_only_hint), tool.name
        if takes:
            assert "idempotency_key" not in tool.input_schema.get("required", [])
            assert tool.input_schema["properties"]["idempotency_key"]["maxLength"] == 255


async def test_a_retried_write_takes_effect_once_and_returns_its_first_answer():
    key = str(uuid.uuid4())
    marker = uuid.uuid4().hex
    arguments = {"run_type": "retry.check", "input": {"marker": marker}, "idempotency_key": key}
    async with mcp(mint()["secret"]) as client:
        first = await client.call_tool("querylayer_begin_run", arguments)
        again = await client.call_tool("querylayer_begin_run", arguments)
        assert structured(again)["run_id"] == structured(first)["run_id"]
        assert not (first.meta or {}).get("querylayer/idempotent-replay")
        assert again.meta["querylayer/idempotent-replay"] is True
        # The same key with other arguments is refused; a new key is a new run.
        reused = tool_error(await client.call_tool("querylayer_begin_run", {**arguments, "input": {"marker": "other"}}))
        assert reused["code"] == "idempotency_key_reused" and reused["hint"]
        other = structured(await client.call_tool("querylayer_begin_run", {**arguments, "idempotency_key": str(uuid.uuid4())}))
        assert other["run_id"] != structured(first)["run_id"]
    count = superuser_sql(f"SELECT count(*) FROM querylayer.runs WHERE input->>'marker' = '{marker}'")
    assert count == "2"


async def test_a_key_belongs_to_its_connection():
    key = str(uuid.uuid4())
    arguments = {"run_type": "retry.check", "idempotency_key": key}
    async with mcp(mint()["secret"]) as first, mcp(mint()["secret"]) as second:
        a = structured(await first.call_tool("querylayer_begin_run", arguments))
        b = structured(await second.call_tool("querylayer_begin_run", arguments))
    assert a["run_id"] != b["run_id"]


async def test_an_owner_cancels_an_abandoned_run_from_the_console_once():
    async with mcp(mint()["secret"]) as client:
        run = structured(await client.call_tool("querylayer_begin_run", {"run_type": "abandoned.run", "deadline_seconds": 3600}))
        assert run["deadline_at"]
    owner = Console(member_token())
    viewer = Console(member_token(role="viewer"))
    refused = viewer.post(f"/runs/{run['run_id']}/cancel", {"reason": "no"})
    assert refused.status_code == 403
    key = {"Idempotency-Key": str(uuid.uuid4())}
    cancelled = owner.http.post(f"/runs/{run['run_id']}/cancel", json={"reason": "stuck"}, headers=key)
    assert cancelled.status_code == 200, cancelled.text
    body = cancelled.json()
    assert (body["outcome"], body["reason_code"]) == ("cancelled", "cancelled_by_member")
    assert body["reasons"][0]["closed_by"]["role"] == "owner" and body["reasons"][0]["message"] == "stuck"
    # A retry with the key gets the same answer, marked; without it the run is already finished.
    again = owner.http.post(f"/runs/{run['run_id']}/cancel", json={"reason": "stuck"}, headers=key)
    assert again.status_code == 200 and again.json() == body and again.headers["idempotent-replayed"] == "true"
    other = owner.http.post(f"/runs/{run['run_id']}/cancel", json={"reason": "other"}, headers=key)
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert owner.post(f"/runs/{run['run_id']}/cancel").json()["error"]["code"] == "run_finished"
    events = owner.get(f"/runs/{run['run_id']}").json()["events"]
    assert [e["kind"] for e in events] == ["started", "finished"]
    assert events[1]["reason_code"] == "cancelled_by_member"


async def test_an_operator_cancels_a_run_from_the_command_line():
    async with mcp(mint()["secret"]) as client:
        run = structured(await client.call_tool("querylayer_begin_run", {"run_type": "operator.cancel"}))
    closed = admin("cancel-run", "--site", "demo", "--run", run["run_id"], "--reason", "maintenance window")
    assert closed["reason_code"] == "cancelled_by_operator" and closed["reasons"][0]["closed_by"]["kind"] == "operator"


async def test_an_oversized_value_is_refused_naming_the_argument():
    async with mcp(mint()["secret"]) as client:
        error = tool_error(await client.call_tool("querylayer_begin_run", {
            "run_type": "big.input", "input": {"blob": "x" * 70_000}}))
    assert error["code"] == "too_large" and error["message"].startswith("input is too large")


async def test_integers_beyond_64_bits_are_refused_not_rounded():
    async with mcp(mint()["secret"]) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("querylayer_begin_run", {"run_type": "big.number", "input": {"n": 2**64}})
        assert refused.value.code == -32602
        assert refused.value.data["code"] == "invalid_argument"
        assert "params.arguments.input.n" in refused.value.data["message"]
        # What fits is kept exactly.
        run = structured(await client.call_tool("querylayer_begin_run", {
            "run_type": "big.number", "input": {"n": 2**64 - 1, "m": -(2**63), "x": 0.1}}))
        assert run["input"] == {"n": 2**64 - 1, "m": -(2**63), "x": 0.1}


def test_a_repeated_member_is_refused_not_last_wins():
    secret = mint()["secret"]
    body = (b'{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "querylayer_begin_run",'
            b' "arguments": {"run_type": "a.b", "run_type": "c.d"}}}')
    refused = httpx2.post(f"{EDGE}/mcp", content=body, headers=headers(secret))
    assert refused.status_code == 200 and refused.json()["id"] == 9
    error = refused.json()["error"]
    assert error["code"] == -32602 and "params.arguments.run_type" in error["data"]["message"]
    # The console too, once its token holds (a dead token gets the same 401 as ever).
    owner = member_token()
    dup = httpx2.post(f"{EDGE}/api/console/form-screening", content=b'{"events": [], "events": []}',
                      headers={"authorization": f"Bearer {owner}", "content-type": "application/json"})
    assert dup.status_code == 400 and dup.json()["error"]["code"] == "invalid_argument"
    dead = httpx2.post(f"{EDGE}/api/console/form-screening", content=b'{"events": [], "events": []}',
                       headers={"authorization": "Bearer qlm_dead", "content-type": "application/json"})
    assert dead.status_code == 401


def test_malformed_json_rpc_gets_the_json_rpc_errors_not_plain_text():
    secret = mint()["secret"]
    broken = httpx2.post(f"{EDGE}/mcp", content=b'{"jsonrpc": "2.0", "id": 1, "method": ', headers=headers(secret))
    assert broken.status_code == 400 and broken.headers["content-type"].startswith("application/json")
    assert broken.json()["error"]["code"] == -32700 and broken.json()["id"] is None
    not_rpc = httpx2.post(f"{EDGE}/mcp", content=b'{"hello": "world"}', headers=headers(secret))
    assert not_rpc.status_code == 400 and not_rpc.json()["error"]["code"] == -32600


def test_a_chunked_body_over_the_limit_is_413_not_500():
    secret = mint()["secret"]

    def chunks():
        yield b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "querylayer_begin_run", "arguments": {"run_type": "x", "input": {"pad": "'
        for _ in range(48):
            yield b"x" * 65536
        yield b'"}}}}'

    refused = httpx2.post(f"{EDGE}/mcp", content=chunks(), headers=headers(secret))
    assert "content-length" not in refused.request.headers
    assert refused.status_code == 413
    assert refused.json()["error"]["data"]["code"] == "payload_too_large"


async def test_a_held_history_stalls_no_write_and_retry_later_reaches_the_sdk_with_retry_after():
    """A site's history held by another transaction: a write does not wait for it; its record
    answers without its record hash until it is sealed. Over its rate a connection gets the one
    "retry later" JSON-RPC error, which the SDK raises with its data and retry_after."""
    holder = subprocess.Popen(
        ["sudo", "-u", "postgres", "psql", "-h", TEST_DIR, "-p", PG_PORT, "-d", "querylayer", "-X", "-q", "-c",
         "BEGIN; SELECT 1 FROM querylayer.ledger_heads h JOIN querylayer.sites s ON s.id = h.site_id "
         "WHERE s.slug = 'demo' FOR NO KEY UPDATE OF h; SELECT pg_sleep(4); COMMIT;"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/tmp")
    try:
        for _ in range(50):
            held = superuser_sql("SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                                 "WHERE c.relname = 'ledger_heads' AND l.mode = 'RowShareLock' AND l.granted")
            if held != "0":
                break
            time.sleep(0.1)
        async with mcp(mint()["secret"]) as client:
            started = time.monotonic()
            run = structured(await client.call_tool("querylayer_begin_run", {"run_type": "held.history"}))
            artifact = structured(await client.call_tool(
                "querylayer_record_artifact", {"run_id": run["run_id"], "key": "held", "value": 1}))
            assert time.monotonic() - started < 3, "a write waited for the held history"
            assert artifact["record_sha256"] is None, artifact
            # Reads of the same site go on meanwhile.
            assert structured(await client.call_tool("querylayer_list_content", {}))["items"] is not None
    finally:
        holder.wait(timeout=30)
    # Once the history is free, the record is sealed (the next writer, or the worker, does it).
    admin("seal-ledger", "--site", "demo")
    sealed = superuser_sql(f"SELECT record_sha256 IS NOT NULL FROM querylayer.run_artifacts WHERE id = '{artifact['artifact_id']}'")
    assert sealed == "t"
    # Retry later: the edge of this tier allows 5 calls a second per connection, 40 at once.
    async with mcp(mint()["secret"]) as client:
        with pytest.raises(MCPError) as limited:
            for _ in range(200):
                await client.call_tool("querylayer_site_context", {})
        assert limited.value.code == RETRY_LATER
        assert limited.value.data["code"] == "rate_limited" and limited.value.data["retry_after"] >= 1


def test_readiness_does_not_need_a_pooled_connection():
    ready = httpx2.get(f"{EDGE}/readyz").json()
    assert ready["status"] == "ready"
    # The readiness check has its own session, visible by its application name.
    sessions = superuser_sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'querylayer-edge-readiness'")
    assert int(sessions) >= 1


def test_a_replayed_connection_creation_never_shows_the_secret_again():
    owner = Console(member_token())
    key = {"Idempotency-Key": str(uuid.uuid4())}
    body = {"agent": "demo-agent", "name": f"idem {uuid.uuid4().hex[:8]}", "scopes": ["site:read"], "expires_in": "1 hour"}
    first = owner.http.post("/connections", json=body, headers=key)
    assert first.status_code == 201
    issued(first.json()["secret"])
    again = owner.http.post("/connections", json=body, headers=key)
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["connection_id"] == first.json()["connection_id"]
    assert again.json()["secret"] is None
    listed = [c for c in owner.get("/connections").json()["connections"] if c["name"] == body["name"]]
    assert len(listed) == 1, "one connection"

"""Limits that hold across every edge (issue 21): the database decides them (sql/157_rate.sql),
so two instances started alike share one limit per connection and one failed-authentication
budget per address, exactly; and the budgets an owner sets on a connection refuse the call past
them through any edge, with retry_after, and show in the console."""

import contextlib
import uuid

import httpx2
import pytest
from mcp import MCPError

from harness import Console, member_token, mcp, mint, peer, raw_post, serve, structured

pytestmark = pytest.mark.anyio

RETRY_LATER = -32010
SITE_CONTEXT = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "querylayer_site_context", "arguments": {}}}


@contextlib.contextmanager
def two_edges(*flags):
    with serve(f"edge-shared-a-{uuid.uuid4().hex[:6]}", *flags) as (a, _), \
            serve(f"edge-shared-b-{uuid.uuid4().hex[:6]}", *flags) as (b, _):
        yield a, b


def test_two_edges_share_one_rate_limit_per_connection():
    """A burst of 60 (a token every 100 s: no refill to speak of during the test): 60 calls
    alternating between the instances go through, the 61st is refused whichever instance takes
    it, and the other instance refuses the next too."""
    with two_edges("--rate-limit", "0.01", "--rate-burst", "60") as (a, b):
        secret = mint()["secret"]
        for i in range(60):
            r = raw_post(SITE_CONTEXT, secret, url=(a, b)[i % 2])
            assert r.status_code == 200 and "error" not in r.json(), (i, r.text)
        for url in (a, b):
            refused = raw_post(SITE_CONTEXT, secret, url=url)
            error = refused.json()["error"]
            assert error["code"] == RETRY_LATER and error["data"]["code"] == "rate_limited", refused.text
            assert error["data"]["retry_after"] >= 1 and int(refused.headers["retry-after"]) >= 1
        # Another connection has its own bucket, on both.
        other = mint()["secret"]
        assert "error" not in raw_post(SITE_CONTEXT, other, url=b).json()


def test_two_edges_share_one_failed_authentication_budget_per_address():
    """Ten wrong secrets alternating between the instances spend the address's budget (ten, a
    failure's worth every 100 s); the next request from the address is refused with 429 on both,
    even with a valid secret. From an address of the test's own."""
    with two_edges("--auth-failure-rate", "0.01", "--auth-failure-burst", "10") as (a, b), \
            peer("127.0.0.7") as client:
        for i in range(10):
            r = raw_post(SITE_CONTEXT, f"qlc_wrong_{uuid.uuid4().hex}", url=(a, b)[i % 2], client=client)
            assert r.status_code == 401, (i, r.status_code, r.text)
        good = mint()["secret"]
        for url in (a, b):
            refused = raw_post(SITE_CONTEXT, good, url=url, client=client)
            assert refused.status_code in (200, 429), refused.text
            body = refused.json()
            code = body["error"]["data"]["code"] if refused.status_code == 200 else body["error"]["code"]
            assert code == "rate_limited", refused.text
        # The budget is the address's: the same secret from another address goes through.
        with peer("127.0.0.8") as elsewhere:
            for url in (a, b):
                assert "error" not in raw_post(SITE_CONTEXT, good, url=url, client=elsewhere).json()


async def test_a_connection_budget_set_in_the_console_refuses_the_call_past_it_on_any_edge():
    connection = mint()
    owner = Console(member_token())
    set_budget = owner.post(f"/connections/{connection['connection_id']}/budgets",
                            {"scope": "runs:write", "period": "hour", "max_calls": 3})
    assert set_budget.status_code == 200, set_budget.text
    assert set_budget.json()["budgets"][0]["max_calls"] == 3
    # A fresh connection authenticates for the budget; three writes, then the fourth is refused.
    async with mcp(connection["secret"]) as client:
        for i in range(3):
            run = structured(await client.call_tool("querylayer_begin_run", {"run_type": f"budget.{i}"}))
            assert run["state"] == "open"
        with pytest.raises(MCPError) as refused:
            await client.call_tool("querylayer_begin_run", {"run_type": "budget.over"})
        assert refused.value.code == RETRY_LATER and refused.value.data["code"] == "rate_limited"
        assert 1 <= refused.value.data["retry_after"] <= 3600
        # Reads do not spend it.
        assert structured(await client.call_tool("querylayer_site_context", {}))["site"]["slug"] == "demo"
    listed = owner.get("/connections", limit=100).json()["connections"]
    mine = next(c for c in listed if c["connection_id"] == connection["connection_id"])
    assert [(b["scope"], b["period"], b["used"], b["max_calls"]) for b in mine["budgets"]] == \
        [("runs:write", "hour", 3, 3)], mine
    # Any member sees the budgets (a viewer cannot list connections, nor set a budget).
    viewer = Console(member_token(f"viewer-{uuid.uuid4().hex[:8]}", role="viewer"))
    seen = viewer.get("/budgets")
    assert seen.status_code == 200, seen.text
    mine = next(c for c in seen.json() if c["connection_id"] == connection["connection_id"])
    assert [(b["scope"], b["used"], b["max_calls"]) for b in mine["budgets"]] == [("runs:write", 3, 3)]
    assert viewer.get("/connections").status_code == 403
    refused = viewer.post(f"/connections/{connection['connection_id']}/budgets",
                          {"scope": "runs:write", "period": "hour", "max_calls": 100})
    assert refused.status_code == 403, refused.text
    # Only owners and admins set budgets, of this site's connections, with scopes of the catalogue.
    bad = owner.post(f"/connections/{connection['connection_id']}/budgets",
                     {"scope": "runs:everything", "period": "hour", "max_calls": 3})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_argument", bad.text
    # Removed, the writes go on.
    cleared = owner.post(f"/connections/{connection['connection_id']}/budgets",
                         {"scope": "runs:write", "period": "hour", "max_calls": None})
    assert cleared.json()["budgets"] == []
    async with mcp(connection["secret"]) as client:
        assert structured(await client.call_tool("querylayer_begin_run", {"run_type": "budget.after"}))["state"] == "open"

"""Statelessness: one client alternating between two edge instances completes the governed flow."""

import collections
import json
import uuid

import httpx2
import pytest

from harness import EDGE, EDGE_B, mcp, member_token, mint
from test_governed_flow import approve_in_console, assert_live, draft_and_request_publishing

pytestmark = pytest.mark.anyio


class Alternating(httpx2.AsyncBaseTransport):
    """Sends each request to the next instance in turn and counts what each one served."""

    def __init__(self, urls):
        self.inner = httpx2.AsyncHTTPTransport()
        self.targets = [httpx2.URL(u) for u in urls]
        self.turn = 0
        self.served = collections.Counter()

    async def handle_async_request(self, request):
        target = self.targets[self.turn % len(self.targets)]
        self.turn += 1
        request.url = request.url.copy_with(host=target.host, port=target.port)
        request.headers["host"] = f"{target.host}:{target.port}"
        try:
            method = json.loads(request.content or b"{}").get("method", "-")
        except ValueError:
            method = "-"
        self.served[(target.port, method)] += 1
        return await self.inner.handle_async_request(request)


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_a_client_alternating_between_two_instances_completes_the_governed_flow(mode):
    assert EDGE_B, "QUERYLAYER_EDGE_URL_B names the second instance"
    transport = Alternating([EDGE, EDGE_B])
    connection = mint()
    async with mcp(connection["secret"], mode=mode, transport=transport) as client:
        await client.list_tools()
        produced = await draft_and_request_publishing(client, f"two-{uuid.uuid4().hex[:10]}")
    approve_in_console(member_token(), produced["proposal_id"])
    async with mcp(connection["secret"], mode=mode, transport=transport) as client:
        await assert_live(client, produced["draft"], produced["proposal_id"])

    ports = {port for port, _ in transport.served}
    assert len(ports) == 2
    for port in ports:
        assert transport.served[(port, "tools/call")] >= 3, transport.served

"""`querylayer mcp-serve`: the same tools over stdio, as the connection in QUERYLAYER_TOKEN."""

import os
import pathlib

import pytest
from mcp import Client, StdioServerParameters

from harness import BIN, EDGE_DB_URL, SECRETS, admin, mint, structured

pytestmark = pytest.mark.anyio

# The server's log (stderr) goes next to the other edge logs, which the tier searches for every
# secret it issued.
LOG = pathlib.Path(SECRETS).parent / "edge-stdio.log"


def server(secret):
    env = {"PATH": os.environ.get("PATH", ""), "DATABASE_URL": EDGE_DB_URL, "QUERYLAYER_TOKEN": secret,
           "QUERYLAYER_LOG_FORMAT": "json", "BIN": BIN, "LOG": str(LOG)}
    return StdioServerParameters(command="/bin/sh", args=["-c", 'exec "$BIN" mcp-serve 2>>"$LOG"'], env=env)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_stdio_serves_the_connections_tools(mode):
    connection = mint(["site:read", "content:read", "runs:write"])
    logged = LOG.stat().st_size if LOG.exists() else 0
    async with Client(server(connection["secret"]), mode=mode) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "querylayer_begin_run" in names and "querylayer_create_draft" not in names
        context = structured(await client.call_tool("querylayer_site_context", {}))
        assert context["connection"]["prefix"] == connection["prefix"]
        run = structured(await client.call_tool("querylayer_begin_run", {"run_type": "stdio.check"}))
        assert run["connection_id"] == connection["connection_id"]
    with LOG.open(encoding="utf-8") as log:
        log.seek(logged)
        assert '"tool":"querylayer_begin_run"' in log.read(), "mcp-serve's log lines reach the searched log"


def messages(e: BaseException) -> str:
    """The messages of an exception and of every exception it groups or was raised from."""
    parts = [str(e)] + [messages(inner) for inner in getattr(e, "exceptions", ())]
    if e.__cause__ is not None:
        parts.append(messages(e.__cause__))
    return "\n".join(parts)


async def test_stdio_with_a_revoked_secret_lists_nothing_and_says_why():
    connection = mint()
    admin("revoke-connection", "--id", connection["connection_id"])
    with pytest.raises(BaseException) as raised:
        async with Client(server(connection["secret"]), mode="legacy") as client:
            await client.list_tools()
    # The reason reaches the client as an MCP error, not as a closed connection.
    assert "could not start: QUERYLAYER_TOKEN: authentication failed" in messages(raised.value)

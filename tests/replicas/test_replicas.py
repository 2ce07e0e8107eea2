"""A hot standby serving read tools, and failover to it, against real edges (scripts/test-replicas
starts a primary and a synchronous streaming standby of it). The tests run in this order: the
last one promotes the standby."""

import asyncio
import json
import os
import subprocess
import time
import uuid

import httpx2

from harness import DIR, MCP_HEADERS, PG_BIN, Edge, Loop, admin, issued, ops_present, report, sql

STANDBY = (os.environ["QUERYLAYER_STANDBY_DIR"], os.environ["QUERYLAYER_STANDBY_PORT"])
STANDBY_DB_URL = os.environ["QUERYLAYER_STANDBY_DB_URL"]
FAILOVER_DB_URL = os.environ["QUERYLAYER_FAILOVER_DB_URL"]
EDGE_PORT = int(os.environ["QUERYLAYER_FAULT_EDGE_PORT"])


def call(url: str, secret: str, tool: str, arguments: dict) -> httpx2.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    return httpx2.post(f"{url}/mcp", json=body, headers={**MCP_HEADERS, "authorization": f"Bearer {secret}"},
                       timeout=30)


def result(response: httpx2.Response) -> dict:
    assert response.status_code == 200, response.text
    answer = response.json()
    assert "result" in answer and not answer["result"].get("isError"), answer
    return answer["result"]["structuredContent"]


def mint() -> dict:
    """A connection of the demo agent with every scope: its secret and id."""
    out = admin("create-connection", "--site", "demo", "--agent", "demo-agent", "--expires-in", "2 hours",
                "--scopes", "site:read,content:read,content:write,runs:read,runs:write",
                "--name", f"replica {uuid.uuid4().hex[:12]}", "--harness", "replicas")
    issued(out["secret"])
    return out


def served(edge: Edge, connection_id: str, tool: str) -> list[str]:
    """Where each successful call of `tool` by the connection was served, from the edge's log."""
    where = []
    for line in edge.logged().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("message") == "tool call" and record.get("connection_id") == connection_id \
                and record.get("tool") == tool and record.get("outcome") == "ok":
            where.append(record.get("served_by"))
    return where


def audited(connection_id: str, tool: str) -> int:
    return int(sql(f"SELECT count(*) FROM querylayer.audit_events WHERE action = 'tool.call' "
                   f"AND connection_id = '{connection_id}' AND target = '{tool}' AND outcome = 'ok'"))


def replay(paused: bool) -> None:
    sql(f"SELECT pg_wal_replay_{'pause' if paused else 'resume'}()", STANDBY)


def caught_up() -> None:
    primary = sql("SELECT pg_current_wal_lsn()")
    for _ in range(100):
        if sql(f"SELECT pg_last_wal_replay_lsn() >= '{primary}'::pg_lsn", STANDBY) == "t":
            return
        time.sleep(0.05)
    raise AssertionError("the standby did not catch up")


def draft(url: str, secret: str, slug: str) -> None:
    run = result(call(url, secret, "querylayer_begin_run", {"run_type": "replica.write"}))
    result(call(url, secret, "querylayer_create_draft", {
        "run_id": run["run_id"], "template": "article", "slug": slug,
        "fields": {"title": slug, "body": "A draft written to be read back."}}))


def slugs(url: str, secret: str) -> set:
    listed = result(call(url, secret, "querylayer_list_content", {"limit": 200}))
    return {item["slug"] for item in listed["items"]}


def test_the_standby_serves_reads_with_read_your_writes_and_every_read_is_audited_on_the_primary():
    minted = mint()
    secret, connection_id = minted["secret"], minted["connection_id"]
    tool = "querylayer_list_content"
    with Edge("--read-database-url", STANDBY_DB_URL, "--replica-max-staleness-ms", "300", log="edge-replica") as edge:
        result(call(edge.url, secret, "querylayer_site_context", {}))
        time.sleep(1)
        caught_up()
        # Reads alone: the standby serves them once it is known fresh.
        for _ in range(20):
            slugs(edge.url, secret)
        time.sleep(0.5)
        alone = served(edge, connection_id, tool)
        assert len(alone) == 20 and alone.count("standby") >= 15, alone
        # Read-your-writes: each read right after a write of the same connection sees it.
        for i in range(15):
            slug = f"ryw-{uuid.uuid4().hex[:10]}"
            draft(edge.url, secret, slug)
            assert slug in slugs(edge.url, secret), f"read {i} missed the write it followed"
        # A lagging standby is left to the primary: the read is still right.
        replay(paused=True)
        try:
            lagging = f"lag-{uuid.uuid4().hex[:10]}"
            draft(edge.url, secret, lagging)
            time.sleep(1)
            assert lagging in slugs(edge.url, secret)
            time.sleep(0.5)
            assert served(edge, connection_id, tool)[-1] == "primary", "a standby behind the bound served a read"
        finally:
            replay(paused=False)
        # Every read that succeeded is one tool.call row on the primary.
        reads = served(edge, connection_id, tool)
        assert len(reads) == 20 + 15 + 1
        assert audited(connection_id, tool) == len(reads)
        # Revoked on the primary while the standby lags: refused, whatever the standby still says.
        replay(paused=True)
        try:
            admin("revoke-connection", "--id", connection_id, "--reason", "replica test")
            refused = call(edge.url, secret, tool, {"limit": 5})
            assert refused.status_code == 401, refused.text
        finally:
            replay(paused=False)
    report("read replica", reads=len(reads), served_by_standby=reads.count("standby"),
           served_by_primary=reads.count("primary"), audited=audited(connection_id, tool))


def test_failover_loses_no_acknowledged_write():
    """Two edges on a multi-host URL, closed-loop writers on both; the primary stops (immediate)
    and the standby is promoted: the edges reconnect to it by themselves and every write they
    acknowledged is there, once."""
    secret = mint()["secret"]
    edges = [Edge(log=f"edge-failover-{i}", port=EDGE_PORT + 1 + i,
                  database_url=FAILOVER_DB_URL) for i in range(2)]
    try:
        writers = [Loop(edges[i % 2].url, secret, f"failover-w{i}") for i in range(6)]
        moments = {}

        async def scenario():
            stop = asyncio.Event()
            tasks = [asyncio.create_task(w.run(stop, run_type="failover.loop")) for w in writers]
            await asyncio.sleep(3)
            moments["stopped"] = time.monotonic()
            await asyncio.to_thread(subprocess.run, ["sudo", "-u", "postgres", f"{PG_BIN}/pg_ctl", "-D", f"{DIR}/data",
                                                     "-m", "immediate", "stop"], check=True, capture_output=True)
            await asyncio.to_thread(subprocess.run, ["sudo", "-u", "postgres", f"{PG_BIN}/pg_ctl", "-D",
                                                     f"{STANDBY[0]}/data", "-w", "promote"], check=True,
                                    capture_output=True)
            # The new primary has no standby of its own: it commits alone.
            await asyncio.to_thread(sql, "ALTER SYSTEM SET synchronous_standby_names = ''", STANDBY)
            await asyncio.to_thread(sql, "SELECT pg_reload_conf()", STANDBY)
            moments["promoted"] = time.monotonic()
            await asyncio.sleep(8)
            stop.set()
            await asyncio.gather(*tasks)

        asyncio.run(scenario())
    finally:
        for edge in edges:
            edge.stop()
    acked = [a for w in writers for a in w.acked]
    after = [o for w in writers for o in w.outcomes if o.ok and o.at > moments["promoted"]]
    assert acked and after, "writes were acknowledged before the failover and after it"
    for edge in edges:
        assert any(o.ok and o.at > moments["promoted"] for w in writers if w.url == edge.url for o in w.outcomes), \
            f"{edge.url} reconnected to the new primary"
    found, extra = ops_present(acked, STANDBY)
    assert (found, extra) == (len(acked), 0), (found, extra, len(acked))
    refusals = sorted({o.code for w in writers for o in w.outcomes if not o.ok})
    report("failover", acknowledged=len(acked), acknowledged_after_promotion=len(after),
           refusals_while_failing_over=refusals,
           seconds_to_first_write_after_promotion=round(min(o.at for o in after) - moments["promoted"], 2))

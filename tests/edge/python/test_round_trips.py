"""The regression guard of issue 16 that is not a timing: the edge counts the database round trips
of each request (every statement it sends, a first prepare on a pooled connection included) and
logs them with the tool call (`db_round_trips`). A tool call of a connection this edge has just
seen is one round trip, read or write; a refused call is two (the call, then the record of its
refusal in a statement of its own); and every one of them is in the audit trail.

Its own edge, with a pool of one connection, so that each statement shape is prepared once and
the counts that follow are exact."""

import json
import os
import pathlib
import socket
import subprocess
import time
import uuid

import httpx2
import pytest

from harness import BIN, EDGE_DB_URL, SECRETS, admin, mint, raw_post, superuser_sql

LOGS = pathlib.Path(SECRETS).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def edge():
    port = free_port()
    path = LOGS / "edge-round-trips.log"
    log = open(path, "w")
    proc = subprocess.Popen(
        [BIN, "--log-format", "json", "serve", "--port", str(port), "--rate-limit", "0", "--db-pool-size", "1"],
        env={**os.environ, "DATABASE_URL": EDGE_DB_URL}, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx2.get(f"{url}/readyz", timeout=1).status_code == 200:
                break
        except Exception:
            pass
        time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError(f"the edge did not start; see {path}")
    yield url, path
    proc.terminate()
    proc.wait(timeout=20)


def call(url: str, secret: str, tool: str, arguments: dict) -> dict:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    response = raw_post(body, secret, url=url)
    assert response.status_code == 200, response.text
    return response.json()["result"]


def tool_calls(path: pathlib.Path, connection_id: str) -> list[dict]:
    """The edge's `tool call` log lines of one connection, in order."""
    lines = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("message") == "tool call" and record.get("connection_id") == connection_id:
            lines.append(record)
    return lines


def trips_of_call(path: pathlib.Path, connection_id: str, tool: str, n: int) -> int:
    """The round trips of the connection's n-th call of `tool` (from 1). The edge batches its log
    lines (they reach the file within 50 ms), so this waits for that call's own line."""
    for _ in range(100):
        lines = [r for r in tool_calls(path, connection_id) if r["tool"] == tool]
        if len(lines) >= n:
            return lines[n - 1]["db_round_trips"]
        time.sleep(0.05)
    raise AssertionError(f"no tool call line for call {n} of {tool}")


def test_a_tool_call_is_one_round_trip_and_a_refused_one_two(edge):
    url, path = edge
    connection = mint()
    secret, connection_id = connection["secret"], connection["connection_id"]

    # The first call of a connection the edge has not seen authenticates in the middleware too,
    # and prepares its statement: more than one round trip.
    call(url, secret, "querylayer_list_content", {"limit": 5})
    first = trips_of_call(path, connection_id, "querylayer_list_content", 1)
    assert first > 1, first

    # A read tool: one statement (authenticate, the call, the audit row).
    result = call(url, secret, "querylayer_list_content", {"limit": 5})
    assert not result.get("isError"), result
    assert trips_of_call(path, connection_id, "querylayer_list_content", 2) == 1

    # A write tool, with and without an idempotency key: one statement each, once prepared.
    for _ in range(2):
        result = call(url, secret, "querylayer_begin_run", {"run_type": "round.trips"})
        assert not result.get("isError"), result
    assert trips_of_call(path, connection_id, "querylayer_begin_run", 2) == 1
    keyed = {"run_type": "round.trips", "idempotency_key": str(uuid.uuid4())}
    call(url, secret, "querylayer_begin_run", keyed)
    replay = call(url, secret, "querylayer_begin_run", keyed)
    assert replay["_meta"]["querylayer/idempotent-replay"] is True
    assert trips_of_call(path, connection_id, "querylayer_begin_run", 4) == 1

    # A refused call: the statement, then the refusal's record in a statement of its own.
    missing = {"run_id": str(uuid.uuid4()), "outcome": "completed"}
    for _ in range(2):
        refused = call(url, secret, "querylayer_finish_run", missing)
        assert refused["isError"] is True
    assert trips_of_call(path, connection_id, "querylayer_finish_run", 2) == 2

    # Every call is in the audit trail, with its outcome and code: nothing was lost by folding
    # the call into one statement.
    rows = superuser_sql(
        "SELECT target || ' ' || outcome || ' ' || coalesce(detail->>'error_code', '-') "
        "FROM querylayer.audit_events WHERE action = 'tool.call' "
        f"AND connection_id = '{connection_id}' ORDER BY id").splitlines()
    assert rows == (["querylayer_list_content ok -"] * 2 + ["querylayer_begin_run ok -"] * 4
                    + ["querylayer_finish_run error not_found"] * 2), rows


def test_a_revoked_connection_is_refused_at_its_next_call_with_the_401(edge):
    url, path = edge
    connection = mint()
    secret = connection["secret"]
    call(url, secret, "querylayer_list_content", {"limit": 1})
    # Revoked right after the edge saw it live: the next call is admitted without a round trip of
    # the middleware, and the database refuses it inside the call's own statement.
    admin("revoke-connection", "--id", connection["connection_id"], "--reason", "e2e: round trips")
    body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "querylayer_list_content", "arguments": {"limit": 1}}}
    response = raw_post(body, secret, url=url)
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"].startswith("Bearer resource_metadata=")
    assert response.json()["error"]["code"] == "unauthenticated"
    # Recorded as a failed authentication, not as a tool call.
    failed = superuser_sql(
        "SELECT count(*) FROM querylayer.audit_events WHERE action = 'authenticate' AND outcome = 'denied' "
        f"AND detail->>'subject_id' = '{connection['connection_id']}' AND detail->>'channel' = 'mcp'")
    assert int(failed) >= 1

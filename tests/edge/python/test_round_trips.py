"""The regression guard of issue 16 that is not a timing: the edge counts the database round trips
of each request (every statement it sends, a first prepare on a pooled connection included) and
logs them with the tool call (`db_round_trips`). A tool call of a connection this edge has just
seen is one round trip, read or write; a refused call is two (the call, then the record of its
refusal in a statement of its own); and every one of them is in the audit trail. A delivery
request is one round trip too (the `request` line carries its count), and a delivery token over
its rate is refused before any; so is a console request of a member token the edge has seen.

Its own edge, with a pool of one connection, so that each statement shape is prepared once and
the counts that follow are exact."""

import json
import pathlib
import time
import uuid

import httpx2
import pytest

from harness import admin, issued, member_token, mint, raw_post, serve, superuser_sql

DEMO_QUESTION = json.loads((pathlib.Path(__file__).resolve().parents[3] / "semantics" / "testdata"
                            / "reference_demo_answer.json").read_text())["question"]


@pytest.fixture(scope="module")
def edge():
    with serve("edge-round-trips", "--rate-limit", "0", "--db-pool-size", "1") as (url, path):
        yield url, path


def call(url: str, secret: str, tool: str, arguments: dict) -> dict:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    response = raw_post(body, secret, url=url)
    assert response.status_code == 200, response.text
    return response.json()["result"]


def log_lines(path: pathlib.Path, message: str) -> list[dict]:
    """The edge's log lines with this message, in order."""
    lines = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("message") == message:
            lines.append(record)
    return lines


def tool_calls(path: pathlib.Path, connection_id: str) -> list[dict]:
    """The edge's `tool call` log lines of one connection, in order."""
    return [r for r in log_lines(path, "tool call") if r.get("connection_id") == connection_id]


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

    # The governed answer, without an LLM: one statement too (the search, the gates, the plans,
    # the signed answer and its records, the audit row).
    for _ in range(2):
        result = call(url, secret, "answer_question", {"question": DEMO_QUESTION})
        assert not result.get("isError"), result
        assert result["structuredContent"]["answer"]
    assert trips_of_call(path, connection_id, "answer_question", 2) == 1

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
                    + ["answer_question ok -"] * 2 + ["querylayer_finish_run error not_found"] * 2), rows


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


def request_lines(path: pathlib.Path, prefix: str, n: int) -> list[dict]:
    """The edge's last `n` request lines of paths under `prefix`, in order, once they have reached
    the log (the edge batches its log lines)."""
    for _ in range(100):
        lines = [r for r in log_lines(path, "request") if r.get("path", "").startswith(prefix)]
        if len(lines) >= n:
            return lines[-n:]
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} request lines under {prefix}")


def delivery_trips(path: pathlib.Path, n: int) -> list[dict]:
    return request_lines(path, "/delivery/v1/", n)


def test_a_delivery_request_is_one_round_trip(edge):
    url, path = edge
    created = admin("create-delivery-token", "--site", "demo", "--name", f"rt {uuid.uuid4().hex[:8]}",
                    "--expires-in", "1 hour")
    token = created["token"]
    issued(token)
    page = f"{url}/delivery/v1/sites/demo/content"
    auth = {"Authorization": f"Bearer {token}"}
    # The first request of a token: authenticate and read in one statement (its prepare the
    # first time the pool's connection sees that shape); then one round trip each, the token's
    # rate taken before the database is asked.
    for _ in range(3):
        response = httpx2.get(page, params={"limit": 5}, headers=auth, timeout=10)
        assert response.status_code == 200, response.text
        assert "items" in response.json()
    item = httpx2.get(f"{page}/no-such-item-{uuid.uuid4().hex[:8]}", headers=auth, timeout=10)
    assert item.status_code == 404, item.text
    # A token that fails: the statement, then the failed authentication's record (its statement
    # prepared once on the pool's connection).
    refused = httpx2.get(page, params={"limit": 5}, headers={"Authorization": "Bearer qld_not_a_token"},
                         timeout=10)
    assert refused.status_code == 401, refused.text
    lines = delivery_trips(path, 5)
    # (The page's shape, the item's and the record's are each prepared once on the pool's one
    # connection.)
    assert [(r["status"], r["db_round_trips"]) for r in lines] == [(200, 2), (200, 1), (200, 1), (404, 2), (401, 3)], lines
    again = httpx2.get(page, params={"limit": 5}, headers={"Authorization": "Bearer qld_not_a_token"},
                       timeout=10)
    assert again.status_code == 401, again.text
    assert [(r["status"], r["db_round_trips"]) for r in delivery_trips(path, 6)][5] == (401, 2)
    failed = superuser_sql(
        "SELECT count(*) FROM querylayer.audit_events WHERE action = 'authenticate' AND outcome = 'denied' "
        "AND detail->>'channel' = 'delivery'")
    assert int(failed) >= 1


def test_a_delivery_token_over_its_rate_is_refused_before_the_database():
    with serve("edge-delivery-rate", "--rate-limit", "0.01", "--rate-burst", "2") as (url, path):
        created = admin("create-delivery-token", "--site", "demo", "--name", f"rate {uuid.uuid4().hex[:8]}",
                        "--expires-in", "1 hour")
        issued(created["token"])
        page = f"{url}/delivery/v1/sites/demo/content"
        auth = {"Authorization": f"Bearer {created['token']}"}
        assert [httpx2.get(page, headers=auth, timeout=10).status_code for _ in range(2)] == [200, 200]
        refused = httpx2.get(page, headers=auth, timeout=10)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited", refused.text
        assert int(refused.headers["retry-after"]) >= 1
        # The token's id was learned with its first answer: the refusal asked nothing of the database.
        assert [(r["status"], r["db_round_trips"]) for r in delivery_trips(path, 3)][2] == (429, 0)
        # Another token has a bucket of its own.
        other = admin("create-delivery-token", "--site", "demo", "--name", f"rate {uuid.uuid4().hex[:8]}",
                      "--expires-in", "1 hour")
        issued(other["token"])
        assert httpx2.get(page, headers={"Authorization": f"Bearer {other['token']}"}, timeout=10).status_code == 200


def test_a_console_request_of_a_token_the_edge_has_seen_is_one_round_trip(edge):
    url, path = edge
    token = member_token()
    auth = {"Authorization": f"Bearer {token}"}
    for _ in range(3):
        response = httpx2.get(f"{url}/api/console/proposals", headers=auth, timeout=10)
        assert response.status_code == 200, response.text
    # A write under an idempotency key keeps its transaction: BEGIN, the authentication, the
    # key's claim, the call, the answer stored under the key, COMMIT (each shape prepared once).
    body = {"name": f"rt {uuid.uuid4().hex[:8]}", "expires_in": "1 hour"}
    created = httpx2.post(f"{url}/api/console/delivery/tokens", json=body,
                          headers={"Idempotency-Key": str(uuid.uuid4()), **auth}, timeout=10)
    assert created.status_code == 201, created.text
    issued(created.json()["token"])
    # The same write without a key, of the token now seen: one statement.
    again = httpx2.post(f"{url}/api/console/delivery/tokens", json={**body, "name": body["name"] + "b"},
                        headers=auth, timeout=10)
    assert again.status_code == 201, again.text
    issued(again.json()["token"])
    # The first request of the token: BEGIN, the authentication (prepared), the call (prepared),
    # COMMIT. Then the one statement: prepared once, then one round trip.
    trips = [(r["method"], r["status"], r["db_round_trips"]) for r in request_lines(path, "/api/console/", 5)]
    assert trips == [("GET", 200, 6), ("GET", 200, 2), ("GET", 200, 1), ("POST", 201, 9), ("POST", 201, 2)], trips


def test_a_v1_answer_is_one_round_trip_and_every_decision_is_kept():
    # Imported here: test_querygraph binds keys with their holders' proofs.
    from querylayer_client import Key
    from querylayer_client import mint_envelope_header as mint_v2
    from test_querygraph import bind, receipts_of

    with serve("edge-v1-round-trips", "--require-auth", "--rate-limit", "0.01", "--rate-burst", "3",
               "--db-pool-size", "1") as (url, path):
        key = Key.from_seed(f"round-trips-{uuid.uuid4().hex}")
        connection_id = bind(key)["connection_id"]

        def send(body: str, header: str | None = None) -> httpx2.Response:
            header = header or mint_v2(key, path="/v1/answer", body=body)
            return httpx2.post(f"{url}/v1/answer", content=body, timeout=30,
                               headers={"x-qg-envelope": header, "content-type": "application/json"})

        question = json.dumps({"question": DEMO_QUESTION})
        first = send(question)
        assert first.status_code == 200 and "envelope" in first.json(), first.text
        header = mint_v2(key, path="/v1/answer", body=question)
        assert send(question, header).status_code == 200
        # The same v2 envelope again: refused by its receipt, in the same one statement.
        replay = send(question, header)
        assert replay.status_code == 401 and replay.json()["receipt"]["checks"]["nonceUnused"] is False
        # A body the route refuses once the envelope holds: the envelope's decision alone.
        malformed = send(json.dumps({"question": 5}))
        assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "invalid_argument"
        assert send(question).status_code == 200
        # Over the connection's burst of 3: the statement is refused whole, then the envelope's
        # decision is recorded by a statement of its own.
        limited = send(question)
        assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limited", limited.text
        assert int(limited.headers["retry-after"]) >= 1

        lines = request_lines(path, "/v1/", 6)
        # (The answer's statement and the envelope's alone are each prepared once on the pool's
        # one connection.)
        assert [(r["status"], r["db_round_trips"]) for r in lines] == [
            (200, 2), (200, 1), (401, 1), (400, 2), (200, 1), (429, 2)], lines
        assert [allowed for allowed, _ in receipts_of(key.did)] == [True, True, False, True, True, True]
        answers = superuser_sql(f"SELECT count(*) FROM querylayer.answers WHERE connection_id = '{connection_id}'")
        assert int(answers) == 3

"""Storage per call, and what retention gives back (scripts/bench-storage runs this; it measures,
it asserts nothing).

`calls`: against a running edge, N calls of each kind — a read tool, a write tool, check_access,
a failed authentication, POST /v1/answer — each kind measured on its own: the growth of every
relation of schema querylayer (tables, partitions, indexes, TOAST) and of the write-ahead log,
per call, split into what may age out (audit rows, envelope receipts, spent nonces, idempotency
keys) and governed history (never deleted).
`retention`: sizes before and after `querylayer admin apply-retention`, once the month those
calls were made in has aged out."""

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone

import httpx2
from querylayer_client import Key, mint_envelope_header

PSQL = [*os.environ["BENCH_PSQL"].split()]
ADMIN_URL = os.environ["BENCH_ADMIN_URL"]
BIN = os.environ["BENCH_BIN"]
EDGE = os.environ.get("BENCH_EDGE", "")
N = int(os.environ.get("BENCH_CALLS", "300"))
WARMUP = 20
QUESTION = "Where do fiscal capacity and energy burden overlap with health risk?"
RESTRICTED = "sail.qg_lakehouse.haalsi_baseline__restricted_raw"
AGING = ("audit_events", "envelope_receipts", "envelope_nonces", "idempotency_keys")


def sql(statement: str) -> str:
    done = subprocess.run([*PSQL, "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", "-c", statement],
                          capture_output=True, text=True, timeout=300, cwd="/tmp")
    if done.returncode != 0:
        sys.exit(f"SQL failed: {done.stderr}")
    return done.stdout.strip()


def admin(*args: str):
    done = subprocess.run([BIN, "admin", *args, "--json"], env={**os.environ, "DATABASE_URL": ADMIN_URL},
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        sys.exit(f"querylayer admin {args[0]} failed: {done.stderr}")
    return json.loads(done.stdout)


def sizes() -> dict:
    """Bytes per table of schema querylayer (partitions folded into their parent, with indexes
    and TOAST) and the WAL insert position."""
    rows = sql("""
        SELECT coalesce(parent.relname, c.relname), sum(pg_total_relation_size(c.oid))
          FROM pg_class c
          LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
          LEFT JOIN pg_class parent ON parent.oid = i.inhparent
         WHERE c.relnamespace = 'querylayer'::regnamespace AND c.relkind = 'r'
         GROUP BY 1""")
    tables = {name: int(size) for name, size in (line.split("|") for line in rows.splitlines())}
    wal = int(sql("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')"))
    return {"tables": tables, "wal": wal}


def growth(before: dict, after: dict) -> dict:
    tables = {t: after["tables"].get(t, 0) - before["tables"].get(t, 0) for t in after["tables"]}
    return {"tables": {t: d for t, d in tables.items() if d}, "wal": after["wal"] - before["wal"]}


def mcp(http, secret, tool, arguments):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    r = http.post(f"{EDGE}/mcp", json=body, headers={
        "authorization": f"Bearer {secret}", "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2025-11-25"})
    answer = r.json()
    if "error" in answer or answer["result"].get("isError"):
        sys.exit(f"{tool} failed: {answer}")


def calls():
    secret = admin("create-connection", "--site", "demo", "--agent", "demo-agent", "--expires-in", "2 hours",
                   "--scopes", "site:read,content:read,content:write,runs:read,runs:write", "--name", "bench-storage")["secret"]
    key = Key.from_seed(f"bench-storage-{uuid.uuid4().hex}")
    admin("create-connection", "--site", "demo", "--agent", "demo-agent", "--expires-in", "2 hours",
          "--scopes", "content:read", "--name", "bench-storage-key", "--did", key.did, "--no-secret")
    http = httpx2.Client(timeout=60)

    def answer(_):
        body = json.dumps({"question": QUESTION}).encode()
        # The database's clock runs behind; an envelope is fresh only on the same clock.
        behind = timedelta(days=int(os.environ.get("BENCH_DAYS_BEHIND", "0")))
        created = (datetime.now(timezone.utc) - behind).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        header = mint_envelope_header(key, path="/v1/answer", body=body, created_at=created)
        r = http.post(f"{EDGE}/v1/answer", content=body, headers={"x-qg-envelope": header, "content-type": "application/json"})
        if r.status_code != 200:
            sys.exit(f"/v1/answer failed: {r.status_code} {r.text}")

    def failed_authentication(_):
        r = http.post(f"{EDGE}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers={
            "authorization": f"Bearer qlc_{uuid.uuid4().hex}", "accept": "application/json, text/event-stream"})
        if r.status_code != 401:
            sys.exit(f"expected 401, got {r.status_code}")

    kinds = [
        ("read (querylayer_list_content)", lambda i: mcp(http, secret, "querylayer_list_content", {"limit": 5})),
        ("write (querylayer_begin_run, with an idempotency key)", lambda i: mcp(
            http, secret, "querylayer_begin_run",
            {"run_type": "bench.write", "input": {"n": i}, "idempotency_key": str(uuid.uuid4())})),
        ("check_access", lambda i: mcp(http, secret, "check_access", {"resource": RESTRICTED, "action": "read"})),
        ("failed authentication", failed_authentication),
        ("POST /v1/answer (v2 envelope)", answer),
    ]
    results = []
    for label, call in kinds:
        for i in range(WARMUP):
            call(i)
        before = sizes()
        started = time.monotonic()
        for i in range(N):
            call(i)
        seconds = time.monotonic() - started
        grew = growth(before, sizes())
        results.append({"kind": label, "calls": N, "seconds": round(seconds, 2), **grew})
    print(json.dumps(results))


def retention():
    before = sizes()
    done = admin("apply-retention")
    after = sizes()
    print(json.dumps({"before": before, "after": after, "result": done,
                      "ledger": admin("verify-ledger", "--site", "demo")}))


if __name__ == "__main__":
    {"calls": calls, "retention": retention}[sys.argv[1]]()

"""Fault injection against a real cluster and a real edge. Each test drives closed-loop clients
that log every id the edge acknowledged, injects one fault, and checks afterwards that every
acknowledged id is in the database (and, where it matters, no more than once)."""

import asyncio
import json
import os
import subprocess
import time

import httpx2

from harness import (ADMIN_URL, BIN, EDGE_PORT, WORKER_DB_URL, Edge, Flood, Loop, admin, connection, crash_and_restart_postgres,
                     member_token, ops_present, report, sql, sql_background)

DEMO_AGENT = "demo-agent"


def windows(outcomes, start, end, width):
    """Outcomes grouped by window of `width` seconds over [start, end)."""
    buckets = {}
    for o in outcomes:
        if start <= o.at < end:
            buckets.setdefault(int((o.at - start) // width), []).append(o)
    return [buckets.get(i, []) for i in range(int((end - start) // width))]


def test_a_stalled_header_flood_at_a_low_descriptor_limit_does_not_stop_authenticated_calls():
    """1,250 connections that never finish their headers, from five addresses, against an edge
    whose process may open 1,024 files: it sheds what is over its caps, cuts the rest off at the
    header-read timeout, never runs out of descriptors, and serves authenticated calls and
    /healthz throughout."""
    secret = connection("demo", DEMO_AGENT)
    with Edge("--header-read-timeout-secs", "3", "--max-connections-per-peer", "150",
              nofile=1024, log="edge-flood") as edge:
        loops = [Loop(edge.url, secret, f"flood-{i}") for i in range(3)] + [Loop(edge.url, secret, "flood-r", kind="read")]
        health = []

        async def scenario():
            stop = asyncio.Event()
            tasks = [asyncio.create_task(loop.run(stop)) for loop in loops]
            await asyncio.sleep(1)
            flood = await asyncio.to_thread(
                Flood, EDGE_PORT, 250, [f"127.0.0.{n}" for n in range(2, 7)])
            started = time.monotonic()
            closed = 0
            async with httpx2.AsyncClient(timeout=3) as http:
                while time.monotonic() - started < 8:
                    t0 = time.monotonic()
                    try:
                        ok = (await http.get(f"{edge.url}/healthz")).status_code == 200
                    except httpx2.HTTPError:
                        ok = False
                    health.append((t0, ok, time.monotonic() - t0))
                    closed = await asyncio.to_thread(flood.trickle)
                    await asyncio.sleep(max(0.0, 1 - (time.monotonic() - t0)))
            stop.set()
            await asyncio.gather(*tasks)
            flood.close()
            return started, closed, len(flood.sockets)

        started, closed, opened = asyncio.run(scenario())
    outcomes = [o for loop in loops for o in loop.outcomes]
    during = [o for o in outcomes if started <= o.at < started + 8]
    assert opened >= 1000, f"the flood opened {opened} connections"
    assert closed >= opened * 0.95, f"the edge cut off {closed} of {opened} stalled connections"
    assert all(ok for _, ok, _ in health), f"/healthz failed during the flood: {health}"
    for window in windows(outcomes, started, started + 8, 2):
        assert any(o.ok and o.kind == "write" for o in window), "a write succeeded in every 2 s of the flood"
        assert any(o.ok and o.kind == "read" for o in window), "a read succeeded in every 2 s of the flood"
    assert sum(o.ok for o in during) > 0
    log = edge.logged()
    assert "Too many open files" not in log and "accept failed" not in log
    assert '"message":"connection limits"' in log and '"open_files_limit":1024' in log
    acked = [a for loop in loops for a in loop.acked]
    assert ops_present(acked) == (len(acked), 0)
    report("stalled-header flood", flood_connections=opened, cut_off=closed, healthz_checks=len(health),
           healthz_slowest_s=round(max(s for _, _, s in health), 3), calls_ok_during_flood=sum(o.ok for o in during),
           calls_failed_during_flood=sum(not o.ok for o in during), acknowledged_writes=len(acked))


def test_one_sites_history_held_30_s_stalls_no_write_and_everything_is_sealed_afterwards():
    """A transaction holds the demo site's ledger head for 30 s. Writers never wait for it: the
    demo site's writes keep succeeding (their records wait to be sealed), as do its reads and the
    other site's calls. A seal that must happen now (seal-ledger, as a checkpoint would) answers
    "busy" within its bound. Once the head is free, everything is sealed, in one verified chain,
    every acknowledged write exactly once. /readyz stays ready."""
    admin("set-setting", "--key", "ledger_lock_timeout_ms", "--value", "2000")
    demo = connection("demo", DEMO_AGENT)
    other = connection("other", "other-agent")
    with Edge(log="edge-held") as edge:
        demo_writers = [Loop(edge.url, demo, f"demo-w{i}") for i in range(8)]
        demo_readers = [Loop(edge.url, demo, f"demo-r{i}", kind="read") for i in range(4)]
        other_writers = [Loop(edge.url, other, f"other-w{i}") for i in range(4)]
        other_readers = [Loop(edge.url, other, f"other-r{i}", kind="read") for i in range(4)]
        everyone = demo_writers + demo_readers + other_writers + other_readers
        ready = []
        sealing = {}

        async def scenario():
            stop = asyncio.Event()
            tasks = [asyncio.create_task(loop.run(stop)) for loop in everyone]
            await asyncio.sleep(1)
            holder = sql_background(
                "BEGIN; SELECT 1 FROM querylayer.ledger_heads h JOIN querylayer.sites s ON s.id = h.site_id "
                "WHERE s.slug = 'demo' FOR NO KEY UPDATE OF h; SELECT pg_sleep(30); COMMIT;")
            # Held once the holder sleeps (its lock is taken before): on a loaded machine its
            # connection can take longer than any fixed pause.
            deadline = time.monotonic() + 20
            while await asyncio.to_thread(
                    sql, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                         "AND query LIKE '%FOR NO KEY UPDATE OF h%'") != "1":
                assert time.monotonic() < deadline and holder.poll() is None, "the holder never took the head"
                await asyncio.sleep(0.1)
            started = time.monotonic()
            # A seal that must happen now waits at most the lock timeout, then says busy; there
            # is one to make once a write of the held site has left its record pending.
            while await asyncio.to_thread(
                    sql, "SELECT count(*) > 0 FROM querylayer.ledger_pending p "
                         "JOIN querylayer.sites s ON s.id = p.site_id WHERE s.slug = 'demo'") != "t":
                assert time.monotonic() < started + 10, "no write of the held site left its record pending"
                await asyncio.sleep(0.05)
            t0 = time.monotonic()
            sealing["held"] = await asyncio.to_thread(
                subprocess.run, [BIN, "admin", "seal-ledger", "--site", "demo", "--json"],
                env={**os.environ, "DATABASE_URL": ADMIN_URL}, capture_output=True, text=True)
            sealing["held_s"] = time.monotonic() - t0
            async with httpx2.AsyncClient(timeout=5) as http:
                while holder.poll() is None:
                    t0 = time.monotonic()
                    try:
                        response = await http.get(f"{edge.url}/readyz")
                        ready.append(response.status_code == 200)
                    except httpx2.HTTPError:
                        ready.append(False)
                    await asyncio.sleep(max(0.0, 0.5 - (time.monotonic() - t0)))
            released = time.monotonic()
            await asyncio.sleep(3)
            stop.set()
            await asyncio.gather(*tasks)
            return started, released

        started, released = asyncio.run(scenario())
    assert released - started >= 25, "the history was held for the whole 30 s"
    held = lambda loops: [o for loop in loops for o in loop.outcomes if started + 1 <= o.at < released - 1]
    other_held = held(other_writers + other_readers)
    assert other_held and all(o.ok for o in other_held), \
        f"the other site failed {[o for o in other_held if not o.ok][:5]}"
    for window in windows([o for loop in other_writers + other_readers for o in loop.outcomes], started + 1, released - 1, 5):
        assert any(o.ok and o.kind == "write" for o in window) and any(o.ok and o.kind == "read" for o in window)
    demo_reads = held(demo_readers)
    assert demo_reads and all(o.ok for o in demo_reads), "the held site's reads never wait on its history"
    demo_writes = held(demo_writers)
    failed = [o for o in demo_writes if not o.ok]
    assert demo_writes and not failed, f"the held site's writes waited for its head: {failed[:5]}"
    for window in windows([o for loop in demo_writers for o in loop.outcomes], started + 1, released - 1, 5):
        assert any(o.ok for o in window), "the held site's writes went on through every 5 s of the hold"
    slowest = sorted(round(o.seconds, 2) for o in demo_writes)[-5:]
    assert slowest[-1] < 5, f"the slowest writes of the held site took {slowest} s"
    # The seal that had to happen then was told "busy" within its bound (2 s, plus start-up).
    refused = sealing["held"]
    assert refused.returncode != 0 and json.loads(refused.stderr)["error"]["code"] == "busy", \
        (refused.stdout, refused.stderr)
    assert sealing["held_s"] < 10, sealing["held_s"]
    assert all(ready), f"/readyz said not ready {ready.count(False)} times while PostgreSQL was fine"
    # Once the head is free, everything left pending is sealed into one chain that verifies.
    sealed = admin("seal-ledger")
    verified = admin("verify-ledger", "--site", "demo")
    assert verified["ok"] is True and verified["pending"] == 0, verified
    # Every write of the held site went through, each exactly once.
    acked = [a for loop in everyone for a in loop.acked]
    assert any(loop.acked for loop in demo_writers)
    assert ops_present(acked) == (len(acked), 0)
    admin("set-setting", "--key", "ledger_lock_timeout_ms", "--value", "5000")
    report("site history held 30 s", held_s=round(released - started, 1),
           other_site_calls_ok=len(other_held), demo_reads_ok=len(demo_reads), demo_writes_ok=len(demo_writes),
           slowest_demo_writes_s=slowest, sealed_after=sealed, chain_records=verified["checked"],
           readyz_checks=len(ready), acknowledged_writes=len(acked))


def test_a_postgres_crash_under_load_with_idempotent_retries_makes_no_duplicate_run():
    """Writers retry every begin_run with its idempotency key until acknowledged while
    PostgreSQL is crashed (immediate stop) and restarted twice. Every acknowledged run exists,
    each operation made exactly one run, and every site's chain verifies."""
    secret = connection("demo", DEMO_AGENT)
    with Edge(log="edge-crash") as edge:
        writers = [Loop(edge.url, secret, f"crash-w{i}") for i in range(8)]

        async def scenario():
            stop = asyncio.Event()
            tasks = [asyncio.create_task(loop.run(stop, run_type="fault.crash")) for loop in writers]
            for _ in range(2):
                await asyncio.sleep(3)
                await asyncio.to_thread(crash_and_restart_postgres)
            await asyncio.sleep(4)
            stop.set()
            await asyncio.gather(*tasks)

        asyncio.run(scenario())
    acked = [a for loop in writers for a in loop.acked]
    deferred = [o for loop in writers for o in loop.outcomes if not o.ok]
    assert deferred, "the crashes were seen"
    assert {o.code for o in deferred} <= {"unavailable", "busy", "overloaded", "timeout", "request_timeout", "transport"}
    found, duplicates = ops_present(acked)
    assert (found, duplicates) == (len(acked), 0), f"{found} of {len(acked)} found, {duplicates} duplicates"
    every = int(sql("SELECT count(*) FROM querylayer.runs WHERE run_type = 'fault.crash'"))
    assert every == len(acked), f"{every} runs for {len(acked)} operations: a retry made a second run"
    for site in ("demo", "other"):
        assert admin("verify-ledger", "--site", site)["ok"] is True
    report("postgres crash-restarted twice", acknowledged_runs=len(acked), runs_in_database=every,
           duplicates=duplicates, deferred_attempts=len(deferred), deferral_codes=sorted({o.code for o in deferred}))


def test_an_abandoned_run_is_closed_at_its_deadline_and_another_cancelled_by_an_owner():
    secret = connection("demo", DEMO_AGENT)
    owner = member_token("demo", "demo-owner")
    with Edge(log="edge-runs") as edge:
        loop = Loop(edge.url, secret, "runs-w")

        async def scenario():
            stop = asyncio.Event()
            task = asyncio.create_task(loop.run(stop, run_type="fault.kept"))
            async with httpx2.AsyncClient(timeout=30) as http:
                abandoned = await loop.call(http, "querylayer_begin_run", {"run_type": "fault.abandoned", "deadline_seconds": 2})
                stuck = await loop.call(http, "querylayer_begin_run", {"run_type": "fault.stuck"})
                cancelled = await http.post(
                    f"{edge.url}/api/console/runs/{stuck['result']['structuredContent']['run_id']}/cancel",
                    json={"reason": "the agent stopped answering"}, headers={"authorization": f"Bearer {owner}"})
            await asyncio.sleep(3)
            stop.set()
            await task
            return abandoned["result"]["structuredContent"], cancelled.json()

        abandoned, cancelled = asyncio.run(scenario())
    worker = subprocess.run([BIN, "worker", "--once", "--retention-interval-secs", "0", "--purge-interval-secs", "0"],
                            env={**os.environ, "DATABASE_URL": WORKER_DB_URL},
                            capture_output=True, text=True, timeout=120)
    assert worker.returncode == 0, worker.stderr
    assert abandoned["run_id"] in worker.stderr, "the worker logged the run it closed"
    closed = sql(f"SELECT outcome || '/' || reason_code || '/' || (reasons->0->'closed_by'->>'kind') "
                 f"FROM querylayer.run_events WHERE run_id = '{abandoned['run_id']}' AND kind = 'finished'")
    assert closed == "cancelled/deadline_exceeded/worker"
    assert (cancelled["outcome"], cancelled["reason_code"]) == ("cancelled", "cancelled_by_member")
    assert cancelled["reasons"][0]["closed_by"]["role"] == "owner"
    # The client's runs (deadlines of an hour) are untouched, and all there.
    acked = loop.acked
    assert acked and ops_present(acked) == (len(acked), 0)
    still_open = int(sql("SELECT count(*) FROM querylayer.runs r WHERE r.run_type = 'fault.kept' AND NOT EXISTS "
                         "(SELECT 1 FROM querylayer.run_events e WHERE e.run_id = r.id AND e.kind = 'finished')"))
    assert still_open == len(acked)

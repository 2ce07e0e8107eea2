"""The Agent Console and editorial contract (seed 000), item by item, through the real interfaces:
the official MCP SDK for agents, the console API for members, and — only to look past the API —
the superuser. Races run on real concurrent connections (threads, or asyncio with one client
each), lined up behind a barrier."""

import asyncio
import contextlib
import datetime
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx2
import pytest

from harness import (ALL_SCOPES, EDGE, Console, admin, issued, mcp, member_token, mint,
                     run_worker, superuser_sql, tool_error)
from hermes import add_turn, agent_with_a_turn, call, claim, hermes_agent, open_conversation, plan, report

pytestmark = pytest.mark.anyio

RUN = uuid.uuid4().hex[:8]
# What PostgreSQL's own messages would leak: constraint and index names.
INTERNAL = ("unique constraint", "_key\"", "_pkey", "violates", "duplicate key", "connections_live_name")


def no_internal_names(text: str) -> None:
    for marker in INTERNAL:
        assert marker not in text, f"an internal name reached the caller: {text}"


def second_site() -> str:
    """Another site of the demo organization, owned by demo-owner."""
    slug = f"contract-{uuid.uuid4().hex[:8]}"
    admin("create-site", "--organization", "demo", "--slug", slug)
    admin("set-member-role", "--site", slug, "--member", "demo-owner", "--role", "owner")
    return slug


def site_token(site: str) -> str:
    out = admin("create-member-token", "--site", site, "--member", "demo-owner", "--expires-in", "1 hour")
    issued(out["token"])
    return out["token"]


def all_at_once(n: int, work) -> list:
    """Runs work(i) on n threads released together; returns their results in order."""
    barrier = threading.Barrier(n)

    def go(i):
        barrier.wait()
        return work(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(go, range(n)))


# ---------------------------------------------------------------------------------------------
# 1. One Hermes stored session, one Agent Console conversation, across sites.

def test_eight_concurrent_registrations_of_one_session_across_two_sites_give_one_conversation():
    agent = hermes_agent()
    other = second_site()
    tokens = [member_token() if i % 2 == 0 else site_token(other) for i in range(8)]
    session_id = f"sess-race-{uuid.uuid4().hex[:10]}"

    def register_and_open(i):
        with httpx2.Client(base_url=f"{EDGE}/api/console", headers={"Authorization": f"Bearer {tokens[i]}"},
                           timeout=30) as http:
            registered = http.post("/sessions", json={"profile_id": agent["profile_id"], "session_id": session_id})
            opened = http.post("/conversations", json={"profile_id": agent["profile_id"], "session_id": session_id})
            return registered.status_code, registered.text, opened.status_code, opened.text

    results = all_at_once(8, register_and_open)
    for _, registered, _, opened in results:
        no_internal_names(registered)
        no_internal_names(opened)
    assert sorted(r[0] for r in results) == [201] + [409] * 7, results
    # One conversation; the other site has no registration to open one on (404), the same site
    # already has it (409).
    opened = [r[2] for r in results]
    assert opened.count(201) == 1 and set(opened) <= {201, 404, 409}, results
    winner = next(r for r in results if r[2] == 201)
    conversation_id = json.loads(winner[3])["conversation_id"]
    refusals = [json.loads(r[1])["error"]["message"] for r in results if r[0] == 409]
    assert all("already registered" in m or "registered on another site" in m for m in refusals), refusals
    # Past the API: one session row and one conversation, whatever the site.
    rows = superuser_sql(
        "SELECT count(*) || '/' || (SELECT count(*) FROM querylayer.console_conversations"
        f" WHERE profile_id = '{agent['profile_id']}' AND session_id = '{session_id}')"
        f" FROM querylayer.agent_sessions WHERE profile_id = '{agent['profile_id']}' AND session_id = '{session_id}'")
    assert rows == "1/1"
    # The link opens that exact conversation, and no other conversation has it.
    link = f"hermes://sessions/{session_id}?profile_id={agent['profile_id']}"
    holder = next(t for t in tokens if Console(t).get(f"/conversations/{conversation_id}/link").status_code == 200)
    assert Console(holder).get(f"/conversations/{conversation_id}/link").json()["link"] == link


def test_a_session_held_by_one_site_is_refused_on_another_site_and_in_another_organization():
    agent = hermes_agent()
    other = second_site()
    owner, elsewhere = Console(member_token()), Console(site_token(other))
    held = open_conversation(owner, agent)
    session = held["session_id"]
    again = elsewhere.post("/sessions", {"profile_id": agent["profile_id"], "session_id": session})
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    assert "registered on another site" in again.json()["error"]["message"]
    no_internal_names(again.text)
    # Without a registration on this site there is no conversation to open here.
    never = elsewhere.post("/conversations", {"profile_id": agent["profile_id"], "session_id": session})
    assert never.status_code == 404
    # Another organization cannot reach the profile at all (a profile_id names one agent).
    org = f"org-{uuid.uuid4().hex[:8]}"
    admin("create-organization", "--slug", org, "--name", "Another organization")
    admin("create-site", "--organization", org, "--slug", org)
    admin("create-member", "--organization", org, "--handle", "boss")
    admin("set-member-role", "--site", org, "--member", "boss", "--role", "owner")
    token = admin("create-member-token", "--site", org, "--member", "boss", "--expires-in", "1 hour")["token"]
    issued(token)
    foreign = Console(token).post("/sessions", {"profile_id": agent["profile_id"], "session_id": session})
    assert foreign.status_code == 404
    assert superuser_sql(
        f"SELECT count(*) FROM querylayer.console_conversations WHERE session_id = '{session}'") == "1"


# ---------------------------------------------------------------------------------------------
# 2. Concurrent identical stagings: one package, the same answer for all.

async def test_eight_concurrent_identical_stagings_give_one_package_and_eight_identical_answers():
    # Eight harnesses (a connection and an open run each) stage the same records at once.
    connections = [mint()["secret"] for _ in range(8)]
    runs = []
    for secret in connections:
        async with mcp(secret) as c:
            runs.append((await call(c, "querylayer_begin_run", {"run_type": "sources.race"}))["run_id"])
    for round_ in range(3):
        records = [{"title": f"Race {RUN} {round_} {i}", "url": f"https://race.example/{RUN}/{round_}/{i}"}
                   for i in range(3)]
        async with contextlib.AsyncExitStack() as stack:
            entered = [await stack.enter_async_context(mcp(secret)) for secret in connections]
            go = asyncio.Event()

            async def stage(i, client):
                await go.wait()
                return await client.call_tool("querylayer_stage_content_source_package", {
                    "run_id": runs[i], "name": f"race {round_}", "records": records})

            tasks = [asyncio.create_task(stage(i, client)) for i, client in enumerate(entered)]
            await asyncio.sleep(0.2)
            go.set()
            results = await asyncio.gather(*tasks)
        for result in results:
            assert not result.is_error, result.content[0].text
        answers = [r.structured_content for r in results]
        assert sorted(a["resubmitted"] for a in answers) == [False] + [True] * 7, "exactly one staged it"
        same = [{k: v for k, v in a.items() if k != "resubmitted"} for a in answers]
        assert all(s == same[0] for s in same), "every caller gets the same package"
        sha = answers[0]["package_sha256"]
        assert superuser_sql(
            f"SELECT count(*) FROM querylayer.content_source_packages WHERE package_sha256 = '{sha}'") == "1"
    ledger = admin("verify-ledger", "--site", "demo")
    assert ledger["ok"] is True, ledger


async def test_racing_drafts_of_one_new_slug_and_racing_connection_names_never_leak_constraint_names():
    slug = f"race-{uuid.uuid4().hex[:10]}"
    connection = mint()
    async with mcp(connection["secret"]) as c:
        run = (await call(c, "querylayer_begin_run", {"run_type": "draft.race"}))["run_id"]
    async with contextlib.AsyncExitStack() as stack:
        entered = [await stack.enter_async_context(mcp(connection["secret"])) for _ in range(8)]
        go = asyncio.Event()

        async def draft(client):
            await go.wait()
            return await client.call_tool("querylayer_create_draft", {
                "run_id": run, "template": "article", "slug": slug, "fields": {"title": "Race", "body": "First."}})

        tasks = [asyncio.create_task(draft(client)) for client in entered]
        await asyncio.sleep(0.2)
        go.set()
        results = await asyncio.gather(*tasks)
    assert sum(not r.is_error for r in results) == 1
    for r in results:
        if r.is_error:
            error = tool_error(r)
            assert error["code"] == "conflict" and f"slug '{slug}' already exists" in error["message"], error
            no_internal_names(r.content[0].text)

    token = member_token()
    name = f"race {uuid.uuid4().hex[:10]}"

    def create(_):
        with httpx2.Client(base_url=f"{EDGE}/api/console", headers={"Authorization": f"Bearer {token}"},
                           timeout=30) as http:
            r = http.post("/connections", json={"agent": "demo-agent", "name": name, "scopes": ["site:read"],
                                                "expires_in": "1 hour"})
            if r.status_code == 201:
                issued(r.json()["secret"])
            return r.status_code, r.text

    results = all_at_once(8, create)
    assert sorted(s for s, _ in results) == [201] + [409] * 7, results
    for status, text in results:
        no_internal_names(text)


# ---------------------------------------------------------------------------------------------
# 3. The retry limit is the turn's: a new plan version cannot reset it; a human may re-open.

ONE_STEP = [{"key": "analyse", "operation": "analysis", "instructions": "Try"}]


async def test_a_failed_plan_fails_its_turn_and_a_new_version_cannot_restart_the_retries():
    agent, owner, _ = agent_with_a_turn()
    async with mcp(mint(agent=agent["handle"])["secret"]) as c:
        turn = (await claim(c))["turn"]
        assert turn["retries_left"] == 2
        await plan(c, turn, ONE_STEP, goal="Version 1")
        task = await plan(c, turn, ONE_STEP, goal="Version 2")
        assert task["plan"]["version"] == 2
        for attempt in range(3):
            assert task["status"] == "running" and task["step"]["retry_count"] == attempt
            task = await report(c, turn, task["step"], "failed", summary=f"boom {attempt}")
        assert task["status"] == "failed" and task["plan"]["state"] == "failed"
        # The scenario: version 3 of the same step would start again at retry 0.
        refused = tool_error(await c.call_tool("querylayer_create_task_plan", {
            "turn_id": turn["turn_id"], "session_id": turn["session_id"], "goal": "Version 3", "steps": ONE_STEP}))
        assert refused["code"] == "invalid_state" and "is failed" in refused["message"]
        ended = await claim(c, turn_id=turn["turn_id"], session_id=turn["session_id"])
        assert ended["status"] == "failed" and ended["turn"]["state"] == "failed"
        assert ended["reason"] == "step analyse failed after 2 automatic retries"
    seen = owner.get(f"/turns/{turn['turn_id']}").json()
    assert [p["version"] for p in seen["plans"]] == [1, 2] and seen["state"] == "failed"


async def test_replanning_before_the_third_failure_does_not_restore_the_retries_and_a_member_reopens():
    agent, owner, _ = agent_with_a_turn()
    async with mcp(mint(agent=agent["handle"])["secret"]) as c:
        turn = (await claim(c))["turn"]
        task = await plan(c, turn, ONE_STEP)
        for _ in range(2):
            task = await report(c, turn, task["step"], "failed")
        assert task["turn"]["retries_left"] == 0
        task = await plan(c, turn, [{"key": "renamed", "operation": "analysis", "instructions": "Again"}])
        assert task["plan"]["version"] == 2 and task["turn"]["retries_left"] == 0
        task = await report(c, turn, task["step"], "failed", summary="still failing")
        assert task["status"] == "failed" and task["turn"]["state"] == "failed", task
    assert Console(member_token(role="viewer")).post(f"/turns/{turn['turn_id']}/reopen").status_code == 403
    reopened = owner.post(f"/turns/{turn['turn_id']}/reopen", {"note": "try with a fresh budget"})
    assert reopened.status_code == 200, reopened.text
    assert (reopened.json()["state"], reopened.json()["retries_left"]) == ("queued", 2)
    assert owner.post(f"/turns/{turn['turn_id']}/reopen").status_code == 422
    async with mcp(mint(agent=agent["handle"])["secret"]) as c:
        again = await claim(c)
        assert again["turn"]["turn_id"] == turn["turn_id"]
        assert (await claim(c, turn_id=turn["turn_id"], session_id=turn["session_id"]))["status"] == "needs_plan"
        task = await plan(c, again["turn"], ONE_STEP)
        assert task["plan"]["version"] == 3
        task = await report(c, again["turn"], task["step"], "failed")
        assert task["status"] == "running" and task["turn"]["retries_left"] == 1


# ---------------------------------------------------------------------------------------------
# 4. A member's cancel ends the turn; no new plan may start on it.

async def test_a_members_cancel_ends_the_turn_and_no_new_plan_version_starts():
    agent, owner, conv = agent_with_a_turn()
    second = add_turn(owner, conv["conversation_id"], "Another request")
    async with mcp(mint(agent=agent["handle"])["secret"]) as c:
        turn = (await claim(c))["turn"]
        task = await plan(c, turn, ONE_STEP)
        cancelled = owner.post(f"/plans/{task['plan']['plan_id']}/cancel", {"reason": "not now"})
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        refused = tool_error(await c.call_tool("querylayer_create_task_plan", {
            "turn_id": turn["turn_id"], "session_id": turn["session_id"], "goal": "Version 2", "steps": ONE_STEP}))
        assert refused["code"] == "invalid_state" and "cancelled" in refused["message"]
        late = tool_error(await c.call_tool("querylayer_complete_console_task", {
            "turn_id": turn["turn_id"], "session_id": turn["session_id"], "step_id": task["step"]["step_id"],
            "outcome": "succeeded"}))
        assert late["code"] == "invalid_state"
        ended = await claim(c, turn_id=turn["turn_id"], session_id=turn["session_id"])
        assert (ended["status"], ended["reason"], ended["step"]) == ("cancelled", "not now", None)
        # A turn without a plan is cancelled by its own action.
        nxt = (await claim(c))["turn"]
        assert nxt["turn_id"] == second["turn_id"]
        stopped = owner.post(f"/turns/{nxt['turn_id']}/cancel", {"reason": "changed my mind"})
        assert stopped.status_code == 200 and stopped.json()["state"] == "cancelled"
        assert tool_error(await c.call_tool("querylayer_create_task_plan", {
            "turn_id": nxt["turn_id"], "session_id": nxt["session_id"], "goal": "g", "steps": ONE_STEP}))["code"] == \
            "invalid_state"
    seen = owner.get(f"/turns/{turn['turn_id']}").json()
    assert (seen["state"], seen["failure_reason"], [p["version"] for p in seen["plans"]]) == ("cancelled", "not now", [1])
    assert owner.post(f"/turns/{turn['turn_id']}/cancel").status_code == 422


# ---------------------------------------------------------------------------------------------
# 5. When the binding goes, the task fails closed at once, with the reason recorded.

async def test_a_member_revoking_the_connection_fails_its_task_in_that_request():
    agent, owner, _ = agent_with_a_turn()
    connection = mint(agent=agent["handle"])
    async with mcp(connection["secret"]) as c:
        turn = (await claim(c))["turn"]
        task = await plan(c, turn, ONE_STEP)
    revoked = owner.post(f"/connections/{connection['connection_id']}/revoke", {"reason": "rotated"})
    assert revoked.status_code == 200
    seen = owner.get(f"/turns/{turn['turn_id']}").json()
    reason = f"connection '{connection['name']}' was revoked: rotated"
    assert (seen["state"], seen["failure_reason"]) == ("failed", reason)
    assert (seen["plans"][0]["state"], seen["plans"][0]["failure_reason"]) == ("failed", reason)
    assert [s["state"] for s in seen["plans"][0]["steps"]] == ["cancelled"]
    assert task["plan"]["plan_id"] == seen["plans"][0]["plan_id"]


async def test_an_expired_connection_fails_its_task_at_the_next_touch_and_at_the_workers_pass():
    touched, idle = hermes_agent(), hermes_agent()
    owner = Console(member_token())
    turns = {}
    for agent in (touched, idle):
        conv = open_conversation(owner, agent)
        add_turn(owner, conv["conversation_id"])
        short = mint(agent=agent["handle"], expires_in="3 seconds")
        async with mcp(short["secret"]) as c:
            turn = (await claim(c))["turn"]
            await plan(c, turn, ONE_STEP)
        turns[agent["handle"]] = (turn, short)
    time.sleep(3.5)
    # The next touch: another harness of the same agent asks for work.
    turn, short = turns[touched["handle"]]
    async with mcp(mint(agent=touched["handle"])["secret"]) as c:
        claimed = await claim(c)
    assert claimed["status"] == "idle"
    assert [t["turn_id"] for t in claimed["closed"]] == [turn["turn_id"]]
    assert claimed["closed"][0]["reason"].startswith(f"connection '{short['name']}' expired at ")
    # Nobody touches the other one: the worker's pass fails it closed.
    turn, short = turns[idle["handle"]]
    assert owner.get(f"/turns/{turn['turn_id']}").json()["state"] == "claimed"
    log = run_worker()
    assert turn["turn_id"] in log and "console task failed closed" in log
    seen = owner.get(f"/turns/{turn['turn_id']}").json()
    assert seen["state"] == "failed" and seen["failure_reason"].startswith(f"connection '{short['name']}' expired at ")
    assert seen["plans"][0]["state"] == "failed"


async def test_a_plan_refuses_a_step_its_connection_could_never_run():
    agent, owner, _ = agent_with_a_turn()
    narrow = [s for s in ALL_SCOPES if s != "publish:request"]
    async with mcp(mint(narrow, agent=agent["handle"])["secret"]) as c:
        turn = (await claim(c))["turn"]
        refused = tool_error(await c.call_tool("querylayer_create_task_plan", {
            "turn_id": turn["turn_id"], "session_id": turn["session_id"], "goal": "Live page", "steps": [
                {"key": "draft", "operation": "draft", "instructions": "Write"},
                {"key": "publish", "operation": "publish", "instructions": "Ask", "depends_on": ["draft"]}]}))
        assert refused["code"] == "forbidden" and "steps[1] (publish) needs publish:request" in refused["message"]


# ---------------------------------------------------------------------------------------------
# 6. A step report after its session ended is refused.

async def test_a_step_report_after_the_session_ended_is_refused_and_the_step_never_succeeds():
    agent, owner, _ = agent_with_a_turn()
    async with mcp(mint(agent=agent["handle"])["secret"]) as c:
        turn = (await claim(c))["turn"]
        task = await plan(c, turn, ONE_STEP)
        assert owner.post(f"/sessions/{turn['session_id']}/end", {"reason": "closed in Hermes"}).status_code == 200
        late = tool_error(await c.call_tool("querylayer_complete_console_task", {
            "turn_id": turn["turn_id"], "session_id": turn["session_id"], "step_id": task["step"]["step_id"],
            "outcome": "succeeded", "summary": "done, honest"}))
        assert late["code"] == "invalid_state" and f"session {turn['session_id']} is missing or ended" in late["message"]
    steps = owner.get(f"/turns/{turn['turn_id']}").json()["plans"][0]["steps"]
    assert [(s["state"], s["result"]) for s in steps] == [("cancelled", None)]


# ---------------------------------------------------------------------------------------------
# 7. Attribution cannot be borrowed.

async def commission_brief(c, owner: Console) -> str:
    run = (await call(c, "querylayer_begin_run", {"run_type": "brief.commission"}))["run_id"]
    topic = f"contract-{uuid.uuid4().hex[:8]}"
    proposal = await call(c, "querylayer_create_proposal", {"run_id": run, "type": "topical_map", "payload": {
        "changes": [{"op": "add_topic", "slug": topic, "title": "Contract"},
                    {"op": "plan_page", "topic": topic, "title": "A page"}]}})
    approved = owner.post(f"/proposals/{proposal['proposal_id']}/approve")
    assert approved.status_code == 200 and approved.json()["state"] == "applied", approved.text
    return approved.json()["execution"]["detail"]["brief_id"]


async def test_a_card_cites_only_revisions_its_own_connections_runs_wrote():
    owner = Console(member_token())
    other_agent = hermes_agent()
    async with mcp(mint()["secret"]) as mine, mcp(mint(agent=other_agent["handle"])["secret"]) as theirs:
        brief = await commission_brief(mine, owner)
        their_run = (await call(theirs, "querylayer_begin_run", {"run_type": "draft"}))["run_id"]
        their_draft = await call(theirs, "querylayer_create_draft", {
            "run_id": their_run, "template": "article", "slug": f"theirs-{uuid.uuid4().hex[:8]}",
            "fields": {"title": "Theirs", "body": "Their words."}})
        run = (await call(mine, "querylayer_begin_run", {"run_type": "brief.draft"}))["run_id"]
        borrowed = {"run_id": run, "brief_id": brief, "content_id": their_draft["content_id"],
                    "revision_id": their_draft["revision_id"]}
        error = tool_error(await mine.call_tool("querylayer_propose_content_brief_draft", borrowed))
        assert error["code"] == "forbidden" and "not written by this connection" in error["message"], error
        # The same borrowing through the generic tool is refused alike.
        error = tool_error(await mine.call_tool("querylayer_create_proposal", {
            "run_id": run, "type": "create_content",
            "payload": {"content_id": their_draft["content_id"], "revision_id": their_draft["revision_id"],
                        "brief_id": brief}}))
        assert error["code"] == "forbidden"
        own = await call(mine, "querylayer_create_draft", {
            "run_id": run, "template": "article", "slug": f"mine-{uuid.uuid4().hex[:8]}",
            "fields": {"title": "Mine", "body": "My words."}})
        card = await call(mine, "querylayer_propose_content_brief_draft", {
            "run_id": run, "brief_id": brief, "content_id": own["content_id"], "revision_id": own["revision_id"]})
        assert card["author"]["run_id"] == run and card["payload"]["revision_id"] == own["revision_id"]
    # Another connection of the same agent does not share the attribution either.
    async with mcp(mint()["secret"]) as sibling:
        run = (await call(sibling, "querylayer_begin_run", {"run_type": "brief.draft"}))["run_id"]
        error = tool_error(await sibling.call_tool("querylayer_propose_content_brief_draft", {
            "run_id": run, "brief_id": brief, "content_id": own["content_id"], "revision_id": own["revision_id"]}))
        assert error["code"] == "forbidden"


# ---------------------------------------------------------------------------------------------
# 8. Evidence is for claims in a draft revision: never a live one, never a superseded one.

async def test_evidence_is_refused_on_a_live_or_superseded_revision_and_accepted_on_the_draft():
    owner = Console(member_token())
    claim_text = "Plans start at 9 euros a month."
    async with mcp(mint()["secret"]) as c:
        run = (await call(c, "querylayer_begin_run", {"run_type": "evidence.live"}))["run_id"]
        first = await call(c, "querylayer_create_draft", {
            "run_id": run, "template": "article", "slug": f"live-{uuid.uuid4().hex[:8]}",
            "fields": {"title": "Pricing", "body": claim_text}})
        evidence = {"run_id": run, "claim": claim_text, "source_url": "https://sources.example/pricing",
                    "quoted_span": "9 euros", "retrieved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                    "source_sha256": "b" * 64}
        await call(c, "querylayer_record_claim_evidence", {**evidence, "revision_id": first["revision_id"]})
        publish = await call(c, "querylayer_request_publish_approval", {"run_id": run, "items": [
            {"content_id": first["content_id"], "action": "publish", "revision_id": first["revision_id"]}]})
        assert owner.post(f"/proposals/{publish['proposal_id']}/approve").json()["state"] == "applied"
        live = tool_error(await c.call_tool("querylayer_record_claim_evidence", {**evidence, "revision_id": first["revision_id"]}))
        assert live["code"] == "invalid_state" and "is live" in live["message"], live
        second = await call(c, "querylayer_create_draft", {
            "run_id": run, "content_id": first["content_id"], "fields": {"title": "Pricing", "body": claim_text + " Soon."}})
        await call(c, "querylayer_record_claim_evidence", {**evidence, "revision_id": second["revision_id"]})
        third = await call(c, "querylayer_create_draft", {
            "run_id": run, "content_id": first["content_id"], "fields": {"title": "Pricing", "body": claim_text + " Later."}})
        stale = tool_error(await c.call_tool("querylayer_record_claim_evidence", {**evidence, "revision_id": second["revision_id"]}))
        assert stale["code"] == "invalid_state" and "no longer the draft" in stale["message"], stale
        listed = (await call(c, "querylayer_list_evidence", {"content_id": first["content_id"]}))["evidence"]
        assert [e["revision_id"] for e in listed] == [first["revision_id"], second["revision_id"]]
        assert third["revision_id"] not in [e["revision_id"] for e in listed]


# ---------------------------------------------------------------------------------------------
# 9. Every list has a limit and a cursor; pages are stable under inserts.

async def walk(c, tool: str, arguments: dict, key: str, id_key: str, limit: int = 2, pages: int = 4) -> list:
    seen, cursor = [], None
    for _ in range(pages):
        page = await call(c, tool, {**arguments, "limit": limit, **({"cursor": cursor} if cursor else {})})
        assert "next_cursor" in page and len(page[key]) <= limit, (tool, page)
        seen += [item_id(i, id_key) for i in page[key]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)), f"{tool} repeated a row across pages"
    return seen


def item_id(item: dict, id_key: str) -> str:
    value = item
    for part in id_key.split("."):
        value = value[part]
    return value


async def test_every_list_tool_pages_with_a_limit_and_a_cursor():
    owner = Console(member_token())
    # Setup, walking and refusals on connections of their own (each credential is rate-limited).
    async with mcp(mint()["secret"]) as c, mcp(mint()["secret"]) as w, mcp(mint()["secret"]) as e:
        run = (await call(c, "querylayer_begin_run", {"run_type": "lists"}))["run_id"]
        content = []
        for i in range(3):
            d = await call(c, "querylayer_create_draft", {
                "run_id": run, "template": "article", "slug": f"list-{RUN}-{i}",
                "fields": {"title": "Listed", "body": f"Claim number {i}."}})
            content.append(d)
            await call(c, "querylayer_record_claim_evidence", {
                "run_id": run, "revision_id": d["revision_id"], "claim": f"Claim number {i}.",
                "source_url": f"https://sources.example/{i}", "quoted_span": "number",
                "retrieved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(), "source_sha256": "c" * 64})
        package = await call(c, "querylayer_stage_content_source_package", {
            "run_id": run, "name": "list package",
            "records": [{"title": f"R{i}", "url": f"https://r.example/{RUN}/{i}"} for i in range(5)]})
        await commission_brief(c, owner)
        await commission_brief(c, owner)
        admin("import-strategy", "--site", "demo", "--source", f"lists-{RUN}", "--file", json_file([
            {"id": f"list-opp-{RUN}-{i}", "topic": f"list-topic-{RUN}", "title": f"Opportunity {i}"} for i in range(3)]))
        lists = {
            "querylayer_list_content": ({}, "items", "content_id"),
            "querylayer_list_proposals": ({}, "proposals", "proposal_id"),
            "querylayer_list_topical_map": ({}, "topics", "topic_id"),
            "querylayer_list_topical_strategy_opportunities": ({}, "opportunities", "opportunity_id"),
            "querylayer_list_content_briefs": ({}, "briefs", "brief_id"),
            "querylayer_list_content_source_packages": ({}, "packages", "package_id"),
            "querylayer_list_content_source_records": ({"package_id": package["package_id"]}, "records", "record_id"),
            "querylayer_list_evidence": ({}, "evidence", "evidence_id"),
            "querylayer_list_evidence_reverification": ({}, "evidence", "target.evidence_id"),
            "querylayer_list_revisions": ({"content_id": content[0]["content_id"]}, "revisions", "revision_id"),
            "querylayer_list_templates": ({}, "templates", "name"),
            "querylayer_list_runs": ({}, "runs", "run_id"),
        }
        tools = {t.name: t for t in (await w.list_tools()).tools}
        listed = {name for name in tools if "_list_" in name}
        assert listed == set(lists), f"a list tool without a paging test: {listed ^ set(lists)}"
        for tool, (arguments, key, id_key) in lists.items():
            properties = tools[tool].input_schema["properties"]
            assert {"limit", "cursor"} <= set(properties), tool
            assert "next_cursor" in tools[tool].output_schema["properties"], tool
            walked = await walk(w, tool, arguments, key, id_key, pages=3)
            whole = (await call(w, tool, {**arguments, "limit": 500}))[key]
            assert walked == [item_id(i, id_key) for i in whole][:len(walked)], tool
            assert len(walked) >= min(len(whole), 3), tool
        # The re-verification list of one item, one row a page, to its end.
        ids = await walk(e, "querylayer_list_evidence_reverification", {"content_id": content[0]["content_id"]},
                         "evidence", "target.evidence_id", limit=1)
        assert len(ids) == 1
        records = await walk(e, "querylayer_list_content_source_records", {"package_id": package["package_id"]},
                             "records", "record_id", limit=2, pages=10)
        assert records == [r["record_id"] for r in package["records"]]
        # A cursor belongs to its list; a made-up one is refused.
        cursor = (await call(e, "querylayer_list_content", {"limit": 1}))["next_cursor"]
        error = tool_error(await e.call_tool("querylayer_list_proposals", {"cursor": cursor}))
        assert error["code"] == "invalid_argument" and "cursor" in error["message"]
        error = tool_error(await e.call_tool("querylayer_list_evidence_reverification", {"cursor": "not-a-cursor"}))
        assert error["code"] == "invalid_argument" and "cursor" in error["message"]
        error = tool_error(await e.call_tool("querylayer_list_evidence_reverification", {"limit": 501}))
        assert error["code"] == "invalid_argument" and "limit" in error["message"]


async def test_pages_are_stable_under_inserts():
    async with mcp(mint()["secret"]) as c:
        run = (await call(c, "querylayer_begin_run", {"run_type": "lists.stable"}))["run_id"]

        async def draft(i):
            return await call(c, "querylayer_create_draft", {
                "run_id": run, "template": "article", "slug": f"stable-{uuid.uuid4().hex[:8]}-{i}",
                "fields": {"title": "Stable", "body": f"Stable {i}."}})

        for i in range(4):
            await draft(i)
        before = [i["content_id"] for i in (await call(c, "querylayer_list_content", {"limit": 4}))["items"]]
        first = await call(c, "querylayer_list_content", {"limit": 2})
        assert [i["content_id"] for i in first["items"]] == before[:2]
        inserted = await draft(99)
        second = await call(c, "querylayer_list_content", {"limit": 2, "cursor": first["next_cursor"]})
        assert [i["content_id"] for i in second["items"]] == before[2:4], "an insert shifts no later page"
        assert inserted["content_id"] not in [i["content_id"] for i in second["items"]]


def test_every_console_list_pages_with_a_limit_and_a_cursor():
    setup = Console(member_token())
    agent = hermes_agent()
    convs = [open_conversation(setup, agent, title=f"Paged {i}") for i in range(3)]
    for i in range(3):
        add_turn(setup, convs[0]["conversation_id"], f"Request {i}")
    owner = Console(member_token())
    for path, params, key, id_key in [
        ("/proposals", {"state": "applied"}, "proposals", "proposal_id"),
        ("/runs", {}, "runs", "run_id"),
        ("/connections", {}, "connections", "connection_id"),
        ("/conversations", {}, "conversations", "conversation_id"),
        (f"/conversations/{convs[0]['conversation_id']}/turns", {}, "turns", "turn_id"),
        ("/evidence-reviews", {"state": "all"}, "reviews", "review_id"),
    ]:
        seen, cursor = [], None
        for _ in range(3):
            r = owner.get(path, **params, limit=1, **({"cursor": cursor} if cursor else {}))
            assert r.status_code == 200, (path, r.text)
            page = r.json()
            assert "next_cursor" in page and len(page[key]) <= 1, (path, page)
            seen += [p[id_key] for p in page[key]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert len(seen) == len(set(seen)), path
        whole = owner.get(path, **params, limit=500).json()[key]
        assert seen == [p[id_key] for p in whole][:len(seen)], path
        assert owner.get(path, **params, cursor="garbage").status_code == 400, path
    turns = owner.get(f"/conversations/{convs[0]['conversation_id']}/turns").json()["turns"]
    assert [t["request"] for t in turns] == ["Request 0", "Request 1", "Request 2"]
    newest = owner.get("/conversations", limit=1).json()["conversations"][0]
    assert newest["conversation_id"] == convs[-1]["conversation_id"]
    listed = next(c for c in owner.get("/conversations", limit=5).json()["conversations"]
                  if c["conversation_id"] == convs[0]["conversation_id"])
    assert listed["turn_count"] == 3 and len(listed["turns"]) == 3


# ---------------------------------------------------------------------------------------------
# 10. Rejected-event totals follow the bounded retention window.

def json_file(value) -> str:
    import tempfile
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(value, f)
    f.close()
    return f.name


async def test_rejected_totals_are_reported_only_inside_the_retention_window():
    form = f"window-{RUN}"
    now = datetime.datetime.now(datetime.timezone.utc).replace(hour=12, minute=0, second=0, microsecond=0)
    old, recent = now - datetime.timedelta(days=45), now - datetime.timedelta(days=3)
    events = [{"form": form, "decision": decision, "reason": reason, "occurred_at": when.isoformat()}
              for when in (old, recent)
              for decision, reason in (("rejected", "spam"), ("accepted", "clean"), ("review", "links"))]
    assert admin("report-form-screening", "--site", "demo", "--file", json_file(events)) == {"recorded": 6}
    async with mcp(mint(["site:read"])["secret"]) as c:
        metrics = await call(c, "querylayer_form_screening_metrics", {"days": 60, "form": form})
    retention = metrics["rejected_raw_retention_days"]
    assert metrics["rejected_since"] == (datetime.datetime.now(datetime.timezone.utc)
                                         - datetime.timedelta(days=retention)).date().isoformat()
    rows = sorted((c["day"], c["decision"]) for c in metrics["counts"])
    d = lambda t: t.date().isoformat()  # noqa: E731
    assert rows == sorted([(d(old), "accepted"), (d(old), "review"),
                           (d(recent), "accepted"), (d(recent), "rejected"), (d(recent), "review")])

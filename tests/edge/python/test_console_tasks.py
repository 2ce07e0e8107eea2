"""The Agent Console through the running edge: members register Hermes sessions, open
conversations and add turns through the console API; scripted Hermes-style harnesses (official
MCP SDK clients) claim turns, plan them, and receive and report one step at a time. Publishing
waits for a member; failures retry at most twice; identity, permission and session problems fail
closed."""

import asyncio
import uuid

import pytest

from harness import Console, admin, mcp, member_token, mint, operator_sql, raw_post, superuser_sql, tool_error
from hermes import add_turn, agent_with_a_turn, call, claim, hermes_agent, open_conversation, plan, report

pytestmark = pytest.mark.anyio

TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


def link_of(console: Console, conversation_id: str):
    return console.get(f"/conversations/{conversation_id}/link")


def states(task: dict) -> dict:
    return {s["key"]: s["state"] for s in task["plan"]["steps"]}


async def test_a_harness_works_a_three_step_plan_one_step_at_a_time_and_publishing_waits_for_a_member():
    agent = hermes_agent()
    connection = mint(agent=agent["handle"])
    owner = Console(member_token())
    conversation = open_conversation(owner, agent)
    cid, session = conversation["conversation_id"], conversation["session_id"]
    link = link_of(owner, cid)
    assert link.status_code == 200
    assert link.json() == {"conversation_id": cid,
                           "link": f"hermes://sessions/{session}?profile_id={agent['profile_id']}"}
    turn = add_turn(owner, cid, "Write a pricing page, revise it, and get it published")
    slug = f"console-pricing-{uuid.uuid4().hex[:10]}"
    received = []

    async with mcp(connection["secret"]) as client:
        claimed = await claim(client, session_id=session)
        assert claimed["status"] == "claimed" and claimed["closed"] == []
        assert claimed["turn"]["turn_id"] == turn["turn_id"] and claimed["turn"]["state"] == "claimed"
        assert (claimed["turn"]["session_id"], claimed["turn"]["profile_id"]) == (session, agent["profile_id"])
        turn = claimed["turn"]
        task = await call(client, "querylayer_create_task_plan", {
            "turn_id": turn["turn_id"], "session_id": session, "goal": "A published pricing page",
            "steps": [
                {"key": "draft", "operation": "draft", "instructions": "Write the first draft"},
                {"key": "revise", "operation": "revision", "instructions": "Improve it; propose the revision",
                 "depends_on": ["draft"]},
                {"key": "publish", "operation": "publish", "instructions": "Ask a member to publish it",
                 "depends_on": ["revise"]},
            ]})
        assert task["status"] == "running" and task["plan"]["version"] == 1
        assert [(s["key"], s["risk"]) for s in task["plan"]["steps"]] == [
            ("draft", "medium"), ("revise", "medium"), ("publish", "high")]
        assert states(task) == {"draft": "running", "revise": "pending", "publish": "pending"}
        received.append(task["step"]["key"])

        # Step 1: a draft (no proposal of its own).
        run = await call(client, "querylayer_begin_run", {"run_type": "console.pricing"})
        draft = await call(client, "querylayer_create_draft", {
            "run_id": run["run_id"], "template": "article", "slug": slug,
            "fields": {"title": "Pricing", "body": "Plans."}})
        task = await report(client, turn, task["step"], "succeeded", run_ids=[run["run_id"]], summary="drafted")
        assert task["status"] == "running" and task["step"]["key"] == "revise"
        assert states(task) == {"draft": "succeeded", "revise": "running", "publish": "pending"}
        received.append(task["step"]["key"])

        # Step 2: a revision, which must name its revision proposal and then waits for a member.
        revision = await call(client, "querylayer_create_draft", {
            "run_id": run["run_id"], "content_id": draft["content_id"],
            "fields": {"title": "Pricing, explained", "body": "Plans and what they include."}})
        unnamed = tool_error(await client.call_tool("querylayer_complete_console_task", {
            "turn_id": turn["turn_id"], "session_id": session, "step_id": task["step"]["step_id"],
            "outcome": "succeeded"}))
        assert unnamed["code"] == "invalid_state" and "revision proposal" in unnamed["message"]
        revision_proposal = await call(client, "querylayer_create_proposal", {
            "run_id": run["run_id"], "type": "revision",
            "payload": {"content_id": draft["content_id"], "revision_id": revision["revision_id"]}})
        task = await report(client, turn, task["step"], "succeeded", proposal_ids=[revision_proposal["proposal_id"]])
        assert task["status"] == "awaiting_approval" and task["step"] is None
        assert states(task) == {"draft": "succeeded", "revise": "awaiting_approval", "publish": "pending"}
        waiting = await claim(client, turn_id=turn["turn_id"], session_id=session)
        assert waiting["status"] == "awaiting_approval" and waiting["step"] is None

    approved = owner.post(f"/proposals/{revision_proposal['proposal_id']}/approve", {"note": "better"})
    assert approved.status_code == 200 and approved.json()["state"] == "approved"

    async with mcp(connection["secret"]) as client:
        # Step 3: publishing only asks; nothing goes live until a member approves.
        task = await claim(client, turn_id=turn["turn_id"], session_id=session)
        assert task["status"] == "running" and task["step"]["key"] == "publish"
        assert states(task) == {"draft": "succeeded", "revise": "succeeded", "publish": "running"}
        received.append(task["step"]["key"])
        publish = await call(client, "querylayer_request_publish_approval", {
            "run_id": run["run_id"],
            "items": [{"content_id": draft["content_id"], "action": "publish", "revision_id": revision["revision_id"]}]})
        task = await report(client, turn, task["step"], "succeeded", proposal_ids=[publish["proposal_id"]])
        assert task["status"] == "awaiting_approval" and states(task)["publish"] == "awaiting_approval"
        for _ in range(2):
            still = await claim(client, turn_id=turn["turn_id"], session_id=session)
            assert still["status"] == "awaiting_approval" and still["step"] is None
        live = (await call(client, "querylayer_list_content", {"state": "published", "limit": 500}))["items"]
        assert draft["content_id"] not in [i["content_id"] for i in live]

    seen = owner.get(f"/turns/{turn['turn_id']}")
    assert seen.status_code == 200
    seen = seen.json()
    assert seen["state"] == "claimed" and [p["version"] for p in seen["plans"]] == [1]
    assert {s["key"]: s["state"] for s in seen["plans"][0]["steps"]} == {
        "draft": "succeeded", "revise": "succeeded", "publish": "awaiting_approval"}
    assert seen["runs"] == [run["run_id"]]
    assert {p["proposal_id"] for p in seen["proposals"]} == {revision_proposal["proposal_id"], publish["proposal_id"]}

    applied = owner.post(f"/proposals/{publish['proposal_id']}/approve", {"note": "ship it"})
    assert applied.status_code == 200 and applied.json()["state"] == "applied"

    async with mcp(connection["secret"]) as client:
        done = await claim(client, turn_id=turn["turn_id"], session_id=session)
        assert done["status"] == "completed" and done["plan"]["state"] == "completed"
        assert set(states(done).values()) == {"succeeded"}
        await call(client, "querylayer_finish_run", {"run_id": run["run_id"], "outcome": "completed"})
        ended = await call(client, "querylayer_complete_console_task", {
            "turn_id": turn["turn_id"], "outcome": "completed", "summary": "published after approval",
            "run_ids": [run["run_id"]], "proposal_ids": [revision_proposal["proposal_id"], publish["proposal_id"]]})
        assert ended["turn"]["state"] == "completed" and ended["turn"]["outcome"] == "completed"
        assert ended["turn"]["result"]["proposal_ids"] == [revision_proposal["proposal_id"], publish["proposal_id"]]
        live = (await call(client, "querylayer_list_content", {"state": "published", "limit": 500}))["items"]
        page = next(i for i in live if i["content_id"] == draft["content_id"])
        assert page["published_revision_id"] == revision["revision_id"]
    assert received == ["draft", "revise", "publish"]
    listed = owner.get("/conversations").json()["conversations"]
    mine = next(c for c in listed if c["conversation_id"] == cid)
    assert mine["problem"] is None and [t["state"] for t in mine["turns"]] == ["completed"]


async def test_a_step_failing_three_times_fails_after_two_retries_and_its_dependents_never_start():
    agent, owner, _ = agent_with_a_turn("Analyse the pricing page")
    async with mcp(mint(agent=agent["handle"])["secret"]) as client:
        turn = (await claim(client))["turn"]
        task = await plan(client, turn, [
            {"key": "analyse", "operation": "analysis", "instructions": "Try"},
            {"key": "summarise", "operation": "analysis", "instructions": "After", "depends_on": ["analyse"]}])
        handed_out = []
        for attempt in range(3):
            assert task["status"] == "running"
            handed_out.append((task["step"]["key"], task["step"]["retry_count"]))
            assert task["step"]["retry_count"] == attempt
            task = await report(client, turn, task["step"], "failed", summary=f"boom {attempt}")
        assert handed_out == [("analyse", 0), ("analyse", 1), ("analyse", 2)]
        assert task["status"] == "failed" and task["step"] is None
        analyse, summarise = task["plan"]["steps"]
        assert (analyse["state"], analyse["retry_count"]) == ("failed", 2)
        assert summarise["state"] == "cancelled" and summarise["retry_count"] == 0
        assert task["plan"]["state"] == "failed"
        assert task["plan"]["failure_reason"] == "step analyse failed after 2 automatic retries"
        # The failed plan failed its turn closed: nothing more is accepted for it.
        again = await claim(client, turn_id=turn["turn_id"], session_id=turn["session_id"])
        assert again["status"] == "failed" and again["step"] is None
        assert again["turn"]["state"] == "failed" and again["reason"] == task["plan"]["failure_reason"]
        for outcome in ("completed", "failed"):
            refused = tool_error(await client.call_tool("querylayer_complete_console_task", {
                "turn_id": turn["turn_id"], "outcome": outcome}))
            assert refused["code"] == "invalid_state" and "nothing more is accepted" in refused["message"]
    steps = owner.get(f"/turns/{turn['turn_id']}").json()["plans"][0]["steps"]
    assert [(s["key"], s["state"], s["run_id"]) for s in steps] == [
        ("analyse", "failed", None), ("summarise", "cancelled", None)]


async def test_a_revoked_connection_stops_the_harness_and_another_connection_cannot_take_its_turn():
    agent, owner, _ = agent_with_a_turn("Draft something")
    first = mint(agent=agent["handle"])
    async with mcp(first["secret"]) as client:
        turn = (await claim(client))["turn"]
        task = await plan(client, turn, [{"key": "draft", "operation": "draft", "instructions": "Write"}], goal="A draft")
        step = task["step"]
    admin("revoke-connection", "--id", first["connection_id"], "--reason", "e2e: harness laptop lost")
    assert raw_post(TOOLS_LIST, first["secret"]).status_code == 401
    call_claim = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "querylayer_claim_console_task", "arguments": {"turn_id": turn["turn_id"], "session_id": turn["session_id"]}}}
    assert raw_post(call_claim, first["secret"]).status_code == 401
    async with mcp(mint(agent=agent["handle"])["secret"]) as other:
        for tool, arguments in [
            ("querylayer_claim_console_task", {"turn_id": turn["turn_id"], "session_id": turn["session_id"]}),
            ("querylayer_complete_console_task", {"turn_id": turn["turn_id"], "session_id": turn["session_id"],
                                                   "step_id": step["step_id"], "outcome": "succeeded"}),
            ("querylayer_complete_console_task", {"turn_id": turn["turn_id"], "outcome": "failed"}),
        ]:
            error = tool_error(await other.call_tool(tool, arguments))
            assert error["code"] == "forbidden" and "not claimed by this connection" in error["message"]
        assert (await claim(other))["status"] == "idle"
    # The revocation failed the task closed at once, with its reason; no member had to stop it.
    seen = owner.get(f"/turns/{turn['turn_id']}").json()
    reason = f"connection '{first['name']}' was revoked: e2e: harness laptop lost"
    assert (seen["state"], seen["failure_reason"]) == ("failed", reason)
    assert (seen["plans"][0]["state"], seen["plans"][0]["failure_reason"]) == ("failed", reason)
    assert seen["plans"][0]["steps"][0]["state"] == "cancelled"
    assert owner.post(f"/plans/{task['plan']['plan_id']}/cancel").status_code == 404


async def test_a_permission_removed_mid_plan_fails_the_task_closed_at_once():
    agent, owner, _ = agent_with_a_turn("Draft and publish")
    connection = mint(agent=agent["handle"])
    async with mcp(connection["secret"]) as client:
        turn = (await claim(client))["turn"]
        task = await plan(client, turn, [
            {"key": "draft", "operation": "draft", "instructions": "Write"},
            {"key": "publish", "operation": "publish", "instructions": "Ask", "depends_on": ["draft"]}], goal="Live page")
        assert task["step"]["key"] == "draft"
        admin("revoke-scopes", "--site", "demo", "--agent", agent["handle"], "--scopes", "publish:request")
        names = {t.name for t in (await client.list_tools()).tools}
        assert "querylayer_request_publish_approval" not in names and "querylayer_claim_console_task" in names
        # The removal failed the task closed in its own transaction: the report comes too late.
        reason = "step publish needs publish:request, which the connection no longer holds"
        late = tool_error(await client.call_tool("querylayer_complete_console_task", {
            "turn_id": turn["turn_id"], "session_id": turn["session_id"], "step_id": task["step"]["step_id"],
            "outcome": "succeeded"}))
        assert late["code"] == "invalid_state" and reason in late["message"]
        task = await claim(client, turn_id=turn["turn_id"], session_id=turn["session_id"])
        assert task["status"] == "failed" and task["step"] is None and task["reason"] == reason
        assert states(task) == {"draft": "cancelled", "publish": "failed"}
        assert task["plan"]["steps"][1]["failure_reason"] == "the connection no longer holds publish:request"
        assert task["plan"]["failure_reason"] == reason and task["turn"]["state"] == "failed"


async def test_a_renamed_profile_keeps_working_and_keeps_its_link():
    agent = hermes_agent()
    owner = Console(member_token())
    conversation = open_conversation(owner, agent)
    cid = conversation["conversation_id"]
    before = link_of(owner, cid).json()["link"]
    add_turn(owner, cid, "Two analyses")
    async with mcp(mint(agent=agent["handle"])["secret"]) as client:
        turn = (await claim(client))["turn"]
        task = await plan(client, turn, [
            {"key": "one", "operation": "analysis", "instructions": "First"},
            {"key": "two", "operation": "analysis", "instructions": "Second", "depends_on": ["one"]}])
        renamed = operator_sql(
            f"SELECT querylayer_api.rename_agent_profile('{agent['profile_id']}', 'Senior writer {agent['handle']}')")
        assert agent["profile_id"] in renamed
        context = await call(client, "querylayer_site_context", {})
        assert context["agent"]["profile_name"] == f"Senior writer {agent['handle']}"
        assert context["agent"]["profile_id"] == agent["profile_id"]
        task = await report(client, turn, task["step"], "succeeded")
        assert task["status"] == "running" and task["step"]["key"] == "two"
        task = await report(client, turn, task["step"], "succeeded")
        assert task["status"] == "completed"
        ended = await call(client, "querylayer_complete_console_task", {"turn_id": turn["turn_id"], "outcome": "completed"})
        assert ended["turn"]["state"] == "completed"
    after = link_of(owner, cid)
    assert after.status_code == 200 and after.json()["link"] == before
    assert before == f"hermes://sessions/{conversation['session_id']}?profile_id={agent['profile_id']}"
    listed = next(c for c in owner.get("/conversations").json()["conversations"] if c["conversation_id"] == cid)
    assert listed["profile_name"] == f"Senior writer {agent['handle']}" and listed["problem"] is None


def test_an_unknown_profile_is_refused_and_never_invented():
    owner = Console(member_token())
    session_id = f"sess-{uuid.uuid4().hex[:12]}"
    unknown = owner.post("/sessions", {"profile_id": f"prof-nobody-{uuid.uuid4().hex[:8]}", "session_id": session_id})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    never = owner.post("/conversations", {"profile_id": "prof-nobody", "session_id": session_id})
    assert never.status_code == 404 and "never creates a Hermes session" in never.json()["error"]["hint"]
    # A session registered for one profile cannot be opened under another.
    a, b = hermes_agent(), hermes_agent()
    registered = owner.post("/sessions", {"profile_id": a["profile_id"], "session_id": session_id})
    assert registered.status_code == 201
    crossed = owner.post("/conversations", {"profile_id": b["profile_id"], "session_id": session_id})
    assert crossed.status_code == 422 and crossed.json()["error"]["code"] == "invalid_state"
    assert owner.post("/sessions", {"profile_id": a["profile_id"], "session_id": session_id}).status_code == 409
    viewer = Console(member_token(role="viewer"))
    assert viewer.post("/sessions", {"profile_id": a["profile_id"], "session_id": f"s-{uuid.uuid4().hex[:8]}"}).status_code == 403
    assert owner.post("/sessions", {"profile_id": a["profile_id"]}).status_code == 400


async def test_a_profile_that_no_longer_resolves_fails_closed_everywhere():
    agent = hermes_agent()
    owner = Console(member_token())
    conversation = open_conversation(owner, agent)
    cid = conversation["conversation_id"]
    add_turn(owner, cid, "First request")
    second = add_turn(owner, cid, "Second request")
    async with mcp(mint(agent=agent["handle"])["secret"]) as client:
        turn = (await claim(client))["turn"]
        await plan(client, turn, [{"key": "one", "operation": "analysis", "instructions": "First"}])
        # No API can rebind a profile (profile_id is immutable); simulate the Hermes profile
        # going away out of band, with the agents guard held off for that one change.
        superuser_sql(
            "BEGIN; ALTER TABLE querylayer.agents DISABLE TRIGGER agents_guard; "
            f"UPDATE querylayer.agents SET profile_id = 'gone-{uuid.uuid4().hex[:12]}' "
            f"WHERE profile_id = '{agent['profile_id']}'; "
            "ALTER TABLE querylayer.agents ENABLE ALWAYS TRIGGER agents_guard; COMMIT;")
        reason = f"profile {agent['profile_id']} is unknown"
        link = link_of(owner, cid)
        assert link.status_code == 422 and reason in link.json()["error"]["message"]
        assert "hermes://" not in link.text
        late = owner.post(f"/conversations/{cid}/turns", {"request": "Too late"})
        assert late.status_code == 422 and reason in late.json()["error"]["message"]
        failed = await claim(client, turn_id=turn["turn_id"], session_id=turn["session_id"])
        assert failed["status"] == "failed" and failed["reason"] == reason and failed["step"] is None
        assert failed["plan"]["failure_reason"] == reason
        closed = await claim(client)
        assert closed["status"] == "idle" and closed["turn"] is None
        assert closed["closed"] == [{"turn_id": second["turn_id"], "reason": reason}]
    listed = next(c for c in owner.get("/conversations").json()["conversations"] if c["conversation_id"] == cid)
    assert listed["problem"] == reason


async def test_a_missing_session_fails_closed_and_refuses_the_link():
    agent = hermes_agent()
    owner = Console(member_token())
    conversation = open_conversation(owner, agent)
    cid, session = conversation["conversation_id"], conversation["session_id"]
    add_turn(owner, cid, "First request")
    second = add_turn(owner, cid, "Second request")
    async with mcp(mint(agent=agent["handle"])["secret"]) as client:
        turn = (await claim(client))["turn"]
        wrong = tool_error(await client.call_tool("querylayer_create_task_plan", {
            "turn_id": turn["turn_id"], "session_id": "another-session", "goal": "g",
            "steps": [{"key": "one", "operation": "analysis", "instructions": "x"}]}))
        assert wrong["code"] == "forbidden" and session in wrong["message"]
        task = await call(client, "querylayer_create_task_plan", {
            "turn_id": turn["turn_id"], "session_id": session, "goal": "Findings",
            "steps": [{"key": "one", "operation": "analysis", "instructions": "First"},
                      {"key": "two", "operation": "analysis", "instructions": "Second", "depends_on": ["one"]}]})
        other_session = tool_error(await client.call_tool("querylayer_claim_console_task", {
            "turn_id": turn["turn_id"], "session_id": "another-session"}))
        assert other_session["code"] == "forbidden"
        ended = owner.post(f"/sessions/{session}/end", {"reason": "deleted in Hermes"})
        assert ended.status_code == 200 and ended.json() == {"session_id": session, "ended": True}
        reason = f"session {session} is missing or ended"
        link = link_of(owner, cid)
        assert link.status_code == 422 and reason in link.json()["error"]["message"]
        late = owner.post(f"/conversations/{cid}/turns", {"request": "Too late"})
        assert late.status_code == 422 and reason in late.json()["error"]["message"]
        # Ending the session failed the task closed at once; a report after it is refused.
        late = tool_error(await client.call_tool("querylayer_complete_console_task", {
            "turn_id": turn["turn_id"], "session_id": session, "step_id": task["step"]["step_id"],
            "outcome": "succeeded"}))
        assert late["code"] == "invalid_state" and reason in late["message"]
        failed = await claim(client, turn_id=turn["turn_id"], session_id=session)
        assert failed["status"] == "failed" and failed["reason"] == reason
        assert states(failed) == {"one": "cancelled", "two": "cancelled"}
        closed = await claim(client)
        assert closed["closed"] == [{"turn_id": second["turn_id"], "reason": reason}]
    assert owner.post(f"/sessions/{session}/end").status_code == 404
    assert owner.get(f"/conversations/{uuid.uuid4()}/link").status_code == 404
    assert owner.get("/conversations/not-a-uuid/link").status_code == 400
    # The token is checked before the request's shape: a bad token learns nothing about either.
    stranger = Console("qlm_not_a_token")
    assert stranger.get("/conversations/not-a-uuid/link").status_code == 401
    assert stranger.post("/conversations", {"unexpected": True}).status_code == 401


async def test_two_harnesses_claiming_concurrently_never_get_the_same_turn():
    agent = hermes_agent()
    owner = Console(member_token())
    conversations = [open_conversation(owner, agent, title=f"Queue {i}") for i in range(2)]
    queued = {add_turn(owner, c["conversation_id"], f"Request {i}")["turn_id"]
              for i in range(5) for c in conversations}
    assert len(queued) == 10

    async def harness(secret: str, ready: asyncio.Event) -> list:
        mine = []
        async with mcp(secret) as client:
            await client.list_tools()
            await ready.wait()
            while True:
                result = await claim(client)
                if result["status"] == "idle":
                    return mine
                assert result["status"] == "claimed"
                mine.append(result["turn"]["turn_id"])

    go = asyncio.Event()
    a = asyncio.create_task(harness(mint(agent=agent["handle"])["secret"], go))
    b = asyncio.create_task(harness(mint(agent=agent["handle"])["secret"], go))
    await asyncio.sleep(0.5)
    go.set()
    first, second = await asyncio.gather(a, b)
    assert not set(first) & set(second), "a turn was claimed twice"
    assert len(first) + len(second) == len(set(first) | set(second)) == 10
    assert set(first) | set(second) == queued

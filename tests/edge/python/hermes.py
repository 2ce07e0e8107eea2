"""Hermes agents of their own, their conversations and their console tasks, as the console and
contract tests drive them: the console API for members, the official MCP SDK for the harness."""

import uuid

from harness import ALL_SCOPES, Console, admin, member_token, structured


def hermes_agent(scopes=ALL_SCOPES, sites=("demo",)) -> dict:
    """A Hermes agent of its own (granted `scopes` on each of `sites`), so that claims never race
    other tests."""
    handle = f"h-{uuid.uuid4().hex[:10]}"
    profile_id = f"prof-{uuid.uuid4().hex[:12]}"
    admin("create-agent", "--organization", "demo", "--handle", handle, "--kind", "hermes",
          "--profile-id", profile_id, "--profile-name", f"Writer {handle}")
    for site in sites:
        admin("grant-scopes", "--site", site, "--agent", handle, "--scopes", ",".join(scopes))
    return {"handle": handle, "profile_id": profile_id}


def open_conversation(console: Console, agent: dict, title: str = "Pricing work") -> dict:
    """Registers an existing Hermes session and opens its one conversation."""
    session_id = f"sess-{uuid.uuid4().hex[:12]}"
    registered = console.post("/sessions", {"profile_id": agent["profile_id"], "session_id": session_id})
    assert registered.status_code == 201, registered.text
    assert registered.json() == {"session_id": session_id, "profile_id": agent["profile_id"], "agent": agent["handle"]}
    opened = console.post("/conversations", {"profile_id": agent["profile_id"], "session_id": session_id, "title": title})
    assert opened.status_code == 201, opened.text
    conversation = opened.json()
    assert (conversation["session_id"], conversation["profile_id"]) == (session_id, agent["profile_id"])
    return conversation


def add_turn(console: Console, conversation_id: str, request: str = "Do the work") -> dict:
    added = console.post(f"/conversations/{conversation_id}/turns", {"request": request})
    assert added.status_code == 201, added.text
    assert added.json()["state"] == "queued"
    return added.json()


def agent_with_a_turn(request: str = "Do the work") -> tuple:
    """A Hermes agent of its own, the owner's console, and a conversation of its own with
    `request` queued for the agent."""
    agent = hermes_agent()
    owner = Console(member_token())
    conversation = open_conversation(owner, agent)
    add_turn(owner, conversation["conversation_id"], request)
    return agent, owner, conversation


async def call(client, tool: str, arguments: dict) -> dict:
    return structured(await client.call_tool(tool, arguments))


async def claim(client, **arguments) -> dict:
    return await call(client, "querylayer_claim_console_task", arguments)


async def plan(client, turn: dict, steps: list, goal: str = "Findings") -> dict:
    return await call(client, "querylayer_create_task_plan", {
        "turn_id": turn["turn_id"], "session_id": turn["session_id"], "goal": goal, "steps": steps})


async def report(client, turn: dict, step: dict, outcome: str, **extra) -> dict:
    return await call(client, "querylayer_complete_console_task", {
        "turn_id": turn["turn_id"], "session_id": turn["session_id"], "step_id": step["step_id"],
        "outcome": outcome, **extra})

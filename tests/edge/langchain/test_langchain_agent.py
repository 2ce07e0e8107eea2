"""A LangChain agent against the running edge (scripts/test-edge starts it): the agent is
LangChain's own (`langchain.agents.create_agent`), its tools are loaded from the edge's /mcp by
`langchain-mcp-adapters` (MultiServerMCPClient, Streamable HTTP, the connection secret as a
header), and its model is a scripted chat model from langchain_core, so no LLM is called: it asks
for `answer_question` with the demo question, then answers with what the tool returned.

Every secret minted here is appended to $QUERYLAYER_TEST_SECRETS for the runner's log check."""

import asyncio
import json
import os
import pathlib
import subprocess
import uuid

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_mcp_adapters.client import MultiServerMCPClient

EDGE = os.environ["QUERYLAYER_EDGE_URL"].rstrip("/")
BIN = os.environ["QUERYLAYER_BIN"]
ADMIN_URL = os.environ["QUERYLAYER_ADMIN_URL"]
SECRETS = os.environ["QUERYLAYER_TEST_SECRETS"]

# QueryGraph's own answer to the demo question, recorded from the reference (semantics/testdata).
REFERENCE = json.loads(
    (pathlib.Path(__file__).resolve().parents[3] / "semantics" / "testdata" / "reference_demo_answer.json").read_text())
DEMO_QUESTION = REFERENCE["question"]
(RESTRICTED,) = REFERENCE["denied_sources"]
DEMO_PLANS = [p["sql"] for p in REFERENCE["plans"]]
SEMANTIC_TOOLS = {"search_semantic_model", "resolve_metric", "check_access", "build_navigator_bundle",
                  "answer_question", "run_qglake_story", "verify_envelope"}
READ_TOOLS = {"querylayer_site_context", "querylayer_list_content", "querylayer_list_proposals"}


def mint_secret() -> str:
    """A fresh read-only connection on the demo site, through the operator command line."""
    done = subprocess.run(
        [BIN, "admin", "create-connection", "--site", "demo", "--agent", "demo-agent",
         "--scopes", "site:read,content:read", "--expires-in", "1 hour",
         "--name", f"langchain {uuid.uuid4().hex[:12]}", "--harness", "langchain", "--json"],
        env={**os.environ, "DATABASE_URL": ADMIN_URL}, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, f"querylayer admin create-connection failed: {done.stderr}"
    secret = json.loads(done.stdout)["secret"]
    with open(SECRETS, "a", encoding="utf-8") as f:
        f.write(secret + "\n")
    return secret


class ScriptedChatModel(FakeMessagesListChatModel):
    """Replies from a script, whatever tools it is bound to; keeps what it was shown."""

    seen: list = []

    def bind_tools(self, tools, **kwargs):
        self.seen.append(("tools", [getattr(t, "name", t) for t in tools]))
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self.seen.append(("messages", list(messages)))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


def tool_text(message: ToolMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(block["text"] for block in content if block.get("type") == "text")


def test_a_langchain_agent_loads_the_edge_tools_and_answers_the_demo_question():
    secret = mint_secret()
    client = MultiServerMCPClient({"querylayer": {
        "transport": "streamable_http",
        "url": f"{EDGE}/mcp",
        "headers": {"Authorization": f"Bearer {secret}"},
    }})
    tools = asyncio.run(client.get_tools())
    names = {t.name for t in tools}
    assert SEMANTIC_TOOLS | READ_TOOLS <= names, sorted(names)

    model = ScriptedChatModel(responses=[
        AIMessage(content="", tool_calls=[{"name": "answer_question", "args": {"question": DEMO_QUESTION},
                                           "id": "call_answer_1", "type": "tool_call"}]),
        AIMessage(content="The governed answer is above, with the restricted source denied."),
    ])
    agent = create_agent(model, tools, system_prompt="Answer through QueryLayer's governed tools only.")
    state = asyncio.run(agent.ainvoke({"messages": [{"role": "user", "content": DEMO_QUESTION}]}))

    messages = state["messages"]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.name for m in results] == ["answer_question"]
    result = results[0]
    assert result.tool_call_id == "call_answer_1" and result.status == "success", tool_text(result)
    answer = json.loads(tool_text(result))
    assert answer["denied_sources"] == [RESTRICTED]
    assert [p["sql"] for p in answer["plans"]] == DEMO_PLANS
    assert [r["allowed"] for r in answer["receipts"]] == [True, True, False]
    assert answer["answer"].startswith("Answerable from governed sources")
    assert answer["envelope"]["signature"].startswith("ed25519:")
    # The adapter carries the structured result beside the text, as MCP returned it.
    assert result.artifact["structured_content"]["denied_sources"] == [RESTRICTED]
    # The model was bound to the edge's tools, and saw the tool's answer before its last reply.
    assert ("tools", sorted(names)) in [(k, sorted(v)) for k, v in model.seen if k == "tools"]
    last_prompt = [v for k, v in model.seen if k == "messages"][-1]
    assert any(isinstance(m, ToolMessage) and RESTRICTED in tool_text(m) for m in last_prompt)
    assert messages[-1].content == "The governed answer is above, with the restricted source denied."

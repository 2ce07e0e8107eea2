"""QueryGraph interoperability and the governed semantics plane, against running edges:

* an edge started here with `serve --require-auth` (the /v1 API), driven by QueryGraph's own
  published client (`querygraph[crypto]==0.5.0`: `governed_post`, `mint_envelope_header`,
  `TypeDidEnvelope.verify_signature`) and by our v2 client (`querylayer_client`);
* an edge started here with `--llm-url` pointing at a local OpenAI-compatible test server;
* the MCP tools and resources of the semantics plane, through the official MCP SDK.
"""

import asyncio
import hashlib
import json
import os
import pathlib
import subprocess
import threading
import uuid
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.error import HTTPError

import httpx2
import jsonschema
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from querygraph.api_auth import governed_post, mint_envelope_header
from querygraph.typedid import TypeDidAgent, TypeDidEnvelope

from harness import (ALL_SCOPES, BIN, EDGE_DB_URL, admin, issued, mcp, member_token, mint, peer, serve, structured,
                     superuser_sql)
from querylayer_client import Key, prove_did_binding
from querylayer_client import mint_envelope_header as mint_v2

ROOT = pathlib.Path(__file__).resolve().parents[3]
VENDOR = ROOT / "tests" / "fixtures" / "vendor"
# QueryGraph's own answer to the demo question, recorded from the reference (semantics/testdata):
# the governed answer gives the same plans, denials and text.
REFERENCE = json.loads((ROOT / "semantics" / "testdata" / "reference_demo_answer.json").read_text())
DEMO_QUESTION = REFERENCE["question"]
(RESTRICTED,) = REFERENCE["denied_sources"]
DEMO_PLANS = [p["sql"] for p in REFERENCE["plans"]]
DEMO_ANSWER = REFERENCE["answer"]


def start_edge(name: str, *flags: str, rate_limit: str = "0"):
    """An edge of the test's own (harness.serve), rate-limited at `rate_limit` a second."""
    return serve(name, "--rate-limit", rate_limit, *flags)


@pytest.fixture(scope="module")
def governed_edge():
    with start_edge("edge-v1", "--require-auth") as (url, _):
        yield url


class FakeLlm(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint that records every request body."""

    seen: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        FakeLlm.seen.append((self.path, body.decode()))
        reply = {"choices": [{"message": {"role": "assistant", "content": "Fiscal capacity and energy burden overlap in the counties the governed plans read."}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def llm_edge():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeLlm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with start_edge("edge-llm", "--require-auth", "--llm-url", f"http://127.0.0.1:{server.server_port}",
                    "--llm-model", "test-model") as (url, _):
        yield url
    server.shutdown()


# The keys of the agents the tests bind, by did:key: binding takes the holder's proof.
KEYS: dict[str, Key] = {}


def bind(key: Key | str, scopes=("site:read", "content:read", "content:write"), site="demo") -> dict:
    """A connection bound to the key only (no secret) for the demo agent, with its holder's
    proof of possession: a server challenge signed by the key (querylayer_client)."""
    key = KEYS[key] if isinstance(key, str) else key
    challenge = admin("create-did-challenge", "--site", site, "--did", key.did)
    proof = prove_did_binding(key, site, challenge["challenge"])
    return admin("create-connection", "--site", site, "--agent", "demo-agent", "--scopes", ",".join(scopes),
                 "--expires-in", "1 hour", "--name", f"key {uuid.uuid4().hex[:12]}", "--did", key.did,
                 "--did-proof", json.dumps(proof), "--no-secret")


@pytest.fixture(scope="module")
def import_site():
    """A site of the demo organization of its own, so imported models do not replace the demo's."""
    site = f"imports-{uuid.uuid4().hex[:8]}"
    admin("create-site", "--organization", "demo", "--slug", site)
    admin("grant-scopes", "--site", site, "--agent", "demo-agent", "--scopes", "site:read,content:read,content:write")
    return site


def fresh_agent() -> TypeDidAgent:
    name = f"e2e-{uuid.uuid4().hex}"
    agent = TypeDidAgent.new(name)
    # QueryGraph derives an agent's key from the seed querygraph-agent:<name>.
    key = Key.from_seed(f"querygraph-agent:{name}")
    assert key.did == agent.did_key()
    KEYS[key.did] = key
    return agent


def model_document(name: str) -> dict:
    return {"version": "0.1.1", "semantic_model": [{
        "name": name,
        "description": "A model imported through the governed /v1 API.",
        "ai_context": "Prefer governed columns.",
        "datasets": [{"name": "orders", "source": "sail.shop.orders", "description": "Orders",
                      "fields": [{"name": "amount", "description": "Order amount"}]}],
        "metrics": [{"name": "revenue", "expression": {"dialects": [{"dialect": "ANSI_SQL", "expression": "SUM(amount)"}]}}],
    }]}


async def call(secret: str, tool: str, args: dict) -> dict:
    async with mcp(secret) as client:
        result = await client.call_tool(tool, args)
        assert not result.is_error, result
        return structured(result)


# ------------------------------------------------------------------------------------------
# Issue 5: the envelope contract, with QueryGraph's own client.

def test_a_bare_post_gets_the_401_receipt(governed_edge):
    r = httpx2.post(f"{governed_edge}/v1/answer", json={"question": "?"})
    assert r.status_code == 401
    body = r.json()
    assert body["error"] == "missing x-qg-envelope header"
    receipt = body["receipt"]
    assert receipt["allowed"] is False and receipt["path"] == "/v1/answer" and receipt["checks"] is None
    assert receipt["contract"]["header"] == "x-qg-envelope"
    assert receipt["contract"]["action"] == "invoke"
    assert receipt["contract"]["payload"] == {"bodySha256": "<sha256 hex of request body>"}


def test_governed_post_with_a_bound_key_imports_a_model(governed_edge, import_site):
    agent = fresh_agent()
    bind(agent.did_key(), site=import_site)
    name = f"shop_{uuid.uuid4().hex[:8]}"
    result = governed_post(governed_edge, "/v1/models/import/osi", model_document(name), agent)
    assert result["name"] == name and result["datasets"] == 1 and result["metrics"] == 1
    reader = admin("create-connection", "--site", import_site, "--agent", "demo-agent", "--scopes", "content:read",
                   "--expires-in", "1 hour", "--name", f"reader {uuid.uuid4().hex[:8]}")
    secret = reader["secret"]
    issued(secret)

    async def current():
        async with mcp(secret) as client:
            resource = await client.read_resource("qg://models/current")
            return json.loads(resource.contents[0].text)

    stored = asyncio.run(current())
    assert stored["name"] == name and stored["version"] == result["version"]


def test_the_same_header_on_another_path_or_with_another_body_is_refused(governed_edge, import_site):
    agent = fresh_agent()
    bind(agent.did_key(), site=import_site)
    body = json.dumps(model_document("moved")).encode()
    header = mint_envelope_header(agent, path="/v1/models/import/osi", body=body)
    headers = {"x-qg-envelope": header, "content-type": "application/json"}
    elsewhere = httpx2.post(f"{governed_edge}/v1/answer", content=body, headers=headers)
    assert elsewhere.status_code == 401
    checks = elsewhere.json()["receipt"]["checks"]
    assert checks["resourceBoundToPath"] is False and checks["signatureValid"] is True
    swapped = httpx2.post(f"{governed_edge}/v1/models/import/osi", content=b'{"other": 1}', headers=headers)
    assert swapped.status_code == 401
    checks = swapped.json()["receipt"]["checks"]
    assert checks["bodyBound"] is False and checks["resourceBoundToPath"] is True


def assert_refused_as_unbound(governed_edge: str, agent) -> None:
    """`agent`'s signed /v1/answer, posted as it is: 401, the signature valid but the key bound to
    no live connection."""
    body = json.dumps({"question": DEMO_QUESTION}).encode()
    r = httpx2.post(f"{governed_edge}/v1/answer", content=body,
                    headers={"x-qg-envelope": mint_envelope_header(agent, path="/v1/answer", body=body)})
    assert r.status_code == 401
    checks = r.json()["receipt"]["checks"]
    assert checks["keyBound"] is False and checks["signatureValid"] is True


def test_an_unbound_key_is_refused(governed_edge):
    agent = fresh_agent()
    with pytest.raises(HTTPError) as refused:
        governed_post(governed_edge, "/v1/answer", {"question": DEMO_QUESTION}, agent)
    assert refused.value.code == 401
    assert_refused_as_unbound(governed_edge, agent)


def test_a_revoked_key_bound_connection_is_refused_at_once(governed_edge):
    agent = fresh_agent()
    connection = bind(agent.did_key())
    assert governed_post(governed_edge, "/v1/answer", {"question": DEMO_QUESTION}, agent)["answer"] == DEMO_ANSWER
    admin("revoke-connection", "--id", connection["connection_id"], "--reason", "key retired")
    assert_refused_as_unbound(governed_edge, agent)


def receipts_of(sender: str) -> list[tuple[bool, str]]:
    rows = superuser_sql("SELECT allowed, path FROM querylayer.envelope_receipts "
                         f"WHERE sender = '{sender}' ORDER BY id")
    return [(allowed == "t", path) for allowed, path in (row.split("|") for row in rows.splitlines())]


def test_every_decision_is_kept_and_a_failed_request_spends_its_nonce(governed_edge, import_site):
    key = Key.from_seed(f"receipts-{uuid.uuid4().hex}")
    bind(key, site=import_site)
    path = "/v1/models/import/osi"
    # A valid envelope carrying a model the importer refuses: the route fails after the
    # envelope was allowed. The receipt and the spent nonce stay; the model does not.
    broken = json.dumps({"version": "0.1.1", "semantic_model": [{"name": "broken", "datasets": "not a list"}]})
    headers = {"x-qg-envelope": mint_v2(key, path=path, body=broken), "content-type": "application/json"}
    refused = httpx2.post(f"{governed_edge}{path}", content=broken, headers=headers)
    assert refused.status_code == 400 and "datasets" in refused.text, refused.text
    replay = httpx2.post(f"{governed_edge}{path}", content=broken, headers=headers)
    assert replay.status_code == 401 and replay.json()["receipt"]["checks"]["nonceUnused"] is False
    other = httpx2.post(f"{governed_edge}/v1/answer", content=broken, headers=headers)
    assert other.status_code == 401
    assert receipts_of(key.did) == [(True, path), (False, path), (False, "/v1/answer")]


def test_the_v1_rate_limit_is_keyed_on_the_verified_connection_not_the_claimed_sender():
    with start_edge("edge-v1-limit", "--require-auth", "--rate-burst", "2", rate_limit="0.2") as (url, _):
        key = Key.from_seed(f"limited-{uuid.uuid4().hex}")
        bind(key)
        body = json.dumps({"question": "budget headroom"})
        # Headers another key signed while claiming this key's did:key cannot spend its bucket.
        for _ in range(5):
            forged = json.loads(mint_v2(Key.from_seed(f"forger-{uuid.uuid4().hex}"), path="/v1/answer", body=body))
            forged["sender"] = key.did
            r = httpx2.post(f"{url}/v1/answer", content=body, headers={"x-qg-envelope": json.dumps(forged)})
            assert r.status_code == 401 and r.json()["receipt"]["checks"]["senderMatchesVerificationMethod"] is False

        def send():
            return httpx2.post(f"{url}/v1/answer", content=body, headers={
                "x-qg-envelope": mint_v2(key, path="/v1/answer", body=body), "content-type": "application/json"})

        assert [send().status_code for _ in range(2)] == [200, 200]
        third = send()
        assert third.status_code == 429 and third.json()["error"]["code"] == "rate_limited"
        assert int(third.headers["retry-after"]) >= 1
        # The over-limit request was still a decision: its receipt is kept.
        assert [allowed for allowed, _ in receipts_of(key.did)] == [False] * 5 + [True] * 3


def test_an_address_over_its_failed_authentication_budget_waits_before_any_database_work():
    tools_list = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"accept": "application/json, text/event-stream", "authorization": "Bearer qlc_not_a_secret"}
    with start_edge("edge-auth-budget", "--require-auth", "--auth-failure-burst", "3",
                    "--auth-failure-rate", "0.1") as (url, _), peer("127.0.0.3") as client:
        assert [client.post(f"{url}/mcp", json=tools_list, headers=headers).status_code for _ in range(3)] == [401] * 3
        refused = client.post(f"{url}/mcp", json=tools_list, headers=headers)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
        assert int(refused.headers["retry-after"]) >= 1
        # The budget is the address's, on every credential check: /v1 and the console wait too,
        # even with a valid token, until it refills.
        assert client.post(f"{url}/v1/answer", json={"question": "?"}).status_code == 429
        console = client.get(f"{url}/api/console/proposals", headers={"authorization": f"Bearer {member_token()}"})
        assert console.status_code == 429
        # Public endpoints are not credential checks.
        assert client.get(f"{url}/.well-known/agent-card.json").status_code == 200
        # Another address has a budget of its own.
        with peer("127.0.0.4") as other:
            assert other.post(f"{url}/mcp", json=tools_list, headers=headers).status_code == 401


def test_governed_post_answers_the_demo_question(governed_edge):
    agent = fresh_agent()
    bind(agent.did_key())
    result = governed_post(governed_edge, "/v1/answer", {"question": DEMO_QUESTION}, agent)
    assert result["answer"] == DEMO_ANSWER
    assert [p["sql"] for p in result["plans"]] == DEMO_PLANS
    assert result["denied_sources"] == [RESTRICTED]
    assert TypeDidEnvelope.model_validate(result["envelope"]).verify_signature()


def test_a_rust_minted_envelope_verifies_with_the_python_package():
    body = '{"question": "Where is fiscal stress highest?"}'
    done = subprocess.run([BIN, "envelope", "mint", "--v1", "--seed", "querygraph-agent:RustMinter",
                           "--path", "/v1/answer", "--body", body], capture_output=True, text=True, check=True)
    header = done.stdout.strip()
    env = TypeDidEnvelope.model_validate_json(header)
    assert env.verify_signature()
    assert env.sender == TypeDidAgent.new("RustMinter").did_key()
    # And the other direction: our verifier accepts QueryGraph's header and rejects a tamper.
    agent = TypeDidAgent.new("PythonMinter")
    theirs = mint_envelope_header(agent, path="/v1/answer", body=body.encode())
    ok = subprocess.run([BIN, "envelope", "verify", "--header", theirs, "--path", "/v1/answer", "--body", body],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([BIN, "envelope", "verify", "--header", theirs, "--path", "/v1/answer", "--body", body + " "],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and json.loads(bad.stdout)["checks"]["bodyBound"] is False


def test_v2_envelopes_refuse_replays_and_stale_ones(governed_edge):
    key = Key.from_seed(f"v2-{uuid.uuid4().hex}")
    bind(key)
    body = json.dumps({"question": "budget headroom"})
    fresh = mint_v2(key, path="/v1/answer", body=body)
    headers = {"x-qg-envelope": fresh, "content-type": "application/json"}
    assert httpx2.post(f"{governed_edge}/v1/answer", content=body, headers=headers).status_code == 200
    replay = httpx2.post(f"{governed_edge}/v1/answer", content=body, headers=headers)
    assert replay.status_code == 401
    assert replay.json()["receipt"]["checks"]["nonceUnused"] is False
    stale_time = (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    stale = mint_v2(key, path="/v1/answer", body=body, created_at=stale_time)
    r = httpx2.post(f"{governed_edge}/v1/answer", content=body, headers={"x-qg-envelope": stale})
    assert r.status_code == 401 and r.json()["receipt"]["checks"]["fresh"] is False
    wrong_method = mint_v2(key, path="/v1/answer", body=body, method="PUT")
    r = httpx2.post(f"{governed_edge}/v1/answer", content=body, headers={"x-qg-envelope": wrong_method})
    assert r.status_code == 401 and r.json()["receipt"]["checks"]["methodBound"] is False


def test_the_agent_card_is_the_cli_card_and_valid_a2a(governed_edge):
    served = httpx2.get(f"{governed_edge}/.well-known/agent-card.json").json()
    printed = subprocess.run([BIN, "agent-card", "--public-url", governed_edge],
                             env={**os.environ, "DATABASE_URL": EDGE_DB_URL}, capture_output=True, text=True, check=True)
    assert json.loads(printed.stdout) == served
    schema = json.loads((VENDOR / "a2a-v0.3.0.json").read_text())
    card_schema = {**schema["definitions"]["AgentCard"], "definitions": schema["definitions"]}
    jsonschema.Draft7Validator(card_schema).validate(served)
    assert {"bearer", "typedid"} <= set(served["securitySchemes"])
    assert served["protocolVersion"] == "0.3.0" and served["provider"]["serverDid"].startswith("did:key:z6Mk")


def test_exported_tool_schemas_are_valid_and_match_tools_list():
    secret = mint(ALL_SCOPES)["secret"]

    async def listed():
        async with mcp(secret) as client:
            return {t.name: t.input_schema for t in (await client.list_tools()).tools}

    tools = asyncio.run(listed())
    for flavor in ("openai", "anthropic"):
        done = subprocess.run([BIN, "tool-schemas", "--flavor", flavor], capture_output=True, text=True, check=True)
        exported = json.loads(done.stdout)
        by_name = {}
        for item in exported:
            if flavor == "openai":
                assert item["type"] == "function"
                by_name[item["function"]["name"]] = item["function"]["parameters"]
            else:
                by_name[item["name"]] = item["input_schema"]
        assert by_name.keys() == tools.keys(), set(by_name) ^ set(tools)
        for name, schema in by_name.items():
            jsonschema.Draft202012Validator.check_schema(schema)
            assert schema == tools[name], name


# ------------------------------------------------------------------------------------------
# Issue 8: the governed navigator loop, signed answers, lineage, attestations.

def verify_attestation(att: dict, event_text: str, did_key: str) -> bool:
    """Our attestation format (docs/semantics.md), checked independently of the server."""
    event_hash = hashlib.sha256(event_text.encode()).hexdigest()
    root = hashlib.sha256(f"querygraph-lineage\n{event_hash}".encode()).hexdigest()
    if att["event_hash"] != event_hash or att["merkle_root"] != root:
        return False
    payload = "\n".join(["querylayer-lineage-attestation-v1", f"issuer:{att['issuer']}", f"subject:{att['subject']}",
                         f"event_hash:{event_hash}", f"merkle_root:{root}", f"created_at:{att['created_at']}"])
    alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
    n = 0
    for c in did_key.removeprefix("did:key:z"):
        n = n * 58 + alphabet.index(c)
    raw = n.to_bytes(34, "big")
    try:
        Ed25519PublicKey.from_public_bytes(raw[2:]).verify(bytes.fromhex(att["signature"].removeprefix("ed25519:")),
                                                          payload.encode())
        return True
    except Exception:
        return False


def openlineage_validator():
    schema = json.loads((ROOT / "semantics" / "testdata" / "openlineage-2-0-2.json").read_text())
    run_event = {"$ref": "#/$defs/RunEvent", "$defs": schema["$defs"]}
    return jsonschema.Draft202012Validator(run_event, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def test_the_demo_answer_is_signed_lineage_anchored_and_verifiable():
    secret = mint(["content:read", "site:read"])["secret"]
    answer = asyncio.run(call(secret, "answer_question", {"question": DEMO_QUESTION}))
    assert answer["answer"] == DEMO_ANSWER
    assert [p["sql"] for p in answer["plans"]] == DEMO_PLANS
    assert answer["denied_sources"] == [RESTRICTED]
    assert [r["allowed"] for r in answer["receipts"]] == [True, True, False]
    assert answer["synthesized_by"] == "deterministic"
    # The envelope verifies with QueryGraph's own verify.
    assert TypeDidEnvelope.model_validate(answer["envelope"]).verify_signature()
    assert answer["envelope"]["sender"] == answer["server_did"]
    # The event validates against the official OpenLineage schema.
    event = json.loads(answer["openlineage_text"])
    openlineage_validator().validate(event)
    assert event["eventType"] == "COMPLETE"
    assert RESTRICTED not in [i["name"] for i in event["inputs"]]
    # The attestation verifies against the published key, and fails after any changed byte.
    text = answer["openlineage_text"]
    published = subprocess.run([BIN, "agent-card"], env={**os.environ, "DATABASE_URL": EDGE_DB_URL},
                               capture_output=True, text=True, check=True)
    assert answer["server_did"] == json.loads(published.stdout)["provider"]["serverDid"]
    assert verify_attestation(answer["attestation"], text, answer["server_did"])
    for i in (0, len(text) // 2, len(text) - 1):
        changed = text[:i] + chr(ord(text[i]) ^ 1) + text[i + 1:]
        assert not verify_attestation(answer["attestation"], changed, answer["server_did"])


def test_an_llm_never_sees_the_restricted_source_and_governance_is_unchanged(llm_edge):
    secret = mint(["content:read"])["secret"]
    deterministic = asyncio.run(call(secret, "answer_question", {"question": DEMO_QUESTION}))
    FakeLlm.seen.clear()

    async def ask():
        async with mcp(secret, url=llm_edge) as client:
            result = await client.call_tool("answer_question", {"question": DEMO_QUESTION})
            assert not result.is_error, result
            return structured(result)

    written = asyncio.run(ask())
    assert len(FakeLlm.seen) == 1
    path, sent = FakeLlm.seen[0]
    assert path == "/v1/chat/completions"
    assert "haalsi_baseline" not in sent and RESTRICTED not in sent
    assert "restricted_health" in sent, "the denied dataset is named as off-limits"
    assert written["synthesized_by"] == "openai-compatible:test-model"
    assert written["answer"].startswith("Fiscal capacity and energy burden overlap")
    strip = lambda receipts: [{k: v for k, v in r.items() if k != "issued_at"} for r in receipts]
    assert strip(written["receipts"]) == strip(deterministic["receipts"])
    assert written["plans"] == deterministic["plans"]
    assert written["denied_sources"] == deterministic["denied_sources"]
    assert TypeDidEnvelope.model_validate(written["envelope"]).verify_signature()


def test_a_v1_answer_an_llm_writes_keeps_every_decision(llm_edge):
    # With an LLM, /v1 keeps its transaction: the envelope's receipt, then the steps (prepare, the
    # model's text, complete) in a savepoint, whatever they do.
    key = Key.from_seed(f"llm-v1-{uuid.uuid4().hex}")
    bind(key)
    FakeLlm.seen.clear()

    def send(body: str) -> httpx2.Response:
        return httpx2.post(f"{llm_edge}/v1/answer", content=body, timeout=30, headers={
            "x-qg-envelope": mint_v2(key, path="/v1/answer", body=body), "content-type": "application/json"})

    written = send(json.dumps({"question": DEMO_QUESTION}))
    assert written.status_code == 200, written.text
    assert written.json()["synthesized_by"] == "openai-compatible:test-model"
    assert TypeDidEnvelope.model_validate(written.json()["envelope"]).verify_signature()
    assert len(FakeLlm.seen) == 1
    malformed = send(json.dumps({"question": DEMO_QUESTION, "unknown": 1}))
    assert malformed.status_code == 400 and "unknown" in malformed.json()["error"]["message"], malformed.text
    assert len(FakeLlm.seen) == 1
    assert receipts_of(key.did) == [(True, "/v1/answer"), (True, "/v1/answer")]


def test_the_story_denies_the_restricted_broker_only():
    secret = mint(["content:read"])["secret"]
    story = asyncio.run(call(secret, "run_qglake_story", {}))
    statuses = {r["agent"]: r["status"] for r in story["responses"]}
    assert [a for a, s in statuses.items() if s == "denied"] == ["RestrictedDataBroker"]
    assert len(statuses) == 6
    validator = openlineage_validator()
    for r in story["responses"]:
        assert r["openlineage"]["eventType"] == "COMPLETE"
        validator.validate(r["openlineage"])
        assert r["attestation"]["issuer"] == story["server_did"]


def test_the_plane_tools_decide_and_record():
    secret = mint(["content:read", "content:write", "site:read"])["secret"]

    async def run():
        async with mcp(secret) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"search_semantic_model", "resolve_metric", "check_access", "build_navigator_bundle",
                    "import_semantic_model", "answer_question", "run_qglake_story", "verify_envelope"} <= names
            found = structured(await client.call_tool("search_semantic_model", {"text": "budget headroom"}))
            assert found["matches"][0]["name"] == "fiscal_capacity"
            metric = structured(await client.call_tool("resolve_metric", {"name": "fiscal_capacity", "dialect": "SNOWFLAKE"}))
            assert metric["dialect"] == "ANSI_SQL" and metric["expression"] == "SUM(total_revenue - mandated_spend)"
            denied = structured(await client.call_tool("check_access", {"resource": RESTRICTED}))
            assert denied["allowed"] is False and denied["receipt"]["allowed"] is False
            allowed = structured(await client.call_tool("check_access", {
                "resource": "sail.qg_lakehouse.government_finance__countydata", "action": "odrl:read"}))
            assert allowed["allowed"] is True
            bundle = structured(await client.call_tool("build_navigator_bundle", {}))
            by_name = {d["name"]: d for d in bundle["datasets"]}
            assert by_name["restricted_health"]["access"]["allowed"] is False
            assert by_name["restricted_health"]["fields"] == []
            bad = await client.call_tool("import_semantic_model", {"document": {"semantic_model": {"name": "x", "datasets": [{"name": "d"}]}}})
            assert bad.is_error
            assert "semantic_model.datasets[0].source" in bad.meta["querylayer/error"]["message"]
            checked = structured(await client.call_tool("verify_envelope", {
                "envelope": mint_envelope_header(TypeDidAgent.new("Verifier"), path="/v1/answer", body=b"{}")}))
            assert checked["signature_valid"] is True and checked["payload_hash_valid"] is True
            story = json.loads((await client.read_resource("qg://story/resilience-desk")).contents[0].text)
            assert len(story["roster"]["specialists"]) == 6

    asyncio.run(run())

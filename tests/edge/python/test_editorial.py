"""Editorial planning through the running edge: the topical map and strategy queue, content
briefs, the source package ledger, claim evidence and its re-verification (`querylayer worker`
against a local page that changes), and form screening metrics with the retention purge.

Every response of the edge's /mcp endpoint in this file is captured raw and checked for the
things that must never reach an agent: form payloads, contact details, actors, network markers,
raw signals, observed evidence bodies and hashes, reviewer notes."""

import datetime
import hashlib
import http.server
import json
import tempfile
import threading
import uuid

import httpx2
import pytest

from harness import (ALL_SCOPES, Console, admin, issued, mcp, member_token, mint, operator_sql,
                     raw_post, run_worker, structured, superuser_sql, tool_error, worker_once)

pytestmark = pytest.mark.anyio

RUN = uuid.uuid4().hex[:10]
FORM_PAYLOAD = f"payload-secret-{RUN}"
CONTACT = f"contact-{RUN}@example.test"
ACTOR = f"actor-{RUN}"
NETWORK = f"net-marker-{RUN}"
RAW_SIGNAL = f"raw-signal-{RUN}"
OBSERVED_BODY = f"observed-body-{RUN}"
REVIEWER_NOTE = f"reviewer-note-{RUN}"
NEVER_TO_AGENTS = [FORM_PAYLOAD, CONTACT, ACTOR, NETWORK, RAW_SIGNAL, OBSERVED_BODY, REVIEWER_NOTE]

TOOLS = {
    "querylayer_list_topical_map", "querylayer_list_topical_strategy_opportunities",
    "querylayer_propose_topical_strategy_opportunities", "querylayer_list_content_briefs",
    "querylayer_propose_content_brief_draft", "querylayer_stage_content_source_package",
    "querylayer_list_content_source_packages", "querylayer_list_content_source_records",
    "querylayer_propose_content_source_draft", "querylayer_record_claim_evidence",
    "querylayer_list_evidence", "querylayer_list_evidence_reverification", "querylayer_form_screening_metrics",
}

# Every raw /mcp response body of this module, and the tools called.
RESPONSES: list[str] = []
CALLED: set[str] = set()


def never_leaks(body: str) -> None:
    for marker in NEVER_TO_AGENTS + SEEN_HASHES:
        assert marker not in body, f"{marker!r} reached an agent: {body[:300]}"


# Observed hashes of changed pages (what the worker saw): reviewers may see them, agents never.
SEEN_HASHES: list[str] = []


def record(request_body: bytes, response_body: str) -> None:
    try:
        message = json.loads(request_body or b"{}")
    except ValueError:
        message = {}
    if message.get("method") == "tools/call":
        CALLED.add(message["params"]["name"])
    RESPONSES.append(response_body)
    never_leaks(response_body)


class Recording(httpx2.AsyncBaseTransport):
    """Passes requests through and keeps each response body exactly as the edge sent it."""

    def __init__(self):
        self.inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request):
        response = await self.inner.handle_async_request(request)
        body = await response.aread()
        await response.aclose()
        record(request.content, body.decode("utf-8", "replace"))
        headers = [(k, v) for k, v in response.headers.items() if k.lower() not in ("content-length", "content-encoding")]
        return httpx2.Response(response.status_code, headers=headers, content=body, request=request)

    async def aclose(self):
        await self.inner.aclose()


def client(secret: str):
    return mcp(secret, transport=Recording())


def sync_call(secret: str, tool: str, arguments: dict) -> dict:
    """One stateless tools/call without an SDK session (for fixtures), recorded like the rest."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    response = raw_post(body, secret)
    record(json.dumps(body).encode(), response.text)
    result = response.json()["result"]
    assert not result.get("isError"), result["content"][0]["text"]
    return result["structuredContent"]


async def call(c, tool: str, arguments: dict) -> dict:
    return structured(await c.call_tool(tool, arguments))


async def refused(c, tool: str, arguments: dict, code: str, *named: str) -> dict:
    error = tool_error(await c.call_tool(tool, arguments))
    assert error["code"] == code, (tool, error)
    for word in named:
        assert word in error["message"], (tool, word, error)
    return error


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def json_file(value) -> str:
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(value, f)
    f.close()
    return f.name


def counts_past_the_api() -> dict:
    """Content, revision, proposal and publishing counts of every site, read as the superuser."""
    row = superuser_sql(
        "SELECT json_build_object('items', (SELECT count(*) FROM querylayer.content_items),"
        " 'revisions', (SELECT count(*) FROM querylayer.content_revisions),"
        " 'proposals', (SELECT count(*) FROM querylayer.proposals),"
        " 'executions', (SELECT count(*) FROM querylayer.proposal_executions),"
        " 'live', (SELECT count(*) FROM querylayer.content_items WHERE published_revision_id IS NOT NULL))")
    return json.loads(row)


# ---------------------------------------------------------------------------------------------
# Fixtures: a local web page that changes, a writer, narrow connections, and a second site.

class Pages:
    """A local HTTP server whose pages a test can change between fetches."""

    def __init__(self):
        self.pages: dict[str, tuple[str, bytes]] = {}
        self.hits: dict[str, int] = {}
        pages = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                pages.hits[self.path] = pages.hits.get(self.path, 0) + 1
                content_type, body = pages.pages.get(self.path, ("text/plain", b"gone"))
                self.send_response(200 if self.path in pages.pages else 404)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def put(self, path: str, html: str) -> bytes:
        body = html.encode()
        self.pages[path] = ("text/html; charset=utf-8", body)
        return body

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"


@pytest.fixture(scope="module")
def pages():
    p = Pages()
    yield p
    p.server.shutdown()


@pytest.fixture
def writer() -> str:
    """A connection of its own per test (the edge rate-limits each credential)."""
    return mint(ALL_SCOPES)["secret"]


@pytest.fixture(scope="module")
def site_only() -> str:
    return mint(["site:read"])["secret"]


@pytest.fixture(scope="module")
def readers() -> str:
    return mint(["content:read", "topical-map:read", "runs:write"])["secret"]


@pytest.fixture(scope="module")
def other(pages) -> dict:
    """A second site of the same organization, with one of everything."""
    slug = f"other-{RUN}"
    admin("create-site", "--organization", "demo", "--slug", slug)
    admin("grant-scopes", "--site", slug, "--agent", "demo-agent", "--scopes", ",".join(ALL_SCOPES))
    admin("set-member-role", "--site", slug, "--member", "demo-owner", "--role", "owner")
    operator_sql(f"""SELECT querylayer_api.create_template('{slug}', 'article',
        '[{{"name": "title", "type": "text", "required": true}}, {{"name": "body", "type": "markdown", "required": true}}]')""")
    connection = admin("create-connection", "--site", slug, "--agent", "demo-agent", "--scopes", ",".join(ALL_SCOPES),
                       "--expires-in", "1 hour", "--name", f"other {RUN}", "--harness", "pytest")
    issued(connection["secret"])
    token = admin("create-member-token", "--site", slug, "--member", "demo-owner", "--expires-in", "1 hour")["token"]
    issued(token)
    secret = connection["secret"]
    admin("add-topic", "--site", slug, "--slug", f"other-topic-{RUN}", "--title", "Other topic")
    admin("import-strategy", "--site", slug, "--source", "other-export", "--file",
          json_file([{"id": f"other-opp-{RUN}", "topic": f"other-topic-{RUN}", "title": "Other page"}]))
    run = sync_call(secret, "querylayer_begin_run", {"run_type": "other.setup"})["run_id"]
    draft = sync_call(secret, "querylayer_create_draft", {
        "run_id": run, "template": "article", "slug": f"other-{RUN}",
        "fields": {"title": "Other", "body": "The other site says 42."}})
    package = sync_call(secret, "querylayer_stage_content_source_package", {
        "run_id": run, "name": "other package", "records": [{"title": "Other source", "url": "https://other.example/a"}]})
    opportunity = sync_call(secret, "querylayer_list_topical_strategy_opportunities", {})["opportunities"][0]
    proposal = sync_call(secret, "querylayer_propose_topical_strategy_opportunities", {
        "run_id": run, "opportunity_ids": [opportunity["opportunity_id"]]})
    decided = Console(token).post(f"/proposals/{proposal['proposal_id']}/approve")
    assert decided.status_code == 200 and decided.json()["state"] == "applied", decided.text
    brief = sync_call(secret, "querylayer_list_content_briefs", {})["briefs"][0]
    page = pages.put(f"/other-{RUN}", "<p>The other site says 42.</p>")
    evidence = sync_call(secret, "querylayer_record_claim_evidence", {
        "run_id": run, "revision_id": draft["revision_id"], "claim": "The other site says 42.",
        "source_url": pages.url(f"/other-{RUN}"), "quoted_span": "42", "retrieved_at": utc_now().isoformat(),
        "source_sha256": sha256(page)})
    return {"slug": slug, "secret": secret, "token": token, "run_id": run, "draft": draft, "package": package,
            "opportunity": opportunity, "brief": brief, "evidence": evidence, "topic": f"other-topic-{RUN}"}


# ---------------------------------------------------------------------------------------------
# Topical map, strategy and briefs.

async def test_strategy_opportunities_become_one_proposal_and_an_approval_commissions_one_brief(writer, readers, other):
    topic, new_topic = f"known-{RUN}", f"fresh-{RUN}"
    added = admin("add-topic", "--site", "demo", "--slug", topic, "--title", "Known topic")
    imported = admin("import-strategy", "--site", "demo", "--source", f"keyword-export-{RUN}", "--file", json_file([
        {"id": f"opp-known-{RUN}", "topic": topic, "title": "Pricing for teams", "signals": {"estimated_volume": 1200}},
        {"id": f"opp-fresh-{RUN}", "topic": new_topic, "title": "Pricing explained", "rationale": "gap"},
    ]))
    assert imported["imported"] == 2 and imported["site"] == "demo"
    owner = Console(member_token())
    async with client(writer) as c:
        topics = {t["slug"]: t for t in (await call(c, "querylayer_list_topical_map", {}))["topics"]}
        assert topics[topic] == {"topic_id": added["topic_id"], "slug": topic, "title": "Known topic", "parent": None, "pages": []}
        assert new_topic not in topics and other["topic"] not in topics

        queue = await call(c, "querylayer_list_topical_strategy_opportunities", {"limit": 500})
        assert "not measured search performance" in queue["note"]
        mine = {o["external_id"]: o for o in queue["opportunities"] if o["provenance"]["source"] == f"keyword-export-{RUN}"}
        known, fresh = mine[f"opp-known-{RUN}"], mine[f"opp-fresh-{RUN}"]
        assert (known["reconciliation_state"], fresh["reconciliation_state"]) == ("matched", "new")
        assert known["planning_signals"] == {"estimated_volume": 1200} and fresh["rationale"] == "gap"
        assert known["provenance"]["import_batch_id"] == imported["import_batch_id"] and known["proposal_id"] is None
        assert other["opportunity"]["opportunity_id"] not in [o["opportunity_id"] for o in queue["opportunities"]]
        only_new = await call(c, "querylayer_list_topical_strategy_opportunities", {"state": "new", "limit": 500})
        assert fresh["opportunity_id"] in [o["opportunity_id"] for o in only_new["opportunities"]]
        assert known["opportunity_id"] not in [o["opportunity_id"] for o in only_new["opportunities"]]

        run = (await call(c, "querylayer_begin_run", {"run_type": "strategy.triage"}))["run_id"]
        await refused(c, "querylayer_propose_topical_strategy_opportunities", {
            "run_id": run, "opportunity_ids": [other["opportunity"]["opportunity_id"]]}, "not_found", "opportunity_ids")
        await refused(c, "querylayer_propose_topical_strategy_opportunities", {
            "run_id": run, "opportunity_ids": []}, "invalid_argument", "opportunity_ids")
        await refused(c, "querylayer_propose_topical_strategy_opportunities", {
            "run_id": run, "opportunity_ids": ["not-a-uuid"]}, "invalid_argument", "`opportunity_ids[0]`")
        await refused(c, "querylayer_list_topical_strategy_opportunities", {"state": "hot"}, "invalid_argument", "state")
        await refused(c, "querylayer_list_topical_strategy_opportunities", {"limit": 0}, "invalid_argument", "limit")
        await refused(c, "querylayer_list_topical_map", {"site": "other"}, "invalid_argument", "site")
        # A hand-made topical_map proposal cannot claim to reconcile opportunities it does not plan.
        await refused(c, "querylayer_create_proposal", {
            "run_id": run, "type": "topical_map", "payload": {
                "opportunity_ids": [known["opportunity_id"]],
                "changes": [{"op": "add_topic", "slug": f"unrelated-{RUN}", "title": "Unrelated"}]}},
            "invalid_argument", "opportunity_ids")
        proposal = await call(c, "querylayer_propose_topical_strategy_opportunities", {
            "run_id": run, "opportunity_ids": [known["opportunity_id"], fresh["opportunity_id"]],
            "summary": "two pricing pages"})
        assert (proposal["type"], proposal["risk"], proposal["state"]) == ("topical_map", "medium", "pending")
        assert [(ch["op"], ch.get("slug") or ch.get("topic")) for ch in proposal["payload"]["changes"]] == [
            ("add_topic", new_topic), ("plan_page", new_topic), ("plan_page", topic)]
        queue = await call(c, "querylayer_list_topical_strategy_opportunities", {"state": "proposed", "limit": 500})
        proposed = {o["opportunity_id"]: o for o in queue["opportunities"]}
        assert proposed[known["opportunity_id"]]["proposal_id"] == proposal["proposal_id"]
        assert fresh["opportunity_id"] in proposed
        unchanged = {t["slug"] for t in (await call(c, "querylayer_list_topical_map", {}))["topics"]}
        assert new_topic not in unchanged, "proposing changes nothing"
        briefs_before = (await call(c, "querylayer_list_content_briefs", {"limit": 500}))["briefs"]

    approved = owner.post(f"/proposals/{proposal['proposal_id']}/approve")
    assert approved.status_code == 200 and approved.json()["state"] == "applied", approved.text
    brief_id = approved.json()["execution"]["detail"]["brief_id"]

    async with client(mint(ALL_SCOPES)["secret"]) as c:
        topics = {t["slug"] for t in (await call(c, "querylayer_list_topical_map", {}))["topics"]}
        assert new_topic in topics
        queue = await call(c, "querylayer_list_topical_strategy_opportunities", {"state": "accepted", "limit": 500})
        assert {known["opportunity_id"], fresh["opportunity_id"]} <= {o["opportunity_id"] for o in queue["opportunities"]}
        briefs = (await call(c, "querylayer_list_content_briefs", {"limit": 500}))["briefs"]
        assert len(briefs) == len(briefs_before) + 1, "exactly one brief per approval"
        brief = next(b for b in briefs if b["commissioned_by_proposal"] == proposal["proposal_id"])
        assert brief["brief_id"] == brief_id and len(brief["record_sha256"]) == 64
        assert [p["title"] for p in brief["brief"]["pages"]] == ["Pricing explained", "Pricing for teams"]
        assert other["brief"]["brief_id"] not in [b["brief_id"] for b in briefs]
        await refused(c, "querylayer_list_content_briefs", {"limit": 0}, "invalid_argument", "limit")

        # Contributor output for the brief: an inert card that cannot publish.
        run = (await call(c, "querylayer_begin_run", {"run_type": "brief.draft"}))["run_id"]
        draft = await call(c, "querylayer_create_draft", {
            "run_id": run, "template": "article", "slug": f"brief-{RUN}",
            "fields": {"title": "Pricing explained", "body": "What each plan includes."}})
        card = await call(c, "querylayer_propose_content_brief_draft", {
            "run_id": run, "brief_id": brief_id, "content_id": draft["content_id"],
            "revision_id": draft["revision_id"], "summary": "first draft for the brief"})
        assert (card["type"], card["risk"], card["state"]) == ("create_content", "medium", "pending")
        assert card["payload"]["brief_id"] == brief_id and card["author"]["run_id"] == run
        second = await call(c, "querylayer_create_draft", {
            "run_id": run, "content_id": draft["content_id"], "fields": {"title": "Pricing explained", "body": "More."}})
        revision_card = await call(c, "querylayer_propose_content_brief_draft", {
            "run_id": run, "brief_id": brief_id, "content_id": draft["content_id"], "revision_id": second["revision_id"]})
        assert revision_card["type"] == "revision"
        await refused(c, "querylayer_propose_content_brief_draft", {
            "run_id": run, "brief_id": other["brief"]["brief_id"], "content_id": draft["content_id"],
            "revision_id": draft["revision_id"]}, "not_found", "brief_id")
        await refused(c, "querylayer_propose_content_brief_draft", {
            "run_id": run, "brief_id": brief_id, "content_id": other["draft"]["content_id"],
            "revision_id": other["draft"]["revision_id"]}, "not_found", "revision_id")
        await refused(c, "querylayer_propose_content_brief_draft", {
            "run_id": run, "content_id": draft["content_id"], "revision_id": draft["revision_id"]},
            "invalid_argument", "brief_id")
        items = (await call(c, "querylayer_list_content", {"limit": 500}))["items"]
        assert next(i for i in items if i["content_id"] == draft["content_id"])["published_revision_id"] is None

    approve_card = owner.post(f"/proposals/{card['proposal_id']}/approve")
    assert approve_card.status_code == 200 and approve_card.json()["state"] == "approved"
    async with client(readers) as c:
        items = (await call(c, "querylayer_list_content", {"limit": 500}))["items"]
        assert next(i for i in items if i["content_id"] == draft["content_id"])["published_revision_id"] is None, \
            "an approved brief draft publishes nothing"


# ---------------------------------------------------------------------------------------------
# The source package ledger.

RECORDS = [
    {"title": "Pricing study", "url": "https://sources.example/pricing", "author": "Ann",
     "published_at": "2026-01-05", "body": "A long enough body. " * 15},
    {"title": "", "url": "ftp://sources.example/nope"},
    {"title": "Pricing study, mirrored", "url": "https://sources.example/pricing"},
]


async def test_staging_is_deterministic_keeps_invalid_records_and_changes_nothing_else(writer, other):
    before = counts_past_the_api()
    async with client(writer) as c:
        run = (await call(c, "querylayer_begin_run", {"run_type": "sources.stage"}))["run_id"]
        records = [dict(r, note=RUN) for r in RECORDS]
        first = await call(c, "querylayer_stage_content_source_package", {
            "run_id": run, "name": "pricing sources", "records": records, "source": "desk research"})
        second = await call(c, "querylayer_stage_content_source_package", {
            "run_id": run, "name": "pricing sources, again", "records": records})
        assert (first["resubmitted"], second["resubmitted"]) == (False, True)
        assert second["package_id"] == first["package_id"]
        for key in ("package_sha256", "warnings", "records", "record_count", "invalid_count"):
            assert first[key] == second[key], key
        assert len(first["package_sha256"]) == 64 and first["invalid_count"] == 1 and first["record_count"] == 3
        assert first["warnings"] == ["1 of 3 records are invalid and were kept for review",
                                     "url https://sources.example/pricing appears in records 0, 2"]
        assert [r["valid"] for r in first["records"]] == [True, False, True]
        assert first["records"][1]["problems"] == ["title: text of 1 to 300 characters is required",
                                                   "url: an http(s) URL is required"]
        assert first["records"][2]["warnings"] == ["body: missing", "author: missing", "published_at: missing"]
        assert all(len(r["record_sha256"]) == 64 for r in first["records"])
        assert len({r["record_sha256"] for r in first["records"]}) == 3

        # The other site's identical package is not a resubmission here: ledgers are per site.
        twin = await call(c, "querylayer_stage_content_source_package", {
            "run_id": run, "name": "twin", "records": [{"title": "Other source", "url": "https://other.example/a"}]})
        assert twin["resubmitted"] is False and twin["package_sha256"] == other["package"]["package_sha256"]
        assert twin["package_id"] != other["package"]["package_id"]

        # Validation is deterministic: the same records staged afresh on the other site (a ledger
        # of its own, so validated again rather than recognised) get the same checksums,
        # warnings and problems.
        async with client(other["secret"]) as oc:
            other_run = (await call(oc, "querylayer_begin_run", {"run_type": "sources.stage"}))["run_id"]
            afresh = await call(oc, "querylayer_stage_content_source_package", {
                "run_id": other_run, "name": "pricing sources elsewhere", "records": records})
        assert afresh["resubmitted"] is False and afresh["package_id"] != first["package_id"]
        for key in ("package_sha256", "warnings", "record_count", "invalid_count"):
            assert afresh[key] == first[key], key
        verdicts = lambda package: [{k: r.get(k) for k in ("record_sha256", "valid", "problems", "warnings")}
                                    for r in package["records"]]
        assert verdicts(afresh) == verdicts(first)

        packages = (await call(c, "querylayer_list_content_source_packages", {"limit": 500}))["packages"]
        assert [p["package_id"] for p in packages].count(first["package_id"]) == 1
        assert other["package"]["package_id"] not in [p["package_id"] for p in packages]
        listed = next(p for p in packages if p["package_id"] == first["package_id"])
        assert listed["package_sha256"] == first["package_sha256"] and listed["warnings"] == first["warnings"]

        invalid = (await call(c, "querylayer_list_content_source_records", {
            "package_id": first["package_id"], "valid": False}))["records"]
        assert [(r["ordinal"], r["record"], r["problems"]) for r in invalid] == [
            (1, records[1], first["records"][1]["problems"])]
        everything = (await call(c, "querylayer_list_content_source_records", {"package_id": first["package_id"]}))["records"]
        assert [r["record"] for r in everything] == records
        assert [r["record_sha256"] for r in everything] == [r["record_sha256"] for r in first["records"]]

        await refused(c, "querylayer_list_content_source_records", {"package_id": other["package"]["package_id"]},
                      "not_found")
        await refused(c, "querylayer_list_content_source_records", {}, "invalid_argument", "package_id")
        await refused(c, "querylayer_stage_content_source_package", {"run_id": run, "name": "empty", "records": []},
                      "invalid_argument", "records")
        await refused(c, "querylayer_stage_content_source_package", {"run_id": run, "name": "", "records": records},
                      "invalid_argument", "name")
        await refused(c, "querylayer_stage_content_source_package", {
            "run_id": other["run_id"], "name": "foreign run", "records": records[:1]}, "not_found", "run")
        await refused(c, "querylayer_list_content_source_packages", {"limit": 501}, "invalid_argument", "limit")

    assert counts_past_the_api() == before, "staging created content, revisions, proposals or publishing"

    async with client(mint(ALL_SCOPES)["secret"]) as c:
        run = (await call(c, "querylayer_begin_run", {"run_type": "sources.draft"}))["run_id"]
        draft = await call(c, "querylayer_create_draft", {
            "run_id": run, "template": "article", "slug": f"sourced-{RUN}",
            "fields": {"title": "Pricing, sourced", "body": "From the study."}})
        valid_ids = [r["record_id"] for r in first["records"] if r["valid"]]
        invalid_id = first["records"][1]["record_id"]
        card = await call(c, "querylayer_propose_content_source_draft", {
            "run_id": run, "package_id": first["package_id"], "record_ids": valid_ids,
            "content_id": draft["content_id"], "revision_id": draft["revision_id"], "summary": "from staged sources"})
        assert (card["type"], card["state"]) == ("create_content", "pending")
        assert card["payload"]["source_record_ids"] == valid_ids
        assert card["payload"]["source_package_id"] == first["package_id"]
        base = {"run_id": run, "content_id": draft["content_id"], "revision_id": draft["revision_id"]}
        await refused(c, "querylayer_propose_content_source_draft", {
            **base, "package_id": first["package_id"], "record_ids": [invalid_id]}, "invalid_argument", "record_ids", "invalid")
        await refused(c, "querylayer_propose_content_source_draft", {
            **base, "package_id": first["package_id"], "record_ids": []}, "invalid_argument", "record_ids")
        await refused(c, "querylayer_propose_content_source_draft", {
            **base, "package_id": other["package"]["package_id"],
            "record_ids": [r["record_id"] for r in other["package"]["records"]]}, "not_found", "package_id")
        await refused(c, "querylayer_propose_content_source_draft", {
            **base, "package_id": first["package_id"],
            "record_ids": [other["package"]["records"][0]["record_id"]]}, "not_found", "record_ids")


# ---------------------------------------------------------------------------------------------
# Claim evidence and its re-verification.

CLAIM = "Plans start at 9 euros a month."


async def draft_with_claim(c, slug: str) -> tuple[str, dict]:
    run = (await call(c, "querylayer_begin_run", {"run_type": "evidence.record"}))["run_id"]
    draft = await call(c, "querylayer_create_draft", {
        "run_id": run, "template": "article", "slug": slug,
        "fields": {"title": "Pricing", "body": f"Our offer. {CLAIM} Cancel any time."}})
    return run, draft


async def test_claim_evidence_is_recorded_listed_and_refused(writer, pages, other):
    page = pages.put(f"/evidence-{RUN}", f"<html><body><p>{CLAIM}</p></body></html>")
    async with client(writer) as c:
        run, draft = await draft_with_claim(c, f"evidence-{RUN}")
        arguments = {"run_id": run, "revision_id": draft["revision_id"], "claim": CLAIM,
                     "source_url": pages.url(f"/evidence-{RUN}"), "quoted_span": "Plans start at 9 euros",
                     "retrieved_at": utc_now().isoformat(), "source_sha256": sha256(page).upper()}
        evidence = await call(c, "querylayer_record_claim_evidence", arguments)
        assert evidence["source_sha256"] == sha256(page) and evidence["content_id"] == draft["content_id"]
        assert len(evidence["record_sha256"]) == 64

        by_content = (await call(c, "querylayer_list_evidence", {"content_id": draft["content_id"]}))["evidence"]
        by_revision = (await call(c, "querylayer_list_evidence", {"revision_id": draft["revision_id"]}))["evidence"]
        assert by_content == by_revision and len(by_content) == 1
        item = by_content[0]
        assert (item["evidence_id"], item["claim"], item["quoted_span"], item["run_id"]) == (
            evidence["evidence_id"], CLAIM, "Plans start at 9 euros", run)
        everything = (await call(c, "querylayer_list_evidence", {}))["evidence"]
        assert evidence["evidence_id"] in [e["evidence_id"] for e in everything]
        assert other["evidence"]["evidence_id"] not in [e["evidence_id"] for e in everything]
        assert (await call(c, "querylayer_list_evidence", {"content_id": other["draft"]["content_id"]}))["evidence"] == []

        state = (await call(c, "querylayer_list_evidence_reverification", {"content_id": draft["content_id"]}))["evidence"]
        assert len(state) == 1
        assert state[0]["target"] == {"evidence_id": evidence["evidence_id"], "content_id": draft["content_id"],
                                      "revision_id": draft["revision_id"], "source_url": arguments["source_url"]}
        assert state[0]["due_job"]["state"] == "due" and state[0]["attempts"] == 0
        assert state[0]["last_attempt"] is None and state[0]["open_review"] is None
        assert set(state[0]) == {"target", "due_job", "last_attempt", "attempts", "open_review"}
        assert (await call(c, "querylayer_list_evidence_reverification", {
            "content_id": other["draft"]["content_id"]}))["evidence"] == []
        all_states = (await call(c, "querylayer_list_evidence_reverification", {}))["evidence"]
        assert other["evidence"]["evidence_id"] not in [s["target"]["evidence_id"] for s in all_states]

        await refused(c, "querylayer_record_claim_evidence", {**arguments, "claim": "Plans are free."},
                      "invalid_argument", "claim")
        await refused(c, "querylayer_record_claim_evidence", {**arguments, "source_sha256": "abc"},
                      "invalid_argument", "source_sha256")
        await refused(c, "querylayer_record_claim_evidence", {**arguments, "source_url": "ftp://x.example/a"},
                      "invalid_argument", "source_url")
        future = (utc_now() + datetime.timedelta(days=1)).isoformat()
        await refused(c, "querylayer_record_claim_evidence", {**arguments, "retrieved_at": future},
                      "invalid_argument", "retrieved_at")
        await refused(c, "querylayer_record_claim_evidence", {**arguments, "revision_id": other["draft"]["revision_id"]},
                      "not_found", "revision_id")
        await refused(c, "querylayer_list_evidence", {"content_id": draft["content_id"], "site": "other"},
                      "invalid_argument", "site")
        await refused(c, "querylayer_list_evidence_reverification", {"evidence_id": evidence["evidence_id"]},
                      "invalid_argument", "evidence_id")
        await refused(c, "querylayer_list_evidence", {"content_id": "not-a-uuid"}, "invalid_argument", "`content_id`")


async def test_the_worker_rechecks_a_changing_page_and_opens_exactly_one_review(writer, pages):
    path = f"/worker-{RUN}"
    first = pages.put(path, f"<html><body><h1>Pricing</h1><p>{CLAIM}</p></body></html>")
    owner = Console(member_token())
    async with client(writer) as c:
        run, draft = await draft_with_claim(c, f"worker-{RUN}")
        evidence = await call(c, "querylayer_record_claim_evidence", {
            "run_id": run, "revision_id": draft["revision_id"], "claim": CLAIM, "source_url": pages.url(path),
            "quoted_span": CLAIM, "retrieved_at": utc_now().isoformat(), "source_sha256": sha256(first)})

    async def state() -> dict:
        async with client(writer) as c:
            rows = (await call(c, "querylayer_list_evidence_reverification", {"content_id": draft["content_id"]}))["evidence"]
        assert len(rows) == 1
        return rows[0]

    def reviews() -> list:
        listed = owner.get("/evidence-reviews", state="all")
        assert listed.status_code == 200
        return [r for r in listed.json()["reviews"] if r["evidence"]["evidence_id"] == evidence["evidence_id"]]

    # By default the worker refuses a loopback address: an error attempt, no request made.
    assert admin("make-evidence-due", "--site", "demo") >= 1
    log = run_worker()
    assert pages.hits.get(path, 0) == 0
    s = await state()
    assert (s["attempts"], s["last_attempt"]["status"], s["open_review"]) == (1, "error", None)
    assert s["due_job"]["state"] == "due", "an error is retried"

    # Same page: unchanged.
    admin("make-evidence-due", "--site", "demo")
    log += run_worker("--allow-private-networks")
    assert pages.hits[path] == 1
    s = await state()
    assert (s["attempts"], s["last_attempt"]["status"], s["open_review"]) == (2, "unchanged", None)
    assert s["due_job"] is not None

    # The page changes: one review opens.
    changed = pages.put(path, f"<html><body><h1>Pricing</h1><p>Plans start at 12 euros. {OBSERVED_BODY}</p></body></html>")
    SEEN_HASHES.append(sha256(changed))
    admin("make-evidence-due", "--site", "demo")
    log += run_worker("--allow-private-networks")
    assert pages.hits[path] == 2
    s = await state()
    assert (s["attempts"], s["last_attempt"]["status"]) == (3, "changed")
    assert s["open_review"]["reason"] == "changed" and s["due_job"] is None

    # It changes again while the review is open: nothing more is fetched or opened.
    pages.put(path, f"<p>Plans start at 15 euros. {OBSERVED_BODY}</p>")
    admin("make-evidence-due", "--site", "demo")
    log += run_worker("--allow-private-networks")
    assert pages.hits[path] == 2
    assert (await state())["attempts"] == 3
    opened = reviews()
    assert len(opened) == 1, "exactly one review"
    review = opened[0]
    assert (review["reason"], review["state"]) == ("changed", "open")
    assert review["observed"]["http_status"] == 200 and review["observed"]["sha256"] == sha256(changed)
    assert review["observed"]["excerpt"] == f"Pricing Plans start at 12 euros. {OBSERVED_BODY}"
    assert OBSERVED_BODY not in log and path not in log, "the worker logs no body, excerpt or URL"
    assert '"review_opened":true' in log.replace(" ", "")

    assert Console(member_token(role="viewer")).post(f"/evidence-reviews/{review['review_id']}/close").status_code == 403
    closed = owner.post(f"/evidence-reviews/{review['review_id']}/close", {"note": REVIEWER_NOTE})
    assert closed.status_code == 200 and closed.json() == {"review_id": review["review_id"], "state": "closed"}
    assert owner.post(f"/evidence-reviews/{review['review_id']}/close").status_code == 404
    assert review["review_id"] not in [r["review_id"] for r in owner.get("/evidence-reviews").json()["reviews"]]
    assert reviews()[0]["reviewer_note"] == REVIEWER_NOTE
    s = await state()
    assert s["open_review"] is None and s["due_job"]["state"] == "due", "re-verification resumes"


async def test_a_job_left_running_by_a_worker_that_died_is_taken_again(writer, pages):
    path = f"/abandoned-{RUN}"
    page = pages.put(path, f"<p>{CLAIM}</p>")
    async with client(writer) as c:
        run, draft = await draft_with_claim(c, f"abandoned-{RUN}")
        evidence = await call(c, "querylayer_record_claim_evidence", {
            "run_id": run, "revision_id": draft["revision_id"], "claim": CLAIM, "source_url": pages.url(path),
            "quoted_span": CLAIM, "retrieved_at": utc_now().isoformat(), "source_sha256": sha256(page)})
    # A worker took the job five minutes ago and died: the job is still its own.
    taken = ("UPDATE querylayer.evidence_jobs SET state = 'running', due_at = now(), "
             "started_at = now() - interval '{age}' WHERE evidence_id = '{id}' AND state <> 'done'")
    superuser_sql(taken.format(age="5 minutes", id=evidence["evidence_id"]))
    run_worker("--allow-private-networks")
    assert pages.hits.get(path, 0) == 0
    # Twenty minutes on, it is taken again.
    superuser_sql(taken.format(age="20 minutes", id=evidence["evidence_id"]))
    run_worker("--allow-private-networks")
    assert pages.hits[path] == 1
    async with client(writer) as c:
        state = (await call(c, "querylayer_list_evidence_reverification", {"content_id": draft["content_id"]}))["evidence"]
    assert (state[0]["attempts"], state[0]["last_attempt"]["status"]) == (1, "unchanged")
    assert state[0]["due_job"]["state"] == "due"


def test_the_worker_acts_only_through_the_worker_role():
    from harness import EDGE_DB_URL
    done = worker_once(EDGE_DB_URL, timeout=60)
    assert done.returncode == 1, done.stderr
    assert '"code":"permission_denied"' in done.stderr.replace(" ", "")


# ---------------------------------------------------------------------------------------------
# Form screening.

def event(form: str, decision: str, reason: str, when: datetime.datetime, private: bool = True) -> dict:
    e = {"form": form, "decision": decision, "reason": reason, "occurred_at": when.isoformat()}
    if private:
        e.update(payload={"message": FORM_PAYLOAD}, contact=CONTACT, actor=ACTOR, network_marker=NETWORK,
                 raw_signals={"score": RAW_SIGNAL})
    return e


@pytest.fixture(scope="module")
def screened(other) -> dict:
    """A form with events now (console), 20 and 40 days ago (operator), and the same form key on
    the other site."""
    form = f"contact-{RUN}"
    noon = utc_now().replace(hour=12, minute=0, second=0, microsecond=0)
    recent, middle, old = noon - datetime.timedelta(days=2), noon - datetime.timedelta(days=20), noon - datetime.timedelta(days=40)
    owner = Console(member_token())
    reported = owner.post("/form-screening", {"events": [
        event(form, "accepted", "clean", recent), event(form, "accepted", "clean", recent, private=False),
        event(form, "rejected", "spam", recent), event(form, "rejected", "spam", recent),
        event(form, "review", "link-heavy", recent)]})
    assert reported.status_code == 200 and reported.json() == {"recorded": 5}, reported.text
    assert admin("report-form-screening", "--site", "demo", "--file", json_file([
        event(form, "rejected", "spam", middle),
        event(form, "rejected", "spam", old), event(form, "rejected", "spam", old), event(form, "rejected", "bot", old),
        event(form, "accepted", "clean", old)])) == {"recorded": 5}
    assert admin("report-form-screening", "--site", other["slug"], "--file", json_file([
        event(form, "rejected", "spam", old), event(form, "accepted", "clean", recent)])) == {"recorded": 2}
    d = lambda t: t.date().isoformat()  # noqa: E731
    # Rejected-event totals follow the 30-day retention window: the 40-day-old rejections are
    # stored in the day aggregates but never reported; accepted and review totals are.
    expected = sorted([
        (d(old), "accepted", "clean", 1),
        (d(middle), "rejected", "spam", 1),
        (d(recent), "accepted", "clean", 2), (d(recent), "rejected", "spam", 2), (d(recent), "review", "link-heavy", 1)])
    beyond_window = sorted([(d(old), "rejected", "bot", 1), (d(old), "rejected", "spam", 2)])
    return {"form": form, "expected": expected, "beyond_window": beyond_window, "old_day": d(old)}


def as_rows(metrics: dict) -> list:
    return sorted((c["day"], c["decision"], c["reason"], c["count"]) for c in metrics["counts"])


async def test_form_screening_metrics_are_aggregates_of_this_site_only(writer, readers, screened):
    async with client(writer) as c:
        metrics = await call(c, "querylayer_form_screening_metrics", {"days": 60, "form": screened["form"]})
        assert metrics["days"] == 60 and metrics["rejected_raw_retention_days"] == 30
        assert metrics["rejected_since"] == (utc_now() - datetime.timedelta(days=30)).date().isoformat()
        assert as_rows(metrics) == screened["expected"], "the other site's events are not counted"
        assert {c["form"] for c in metrics["counts"]} == {screened["form"]}
        assert set(metrics["counts"][0]) == {"day", "form", "decision", "reason", "count"}
        default = await call(c, "querylayer_form_screening_metrics", {"form": screened["form"]})
        assert default["days"] == 30 and len(default["counts"]) == 4, "the last 30 days"
        await refused(c, "querylayer_form_screening_metrics", {"days": 0}, "invalid_argument", "days")
        await refused(c, "querylayer_form_screening_metrics", {"days": "many"}, "invalid_argument", "`days`")
        await refused(c, "querylayer_form_screening_metrics", {"form": screened["form"], "contact": "x"},
                      "invalid_argument", "contact")
    owner = Console(member_token())
    bad = owner.post("/form-screening", {"events": [{"form": screened["form"], "decision": "maybe", "reason": "x"}]})
    assert bad.status_code == 400 and "events[0].decision" in bad.json()["error"]["message"]
    assert owner.post("/form-screening", {"rows": []}).status_code == 400
    viewer = Console(member_token(role="viewer"))
    assert viewer.post("/form-screening", {"events": [event(screened["form"], "accepted", "clean", utc_now())]}).status_code == 403


async def test_the_retention_purge_removes_old_raw_rejections_and_keeps_the_aggregates(writer, screened):
    form = screened["form"]
    raw = ("SELECT count(*) FROM querylayer.form_screening_events WHERE form_key = '{form}' AND decision = '{decision}'"
           " AND site_id = (SELECT id FROM querylayer.sites WHERE slug = 'demo')"
           " AND occurred_at {op} now() - make_interval(days => 30)")
    assert admin("set-setting", "--key", "form_rejected_retention_days", "--value", "30")
    async with client(writer) as c:
        before = await call(c, "querylayer_form_screening_metrics", {"days": 60, "form": form})
    assert superuser_sql(raw.format(form=form, decision="rejected", op="<")) == "3"
    stored = ("SELECT coalesce(json_agg(json_build_array(day::text, decision, reason, events) ORDER BY day, decision, reason), '[]')"
              f" FROM querylayer.form_screening_daily WHERE form_key = '{form}' AND decision = 'rejected'"
              f" AND day = '{screened['old_day']}' AND site_id = (SELECT id FROM querylayer.sites WHERE slug = 'demo')")
    assert [tuple(r) for r in json.loads(superuser_sql(stored))] == screened["beyond_window"], \
        "the day totals beyond the window are stored, and not reported"
    assert superuser_sql(f"SELECT count(*) FROM querylayer.form_screening_events WHERE payload->>'message' = '{FORM_PAYLOAD}'"
                         f" AND contact = '{CONTACT}'") == "11", "both sites' private fields are stored"

    log = run_worker("--allow-private-networks")
    assert '"deleted":' in log.replace(" ", "")

    assert superuser_sql(raw.format(form=form, decision="rejected", op="<")) == "0", "old raw rejections are gone"
    assert superuser_sql(raw.format(form=form, decision="rejected", op=">=")) == "3", "recent rejections stay"
    assert superuser_sql(raw.format(form=form, decision="accepted", op="<")) == "1", "only rejections are purged"
    async with client(writer) as c:
        after = await call(c, "querylayer_form_screening_metrics", {"days": 60, "form": form})
    assert after == before and as_rows(after) == screened["expected"], "what is reported is unchanged by the purge"
    again = admin("purge-form-screening")
    assert again == {"deleted": 0, "retention_days": 30}


# ---------------------------------------------------------------------------------------------
# Scopes, and what never reaches an agent.

async def test_every_editorial_tool_refuses_a_connection_without_its_scope(site_only, readers):
    some = str(uuid.uuid4())
    needs_content_read = {
        "querylayer_list_content_briefs": {},
        "querylayer_list_content_source_packages": {},
        "querylayer_list_content_source_records": {"package_id": some},
        "querylayer_list_evidence": {},
        "querylayer_list_evidence_reverification": {},
        "querylayer_list_topical_map": {},
        "querylayer_list_topical_strategy_opportunities": {},
    }
    needs_write = {
        "querylayer_propose_topical_strategy_opportunities": ({"run_id": some, "opportunity_ids": [some]}, "topical-map:write"),
        "querylayer_propose_content_brief_draft": (
            {"run_id": some, "brief_id": some, "content_id": some, "revision_id": some}, "content:write"),
        "querylayer_stage_content_source_package": ({"run_id": some, "name": "n", "records": [{}]}, "content:write"),
        "querylayer_propose_content_source_draft": (
            {"run_id": some, "package_id": some, "record_ids": [some], "content_id": some, "revision_id": some},
            "content:write"),
        "querylayer_record_claim_evidence": (
            {"run_id": some, "revision_id": some, "claim": "c", "source_url": "https://x.example", "quoted_span": "q",
             "retrieved_at": utc_now().isoformat(), "source_sha256": "a" * 64}, "content:write"),
    }
    async with client(site_only) as c:
        visible = {t.name for t in (await c.list_tools()).tools}
        assert visible & TOOLS == {"querylayer_form_screening_metrics"}
        for tool, arguments in needs_content_read.items():
            scope = "topical-map:read" if "topical" in tool else "content:read"
            await refused(c, tool, arguments, "forbidden", scope)
        structured(await c.call_tool("querylayer_form_screening_metrics", {}))
    async with client(readers) as c:
        visible = {t.name for t in (await c.list_tools()).tools}
        assert visible & TOOLS == set(needs_content_read)
        await refused(c, "querylayer_form_screening_metrics", {}, "forbidden", "site:read")
        for tool, (arguments, scope) in needs_write.items():
            await refused(c, tool, arguments, "forbidden", scope)


async def test_no_tool_response_carries_form_payloads_contacts_observed_bodies_or_reviewer_notes(writer):
    # What must never reach an agent is in the database (so this check can fail) ...
    assert superuser_sql(f"SELECT count(*) > 0 FROM querylayer.form_screening_events WHERE contact = '{CONTACT}'"
                         f" AND actor = '{ACTOR}' AND network_marker = '{NETWORK}'") == "t"
    assert superuser_sql(f"SELECT count(*) FROM querylayer.evidence_attempts WHERE observed_excerpt LIKE '%{OBSERVED_BODY}%'") == "1"
    assert superuser_sql(f"SELECT count(*) FROM querylayer.evidence_reviews WHERE reviewer_note = '{REVIEWER_NOTE}'") == "1"
    # ... and every read tool, once more, plus every response of this module, is free of it.
    async with client(writer) as c:
        for tool in sorted(TOOLS):
            if "_list_" in tool and tool != "querylayer_list_content_source_records":
                structured(await c.call_tool(tool, {}))
        structured(await c.call_tool("querylayer_form_screening_metrics", {"days": 366}))
        for package in (await call(c, "querylayer_list_content_source_packages", {"limit": 500}))["packages"]:
            structured(await c.call_tool("querylayer_list_content_source_records", {"package_id": package["package_id"]}))
    assert CALLED >= TOOLS, f"not exercised: {TOOLS - CALLED}"
    assert len(RESPONSES) > 50
    for body in RESPONSES:
        never_leaks(body)

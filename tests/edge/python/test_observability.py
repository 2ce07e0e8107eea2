"""Request ids, Prometheus metrics and OTLP traces of the running edge (edge A of
scripts/test-edge, started with --metrics-listen and --otlp-endpoint to a local receiver)."""

import json
import os
import re
import time
import uuid

import httpx2
import pytest

from harness import EDGE, mint, raw_post

METRICS = os.environ.get("QUERYLAYER_METRICS_URL", "")
TRACES = os.environ.get("QUERYLAYER_OTLP_CAPTURE", "")
LOG = os.environ.get("QUERYLAYER_EDGE_LOG", "")

pytestmark = pytest.mark.skipif(not METRICS, reason="edge A runs without --metrics-listen")


def scrape() -> dict[str, float]:
    text = httpx2.get(METRICS, timeout=10).text
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def tool_call(secret: str, name: str, arguments: dict, request_id: str | None = None):
    headers = {"x-request-id": request_id} if request_id else {}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    return raw_post(body, secret, headers)


def test_every_response_carries_a_request_id_and_a_sane_incoming_one_is_kept():
    generated = httpx2.get(EDGE + "/healthz").headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f-]{36}", generated)
    assert httpx2.get(EDGE + "/healthz").headers["x-request-id"] != generated
    kept = httpx2.get(EDGE + "/healthz", headers={"x-request-id": "client-42.a_b:c"})
    assert kept.headers["x-request-id"] == "client-42.a_b:c"
    for insane in ["has space", "x" * 65, "quote\"d"]:
        replaced = httpx2.get(EDGE + "/healthz", headers={"x-request-id": insane}).headers["x-request-id"]
        assert replaced != insane and re.fullmatch(r"[0-9a-f-]{36}", replaced)
    # A refusal before any route (a 401 on /mcp) carries one too.
    assert raw_post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).headers["x-request-id"]


def test_the_request_id_is_in_the_request_line_and_the_tool_call_line_of_the_log():
    if not LOG:
        pytest.skip("no edge log given")
    secret = mint(["site:read"])["secret"]
    request_id = f"obs-{uuid.uuid4().hex}"
    assert tool_call(secret, "querylayer_site_context", {}, request_id).status_code == 200
    time.sleep(0.3)
    lines = [json.loads(l) for l in open(LOG, encoding="utf-8") if request_id in l]
    messages = {line.get("message") for line in lines}
    assert {"request", "tool call"} <= messages, lines
    assert all(line["span"]["request_id"] == request_id for line in lines), lines


def test_metrics_count_tool_calls_refusals_database_errors_and_show_the_pool():
    before = scrape()
    secret = mint(["site:read"])["secret"]
    ok = 'querylayer_tool_calls_total{tool="querylayer_site_context",outcome="ok",code=""}'
    refused = 'querylayer_tool_calls_total{tool="querylayer_begin_run",outcome="error",code="forbidden"}'
    assert tool_call(secret, "querylayer_site_context", {}).status_code == 200
    assert tool_call(secret, "querylayer_site_context", {}).status_code == 200
    # A scope the connection lacks: refused by the database (QL403), counted by code.
    assert tool_call(secret, "querylayer_begin_run", {"run_type": "metrics.check"}).status_code == 200
    # A dead secret: 401, an authentication refusal.
    assert tool_call("qlc_" + "0" * 40, "querylayer_site_context", {}).status_code == 401
    after = scrape()
    assert after[ok] - before.get(ok, 0) == 2, {k: v for k, v in after.items() if "tool_calls" in k}
    assert after.get(refused, 0) - before.get(refused, 0) == 1, {k: v for k, v in after.items() if "tool_calls" in k}
    refusal = 'querylayer_refusals_total{reason="authentication_failed",route="/mcp"}'
    assert after[refusal] - before.get(refusal, 0) >= 1
    latency = 'querylayer_tool_call_duration_seconds_count{tool="querylayer_site_context"}'
    assert after[latency] - before.get(latency, 0) == 2
    assert after['querylayer_http_request_duration_seconds_bucket{route="/mcp",le="+Inf"}'] > 0
    assert after['querylayer_database_errors_total{sqlstate="QL403"}'] >= 1
    assert after["querylayer_pool_wait_seconds_count"] > before.get("querylayer_pool_wait_seconds_count", 0)
    assert after["querylayer_pool_size"] >= 1 and "querylayer_pool_waiting" in after
    # The metrics are on their own listener, not on the edge's.
    assert httpx2.get(EDGE + "/metrics").status_code == 404


def test_a_tool_call_reaches_the_otlp_receiver_as_one_trace():
    if not TRACES:
        pytest.skip("edge A runs without --otlp-endpoint")
    secret = mint(["site:read"])["secret"]
    request_id = f"trace-{uuid.uuid4().hex}"
    trace_id = uuid.uuid4().hex
    parent = uuid.uuid4().hex[:16]
    headers = {"x-request-id": request_id, "traceparent": f"00-{trace_id}-{parent}-01"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "querylayer_site_context", "arguments": {}}}
    assert raw_post(body, secret, headers).status_code == 200
    spans = []
    for _ in range(50):
        time.sleep(0.2)
        spans = [span
                 for line in open(TRACES, encoding="utf-8")
                 for resource in json.loads(line)["resourceSpans"]
                 for scope in resource["scopeSpans"]
                 for span in scope["spans"]
                 if span["traceId"] == trace_id]
        if {"request", "tool", "db"} <= {s["name"] for s in spans}:
            break
    by_name = {s["name"]: s for s in spans}
    assert {"request", "tool", "db"} <= set(by_name), spans
    attrs = lambda s: {a["key"]: a["value"]["stringValue"] for a in s["attributes"]}
    request, tool, db = by_name["request"], by_name["tool"], by_name["db"]
    # The caller's trace continues: the request span's parent is the caller's span.
    assert request["parentSpanId"] == parent and request["kind"] == 2
    assert attrs(request)["request_id"] == request_id and attrs(request)["http.route"] == "/mcp"
    assert attrs(request)["http.response.status_code"] == "200"
    assert tool["parentSpanId"] == request["spanId"] and attrs(tool)["tool"] == "querylayer_site_context"
    assert db["parentSpanId"] == tool["spanId"] and attrs(db)["db.operation.name"] == "site_context"
    assert int(request["startTimeUnixNano"]) <= int(tool["startTimeUnixNano"]) <= int(db["endTimeUnixNano"])

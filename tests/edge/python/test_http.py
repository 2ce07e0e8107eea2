"""The HTTP surface around MCP: resource metadata, health, Host and Origin checks, limits."""

import concurrent.futures

import httpx2

from harness import EDGE, mint, raw_post

TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


def test_protected_resource_metadata_describes_the_mcp_endpoint():
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        meta = httpx2.get(EDGE + path).json()
        assert meta["resource"] == EDGE + "/mcp"
        assert meta["bearer_methods_supported"] == ["header"]
        assert "runs:write" in meta["scopes_supported"]
    challenge = raw_post(TOOLS_LIST).headers["www-authenticate"]
    assert challenge == f'Bearer resource_metadata="{EDGE}/.well-known/oauth-protected-resource"'


def test_health_and_readiness():
    assert httpx2.get(EDGE + "/healthz").json() == {"status": "ok"}
    ready = httpx2.get(EDGE + "/readyz").json()
    # Both versions, and they agree: the edge speaks the extension version the database holds.
    assert ready["status"] == "ready" and ready["versions"]["edge"] == ready["versions"]["extension"], ready
    missing = httpx2.get(EDGE + "/nowhere")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_a_foreign_origin_is_refused_with_or_without_a_secret():
    secret = mint()["secret"]
    for s in (None, secret):
        r = raw_post(TOOLS_LIST, s, headers={"origin": "http://evil.example.com"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_origin"
    assert raw_post(TOOLS_LIST, secret, headers={"origin": "http://localhost:5173"}).status_code == 200
    assert raw_post(TOOLS_LIST, secret, headers={"origin": "null"}).status_code == 403


def test_a_foreign_host_is_refused():
    secret = mint()["secret"]
    r = raw_post(TOOLS_LIST, secret, headers={"host": "evil.example.com"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_host"
    assert raw_post(TOOLS_LIST, secret, headers={"host": "localhost:1"}).status_code == 200


def test_an_oversized_body_is_refused():
    secret = mint()["secret"]
    huge = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "querylayer_list_content", "arguments": {"pad": "x" * (3 * 1024 * 1024)}}}
    refused = raw_post(huge, secret)
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "payload_too_large"


def test_a_connection_over_its_rate_is_answered_429_with_retry_after():
    secret = mint()["secret"]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(lambda _: raw_post(TOOLS_LIST, secret), range(150)))
    statuses = {r.status_code for r in responses}
    assert statuses <= {200, 429} and 429 in statuses
    limited = next(r for r in responses if r.status_code == 429)
    assert int(limited.headers["retry-after"]) >= 1
    assert limited.json()["error"]["code"] == "rate_limited"
    # Another connection has its own bucket.
    assert raw_post(TOOLS_LIST, mint()["secret"]).status_code == 200

"""The HTTP surface around MCP: resource metadata, health, Host and Origin checks, limits."""

import concurrent.futures

import httpx2

from harness import EDGE, EDGE_B, mint, peer, raw_post, serve

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
    ready = httpx2.get(EDGE + "/readyz")
    assert ready.status_code == 200
    report = ready.json()
    assert report["status"] == "ready"
    # What it checked: reachable, the version this edge speaks, writable (not a standby, not
    # read-only, room on disk).
    assert report["checks"]["database"]["ok"] is True
    assert report["checks"]["version"]["ok"] is True
    writable = report["checks"]["writable"]
    assert writable["ok"] is True and writable["in_recovery"] is False and writable["read_only"] is False
    assert writable["free_bytes"] > writable["min_free_bytes"]
    # Both versions, and they agree: the edge speaks the extension version the database holds.
    assert report["versions"]["edge"] == report["versions"]["extension"], report
    assert "extension_version" not in report, "one extension version, under versions"
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
    assert refused.status_code == 413
    assert refused.json()["error"]["data"]["code"] == "payload_too_large"


def test_a_connection_over_its_rate_gets_the_retry_later_error():
    secret = mint()["secret"]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(lambda _: raw_post(TOOLS_LIST, secret), range(150)))
    # Over the rate, each request gets its JSON-RPC error (the one "retry later" shape of /mcp).
    assert {r.status_code for r in responses} == {200}
    limited = [r for r in responses if "error" in r.json()]
    assert limited, "some requests were over the rate"
    error = limited[0].json()["error"]
    assert limited[0].json()["id"] == 1
    assert error["code"] == -32010 and error["data"]["code"] == "rate_limited"
    assert error["data"]["retry_after"] >= 1 and int(limited[0].headers["retry-after"]) >= 1
    # Another connection has its own bucket.
    assert raw_post(TOOLS_LIST, mint()["secret"]).status_code == 200


def test_client_registrations_from_one_address_are_limited():
    """Dynamic client registration is open to anyone, so one address registers at most its burst
    (20) at once, then one every ten seconds: the rest are answered 429 with Retry-After, by
    both instances (the database keeps the count). From an address of this test's own."""
    body = {"client_name": "flood", "redirect_uris": ["http://127.0.0.1:9/cb"]}
    with peer("127.0.0.5") as client:
        statuses = [client.post(f"{(EDGE, EDGE_B)[i % 2]}/register", json=body) for i in range(25)]
    assert [r.status_code for r in statuses[:20]] == [201] * 20, [r.status_code for r in statuses]
    refused = statuses[-1]
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1, refused.text
    assert refused.json()["error"] == "temporarily_unavailable"
    assert [r.status_code for r in statuses[20:]] == [429] * 5


def test_refused_token_requests_spend_the_failed_authentication_budget():
    """A wrong code or refresh token at /token is a failed authentication: an address that keeps
    presenting them is answered 429 before any database work, as one presenting bad secrets is
    (an edge of the test's own with the default budget: 60 at once, two a second; from an
    address of the test's own)."""
    statuses = []
    with serve("edge-token-budget", "--auth-failure-burst", "60") as (url, _), peer("127.0.0.6") as client:
        for _ in range(120):
            r = client.post(f"{url}/token", data={"grant_type": "refresh_token", "refresh_token": "qlr_guess",
                                                   "client_id": "qlo_" + "0" * 32})
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1
                break
    assert statuses[0] == 400 and statuses[-1] == 429 and len(statuses) >= 60, statuses

"""OAuth 2.1 end to end, with no pre-shared secret: the official Python MCP SDK's OAuth client
provider discovers the authorization server from the edge's 401, registers dynamically, a member
signs in and presses Allow in headless Chromium, the SDK exchanges the code (PKCE S256, RFC 8707
resource), lists and calls tools, refreshes (the old access token dies), and after a revocation
(RFC 7009) its token gets the 401. Also the refusals an attacker would try from outside."""

import asyncio
import http.server
import json
import os
import re
import ssl
import threading
import time
import urllib.parse
import uuid

import httpx2
import pytest
from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientMetadata
from selenium.webdriver.common.by import By

import harness
from conftest import DESK, axe, click_and_wait, new_member, same_origin_post, shot, submit_sign_in


class Memory:
    """The SDK's token storage, in memory; every secret it holds is recorded for the log check."""

    def __init__(self):
        self.tokens = None
        self.client = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        harness.issued(tokens.access_token)
        if tokens.refresh_token:
            harness.issued(tokens.refresh_token)
        self.tokens = tokens

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, client):
        self.client = client


@pytest.fixture
def callback():
    """The native client's loopback redirect URI (RFC 8252): records what the browser brings."""
    got = {}
    arrived = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            url = urllib.parse.urlparse(self.path)
            if url.path != "/callback":  # the browser's favicon request, for one
                self.send_response(404)
                self.end_headers()
                return
            query = url.query
            got.clear()
            got.update({k: v[0] for k, v in urllib.parse.parse_qs(query).items()})
            arrived.set()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.end_headers()
            self.wfile.write(b"<!doctype html><title>Done</title><p>You can close this window.</p>")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/callback", got, arrived
    server.shutdown()


def sdk_provider(client_name: str, redirect_uri: str, got: dict, arrived: threading.Event, storage: Memory,
                 redirect_handler, **options) -> OAuthClientProvider:
    """The official SDK's OAuth client provider for a public native client redirected to the
    loopback `redirect_uri` (the `callback` fixture's): the code is what the browser brought there."""

    async def callback_handler() -> AuthorizationCodeResult:
        assert await asyncio.to_thread(arrived.wait, 30), "the browser never reached the redirect URI"
        assert "code" in got, got
        harness.issued(got["code"])
        return AuthorizationCodeResult(code=got["code"], state=got.get("state"), iss=got.get("iss"))

    return OAuthClientProvider(
        server_url=f"{DESK}/mcp",
        client_metadata=OAuthClientMetadata(
            client_name=client_name, redirect_uris=[redirect_uri],
            grant_types=["authorization_code", "refresh_token"], response_types=["code"],
            token_endpoint_auth_method="none"),
        storage=storage, redirect_handler=redirect_handler, callback_handler=callback_handler, **options)


def sign_in_here(driver, handle: str, password: str, site: str = "demo") -> None:
    """On the sign-in page an authorization request sent the member to: sign in, come back."""
    assert "/sign-in" in driver.current_url, driver.current_url
    assert "An application asks to connect" in driver.page_source
    submit_sign_in(driver, handle, password, site)
    assert driver.current_url.startswith(f"{DESK}/authorize?"), driver.current_url
    harness.issued(driver.get_cookie("ql_session")["value"])


def consent_in_browser(driver, url: str, handle: str, password: str, scopes: str, agent: str = "demo-agent",
                       client: str = "QueryLayer OAuth test", shot_name: str = "oauth-consent") -> list[str]:
    """The member's part: sign in when asked, review the request, choose the agent and the scopes
    ("read": the read scopes; "all"; "asked": as the page presets them from the request), Allow.
    Returns the scopes allowed."""
    driver.get(url)
    if "/sign-in" in driver.current_url:
        sign_in_here(driver, handle, password)
    assert driver.current_url.startswith(f"{DESK}/authorize?"), driver.current_url
    body = driver.find_element(By.TAG_NAME, "main").text
    assert client in body and "127.0.0.1" in body, body
    shot(driver, shot_name)
    axe(driver)
    driver.find_element(By.CSS_SELECTOR, f"select#agent option[value='{agent}']").click()
    allowed = []
    for box in driver.find_elements(By.CSS_SELECTOR, "input[name=scopes]"):
        name = box.get_attribute("value")
        wanted = {"read": name.endswith(":read"), "all": True, "asked": box.is_selected()}[scopes]
        if box.is_selected() != wanted:
            box.click()
        if wanted:
            allowed.append(name)
    driver.find_element(By.CSS_SELECTOR, "button[name=decision][value=allow]").click()
    return allowed


def test_the_python_sdk_connects_by_itself_refreshes_and_is_revoked(browser, callback):
    redirect_uri, got, arrived = callback
    handle, password = new_member("owner", "OAuth Owner")
    driver = browser()
    storage = Memory()

    consents = []

    async def redirect_handler(url: str) -> None:
        arrived.clear()
        # The first consent allows the read scopes only; a step-up allows what the client asks.
        mode = "read" if not consents else "asked"
        consents.append(await asyncio.to_thread(consent_in_browser, driver, url, handle, password, mode,
                                                shot_name=f"oauth-consent-{len(consents) + 1}"))

    provider = sdk_provider("QueryLayer OAuth test", redirect_uri, got, arrived, storage, redirect_handler)

    read_scopes = [s for s in harness.ALL_SCOPES if s.endswith(":read")]

    async def flow():
        http = httpx2.AsyncClient(auth=provider, timeout=60)
        async with Client(streamable_http_client(f"{DESK}/mcp", http_client=http)) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert tools == harness.tools_for(read_scopes), tools
            context = harness.structured(await client.call_tool("querylayer_site_context", {}))
            assert sorted(context["scopes"]) == sorted(read_scopes), context
            first = storage.tokens
            assert first.access_token.startswith("qlc_") and first.refresh_token.startswith("qlr_")
            assert sorted(first.scope.split()) == sorted(read_scopes)
            assert storage.client.client_id.startswith("qlo_")
            # The access token has expired (as far as the client knows): the SDK refreshes.
            provider.context.token_expiry_time = time.time() - 1
            await client.call_tool("querylayer_site_context", {})
            second = storage.tokens
            assert second.access_token != first.access_token and second.refresh_token != first.refresh_token
            return first, second

    async def step_up():
        """A write tool the read-only grant lacks: the edge answers 403 insufficient_scope naming
        runs:write; the SDK asks the member again (what it had plus runs:write, preset on the
        page), the member allows, and the call goes through on the new connection."""
        http = httpx2.AsyncClient(auth=provider, timeout=60)
        async with Client(streamable_http_client(f"{DESK}/mcp", http_client=http)) as client:
            run = harness.structured(await client.call_tool("querylayer_begin_run", {"run_type": "oauth.step_up"}))
            assert run["state"] == "open", run
            return storage.tokens

    first, second = asyncio.run(flow())
    # The read-only access token asking for a write: the step-up challenge, from outside too.
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "querylayer_begin_run", "arguments": {"run_type": "oauth.denied"}}}
    denied = harness.raw_post(call, second.access_token, url=DESK)
    assert denied.status_code == 403, denied.text
    challenge = denied.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="runs:write"' in challenge, challenge
    assert f'resource_metadata="{DESK}/.well-known/oauth-protected-resource"' in challenge
    assert denied.json()["error"]["required_scope"] == "runs:write"
    third = asyncio.run(step_up())
    assert len(consents) == 2 and "runs:write" in consents[1] and set(consents[0]) <= set(consents[1]), consents
    assert third.access_token != second.access_token and "runs:write" in third.scope.split(), third.scope
    second = third
    assert got.get("iss") == DESK, got
    # The refreshed-away access token is dead; the new one lives.
    ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    old = harness.raw_post(ping, first.access_token, url=DESK)
    assert old.status_code == 401 and "resource_metadata=" in old.headers["www-authenticate"]
    assert harness.raw_post(ping, second.access_token, url=DESK).status_code == 200
    # The audit trail has the consent, the grant and the refresh.
    actions = harness.superuser_sql(
        "SELECT string_agg(DISTINCT action, ',' ORDER BY action) FROM querylayer.audit_events WHERE action LIKE 'oauth.%'")
    assert {"oauth.consent", "oauth.grant", "oauth.refresh"} <= set(actions.split(",")), actions

    # Revocation (RFC 7009) of the refresh token ends the grant: the access token gets the 401.
    r = httpx2.post(f"{DESK}/revoke", data={"token": second.refresh_token,
                                            "client_id": provider.context.client_info.client_id}, timeout=30)
    assert r.status_code == 200, r.text
    dead = harness.raw_post(ping, second.access_token, url=DESK)
    assert dead.status_code == 401 and "resource_metadata=" in dead.headers["www-authenticate"]
    # And the refresh token is spent with it.
    r = httpx2.post(f"{DESK}/token", data={"grant_type": "refresh_token", "refresh_token": second.refresh_token,
                                           "client_id": provider.context.client_info.client_id}, timeout=30)
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant", r.text


@pytest.fixture
def client_document(callback):
    """The client's Client ID Metadata Document, served over https on 127.0.0.1 with the
    certificate of the CA the edge was told to trust (scripts/test-edge). Yields (its URL, the
    redirect URI it names, what the browser brings back, the event that says it arrived, the
    number of times the edge fetched it)."""
    redirect_uri, got, arrived = callback
    fetched = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/oauth/client.json":
                self.send_response(404)
                self.end_headers()
                return
            fetched.append(self.headers.get("user-agent", ""))
            body = json.dumps({"client_id": url, "client_name": "QueryLayer CIMD test", "redirect_uris": [redirect_uri],
                               "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
                               "token_endpoint_auth_method": "none"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "max-age=600")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(os.environ["QUERYLAYER_CIMD_CERT"], os.environ["QUERYLAYER_CIMD_KEY"])
    server.socket = context.wrap_socket(server.socket, server_side=True)
    url = f"https://127.0.0.1:{server.server_port}/oauth/client.json"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield url, redirect_uri, got, arrived, fetched
    server.shutdown()


def test_a_client_named_by_its_metadata_document_connects_a_new_agent_on_the_site_the_member_chose(
        browser, client_document):
    """No registration at all: the SDK uses the document's URL as its client_id (the edge
    advertises client_id_metadata_document_supported), the edge fetches and keeps the document,
    and the member, signed in to demo, switches to another site of theirs on the consent page
    and has a new agent registered there for the client, with the read scopes."""
    url, redirect_uri, got, arrived, fetched = client_document
    handle, password = new_member("owner", "OAuth Sites")
    other = f"oauth-{uuid.uuid4().hex[:8]}"
    harness.admin("create-site", "--organization", "demo", "--slug", other, "--name", "OAuth other site")
    # A member signs in to each site with a password of that site: invited there too.
    invited = harness.admin("invite-member", "--site", other, "--member", handle, "--role", "owner")
    harness.issued(invited["token"])
    r = same_origin_post("/invite", {"token": invited["token"], "password": password, "confirm": password})
    assert r.status_code == 200 and "Password set" in r.text, r.text
    driver = browser()
    storage = Memory()

    def consent(url_to_open: str) -> None:
        driver.get(url_to_open)
        sign_in_here(driver, handle, password, site="demo")
        body = driver.find_element(By.TAG_NAME, "main").text
        assert "QueryLayer CIMD test" in body and url in body, body
        click_and_wait(driver, driver.find_element(By.ID, "other-site"))
        sign_in_here(driver, handle, password, site=other)
        assert "OAuth other site" in driver.find_element(By.TAG_NAME, "main").text
        shot(driver, "oauth-consent-document")
        axe(driver)
        driver.find_element(By.CSS_SELECTOR, "select#agent option[value='(new)']").click()
        for box in driver.find_elements(By.CSS_SELECTOR, "input[name=scopes]"):
            if box.is_selected() != box.get_attribute("value").endswith(":read"):
                box.click()
        driver.find_element(By.CSS_SELECTOR, "button[name=decision][value=allow]").click()

    async def redirect_handler(url_to_open: str) -> None:
        arrived.clear()
        await asyncio.to_thread(consent, url_to_open)

    provider = sdk_provider("QueryLayer CIMD test", redirect_uri, got, arrived, storage, redirect_handler,
                            client_metadata_url=url)
    read_scopes = [s for s in harness.ALL_SCOPES if s.endswith(":read")]

    async def flow():
        http = httpx2.AsyncClient(auth=provider, timeout=60)
        async with Client(streamable_http_client(f"{DESK}/mcp", http_client=http)) as client:
            assert {t.name for t in (await client.list_tools()).tools} == harness.tools_for(read_scopes)
            return harness.structured(await client.call_tool("querylayer_site_context", {}))

    context = asyncio.run(flow())
    assert storage.client.client_id == url
    assert context["site"]["slug"] == other, context
    assert re.fullmatch(r"oauth-querylayer-cimd-test(-\d+)?", context["agent"]["handle"]), context
    assert sorted(context["scopes"]) == sorted(read_scopes), context
    assert fetched and fetched[0].startswith("querylayer-oauth/"), fetched
    assert len(fetched) == 1, "the document was fresh for its max-age: fetched once"
    counts = harness.superuser_sql(
        f"SELECT (SELECT count(*) FROM querylayer.oauth_clients WHERE client_id = '{url}') || ',' || "
        f"(SELECT count(*) FROM querylayer.oauth_client_documents WHERE client_id = '{url}') || ',' || "
        f"(SELECT count(*) FROM querylayer.oauth_clients WHERE client_name = 'QueryLayer CIMD test' AND client_id LIKE 'qlo_%')")
    assert counts == "1,1,0", counts


def code_for(client_id: str, redirect_uri: str, challenge: str, handle: str, password: str,
             scopes: list[str], agent: str = "demo-agent") -> str:
    """A member's consent over plain HTTP, as the dashboard's own pages post it: sign in (a
    session cookie), open the authorization request (the page's CSRF token), Allow. Returns the
    code the redirect carries."""
    r = same_origin_post("/sign-in", {"site": "demo", "handle": handle, "password": password})
    assert r.status_code == 303, r.text
    cookie = re.search(r"ql_session=([^;]+)", r.headers["set-cookie"]).group(1)
    harness.issued(cookie)
    request = {"client_id": client_id, "redirect_uri": redirect_uri, "response_type": "code", "state": "st",
               "code_challenge": challenge, "code_challenge_method": "S256", "resource": f"{DESK}/mcp"}
    page = httpx2.get(f"{DESK}/authorize", params=request, headers={"Cookie": f"ql_session={cookie}"}, timeout=30)
    assert page.status_code == 200, page.text
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
    form = {**request, "csrf_token": csrf, "decision": "allow", "agent": agent, "expires_in": "1 day"}
    r = httpx2.post(f"{DESK}/authorize", data={**form, "scopes": scopes},
                    headers={"Origin": DESK, "Cookie": f"ql_session={cookie}"}, follow_redirects=False, timeout=30)
    assert r.status_code == 303, r.text
    query = urllib.parse.parse_qs(urllib.parse.urlparse(r.headers["location"]).query)
    assert "code" in query, r.headers["location"]
    harness.issued(query["code"][0])
    return query["code"][0]


def test_the_token_endpoint_refuses_what_an_attacker_would_try_with_a_real_code():
    """Each refusal over HTTP, with codes a member really consented to: a wrong PKCE verifier, a
    redirect URI that does not match, a reused code (its grant dies), an expired code, a token
    for another resource, a reused refresh token (the whole grant dies), consent for more than the
    agent holds, a consent form posted cross-site; and the access token works nowhere else."""
    import base64
    import hashlib
    handle, password = new_member("owner", "OAuth Refusals")
    redirect_uri = "http://127.0.0.1:9/cb"
    client_id = register(redirect_uri)
    verifier = "v" * 20 + uuid.uuid4().hex
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    token = lambda **data: httpx2.post(f"{DESK}/token", data={"client_id": client_id, **data}, timeout=30)
    redeem = lambda code, **over: token(**{"grant_type": "authorization_code", "code": code,
                                           "redirect_uri": redirect_uri, "code_verifier": verifier,
                                           "resource": f"{DESK}/mcp", **over})
    refused = lambda r: r.status_code == 400 and r.json()["error"] in ("invalid_grant", "invalid_target")

    # A wrong verifier and another redirect URI are refused and leave the code unspent.
    code = code_for(client_id, redirect_uri, challenge, handle, password, ["site:read"])
    assert refused(redeem(code, code_verifier="w" * 43))
    assert refused(redeem(code, redirect_uri="http://127.0.0.1:9/elsewhere"))
    assert refused(redeem(code, resource="https://other.example/mcp"))
    first = redeem(code)
    assert first.status_code == 200, first.text
    tokens = first.json()
    harness.issued(tokens["access_token"])
    harness.issued(tokens["refresh_token"])
    ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    assert harness.raw_post(ping, tokens["access_token"], url=DESK).status_code == 200
    # The access token is this MCP resource's only: the console refuses it.
    assert httpx2.get(f"{DESK}/api/console/me", headers={"authorization": f"Bearer {tokens['access_token']}"},
                      timeout=30).status_code == 401
    # The code again: refused, and the grant it made dies with its connection.
    assert refused(redeem(code))
    assert harness.raw_post(ping, tokens["access_token"], url=DESK).status_code == 401
    assert refused(token(grant_type="refresh_token", refresh_token=tokens["refresh_token"]))

    # A reused refresh token ends the whole grant: the newest access token dies too.
    code = code_for(client_id, redirect_uri, challenge, handle, password, ["site:read"])
    tokens = redeem(code).json()
    harness.issued(tokens["access_token"])
    harness.issued(tokens["refresh_token"])
    rotated = token(grant_type="refresh_token", refresh_token=tokens["refresh_token"], resource=f"{DESK}/mcp")
    assert rotated.status_code == 200, rotated.text
    newest = rotated.json()
    harness.issued(newest["access_token"])
    harness.issued(newest["refresh_token"])
    assert harness.raw_post(ping, newest["access_token"], url=DESK).status_code == 200
    assert refused(token(grant_type="refresh_token", refresh_token=tokens["refresh_token"]))
    assert harness.raw_post(ping, newest["access_token"], url=DESK).status_code == 401
    assert refused(token(grant_type="refresh_token", refresh_token=newest["refresh_token"]))

    # An expired code: the operator shortens a code's life to one second.
    harness.admin("set-setting", "--key", "oauth_code_ttl_seconds", "--value", "1")
    try:
        code = code_for(client_id, redirect_uri, challenge, handle, password, ["site:read"])
        time.sleep(2)
        assert refused(redeem(code))
    finally:
        harness.admin("set-setting", "--key", "oauth_code_ttl_seconds", "--value", "60")

    # Consent for more than the agent holds: the page refuses, no code.
    narrow = f"narrow-{uuid.uuid4().hex[:8]}"
    harness.admin("create-agent", "--organization", "demo", "--handle", narrow)
    harness.admin("grant-scopes", "--site", "demo", "--agent", narrow, "--scopes", "site:read")
    r = same_origin_post("/sign-in", {"site": "demo", "handle": handle, "password": password})
    cookie = re.search(r"ql_session=([^;]+)", r.headers["set-cookie"]).group(1)
    harness.issued(cookie)
    request = {"client_id": client_id, "redirect_uri": redirect_uri, "response_type": "code", "state": "st",
               "code_challenge": challenge, "code_challenge_method": "S256", "resource": f"{DESK}/mcp"}
    page = httpx2.get(f"{DESK}/authorize", params=request, headers={"Cookie": f"ql_session={cookie}"}, timeout=30)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
    form = {**request, "csrf_token": csrf, "decision": "allow", "agent": narrow,
            "scopes": ["site:read", "content:write"]}
    r = httpx2.post(f"{DESK}/authorize", data=form, headers={"Origin": DESK, "Cookie": f"ql_session={cookie}"},
                    follow_redirects=False, timeout=30)
    assert r.status_code == 403 and "does not hold" in r.text, (r.status_code, r.text[:500])
    # The same form posted from another site: refused before anything else, no code either.
    r = httpx2.post(f"{DESK}/authorize", data={**request, "csrf_token": csrf, "decision": "allow",
                                               "agent": "demo-agent", "scopes": "site:read"},
                    headers={"Origin": "http://evil.example", "Cookie": f"ql_session={cookie}"},
                    follow_redirects=False, timeout=30)
    assert r.status_code == 403 and "location" not in r.headers
    # The audit trail has the refusals, the reuse and the revocations.
    actions = harness.superuser_sql(
        "SELECT string_agg(DISTINCT action || ':' || outcome, ',' ORDER BY action || ':' || outcome) "
        "FROM querylayer.audit_events WHERE action LIKE 'oauth.%'")
    assert {"oauth.token:denied", "oauth.refresh_reuse:denied", "oauth.revoke:ok"} <= set(actions.split(",")), actions


def test_discovery_names_the_edge_as_its_own_authorization_server():
    r = httpx2.post(f"{DESK}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=30,
                    headers={"accept": "application/json, text/event-stream"})
    assert r.status_code == 401
    challenge = r.headers["www-authenticate"]
    assert challenge.startswith("Bearer ") and f'resource_metadata="{DESK}/.well-known/oauth-protected-resource"' in challenge
    prm = httpx2.get(f"{DESK}/.well-known/oauth-protected-resource", timeout=30).json()
    assert prm["resource"] == f"{DESK}/mcp" and prm["authorization_servers"] == [DESK]
    asm = httpx2.get(f"{DESK}/.well-known/oauth-authorization-server", timeout=30).json()
    assert asm["issuer"] == DESK and asm["code_challenge_methods_supported"] == ["S256"]
    assert asm["response_types_supported"] == ["code"] and asm["registration_endpoint"] == f"{DESK}/register"
    assert asm["scopes_supported"] == harness.ALL_SCOPES


def register(redirect_uri: str) -> str:
    r = httpx2.post(f"{DESK}/register", json={"client_name": "refusals", "redirect_uris": [redirect_uri]}, timeout=30)
    assert r.status_code == 201, r.text
    assert r.json()["token_endpoint_auth_method"] == "none"
    return r.json()["client_id"]


def test_registration_and_authorization_refuse_what_an_attacker_would_try():
    # Only https or loopback redirect URIs register.
    r = httpx2.post(f"{DESK}/register", json={"redirect_uris": ["http://evil.example/cb"]}, timeout=30)
    assert r.status_code == 400 and r.json()["error"] == "invalid_redirect_uri"
    client_id = register("http://127.0.0.1:9/cb")
    base = {"client_id": client_id, "response_type": "code", "code_challenge": "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
            "code_challenge_method": "S256", "state": "s"}
    # A redirect URI the client did not register: refused here, never redirected.
    r = httpx2.get(f"{DESK}/authorize", params={**base, "redirect_uri": "https://evil.example/cb"}, timeout=30)
    assert r.status_code == 400 and "location" not in r.headers
    # PKCE plain and another resource go back to the client as errors.
    r = httpx2.get(f"{DESK}/authorize", params={**base, "redirect_uri": "http://127.0.0.1:9/cb",
                                                 "code_challenge_method": "plain"}, timeout=30)
    assert r.status_code == 303 and "error=invalid_request" in r.headers["location"]
    r = httpx2.get(f"{DESK}/authorize", params={**base, "redirect_uri": "http://127.0.0.1:9/cb",
                                                 "resource": "https://other.example/mcp"}, timeout=30)
    assert r.status_code == 303 and "error=invalid_target" in r.headers["location"]
    # Without a session: to the sign-in, and back here afterwards.
    r = httpx2.get(f"{DESK}/authorize", params={**base, "redirect_uri": "http://127.0.0.1:9/cb"}, timeout=30)
    assert r.status_code == 303 and r.headers["location"].startswith("/sign-in?next=%2Fauthorize%3F")
    # A consent form posted from another site is refused before anything else.
    r = httpx2.post(f"{DESK}/authorize", data={**base, "redirect_uri": "http://127.0.0.1:9/cb", "decision": "allow",
                                               "agent": "demo-agent", "scopes": "site:read", "csrf_token": "x"},
                    headers={"Origin": "http://127.0.0.1:1"}, timeout=30)
    assert r.status_code == 403, r.status_code
    # Same origin but no session: no code.
    r = same_origin_post("/authorize", {**base, "redirect_uri": "http://127.0.0.1:9/cb", "decision": "allow",
                                        "agent": "demo-agent", "scopes": "site:read", "csrf_token": "x"})
    assert r.status_code == 303 and "code=" not in r.headers["location"]
    # The token endpoint: unknown codes, other grant types and other resources.
    r = httpx2.post(f"{DESK}/token", data={"grant_type": "authorization_code", "code": "qla_nothing",
                                           "redirect_uri": "http://127.0.0.1:9/cb", "client_id": client_id,
                                           "code_verifier": "v" * 43}, timeout=30)
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
    r = httpx2.post(f"{DESK}/token", data={"grant_type": "password"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"] == "unsupported_grant_type"
    r = httpx2.post(f"{DESK}/token", data={"grant_type": "refresh_token", "refresh_token": "qlr_x",
                                           "resource": "https://other.example/mcp"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"] == "invalid_target"

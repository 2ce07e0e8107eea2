"""OAuth 2.1 end to end, with no pre-shared secret: the official Python MCP SDK's OAuth client
provider discovers the authorization server from the edge's 401, registers dynamically, a member
signs in and presses Allow in headless Chromium, the SDK exchanges the code (PKCE S256, RFC 8707
resource), lists and calls tools, refreshes (the old access token dies), and after a revocation
(RFC 7009) its token gets the 401. Also the refusals an attacker would try from outside."""

import asyncio
import http.server
import threading
import time
import urllib.parse

import httpx2
import pytest
from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientMetadata
from selenium.webdriver.common.by import By

import harness
from conftest import DESK, axe, click_and_wait, new_member, same_origin_post, shot


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


def consent_in_browser(driver, url: str, handle: str, password: str, read_only: bool) -> None:
    """The member's part: sign in when asked, review the request, choose the scopes, Allow."""
    driver.get(url)
    assert "/sign-in" in driver.current_url, driver.current_url
    assert "An application asks to connect" in driver.page_source
    driver.find_element(By.ID, "site").clear()
    driver.find_element(By.ID, "site").send_keys("demo")
    driver.find_element(By.ID, "handle").clear()
    driver.find_element(By.ID, "handle").send_keys(handle)
    driver.find_element(By.ID, "password").send_keys(password)
    click_and_wait(driver, driver.find_element(By.CSS_SELECTOR, "main form button[type=submit]"))
    assert driver.current_url.startswith(f"{DESK}/authorize?"), driver.current_url
    harness.issued(driver.get_cookie("ql_session")["value"])
    body = driver.find_element(By.TAG_NAME, "main").text
    assert "QueryLayer OAuth test" in body and "127.0.0.1" in body, body
    shot(driver, "oauth-consent")
    axe(driver)
    driver.find_element(By.CSS_SELECTOR, "select#agent option[value='demo-agent']").click()
    for box in driver.find_elements(By.CSS_SELECTOR, "input[name=scopes]"):
        wanted = box.get_attribute("value").endswith(":read") if read_only else True
        if box.is_selected() != wanted:
            box.click()
    driver.find_element(By.CSS_SELECTOR, "button[name=decision][value=allow]").click()


def test_the_python_sdk_connects_by_itself_refreshes_and_is_revoked(browser, callback):
    redirect_uri, got, arrived = callback
    handle, password = new_member("owner", "OAuth Owner")
    driver = browser()
    storage = Memory()

    async def redirect_handler(url: str) -> None:
        arrived.clear()
        await asyncio.to_thread(consent_in_browser, driver, url, handle, password, True)

    async def callback_handler() -> AuthorizationCodeResult:
        assert await asyncio.to_thread(arrived.wait, 30), "the browser never reached the redirect URI"
        assert "code" in got, got
        harness.issued(got["code"])
        return AuthorizationCodeResult(code=got["code"], state=got.get("state"), iss=got.get("iss"))

    provider = OAuthClientProvider(
        server_url=f"{DESK}/mcp",
        client_metadata=OAuthClientMetadata(
            client_name="QueryLayer OAuth test", redirect_uris=[redirect_uri],
            grant_types=["authorization_code", "refresh_token"], response_types=["code"],
            token_endpoint_auth_method="none"),
        storage=storage, redirect_handler=redirect_handler, callback_handler=callback_handler)

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

    first, second = asyncio.run(flow())
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

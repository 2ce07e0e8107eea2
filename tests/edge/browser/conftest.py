"""The browser tier: Debian's headless Chromium, driven through Debian's chromium-driver by
Selenium, against a running edge (scripts/test-edge starts one for it). Every test saves
screenshots under target/browser/, and axe-core (npm, injected into each page) must find no
serious or critical violation."""

import json
import os
import pathlib
import shutil
import sys
import tempfile
import uuid

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
DESK = (os.environ.get("QUERYLAYER_DESK_URL") or os.environ["QUERYLAYER_EDGE_URL"]).rstrip("/")
os.environ["QUERYLAYER_EDGE_URL"] = DESK
# Never let Selenium look for a driver or a browser anywhere but the paths given below.
os.environ.setdefault("SE_OFFLINE", "true")

import harness  # noqa: E402
import httpx2  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

SHOTS = pathlib.Path(os.environ.get("QUERYLAYER_SCREENSHOTS", HERE.parents[2] / "target" / "browser"))
SHOTS.mkdir(parents=True, exist_ok=True)
AXE = (HERE / "node_modules" / "axe-core" / "axe.min.js").read_text(encoding="utf-8")
SCRATCH = os.environ.get("QUERYLAYER_TMP") or None


@pytest.fixture
def browser():
    """A factory of fresh headless Chromium sessions (each with its own profile)."""
    started = []

    def make(width: int = 1280, height: int = 900):
        profile = tempfile.mkdtemp(prefix="ql-chromium-", dir=SCRATCH)
        options = Options()
        options.binary_location = "/usr/bin/chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            options.add_argument(arg)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        driver.set_window_size(width, height)
        driver.set_page_load_timeout(30)
        started.append((driver, profile))
        return driver

    yield make
    for driver, profile in started:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def shot(driver, name: str) -> None:
    """A full-page screenshot under target/browser/."""
    height = driver.execute_script("return Math.max(document.body.scrollHeight, 600)")
    width = driver.get_window_size()["width"]
    driver.set_window_size(width, min(height + 120, 6000))
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def click_and_wait(driver, element) -> None:
    """Clicks (a submit button, a link) and waits until the next page has replaced this one."""
    page = driver.find_element(By.TAG_NAME, "html")
    element.click()

    def replaced(_):
        try:
            page.is_enabled()
            return False
        except WebDriverException:  # stale, or the node left the document mid-navigation
            return True

    WebDriverWait(driver, 20).until(replaced)
    WebDriverWait(driver, 20, ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.execute_script("return document.readyState") == "complete")


def axe(driver) -> None:
    """axe-core inside the page: no serious or critical violation."""
    driver.execute_script(AXE)
    violations = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']})"
        ".then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,"
        " nodes: v.nodes.slice(0, 3).map(n => n.target)}))))"
        ".catch(e => done([{id: 'axe-error', impact: 'critical', help: String(e), nodes: []}]));")
    bad = [v for v in violations if v["impact"] in ("serious", "critical")]
    assert not bad, f"{driver.current_url}: {json.dumps(bad, indent=1)}"


def tool(secret: str, name: str, arguments: dict) -> dict:
    """One MCP tool call as the agent (stateless Streamable HTTP, one JSON-RPC POST)."""
    r = harness.raw_post({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": {"name": name, "arguments": arguments}}, secret)
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    assert not result.get("isError"), result
    return result["structuredContent"]


def same_origin_post(path: str, data: dict, cookie: str | None = None) -> httpx2.Response:
    """A form post as the dashboard's own page would send it (Origin of the desk)."""
    headers = {"Origin": DESK}
    if cookie:
        headers["Cookie"] = f"ql_session={cookie}"
    return httpx2.post(f"{DESK}{path}", data=data, headers=headers, follow_redirects=False, timeout=30)


def new_member(role: str, name: str = "Test Member") -> tuple[str, str]:
    """An operator invites a new member of demo; the member sets a password (through the
    dashboard's own form). Returns (handle, password)."""
    handle = f"{role[:3]}-{uuid.uuid4().hex[:10]}"
    invited = harness.admin("invite-member", "--site", "demo", "--member", handle, "--role", role,
                            "--display-name", name)
    harness.issued(invited["token"])
    password = f"correct horse {uuid.uuid4().hex[:12]}"
    harness.issued(password)
    r = same_origin_post("/invite", {"token": invited["token"], "password": password, "confirm": password})
    assert r.status_code == 200 and "Password set" in r.text, r.text
    return handle, password


def submit_sign_in(driver, handle: str, password: str, site: str) -> None:
    """Fills in the sign-in form of the page the driver is on and submits it."""
    driver.find_element(By.ID, "site").clear()
    driver.find_element(By.ID, "site").send_keys(site)
    driver.find_element(By.ID, "handle").clear()
    driver.find_element(By.ID, "handle").send_keys(handle)
    driver.find_element(By.ID, "password").send_keys(password)
    click_and_wait(driver, driver.find_element(By.CSS_SELECTOR, "main form button[type=submit]"))


def sign_in(driver, handle: str, password: str, site: str = "demo") -> None:
    driver.get(f"{DESK}/sign-in")
    submit_sign_in(driver, handle, password, site)
    assert driver.current_url == f"{DESK}/inbox", driver.current_url
    harness.issued(driver.get_cookie("ql_session")["value"])


def agent_draft(secret: str, title: str, body: str, slug: str | None = None) -> tuple[dict, dict]:
    """As the agent: a run and a draft of a new article. Returns (run, draft)."""
    run = tool(secret, "querylayer_begin_run", {"run_type": "article.draft"})
    draft = tool(secret, "querylayer_create_draft", {
        "run_id": run["run_id"], "template": "article", "slug": slug or f"desk-{uuid.uuid4().hex[:10]}",
        "fields": {"title": title, "body": body}})
    return run, draft


def request_publish(secret: str, run: dict, draft: dict, summary: str) -> dict:
    return tool(secret, "querylayer_request_publish_approval", {
        "run_id": run["run_id"], "summary": summary,
        "items": [{"content_id": draft["content_id"], "action": "publish", "revision_id": draft["revision_id"]}]})

"""What the end-to-end tests share: the running edge (scripts/test-edge starts it), the operator
command line for issuing credentials, MCP clients of the official SDK, and the console API.

Every secret a test obtains is appended to $QUERYLAYER_TEST_SECRETS so that the runner can prove
afterwards that none reached a log."""

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import time
import uuid

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

EDGE = os.environ["QUERYLAYER_EDGE_URL"].rstrip("/")
EDGE_B = os.environ.get("QUERYLAYER_EDGE_URL_B", "").rstrip("/")
BIN = os.environ["QUERYLAYER_BIN"]
ADMIN_URL = os.environ["QUERYLAYER_ADMIN_URL"]
EDGE_DB_URL = os.environ["QUERYLAYER_EDGE_DB_URL"]
SECRETS = os.environ["QUERYLAYER_TEST_SECRETS"]
WORKER_DB_URL = os.environ.get("QUERYLAYER_WORKER_DB_URL", "")
TEST_DIR = os.environ.get("QUERYLAYER_TEST_DIR", "")
PG_PORT = os.environ.get("QUERYLAYER_PG_PORT", "")
# A command that runs psql as the cluster's superuser on the querylayer database, for a cluster this
# machine cannot reach as `sudo -u postgres` (the container tier execs psql in the database container).
SUPERUSER_PSQL = os.environ.get("QUERYLAYER_SUPERUSER_PSQL", "")

# The tool registry and the scope catalogue, from the edge itself (`querylayer tools`).
REGISTRY = json.loads(subprocess.run([BIN, "tools"], capture_output=True, text=True, check=True,
                                     timeout=60).stdout)
ALL_SCOPES = REGISTRY["scopes"]
READ_TOOLS = {t["name"] for t in REGISTRY["tools"] if t["read_only"]}
WRITE_TOOLS = {t["name"] for t in REGISTRY["tools"] if not t["read_only"]}


def tools_for(scopes) -> set:
    """The tools `tools/list` shows a connection holding `scopes`."""
    return {t["name"] for t in REGISTRY["tools"] if set(t["scopes"]) & set(scopes)}


def issued(secret: str) -> None:
    with open(SECRETS, "a", encoding="utf-8") as f:
        f.write(secret + "\n")


def admin(*args: str) -> dict | list:
    """Runs `querylayer admin <args> --json` as the operator and returns its JSON."""
    done = subprocess.run(
        [BIN, "admin", *args, "--json"],
        env={**os.environ, "DATABASE_URL": ADMIN_URL},
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, f"querylayer admin {args[0]} failed: {done.stderr}"
    return json.loads(done.stdout)


def worker_once(database_url: str, *flags: str, log: str = "worker", timeout: int = 180) -> subprocess.CompletedProcess:
    """`querylayer worker --once <flags>` as the login of `database_url`; its log lands beside the
    others as `<log>-<random>.log` (secret grep)."""
    done = subprocess.run([BIN, "--log-format", "json", "worker", "--once", *flags],
                          env={**os.environ, "DATABASE_URL": database_url},
                          capture_output=True, text=True, timeout=timeout)
    if TEST_DIR:
        with open(os.path.join(TEST_DIR, f"{log}-{uuid.uuid4().hex[:8]}.log"), "w") as f:
            f.write(done.stderr)
    return done


def run_worker(*flags: str) -> str:
    """One pass of the worker as its own login (`WORKER_DB_URL`), which must succeed; its log."""
    done = worker_once(WORKER_DB_URL, *flags)
    assert done.returncode == 0, done.stderr
    return done.stderr


def mint(scopes=ALL_SCOPES, expires_in="1 hour", agent="demo-agent") -> dict:
    """A fresh connection on the demo site (its secret recorded for the log check)."""
    out = admin("create-connection", "--site", "demo", "--agent", agent, "--scopes", ",".join(scopes),
                "--expires-in", expires_in, "--name", f"e2e {uuid.uuid4().hex[:16]}", "--harness", "pytest")
    issued(out["secret"])
    return out


def member_token(member="demo-owner", role=None) -> str:
    """A fresh console token; with `role`, for a new member holding that role on demo."""
    if role is not None:
        member = f"m-{uuid.uuid4().hex[:10]}"
        admin("create-member", "--organization", "demo", "--handle", member)
        admin("set-member-role", "--site", "demo", "--member", member, "--role", role)
    out = admin("create-member-token", "--site", "demo", "--member", member, "--expires-in", "1 hour")
    issued(out["token"])
    return out["token"]


def mcp(secret: str | None, mode: str = "auto", url: str = EDGE, transport=None) -> Client:
    """An official-SDK client of the edge's Streamable HTTP endpoint."""
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    http = httpx2.AsyncClient(headers=headers, timeout=30, transport=transport)
    return Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode)


def structured(result) -> dict:
    assert not result.is_error, f"tool error: {result.content[0].text}"
    assert result.structured_content is not None
    return result.structured_content


def tool_error(result) -> dict:
    """The error object of a tool error: the same in the text content and in _meta."""
    assert result.is_error, f"expected a tool error, got {result.structured_content}"
    assert result.structured_content is None, "tool errors carry no structuredContent"
    error = json.loads(result.content[0].text)["error"]
    assert result.meta is not None and result.meta["querylayer/error"] == error
    assert error["code"] and error["message"]
    return error


class Console:
    """The member console API."""

    def __init__(self, token: str, url: str = EDGE):
        self.http = httpx2.Client(base_url=f"{url}/api/console",
                                  headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def get(self, path: str, **params):
        return self.http.get(path, params=params)

    def post(self, path: str, body=None):
        return self.http.post(path, json=body) if body is not None else self.http.post(path)


def raw_post(body: dict, secret: str | None = None, headers: dict | None = None, url: str = EDGE,
             client: httpx2.Client | None = None):
    """One raw JSON-RPC POST to /mcp (to see HTTP statuses the SDK does not surface)."""
    h = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}
    if secret:
        h["authorization"] = f"Bearer {secret}"
    h.update(headers or {})
    if client is not None:
        return client.post(f"{url}/mcp", json=body, headers=h)
    return httpx2.post(f"{url}/mcp", json=body, headers=h, timeout=30)


def peer(address: str) -> httpx2.Client:
    """An HTTP client whose requests come from `address` (any address of 127.0.0.0/8 here): an
    address of the test's own. The database keeps one failed-authentication budget (and one
    registration limit) per address for every edge, and every other test's requests come from
    127.0.0.1, so a test of those limits starts from a full budget only on an address of its
    own. Each such test takes another address."""
    return httpx2.Client(transport=httpx2.HTTPTransport(local_address=address), timeout=30)


def operator_sql(sql: str) -> str:
    """One statement as the operator login, for operator functions without an admin command."""
    done = subprocess.run(["psql", ADMIN_URL, "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", "-c", sql],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"operator SQL failed: {done.stderr}"
    return done.stdout.strip()


def superuser_sql(sql: str) -> str:
    """One script as the private cluster's superuser: only for looking past the API (raw rows, a
    simulated out-of-band change), never for what a test proves through the API."""
    psql = ([SUPERUSER_PSQL] if SUPERUSER_PSQL else
            ["sudo", "-u", "postgres", "psql", "-h", TEST_DIR, "-p", PG_PORT, "-d", "querylayer"])
    done = subprocess.run(psql + ["-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", "-c", sql],
                          capture_output=True, text=True, timeout=60, cwd="/tmp")
    assert done.returncode == 0, f"superuser SQL failed: {done.stderr}"
    return done.stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tier_flags(flags: tuple[str, ...]) -> list[str]:
    """`flags` with this tier's large failed-authentication budget unless they set one: as the
    tier's two instances (scripts/test-edge), since the budget of 127.0.0.1 is theirs too."""
    return [*flags] if "--auth-failure-burst" in flags else [*flags, "--auth-failure-burst", "1000"]


@contextlib.contextmanager
def serve(name: str, *flags: str, database_url: str | None = None):
    """An edge of a test's own (`querylayer serve` with `flags`, `tier_flags`), its log beside
    the tier's logs. Yields (its URL, its log's path); stopped (SIGTERM) afterwards."""
    port = free_port()
    path = pathlib.Path(SECRETS).parent / f"{name}.log"
    with open(path, "w") as log:
        proc = subprocess.Popen(
            [BIN, "--log-format", "json", "serve", "--port", str(port), *tier_flags(flags)],
            env={**os.environ, "DATABASE_URL": database_url or EDGE_DB_URL}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx2.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            time.sleep(0.05)
        else:
            raise RuntimeError(f"the {name} edge did not start; see {path}")
        yield url, path
    finally:
        proc.terminate()
        proc.wait(timeout=20)

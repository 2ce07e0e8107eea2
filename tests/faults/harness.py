"""What the fault tests share: the private cluster they may crash, edges they start themselves
(under a low open-files limit when asked), closed-loop clients that log every id the edge
acknowledged, and a flood of connections that never finish their headers.

scripts/test-faults prepares the cluster, the demo site and a second site, and exports where
they are. Every secret a test obtains is appended to $QUERYLAYER_TEST_SECRETS."""

import asyncio
import json
import os
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field

import httpx2

BIN = os.environ["QUERYLAYER_BIN"]
ADMIN_URL = os.environ["QUERYLAYER_ADMIN_URL"]
EDGE_DB_URL = os.environ["QUERYLAYER_EDGE_DB_URL"]
WORKER_DB_URL = os.environ["QUERYLAYER_WORKER_DB_URL"]
SECRETS = os.environ["QUERYLAYER_TEST_SECRETS"]
DIR = os.environ["QUERYLAYER_TEST_DIR"]
PG_PORT = os.environ["QUERYLAYER_PG_PORT"]
PG_BIN = os.environ["QUERYLAYER_PG_BIN"]
EDGE_PORT = int(os.environ["QUERYLAYER_FAULT_EDGE_PORT"])

RETRY_LATER = -32010
MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2025-11-25"}


def report(test: str, **figures) -> None:
    """Figures of a fault test, printed by scripts/test-faults at the end (not asserted here)."""
    with open(f"{DIR}/fault-figures.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"test": test, **figures}) + "\n")


def issued(secret: str) -> None:
    with open(SECRETS, "a", encoding="utf-8") as f:
        f.write(secret + "\n")


def admin(*args: str):
    done = subprocess.run([BIN, "admin", *args, "--json"], env={**os.environ, "DATABASE_URL": ADMIN_URL},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"querylayer admin {args[0]} failed: {done.stderr}"
    return json.loads(done.stdout)


def connection(site: str, agent: str) -> str:
    out = admin("create-connection", "--site", site, "--agent", agent, "--expires-in", "2 hours",
                "--scopes", "site:read,content:read,content:write,runs:read,runs:write",
                "--name", f"fault {uuid.uuid4().hex[:12]}", "--harness", "faults")
    issued(out["secret"])
    return out["secret"]


def member_token(site: str, member: str) -> str:
    out = admin("create-member-token", "--site", site, "--member", member, "--expires-in", "2 hours")
    issued(out["token"])
    return out["token"]


def sql(statement: str, cluster: tuple[str, str] | None = None) -> str:
    """One statement as the cluster's superuser (the test cluster, or `cluster`: its directory and
    port): for checks that look past the API. The statement goes on stdin: a check of every
    acknowledged id can outgrow one command-line argument."""
    directory, port = cluster or (DIR, PG_PORT)
    done = subprocess.run(["sudo", "-u", "postgres", f"{PG_BIN}/psql", "-h", directory, "-p", port, "-d", "querylayer",
                           "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", "-f", "-"],
                          input=statement + ";\n", capture_output=True, text=True, timeout=120, cwd="/tmp")
    assert done.returncode == 0, f"SQL failed: {done.stderr}"
    return done.stdout.strip()


def sql_background(statement: str) -> subprocess.Popen:
    return subprocess.Popen(["sudo", "-u", "postgres", f"{PG_BIN}/psql", "-h", DIR, "-p", PG_PORT, "-d", "querylayer",
                             "-X", "-q", "-c", statement],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/tmp")


def pg_ctl(*args: str) -> None:
    done = subprocess.run(["sudo", "-u", "postgres", f"{PG_BIN}/pg_ctl", "-D", f"{DIR}/data", *args],
                          capture_output=True, text=True, timeout=120, cwd="/tmp")
    assert done.returncode == 0, f"pg_ctl {args}: {done.stderr}"


def crash_and_restart_postgres() -> None:
    """An immediate stop (no checkpoint, like a crash) and a start with recovery."""
    pg_ctl("-m", "immediate", "stop")
    time.sleep(1)
    pg_ctl("-l", f"{DIR}/postgresql.log", "-w", "start")


class Edge:
    """An edge process of this test, on EDGE_PORT, optionally under `prlimit --nofile`."""

    def __init__(self, *flags: str, nofile: int | None = None, log: str = "edge", port: int = EDGE_PORT,
                 database_url: str = EDGE_DB_URL):
        self.log_path = f"{DIR}/{log}.log"
        command = [BIN, "--log-format", "json", "serve", "--port", str(port), "--rate-limit", "0",
                   "--shutdown-grace-secs", "5", *flags]
        if nofile is not None:
            command = ["prlimit", f"--nofile={nofile}:{nofile}", *command]
        self.log = open(self.log_path, "a", encoding="utf-8")
        self.process = subprocess.Popen(command, env={**os.environ, "DATABASE_URL": database_url},
                                        stdout=self.log, stderr=self.log)
        self.url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx2.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the edge did not become ready; see {self.log_path}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        finally:
            self.log.close()

    def logged(self) -> str:
        with open(self.log_path, encoding="utf-8") as f:
            return f.read()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.stop()


@dataclass
class Outcome:
    at: float
    kind: str            # "write" | "read"
    ok: bool
    seconds: float
    code: str | None = None


@dataclass
class Loop:
    """A closed-loop client: one call at a time; a write is retried with its idempotency key
    until the edge acknowledges it, then its id is logged. Reads are logged as they come."""
    url: str
    secret: str
    name: str
    kind: str = "write"
    acked: list = field(default_factory=list)        # (op, run_id)
    outcomes: list = field(default_factory=list)
    ids: int = 0

    async def call(self, http, tool: str, arguments: dict):
        self.ids += 1
        body = {"jsonrpc": "2.0", "id": self.ids, "method": "tools/call",
                "params": {"name": tool, "arguments": arguments}}
        response = await http.post(f"{self.url}/mcp", json=body,
                                   headers={**MCP_HEADERS, "authorization": f"Bearer {self.secret}"})
        return response.json()

    async def write(self, http, stop: asyncio.Event, run_type: str):
        op = str(uuid.uuid4())
        arguments = {"run_type": run_type, "input": {"op": op, "client": self.name},
                     "idempotency_key": f"op-{op}", "deadline_seconds": 3600}
        while True:
            started = time.monotonic()
            try:
                answer = await self.call(http, "querylayer_begin_run", arguments)
            except (httpx2.HTTPError, ValueError):
                self.outcomes.append(Outcome(time.monotonic(), "write", False, time.monotonic() - started, "transport"))
                await asyncio.sleep(0.2)
                continue
            seconds = time.monotonic() - started
            if "result" in answer and not answer["result"].get("isError"):
                run_id = answer["result"]["structuredContent"]["run_id"]
                self.acked.append((op, run_id))
                self.outcomes.append(Outcome(time.monotonic(), "write", True, seconds))
                return
            if "error" in answer and answer["error"]["code"] == RETRY_LATER:
                data = answer["error"]["data"]
                self.outcomes.append(Outcome(time.monotonic(), "write", False, seconds, data["code"]))
                await asyncio.sleep(min(float(data.get("retry_after", 1)), 0.5))
                continue
            raise AssertionError(f"{self.name}: a write was refused, not deferred: {answer}")

    async def read(self, http):
        started = time.monotonic()
        try:
            answer = await self.call(http, "querylayer_list_content", {"limit": 5})
            ok = "result" in answer and not answer["result"].get("isError")
            code = None if ok else (answer.get("error", {}).get("data", {}) or {}).get("code", "error")
        except (httpx2.HTTPError, ValueError):
            ok, code = False, "transport"
        self.outcomes.append(Outcome(time.monotonic(), "read", ok, time.monotonic() - started, code))
        if not ok:
            await asyncio.sleep(0.2)

    async def run(self, stop: asyncio.Event, run_type: str = "fault.loop"):
        async with httpx2.AsyncClient(timeout=60) as http:
            while not stop.is_set():
                if self.kind == "write":
                    await self.write(http, stop, run_type)
                else:
                    await self.read(http)


def ops_present(acked: list, cluster: tuple[str, str] | None = None) -> tuple[int, int]:
    """(acknowledged ids found, runs per op beyond one) for a list of (op, run_id)."""
    if not acked:
        return 0, 0
    values = ",".join(f"('{op}', '{run}'::uuid)" for op, run in acked)
    found = int(sql(f"SELECT count(*) FROM (VALUES {values}) a(op, run_id) "
                    f"JOIN querylayer.runs r ON r.id = a.run_id AND r.input->>'op' = a.op", cluster))
    extra = int(sql(f"SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM querylayer.runs r "
                    f"WHERE r.input->>'op' IN (SELECT op FROM (VALUES {values}) a(op, run_id)) "
                    f"GROUP BY r.input->>'op') per_op", cluster))
    return found, extra


class Flood:
    """Sockets that open, send half a request head and then one byte a second, never finishing;
    from several loopback addresses (the edge caps connections per address)."""

    def __init__(self, port: int, per_address: int, addresses: list[str]):
        self.sockets = []
        self.refused = 0
        for address in addresses:
            for _ in range(per_address):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(True)
                s.settimeout(2)
                try:
                    s.bind((address, 0))
                    s.connect(("127.0.0.1", port))
                    s.sendall(b"POST /mcp HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
                    s.setblocking(False)
                    self.sockets.append(s)
                except OSError:
                    self.refused += 1
                    s.close()

    def trickle(self) -> int:
        """One more byte on every socket still open; returns how many the edge has closed."""
        closed = 0
        for s in self.sockets:
            try:
                data = s.recv(4096)
                if data == b"" or data.startswith(b"HTTP/1.1 503") or data.startswith(b"HTTP/1.1 408"):
                    closed += 1
                    continue
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
                continue
            try:
                s.send(b"a")
            except OSError:
                closed += 1
        return closed

    def close(self) -> None:
        for s in self.sockets:
            s.close()

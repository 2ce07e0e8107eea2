"""The scale benchmark (scripts/bench-scale runs it; it measures, it asserts nothing).

`generate`: a large installation written through the governed path. Operators make the sites,
the agent, the templates and one connection per site (`querylayer_api` operator functions, as
`querylayer admin` calls them); then every content revision and every run is written by that
site's connection, in the edge role's own session, through the same functions an agent's tool
call runs: `BEGIN; authenticate(fingerprint); begin_run …; create_draft …; finish_run …;
COMMIT`. Every row therefore passes the same scope checks, triggers, immutability guards, hash
chains and audit rows as an agent's call; only the edge's HTTP round trip is left out, batched
into one transaction of many calls. Site 1 holds the large content (BENCH_BIG_ITEMS items of
BENCH_REVISIONS revisions), site 2 the small (BENCH_SMALL_ITEMS items), and every site
BENCH_RUNS runs (two run events each: started, finished).

`measure`: row counts and bytes per row (indexes and TOAST included, partitions folded), the
time per million records of `verify_ledger` on the largest sites, and, through a running edge
(BENCH_EDGE) with wrk, p50/p99 of read tools on the large and the small site.
"""

import concurrent.futures
import hashlib
import json
import os
import re
import subprocess
import sys
import time

PSQL = os.environ["BENCH_PSQL"].split()          # a superuser session on the database
EDGE_DSN = os.environ["BENCH_EDGE_DSN"]          # the querylayer_edge login
ADMIN_DSN = os.environ["BENCH_ADMIN_DSN"]        # a querylayer_admin login
DIR = os.environ["BENCH_DIR"]
SITES = int(os.environ.get("BENCH_SITES", "1000"))
RUNS = int(os.environ.get("BENCH_RUNS", "5000"))
BIG_ITEMS = int(os.environ.get("BENCH_BIG_ITEMS", "100000"))
SMALL_ITEMS = int(os.environ.get("BENCH_SMALL_ITEMS", "1000"))
REVISIONS = int(os.environ.get("BENCH_REVISIONS", "10"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
RUNS_PER_TX = 500
ITEMS_PER_TX = 200
SCOPES = "ARRAY['site:read','content:read','content:write','runs:read','runs:write']::text[]"
BODY = ("A paragraph of a governed article, long enough to look like one: it names the source it "
        "came from, says what changed and why, and leaves the decision to a person. ") * 12


def psql(dsn: str, sql: str, *flags: str) -> str:
    done = subprocess.run(["psql", dsn, "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", *flags],
                          input=sql, capture_output=True, text=True, cwd="/tmp")
    if done.returncode != 0:
        sys.exit(f"SQL failed: {done.stderr[-2000:]}")
    return done.stdout.strip()


def superuser(sql: str) -> str:
    done = subprocess.run([*PSQL, "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1"], input=sql,
                          capture_output=True, text=True, cwd="/tmp")
    if done.returncode != 0:
        sys.exit(f"SQL failed: {done.stderr[-2000:]}")
    return done.stdout.strip()


def sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def site(i: int) -> str:
    return f"scale-{i:04d}"


def fingerprint(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def as_connection(secret: str, body: str) -> None:
    """One transaction of the site's connection: authenticate, then `body` (calls of
    querylayer_api functions, in a DO block)."""
    psql(EDGE_DSN, f"""SET synchronous_commit = off;
BEGIN;
SELECT querylayer_api.authenticate('\\x{fingerprint(secret)}'::bytea) IS NOT NULL;
DO $$
{body}
$$;
COMMIT;
""")


def runs_batch(secret: str, n: int) -> None:
    as_connection(secret, f"""DECLARE r jsonb;
BEGIN
    FOR i IN 1..{n} LOOP
        r := querylayer_api.begin_run('scale.run'::text, jsonb_build_object('n', i));
        PERFORM querylayer_api.finish_run((r->>'run_id')::uuid, 'completed'::text, 'done'::text);
    END LOOP;
END""")


def content_batch(secret: str, first: int, n: int) -> None:
    as_connection(secret, f"""DECLARE r uuid; item jsonb; fields jsonb;
BEGIN
    r := (querylayer_api.begin_run('scale.content'::text)->>'run_id')::uuid;
    FOR i IN {first}..{first + n - 1} LOOP
        fields := jsonb_build_object('title', 'Item ' || i, 'body', {sql_text(BODY)});
        item := querylayer_api.create_draft(r, 'article'::text, fields, NULL::uuid, 'item-' || i);
        FOR v IN 2..{REVISIONS} LOOP
            PERFORM querylayer_api.create_draft(r, 'article'::text,
                fields || jsonb_build_object('summary', 'Revision ' || v), (item->>'content_id')::uuid);
        END LOOP;
    END LOOP;
    PERFORM querylayer_api.finish_run(r, 'completed'::text, 'content written'::text);
END""")


def make_sites() -> dict:
    """The operators' part: an organization, an agent, the sites with their template and scopes,
    and a connection per site. Returns {site: secret}."""
    template = json.dumps([{"name": "title", "type": "text", "required": True, "max_length": 200},
                           {"name": "body", "type": "markdown", "required": True},
                           {"name": "summary", "type": "text", "required": False, "max_length": 500}])
    psql(ADMIN_DSN, """SELECT querylayer_api.create_organization('scale'::text, 'Scale'::text) IS NOT NULL;
SELECT querylayer_api.create_agent('scale'::text, 'scale-agent'::text, 'generic'::text) IS NOT NULL;""")
    statements = []
    for i in range(1, SITES + 1):
        s = site(i)
        statements.append(
            f"SELECT querylayer_api.create_site('scale'::text, '{s}'::text) IS NOT NULL;\n"
            f"SELECT querylayer_api.grant_agent_scopes('{s}'::text, 'scale-agent'::text, {SCOPES}) IS NOT NULL;\n"
            f"SELECT querylayer_api.create_template('{s}'::text, 'article'::text, '{template}'::jsonb) IS NOT NULL;\n"
            f"SELECT '{s}', querylayer_api.create_connection('{s}'::text, 'scale-agent'::text, 'scale'::text, "
            f"{SCOPES}, now() + interval '30 days')->>'secret';")
    out = psql(ADMIN_DSN, "\n".join(statements))
    secrets = {}
    for line in out.splitlines():
        if "|" in line:
            name, secret = line.split("|", 1)
            secrets[name] = secret
    return secrets


def parallel(tasks) -> float:
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        for future in concurrent.futures.as_completed([pool.submit(t) for t in tasks]):
            future.result()
    return time.monotonic() - started


def function_times() -> list:
    rows = superuser("""SELECT funcname, calls, round(self_time::numeric, 1) FROM pg_stat_user_functions
                         WHERE schemaname IN ('querylayer', 'querylayer_api') ORDER BY self_time DESC LIMIT 8""")
    return [dict(zip(("function", "calls", "self_ms"), line.split("|"))) for line in rows.splitlines()]


def generate() -> None:
    started = time.monotonic()
    secrets = make_sites()
    sites_seconds = time.monotonic() - started
    with open(f"{DIR}/secrets.json", "w") as f:
        json.dump(secrets, f)
    superuser("SELECT pg_stat_reset();")
    big, small = secrets[site(1)], secrets[site(min(2, SITES))]
    tasks = [lambda first=first: content_batch(big, first, min(ITEMS_PER_TX, BIG_ITEMS - first + 1))
             for first in range(1, BIG_ITEMS + 1, ITEMS_PER_TX)]
    tasks += [lambda first=first: content_batch(small, first, min(ITEMS_PER_TX, SMALL_ITEMS - first + 1))
              for first in range(1, SMALL_ITEMS + 1, ITEMS_PER_TX)]
    content_seconds = parallel(tasks)
    content_functions = function_times()
    superuser("SELECT pg_stat_reset();")
    tasks = []
    for i in range(1, SITES + 1):
        secret = secrets[site(i)]
        tasks += [lambda secret=secret, n=min(RUNS_PER_TX, RUNS - done): runs_batch(secret, n)
                  for done in range(0, RUNS, RUNS_PER_TX)]
    # Interleave the sites, as agents of many sites write at once.
    tasks = tasks[::2] + tasks[1::2]
    runs_seconds = parallel(tasks)
    revisions = (BIG_ITEMS + SMALL_ITEMS) * REVISIONS
    print(json.dumps({
        "sites": SITES, "sites_seconds": round(sites_seconds, 1),
        "revisions": revisions, "revisions_seconds": round(content_seconds, 1),
        "revisions_per_sec": round(revisions / content_seconds),
        "runs": SITES * RUNS, "run_events": 2 * SITES * RUNS, "runs_seconds": round(runs_seconds, 1),
        "run_events_per_sec": round(2 * SITES * RUNS / runs_seconds),
        "workers": WORKERS,
        "content_top_functions": content_functions,
        "runs_top_functions": function_times(),
    }))


def summary() -> None:
    """What `generate` prints, for a generation stopped before its end (BENCH_REUSE=1): the rows
    written, the rates from the rows' own timestamps (the content's run began before the runs'),
    and the top functions of the runs phase (the statistics were reset between the phases)."""
    row = superuser("""SELECT (SELECT count(*) FROM querylayer.sites),
        (SELECT count(*) FROM querylayer.content_revisions),
        (SELECT extract(epoch FROM max(created_at) - min(created_at)) FROM querylayer.content_revisions),
        (SELECT count(*) FROM querylayer.runs WHERE run_type = 'scale.run'),
        (SELECT extract(epoch FROM max(started_at) - min(started_at)) FROM querylayer.runs WHERE run_type = 'scale.run')""")
    sites, revisions, revisions_seconds, runs, runs_seconds = row.split("|")
    revisions_seconds, runs_seconds = float(revisions_seconds), float(runs_seconds)
    print(json.dumps({
        "sites": int(sites), "sites_seconds": None,
        "revisions": int(revisions), "revisions_seconds": round(revisions_seconds, 1),
        "revisions_per_sec": round(int(revisions) / revisions_seconds),
        "runs": int(runs), "run_events": 2 * int(runs), "runs_seconds": round(runs_seconds, 1),
        "run_events_per_sec": round(2 * int(runs) / runs_seconds),
        "workers": WORKERS, "stopped_early": True,
        "content_top_functions": [],
        "runs_top_functions": function_times(),
    }))


def sizes() -> dict:
    """Rows and bytes (table, indexes, TOAST; partitions folded into their parent) per table."""
    rows = superuser("""
        SELECT coalesce(parent.relname, c.relname), sum(pg_total_relation_size(c.oid)), sum(c.reltuples)
          FROM pg_class c
          LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
          LEFT JOIN pg_class parent ON parent.oid = i.inhparent
         WHERE c.relnamespace = 'querylayer'::regnamespace AND c.relkind = 'r'
         GROUP BY 1""")
    out = {}
    for line in rows.splitlines():
        name, size, _ = line.split("|")
        out[name] = {"bytes": int(size)}
    for table in ("run_events", "runs", "audit_events", "content_revisions", "content_items"):
        out[table]["rows"] = int(superuser(f"SELECT count(*) FROM querylayer.{table}"))
        out[table]["bytes_per_row"] = round(out[table]["bytes"] / max(out[table]["rows"], 1))
    return out


def verify(name: str) -> dict:
    started = time.monotonic()
    result = json.loads(psql(ADMIN_DSN, f"SELECT querylayer_api.verify_ledger('{name}'::text);"))
    seconds = time.monotonic() - started
    records = int(result.get("checked", 0))
    return {"site": name, "records": records, "ok": result.get("ok"), "seconds": round(seconds, 2),
            "seconds_per_million": round(seconds / max(records, 1) * 1e6, 1)}


def wrk(secret: str, tool: str, arguments: dict, clients: int, seconds: int) -> dict:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": tool, "arguments": arguments}})
    script = f"{DIR}/{tool}.lua"
    with open(script, "w") as f:
        f.write(f"""wrk.method = "POST"
wrk.body = {json.dumps(body)}
wrk.headers["content-type"] = "application/json"
wrk.headers["accept"] = "application/json, text/event-stream"
wrk.headers["mcp-protocol-version"] = "2025-11-25"
wrk.headers["authorization"] = "Bearer {secret}"
""")
    url = f"{os.environ['BENCH_EDGE']}/mcp"
    subprocess.run(["wrk", "-t", "2", "-c", str(clients), "-d", "2s", "-s", script, url], capture_output=True)
    out = subprocess.run(["wrk", "-t", "2", "-c", str(clients), "-d", f"{seconds}s", "--latency", "-s", script, url],
                         capture_output=True, text=True).stdout

    def ms(text):
        value, unit = re.match(r"([\d.]+)(us|ms|s)", text).groups()
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
    calls = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"tool": tool, "clients": clients, "calls_per_sec": round(calls / seconds),
            "p50_ms": ms(re.search(r"^\s*50%\s+(\S+)", out, re.M).group(1)),
            "p99_ms": ms(re.search(r"^\s*99%\s+(\S+)", out, re.M).group(1)),
            "non_2xx": int(non2xx.group(1)) if non2xx else 0}


def measure() -> None:
    secrets = json.load(open(f"{DIR}/secrets.json"))
    big, small = secrets[site(1)], secrets[site(min(2, SITES))]
    seconds = int(os.environ.get("BENCH_SECONDS", "10"))
    reads = []
    # Side by side, twice, so that the machine's noise shows in the ratio.
    for _ in range(2):
        for label, secret in (("small", small), ("large", big)):
            for tool, arguments in (("querylayer_list_content", {"limit": 20}),
                                    ("querylayer_list_runs", {"limit": 20}),
                                    ("querylayer_site_context", {})):
                reads.append({"site": label, **wrk(secret, tool, arguments, 8, seconds)})
    print(json.dumps({
        "tables": sizes(),
        "verify_ledger": [verify(site(1)), verify(site(min(3, SITES)))],
        "reads": reads,
    }))


if __name__ == "__main__":
    {"generate": generate, "summary": summary, "measure": measure}[sys.argv[1]]()

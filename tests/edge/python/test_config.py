"""`querylayer serve`'s configuration file under its flags and environment, and
`--print-config` (flag > env > file > default; secrets masked)."""

import os
import subprocess
import tomllib

from harness import BIN


def print_config(tmp_path, file_text: str, *flags: str, env: dict | None = None):
    path = tmp_path / "edge.toml"
    path.write_text(file_text)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("QUERYLAYER_") and k != "DATABASE_URL"}
    return subprocess.run([BIN, "serve", "--config", str(path), "--print-config", *flags],
                          env={**clean, **(env or {})}, capture_output=True, text=True, timeout=30)


def test_flag_beats_env_beats_file_beats_default_and_passwords_are_masked(tmp_path):
    done = print_config(
        tmp_path,
        'port = 9001\nrate_limit = 3.5\ndb-pool-size = 7\nallowed_host = ["a.example", "b.example"]\n'
        'database_url = "postgresql://querylayer_edge:file-s3cret@db.example/ql?sslmode=verify-full&sslrootcert=/ca.pem"\n'
        'require_auth = true\nlog_format = "json"\n',
        "--port", "9003",
        env={"QUERYLAYER_PORT": "9002", "QUERYLAYER_RATE_LIMIT": "4.5"},
    )
    assert done.returncode == 0, done.stderr
    assert "s3cret" not in done.stdout
    effective = tomllib.loads(done.stdout)
    assert effective["port"] == 9003                      # the flag
    assert effective["rate_limit"] == 4.5                 # the environment over the file
    assert effective["db_pool_size"] == 7                 # the file over the default
    assert effective["max_body_bytes"] == 2 * 1024 * 1024  # the default
    assert effective["allowed_hosts"] == ["a.example", "b.example"]
    assert effective["require_auth"] is True and effective["log_format"] == "json"
    assert effective["database_url"] == "postgresql://querylayer_edge:****@db.example/ql?sslmode=verify-full&sslrootcert=/ca.pem"
    sources = {line.split("=")[0].strip(): line.rsplit("#", 1)[1].strip()
               for line in done.stdout.splitlines() if line and not line.startswith("#")}
    assert sources["port"] == "flag"
    assert sources["rate_limit"] == "env QUERYLAYER_RATE_LIMIT"
    assert sources["db_pool_size"] == "file" and sources["database_url"] == "file"
    assert sources["max_body_bytes"] == "default"


def test_a_bad_file_stops_the_edge_with_its_name_and_the_key(tmp_path):
    done = print_config(tmp_path, 'port = 8080\nprot = 1\n')
    assert done.returncode != 0 and "edge.toml" in done.stderr and '"prot"' in done.stderr, done.stderr
    done = print_config(tmp_path, 'port = "many"\n', env={"DATABASE_URL": "postgres://h/db"})
    assert done.returncode != 0 and "port" in done.stderr, done.stderr

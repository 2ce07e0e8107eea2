# Shared by the scripts in this folder: machine set-up and a throwaway PostgreSQL cluster.
# shellcheck shell=bash

PGRX_VERSION=0.18.0
PG_MAJOR=15
# Overridable so that two checkouts can test side by side on one machine: another PostgreSQL
# installation (PG_CONFIG, PG_BIN), other ports (QUERYLAYER_PORT_OFFSET is added to every port
# the scripts use) and another scratch directory (QUERYLAYER_TMP).
PG_BIN=${PG_BIN:-/usr/lib/postgresql/$PG_MAJOR/bin}
PG_CONFIG=${PG_CONFIG:-/usr/bin/pg_config}
PORT_OFFSET=${QUERYLAYER_PORT_OFFSET:-0}
TMP_BASE=${QUERYLAYER_TMP:-/tmp}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The scratch directory is shared with the postgres user, like /tmp.
if [ "$TMP_BASE" != /tmp ]; then mkdir -p "$TMP_BASE" && chmod 1777 "$TMP_BASE"; fi

# A port of the scripts, shifted by QUERYLAYER_PORT_OFFSET.
port() { echo $(($1 + PORT_OFFSET)); }

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# Installs what building and testing need. Idempotent; quick when everything is present.
setup_machine() {
    local need=()
    for pkg in postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR libclang-dev clang sudo curl; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
    done
    if [ ${#need[@]} -gt 0 ]; then
        say "installing Debian packages: ${need[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${need[@]}" >/dev/null
    fi
    if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
        say "installing cargo-pgrx $PGRX_VERSION (a few minutes, once)"
        cargo install --locked cargo-pgrx --version "$PGRX_VERSION" >/dev/null
    fi
    if ! grep -q "pg$PG_MAJOR" "${PGRX_HOME:-$HOME/.pgrx}/config.toml" 2>/dev/null; then
        mkdir -p "${PGRX_HOME:-$HOME/.pgrx}"
        cargo pgrx init --pg$PG_MAJOR "$PG_CONFIG" >/dev/null
    fi
}

# Builds the extension and installs it into the system PostgreSQL. $1: "release" or "debug".
install_extension() {
    local profile=()
    [ "${1:-debug}" = release ] && profile=(--release)
    say "building and installing the querylayer extension (${1:-debug})"
    (cd "$ROOT/extension" && cargo pgrx install "${profile[@]}" --pg-config "$PG_CONFIG" >/dev/null)
}

# Starts a private cluster owned by postgres. $1: directory, $2: port, then extra settings.
start_cluster() {
    local dir=$1 port=$2
    shift 2
    if [ -f "$dir/data/postmaster.pid" ]; then
        sudo -u postgres "$PG_BIN/pg_ctl" -D "$dir/data" -m fast stop >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
    mkdir -p "$dir"
    chown postgres:postgres "$dir"
    sudo -u postgres "$PG_BIN/initdb" -D "$dir/data" --auth-local=trust --auth-host=scram-sha-256 \
        -U postgres >/dev/null
    {
        echo "port = $port"
        echo "unix_socket_directories = '$dir'"
        echo "listen_addresses = '127.0.0.1'"
        for setting in "$@"; do echo "$setting"; done
    } >> "$dir/data/postgresql.conf"
    sudo -u postgres "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/postgresql.log" -w start >/dev/null
}

stop_cluster() {
    local dir=$1
    [ -f "$dir/data/postmaster.pid" ] && sudo -u postgres "$PG_BIN/pg_ctl" -D "$dir/data" -m fast stop >/dev/null 2>&1
    true
}

# A virtual environment for the Python test clients (tests/.venv), with the requirements of each
# file given (pip skips what is already there).
python_env() {
    local venv="$ROOT/tests/.venv"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$@" >/dev/null
    echo "$venv/bin/python"
}

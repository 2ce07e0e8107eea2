# Shared by the scripts in this folder: machine set-up and a throwaway PostgreSQL cluster.
# shellcheck shell=bash

PG_MAJOR=15
# Overridable so that two checkouts can test side by side on one machine: another PostgreSQL
# installation (PG_CONFIG, PG_BIN), other ports (QUERYLAYER_PORT_OFFSET is added to every port
# the scripts use) and another scratch directory (QUERYLAYER_TMP).
CALLER_PG_CONFIG=${PG_CONFIG:-}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/$PG_MAJOR/bin}
PG_CONFIG=${PG_CONFIG:-/usr/bin/pg_config}
PORT_OFFSET=${QUERYLAYER_PORT_OFFSET:-0}
TMP_BASE=${QUERYLAYER_TMP:-/tmp}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# cargo-pgrx must be the version of the pgrx crate, which the workspace's Cargo.toml pins.
PGRX_VERSION=$(sed -n 's/^pgrx = "=\(.*\)"$/\1/p' "$ROOT/Cargo.toml")

# The scratch directory is shared with the postgres user, like /tmp.
if [ "$TMP_BASE" != /tmp ]; then mkdir -p "$TMP_BASE" && chmod 1777 "$TMP_BASE"; fi

# A port of the scripts, shifted by QUERYLAYER_PORT_OFFSET.
port() { echo $(($1 + PORT_OFFSET)); }

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# A new password: $1 random bytes (default 24) in base64 without / + =.
new_password() { head -c "${1:-24}" /dev/urandom | base64 | tr -d '/+='; }

# $1 random bytes (default 16) in lower-case hex: seeds and passphrases.
random_hex() { head -c "${1:-16}" /dev/urandom | od -An -tx1 | tr -d ' \n'; }

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

# The test tiers and the benchmarks never install into the system PostgreSQL that scripts/up
# serves: unless the caller chose a PostgreSQL (PG_CONFIG), they use a private copy of it under
# $TMP_BASE, with its own PGRX_HOME so that `cargo pgrx test` installs there too. PostgreSQL finds
# its directories relative to its binaries, so a copy that keeps the layout is a whole
# installation. Refreshed when the Debian package changes.
use_private_postgres() {
    [ -n "$CALLER_PG_CONFIG" ] && return 0
    local prefix version
    prefix=$TMP_BASE/querylayer-pg$PG_MAJOR-$(printf %s "$ROOT" | sha256sum | cut -c1-8)
    version=$(dpkg-query -W -f='${Version}' "postgresql-$PG_MAJOR")
    if [ "$(cat "$prefix/package-version" 2>/dev/null)" != "$version" ]; then
        say "copying PostgreSQL $PG_MAJOR to $prefix (the tiers install there, never into the system's)"
        rm -rf "$prefix"
        copy_postgres "/usr/lib/postgresql/$PG_MAJOR/bin/pg_config" "$prefix"
        echo "$version" > "$prefix/package-version"
    fi
    mkdir -p "$prefix/pgrx"
    printf 'base_testing_port = %s\n\n[configs]\npg%s = "%s"\n' "$(port 32200)" "$PG_MAJOR" \
        "$prefix/usr/lib/postgresql/$PG_MAJOR/bin/pg_config" > "$prefix/pgrx/config.toml"
    PG_CONFIG=$prefix/usr/lib/postgresql/$PG_MAJOR/bin/pg_config
    PG_BIN=$prefix/usr/lib/postgresql/$PG_MAJOR/bin
    export PG_CONFIG PG_BIN PGRX_HOME=$prefix/pgrx
}

# Copies the PostgreSQL installation of pg_config $1 to the prefix $2 with the same layout
# (usr/lib/postgresql/N, usr/share/postgresql/N; the headers are linked), without querylayer.
copy_postgres() {
    local bindir sharedir dest=$2
    bindir=$("$1" --bindir)
    sharedir=$("$1" --sharedir)
    mkdir -p "$dest/usr/lib/postgresql" "$dest/usr/share/postgresql" "$dest/usr/include"
    cp -a "$(dirname "$bindir")" "$dest/usr/lib/postgresql/$PG_MAJOR"
    cp -a "$sharedir" "$dest/usr/share/postgresql/$PG_MAJOR"
    ln -sfn /usr/include/postgresql "$dest/usr/include/postgresql"
    rm -f "$dest/usr/lib/postgresql/$PG_MAJOR/lib/querylayer.so" "$dest/usr/share/postgresql/$PG_MAJOR/extension/querylayer"*
}

# What an installed querylayer consists of in the PostgreSQL of pg_config $1 (library, control
# file, SQL scripts): path, inode, size, time and SHA-256 of each, or "none".
installed_extension_files() {
    local lib ext
    lib=$("$1" --pkglibdir)
    ext=$("$1" --sharedir)/extension
    local files=("$lib"/querylayer.so "$ext"/querylayer.control "$ext"/querylayer--*.sql)
    local found=0
    for f in "${files[@]}"; do
        [ -e "$f" ] || continue
        found=1
        printf '%s %s\n' "$(stat -c '%n %i %s %Y' "$f")" "$(sha256sum < "$f" | cut -c1-64)"
    done
    [ $found = 1 ] || echo none
}

# Builds the extension and installs it into the PostgreSQL of PG_CONFIG. $1: "release" or "debug".
install_extension() {
    local profile=()
    [ "${1:-debug}" = release ] && profile=(--release)
    say "building and installing the querylayer extension (${1:-debug})"
    (cd "$ROOT/extension" && cargo pgrx install "${profile[@]}" --pg-config "$PG_CONFIG" >/dev/null)
}

# The demo's question of its resilience-desk model (semantics/src/demo.rs), which the answer
# benchmarks and the profile ask.
DEMO_QUESTION="Where do fiscal capacity and energy burden overlap with health risk?"

# The released version an upgrade starts from, and its commit.
PREVIOUS_VERSION=0.12.0
PREVIOUS_COMMIT=d1825c4

# The commit of each earlier release: the upgrade tier also upgrades each older one, through
# every upgrade script in turn, to this version.
release_commit() {
    case $1 in
        0.1.0) echo 2db22fd ;;
        0.2.0) echo 51fe0f2 ;;
        0.3.0) echo 346c5b5 ;;
        0.4.0) echo ee209ce ;;
        0.5.0) echo a3fbb0b ;;
        0.6.0) echo d8bf90f ;;
        0.7.0) echo 154bb65 ;;
        0.8.0) echo ce9dfd9 ;;
        0.9.0) echo d6cbc72 ;;
        0.10.0) echo 75aceb3 ;;
        0.11.0) echo c042217 ;;
        0.12.0) echo d1825c4 ;;
        *) echo "no release $1" >&2; return 1 ;;
    esac
}
EARLIER_RELEASES="0.1.0"

# The build of release $1 (commit $2), for the upgrade tests and the upgrade script generator:
# its library, control file and install script, built once per machine (and PostgreSQL version)
# from git history and kept under $QUERYLAYER_CACHE (default ~/.cache/querylayer). Prints the
# directory.
previous_release() {
    local version=${1:-$PREVIOUS_VERSION} commit cache pgver dir work lib ext
    commit=${2:-$(release_commit "$version")}
    cache=${QUERYLAYER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/querylayer}
    pgver=$("$PG_CONFIG" --version | awk '{print $2}')
    dir=$cache/release-$version-$commit-pg$pgver
    if [ ! -f "$dir/complete" ]; then
        if ! git -C "$ROOT" cat-file -e "$commit^{commit}" 2>/dev/null; then
            echo "release $version is commit $commit, which is not in this clone's history; the upgrade" \
                 "test builds that release from it. In a shallow clone, run: git fetch --unshallow" >&2
            return 1
        fi
        mkdir -p "$cache"
        (
            flock 9
            [ -f "$dir/complete" ] && exit 0
            say "building release $version (commit $commit) once for this machine, into $dir"
            work=$cache/build-$version-$commit
            rm -rf "$work/tree" "$work/package" "$dir"
            mkdir -p "$work/tree" "$dir"
            git -C "$ROOT" archive "$commit" | tar -x -C "$work/tree"
            (cd "$work/tree/extension" && CARGO_TARGET_DIR="$cache/target" \
                cargo pgrx package --debug --pg-config "$PG_CONFIG" --out-dir "$work/package" >/dev/null)
            lib=$(find "$work/package" -name querylayer.so | head -1)
            ext=$(dirname "$(find "$work/package" -name querylayer.control | head -1)")
            cp "$lib" "$ext/querylayer.control" "$ext/querylayer--$version.sql" "$dir/"
            rm -rf "$work/tree" "$work/package"
            touch "$dir/complete"
        ) 9> "$cache/lock"
    fi
    echo "$dir"
}

# Installs files into the PostgreSQL of pg_config $1: the library (cp --remove-destination: a
# new inode, so that running backends keep the library they mapped) and control files and SQL
# scripts. $2…: files.
install_files() {
    local pgc=$1 lib ext f
    shift
    lib=$("$pgc" --pkglibdir)
    ext=$("$pgc" --sharedir)/extension
    for f in "$@"; do
        case "$f" in
            *.so) cp --remove-destination "$f" "$lib/" ;;
            *) cp --remove-destination "$f" "$ext/" ;;
        esac
    done
}

# The files of this version's querylayer installed in the PostgreSQL of pg_config $1: the
# library, the control file, the install script and the upgrade scripts (each release to the
# next, so that any earlier release upgrades step by step to this one).
extension_files() {
    local lib ext version
    lib=$("$1" --pkglibdir)
    ext=$("$1" --sharedir)/extension
    version=$(workspace_version)
    ls "$lib/querylayer.so" "$ext/querylayer.control" "$ext/querylayer--$version.sql"
    compgen -G "$ext/querylayer--*--*.sql" || true
}

# The version being built (the workspace's; the control file takes it from Cargo).
workspace_version() {
    sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml"
}

# The upgrade script that ALTER EXTENSION querylayer UPDATE runs from the previous release.
upgrade_script_path() {
    echo "$ROOT/extension/sql/querylayer--$PREVIOUS_VERSION--$(workspace_version).sql"
}

# psql as postgres on a private cluster: $1 its directory, $2 its port, $3 the database, then
# psql's own arguments.
psql_at() {
    local dir=$1 port=$2 db=$3
    shift 3
    sudo -u postgres "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -d "$db" "$@"
}

# Prints the upgrade script from the previous release to this version (scripts/upgrade-script
# says how it is made). $1 and $2: "directory port database" of a fresh install of the previous
# release and of this version, on a cluster of this version's library.
generate_upgrade_script() {
    local old new version fragments facts f
    read -r -a old <<< "$1"
    read -r -a new <<< "$2"
    version=$(workspace_version)
    fragments=$ROOT/sql/upgrades/$version
    facts=$(mktemp "$TMP_BASE/querylayer-facts.XXXXXX")
    chmod 0644 "$facts"
    psql_at "${old[@]}" -f - < "$ROOT/scripts/upgrade/facts.sql" > "$facts"
    generated() { # $1: the section of scripts/upgrade/generate.sql
        { echo "CREATE TEMP TABLE old_facts (kind text, ident text, name text, detail text);"
          echo "COPY old_facts FROM STDIN;"
          cat "$facts"
          echo '\.'
          cat "$ROOT/scripts/upgrade/generate.sql"
        } | psql_at "${new[@]}" -At -v section="$1" -f -
    }
    cat <<HEADER
-- querylayer $PREVIOUS_VERSION -> $version: the script ALTER EXTENSION querylayer UPDATE runs.
--
-- GENERATED by scripts/upgrade-script; do not edit. It is made of
--   (a) the fragments sql/upgrades/$version/*.pre.sql, in name order;
--   (b) from the catalog of a fresh $version install: each function whose definition a fresh
--       $PREVIOUS_VERSION install does not have as it is (CREATE OR REPLACE), then the owner, comment
--       and grants of every function;
--   (c) the fragments sql/upgrades/$version/*.sql (not .pre), in name order;
--   (d) every trigger, event trigger, policy, row-security flag, grant, owner, comment,
--       pg_extension_config_dump registration and ledger form of the fresh install, then drops
--       of the functions, triggers, policies and event triggers $PREVIOUS_VERSION had and $version has not.
-- To change the schema, edit sql/ (the fresh install) and add a fragment, then run
-- scripts/upgrade-script (docs/operations.md, "Schema changes").
\echo Use "ALTER EXTENSION querylayer UPDATE TO '$version'" to load this file. \quit
HEADER
    for f in "$fragments"/*.pre.sql; do
        [ -e "$f" ] || continue
        printf '\n-- (a) %s\n\n' "${f#"$ROOT"/}"
        cat "$f"
    done
    printf '\n-- (b) the functions of a fresh %s install: those changed since %s, then every one'"'"'s\n' "$version" "$PREVIOUS_VERSION"
    printf -- '-- owner, comment and grants\n\n'
    generated functions
    for f in "$fragments"/*.sql; do
        [ -e "$f" ] || continue
        case "$f" in *.pre.sql) continue ;; esac
        printf '\n-- (c) %s\n\n' "${f#"$ROOT"/}"
        cat "$f"
    done
    printf '\n-- (d) triggers, policies, privileges, owners, comments, backups and ledger forms of a fresh %s\n' "$version"
    printf -- '-- install; then what %s had and %s has not\n\n' "$PREVIOUS_VERSION" "$version"
    generated rest
    rm -f "$facts"
}

# A private copy of the PostgreSQL of PG_CONFIG at $1 holding this version's build (installed
# there by install_extension) and the previous release's install script, so that either version
# can be created: the new library serves the previous version's objects too. Prints its pg_config.
upgrade_postgres() {
    local prefix=$1 previous
    previous=$(previous_release)
    rm -rf "$prefix"
    copy_postgres "$PG_CONFIG" "$prefix"
    local pgc=$prefix/usr/lib/postgresql/$PG_MAJOR/bin/pg_config
    # shellcheck disable=SC2046
    install_files "$pgc" $(extension_files "$PG_CONFIG") "$previous/querylayer--$PREVIOUS_VERSION.sql"
    echo "$pgc"
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
    # UTF8 whatever this shell's locale (the extension installs into UTF8 databases only).
    sudo -u postgres "$PG_BIN/initdb" -D "$dir/data" --auth-local=trust --auth-host=scram-sha-256 \
        -U postgres --encoding UTF8 --locale C.UTF-8 >/dev/null
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
    # A pid file left by a cluster that is no longer running (a killed run) is no error.
    if [ -f "$dir/data/postmaster.pid" ]; then
        sudo -u postgres "$PG_BIN/pg_ctl" -D "$dir/data" -m fast stop >/dev/null 2>&1 || true
    fi
}

# The database "querylayer" of the private cluster at directory $1, port $2, and its logins:
# querylayer_edge may log in (EDGE_PASSWORD, EDGE_URL), ql_operator is a querylayer_admin
# (OPERATOR_PASSWORD, ADMIN_URL) and, with --worker, ql_worker a querylayer_worker
# (WORKER_PASSWORD, WORKER_URL). The passwords are new, set with statement logging off for this
# session only, and appended to the file $SECRETS when it is set. The database is created with
# the extension, or with --template DB as a copy of DB.
create_querylayer_database() {
    local dir=$1 port=$2 worker=0 create="CREATE DATABASE querylayer;
\\c querylayer
CREATE EXTENSION querylayer;"
    shift 2
    while [ $# -gt 0 ]; do
        case "$1" in
            --worker) worker=1 ;;
            --template) create="CREATE DATABASE querylayer TEMPLATE $2;
\\c querylayer"; shift ;;
            *) echo "create_querylayer_database: unknown option $1" >&2; return 1 ;;
        esac
        shift
    done
    EDGE_PASSWORD=$(new_password)
    OPERATOR_PASSWORD=$(new_password)
    WORKER_PASSWORD=
    local worker_role=
    if [ $worker = 1 ]; then
        WORKER_PASSWORD=$(new_password)
        worker_role="CREATE ROLE ql_worker LOGIN PASSWORD '$WORKER_PASSWORD' IN ROLE querylayer_worker;"
    fi
    if [ -n "${SECRETS:-}" ]; then
        printf '%s\n' "$EDGE_PASSWORD" "$OPERATOR_PASSWORD" ${WORKER_PASSWORD:+"$WORKER_PASSWORD"} >> "$SECRETS"
    fi
    psql_at "$dir" "$port" postgres -f - <<SQL
$create
SET log_statement = 'none';
ALTER ROLE querylayer_edge LOGIN PASSWORD '$EDGE_PASSWORD';
CREATE ROLE ql_operator LOGIN PASSWORD '$OPERATOR_PASSWORD' IN ROLE querylayer_admin;
$worker_role
SQL
    EDGE_URL="postgres://querylayer_edge:$EDGE_PASSWORD@127.0.0.1:$port/querylayer"
    ADMIN_URL="postgres://ql_operator:$OPERATOR_PASSWORD@127.0.0.1:$port/querylayer"
    WORKER_URL=${WORKER_PASSWORD:+"postgres://ql_worker:$WORKER_PASSWORD@127.0.0.1:$port/querylayer"}
}

# A throwaway CA and a server certificate it signed, for tests that need TLS: in directory $1,
# ca.pem/ca.key and server.pem/server.key, the server's subjectAltName $2 (DNS:localhost,
# IP:127.0.0.1, …). Valid two days.
test_certificates() {
    local dir=$1 san=$2
    command -v openssl >/dev/null || { export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq openssl >/dev/null; }
    mkdir -p "$dir"
    (
        cd "$dir"
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=QueryLayer test CA" \
            -keyout ca.key -out ca.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=querylayer-test" -keyout server.key -out server.csr 2>/dev/null
        printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' \
            "$san" > server.ext
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
            -extfile server.ext -out server.pem 2>/dev/null
    )
}

# A virtual environment for the Python test clients (tests/.venv), with the requirements of each
# file given (pip skips what is already there).
python_env() {
    local venv="$ROOT/tests/.venv"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$@" >/dev/null
    echo "$venv/bin/python"
}

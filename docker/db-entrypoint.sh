#!/bin/bash
# The database container's entry (runs as root, then PostgreSQL runs as postgres).
# At the first start (an empty data directory): initdb, the database $QUERYLAYER_DB with the
# extension and, with QUERYLAYER_DEMO=1, the demo (its first credentials go to
# /var/lib/postgresql/demo-credentials.json, 0600). Whenever the edge's password file is missing
# (first start, or its volume was replaced): a new random password for querylayer_edge, written
# only to $QUERYLAYER_EDGE_PASSWORD_FILE (0400, owned by the edge's uid). Nothing secret is logged.
set -euo pipefail

PGDATA=${PGDATA:-/var/lib/postgresql/data}
DB=${QUERYLAYER_DB:-querylayer}
PASSWORD_FILE=${QUERYLAYER_EDGE_PASSWORD_FILE:-/var/lib/querylayer/edge/database-password}
EDGE_UID=${QUERYLAYER_EDGE_UID:-10001}
PG_BIN=/usr/lib/postgresql/15/bin

as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
psql_local() { as_postgres psql -X -q -v ON_ERROR_STOP=1 -h /var/run/postgresql "$@"; }
log() { echo "querylayer-db: $*" >&2; }

mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" "$(dirname "$PGDATA")" /var/run/postgresql
chmod 0700 "$PGDATA"

first_start=0
[ -s "$PGDATA/PG_VERSION" ] || first_start=1
if [ $first_start = 1 ] || [ ! -s "$PASSWORD_FILE" ]; then
    if [ $first_start = 1 ]; then
        log "first start: initdb in $PGDATA"
        as_postgres "$PG_BIN/initdb" -D "$PGDATA" -U postgres --encoding UTF8 --locale C.UTF-8 \
            --auth-local peer --auth-host scram-sha-256 >/dev/null
        # Other containers reach it over the compose network, always with a password.
        printf 'host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
        printf "listen_addresses = '*'\n" >> "$PGDATA/postgresql.conf"
    fi
    # A server on the socket only while the set-up runs: no client can connect over TCP yet.
    as_postgres "$PG_BIN/pg_ctl" -D "$PGDATA" -o "-c listen_addresses=''" -w -s start
    if [ $first_start = 1 ]; then
        log "creating database $DB with the querylayer extension"
        psql_local -d postgres -c "CREATE DATABASE \"$DB\""
        psql_local -d "$DB" -c "CREATE EXTENSION querylayer"
        if [ "${QUERYLAYER_DEMO:-0}" = 1 ]; then
            log "seeding the demo (site demo); its first credentials: /var/lib/postgresql/demo-credentials.json"
            (umask 077 && psql_local -d "$DB" -tA -c "SELECT querylayer_api.seed_demo()" \
                > /var/lib/postgresql/demo-credentials.json)
            chown postgres:postgres /var/lib/postgresql/demo-credentials.json
        fi
    fi
    log "generating the password of querylayer_edge into $PASSWORD_FILE"
    password=$(head -c 32 /dev/urandom | base64 | tr -d '/+=\n')
    psql_local -d "$DB" <<SQL
SET log_statement = 'none';
ALTER ROLE querylayer_edge LOGIN PASSWORD '$password';
SQL
    mkdir -p "$(dirname "$PASSWORD_FILE")"
    (umask 077 && printf '%s' "$password" > "$PASSWORD_FILE.new")
    chown "$EDGE_UID:$EDGE_UID" "$PASSWORD_FILE.new"
    chmod 0400 "$PASSWORD_FILE.new"
    mv "$PASSWORD_FILE.new" "$PASSWORD_FILE"
    unset password
    as_postgres "$PG_BIN/pg_ctl" -D "$PGDATA" -m fast -w -s stop
fi

log "starting PostgreSQL 15"
exec setpriv --reuid=postgres --regid=postgres --init-groups "$PG_BIN/postgres" -D "$PGDATA" "$@"

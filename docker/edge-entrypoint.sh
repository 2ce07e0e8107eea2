#!/bin/bash
# The edge container's entry: runs `querylayer "$@"`. Without DATABASE_URL it builds one for the
# querylayer_edge login from the password the database container generated at its first start
# (QUERYLAYER_DB_PASSWORD_FILE) and QUERYLAYER_DB_HOST/PORT/NAME, after waiting (at most
# QUERYLAYER_DB_WAIT_SECS) for that file and for the database to accept connections.
set -euo pipefail

if [ -z "${DATABASE_URL:-}" ] && [ -n "${QUERYLAYER_DB_PASSWORD_FILE:-}" ]; then
    host=${QUERYLAYER_DB_HOST:-db}
    port=${QUERYLAYER_DB_PORT:-5432}
    waited=0
    until [ -s "$QUERYLAYER_DB_PASSWORD_FILE" ] && (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; do
        if [ "$waited" -ge "${QUERYLAYER_DB_WAIT_SECS:-120}" ]; then
            echo "querylayer: no database at $host:$port with a password in $QUERYLAYER_DB_PASSWORD_FILE" \
                 "after ${waited}s (is the db container running? its log says why not)" >&2
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    DATABASE_URL="postgres://querylayer_edge:$(cat "$QUERYLAYER_DB_PASSWORD_FILE")@$host:$port/${QUERYLAYER_DB_NAME:-querylayer}"
    export DATABASE_URL
fi
exec /usr/local/bin/querylayer "$@"

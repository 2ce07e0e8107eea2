#!/bin/bash
# The edge image's health check: GET /readyz (the database answers) on the edge's own port,
# with bash alone (the image has no HTTP client).
exec 3<>"/dev/tcp/127.0.0.1/${QUERYLAYER_PORT:-8080}" || exit 1
printf 'GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
IFS= read -r -t 5 status <&3 || exit 1
[[ $status == "HTTP/1."?" 200 "* ]]

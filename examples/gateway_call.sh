#!/bin/sh
# Calls a pelican queue through `pelican gateway` with curl.
#
#   pelican worker --queue demo &     # answers each request with itself (--handler echo)
#   pelican gateway &                  # http://127.0.0.1:8090
#   sh examples/gateway_call.sh
#
# Where to call: PELICAN_GATEWAY (default http://127.0.0.1:8090), PELICAN_QUEUE (default
# demo), PELICAN_GATEWAY_TOKEN (when the gateway runs with --token). Every error is JSON,
# {"error": {"kind": ..., "message": ...}}; --fail-with-body prints it and exits non-zero.
set -eu
GATEWAY="${PELICAN_GATEWAY:-http://127.0.0.1:8090}"
QUEUE="${PELICAN_QUEUE:-demo}"

# One call: the answer is the body. -i shows the headers: Pelican-Request-Id (the
# request's id, for `pelican inspect`) and Pelican-Served (new, joined, cached).
curl -sS -i --fail-with-body \
  ${PELICAN_GATEWAY_TOKEN:+-H "Authorization: Bearer $PELICAN_GATEWAY_TOKEN"} \
  -H 'Content-Type: application/json' \
  -H 'Pelican-Timeout: 30000' \
  --data '{"n": 12}' \
  "$GATEWAY/v1/queues/$QUEUE/call"
echo

# Without holding the connection: submit (202 and an id), then ask for the answer,
# waiting up to 10 s at a time (202 while it is in work).
id=$(curl -sS --fail-with-body \
  ${PELICAN_GATEWAY_TOKEN:+-H "Authorization: Bearer $PELICAN_GATEWAY_TOKEN"} \
  -H 'Content-Type: application/json' \
  -H "Idempotency-Key: example-$(date +%s)-$$" \
  --data '{"n": 13}' \
  "$GATEWAY/v1/queues/$QUEUE/requests" | sed 's/.*"id":"\([^"]*\)".*/\1/')
echo "submitted: $id"
answer=$(mktemp)
trap 'rm -f "$answer"' EXIT
while :; do
  status=$(curl -sS -o "$answer" -w '%{http_code}' \
    ${PELICAN_GATEWAY_TOKEN:+-H "Authorization: Bearer $PELICAN_GATEWAY_TOKEN"} \
    "$GATEWAY/v1/queues/$QUEUE/requests/$id?wait_ms=10000")
  [ "$status" != 202 ] && break
done
echo "status $status: $(cat "$answer")"
[ "$status" = 200 ]

#!/usr/bin/env python3
"""Calls a pelican queue through `pelican gateway`, with Python's standard library only.

    pelican worker --queue demo &     # answers each request with itself (--handler echo)
    pelican gateway &                  # http://127.0.0.1:8090
    python3 examples/gateway_call.py

Where to call: PELICAN_GATEWAY (default http://127.0.0.1:8090), PELICAN_QUEUE (default
demo), PELICAN_GATEWAY_TOKEN (when the gateway runs with --token).

Every error comes as JSON, {"error": {"kind": ..., "message": ...}}: branch on the kind
(the table is in the README, "From any language").
"""

import json
import os
import time
import urllib.error
import urllib.request
import uuid

GATEWAY = os.environ.get("PELICAN_GATEWAY", "http://127.0.0.1:8090")
QUEUE = os.environ.get("PELICAN_QUEUE", "demo")
TOKEN = os.environ.get("PELICAN_GATEWAY_TOKEN")


class PelicanError(Exception):
    """An error answer of the gateway: its status, kind and message."""

    def __init__(self, status, kind, message, request_id=None):
        super().__init__(f"{status} {kind}: {message}")
        self.status, self.kind, self.message = status, kind, message
        self.request_id = request_id


def _send(method, path, body=None, headers=None, timeout_s=60.0):
    """(status, headers, body bytes); raises PelicanError for an error answer. A 503
    (Redis unreachable, the gateway too busy or stopping) is tried again after its
    Retry-After, a few times."""
    h = dict(headers or {})
    if body is not None:
        h["Content-Type"] = "application/json"
    if TOKEN:
        h["Authorization"] = "Bearer " + TOKEN
    data = None if body is None else json.dumps(body).encode()
    for attempt in range(5):
        req = urllib.request.Request(GATEWAY + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as res:
                return res.status, res.headers, res.read()
        except urllib.error.HTTPError as e:
            error = json.loads(e.read())["error"]
            if e.code == 503 and attempt < 4:
                time.sleep(float(e.headers.get("Retry-After", "1")))
                continue
            raise PelicanError(e.code, error["kind"], error["message"],
                               e.headers.get("Pelican-Request-Id")) from None


def call(queue, request, timeout_ms=30000, key=None):
    """Sends `request` (any JSON value) and returns (answer, headers). `key` makes a
    retried call the same request (Idempotency-Key): it is solved once."""
    headers = {"Pelican-Timeout": str(timeout_ms)}
    if key:
        headers["Idempotency-Key"] = key
    _, res_headers, body = _send("POST", f"/v1/queues/{queue}/call", request, headers,
                                 timeout_s=timeout_ms / 1000 + 5)
    return json.loads(body), res_headers


def submit(queue, request, key=None, timeout_ms=300000):
    """Submits without waiting; returns the request's id. The request runs whether or
    not anyone comes back for it, until its timeout (its deadline in the queue)."""
    headers = {"Pelican-Timeout": str(timeout_ms)}
    if key:
        headers["Idempotency-Key"] = key
    _, _, body = _send("POST", f"/v1/queues/{queue}/requests", request, headers)
    return json.loads(body)["id"]


def result(queue, request_id, wait_ms=10000):
    """(True, answer) once the request is answered, (False, None) while it is in work
    after waiting up to wait_ms; PelicanError for a failure, or 404 for an id the queue
    does not know."""
    status, _, body = _send("GET", f"/v1/queues/{queue}/requests/{request_id}?wait_ms={wait_ms}",
                            timeout_s=wait_ms / 1000 + 15)
    if status == 202:
        return False, None
    return True, json.loads(body)


def main():
    answer, headers = call(QUEUE, {"n": 12})
    print("answer:", answer)
    print("request id:", headers["Pelican-Request-Id"])
    print("served:", headers["Pelican-Served"])

    request_id = submit(QUEUE, {"n": 13}, key=str(uuid.uuid4()))
    print("submitted:", request_id)
    done, answer = False, None
    while not done:
        done, answer = result(QUEUE, request_id)
    print("async answer:", answer)

    try:
        call(QUEUE, {"bad": True})
    except PelicanError as e:
        print("error kind:", e.kind, "status:", e.status, "message:", e.message)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A pelican worker in Python for `pelican worker --exec` (standard library only).

    pelican worker --exec 'python3 examples/exec_worker.py' --processes 2 --concurrency 8
    pelican call '{"n": 12}'                  # prints {"n":12,"square":144}

pelican starts the program (several copies with --processes) and keeps it running. The line
protocol, version 1 (README, "From any language"):

  stdin   {"pelican": 1, "body": "json", "concurrency": 8, "child": 0}     pelican's hello
  stdout  {"pelican": 1}                                                  this program's hello
  stdin   {"id": "...", "delivery": 1, "deadline_ms": ..., "body": {...}}  one line per request
  stdout  {"id": "...", "ok": {...}}                                      one line per answer,
          {"id": "...", "error": "why", "retry": false}                   in any order

With `--codec raw` the hello says "body": "base64" and bodies travel as base64 strings, the
request's "body" and the answer's "ok" alike. Logs go to stderr: pelican forwards them,
line by line, with this process's pid. Anything else on stdout is taken for a broken child:
it is restarted and its requests handed back.
"""

import base64
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor


def handle(body):
    """The work, JSON in and JSON out. A ValueError fails the request for good (the caller
    gets the message); any other exception hands it back to be tried again."""
    if not isinstance(body, dict) or not isinstance(body.get("n"), (int, float)):
        raise ValueError('expected {"n": <number>}')
    return {"n": body["n"], "square": body["n"] * body["n"]}


def handle_raw(data):
    """The work on a raw-bytes queue (`--codec raw`): bytes in, bytes out."""
    return data.upper()


def main():
    hello = json.loads(sys.stdin.readline())
    raw = hello.get("body") == "base64"
    out = threading.Lock()

    def write(line):
        with out:
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()

    def work(req):
        rid = req["id"]
        try:
            if raw:
                answer = base64.b64encode(handle_raw(base64.b64decode(req["body"]))).decode()
            else:
                answer = handle(req["body"])
            write({"id": rid, "ok": answer})
        except ValueError as e:
            write({"id": rid, "error": str(e), "retry": False})
        except Exception as e:  # a passing failure: let pelican deliver it again
            sys.stderr.write(f"request {rid}: {e!r}\n")  # one write: lines stay whole
            sys.stderr.flush()
            write({"id": rid, "error": repr(e), "retry": True})

    # Several requests at once, answered as each is done (threads suit work that waits on
    # I/O; for CPU-bound work, run more processes: --processes).
    with ThreadPoolExecutor(max_workers=hello.get("concurrency", 1)) as pool:
        write({"pelican": 1})
        for line in sys.stdin:
            if not line.strip():
                continue
            req = json.loads(line)
            if "id" in req:  # lines of a later protocol version are skipped
                pool.submit(work, req)
    # stdin closed: pelican is stopping; the pool finishes what it has first.


if __name__ == "__main__":
    main()

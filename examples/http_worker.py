#!/usr/bin/env python3
"""A pelican worker in Python for `pelican worker --http` (standard library only).

    python3 examples/http_worker.py --port 8000 &
    pelican worker --http http://127.0.0.1:8000/square --concurrency 16
    pelican call '{"n": 12}'                  # prints {"n":12,"square":144}

pelican POSTs each request to the URL (keep-alive connections, --concurrency at once) with
the headers Pelican-Request-Id, Pelican-Delivery (1 = the first delivery), Pelican-Deadline
(ms since the Unix epoch) and traceparent (when the request carries one). The status says
what became of the request (README, "From any language"):

  2xx                      the body is the answer
  4xx (but 408 and 429)    failed for good, the body is the message the caller gets
  408, 429, 5xx, no answer handed back to be delivered again (Retry-After: seconds, honoured)

On a raw-bytes queue (`pelican worker --codec raw`) bodies are application/octet-stream.
With --port 0 a free port is chosen; the URL is printed on stdout either way.
"""

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def handle(body):
    """The work, JSON in and JSON out. A ValueError fails the request for good."""
    if not isinstance(body, dict) or not isinstance(body.get("n"), (int, float)):
        raise ValueError('expected {"n": <number>}')
    return {"n": body["n"], "square": body["n"] * body["n"]}


def handle_raw(data):
    """The work on a raw-bytes queue: bytes in, bytes out."""
    return data.upper()


class Worker(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: pelican reuses its connections

    def do_POST(self):
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            if self.headers.get("Content-Type") == "application/octet-stream":
                self.reply(200, handle_raw(data), "application/octet-stream")
            else:
                answer = handle(json.loads(data))
                self.reply(200, json.dumps(answer).encode(), "application/json")
        except ValueError as e:  # bad input: fail for good (422 is a 4xx)
            self.reply(422, str(e).encode(), "text/plain")
        except Exception as e:  # anything else: try again later
            self.reply(503, repr(e).encode(), "text/plain")

    def reply(self, status, body, content_type):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):  # one line per request on stderr, in one write
        rid = self.headers.get("Pelican-Request-Id", "-") if self.headers else "-"
        sys.stderr.write(f"{fmt % args} request {rid}\n")
        sys.stderr.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    args = p.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Worker)
    server.daemon_threads = True
    print(f"http://{args.host}:{server.server_port}/square", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

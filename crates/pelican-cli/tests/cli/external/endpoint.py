"""An `--http` endpoint for the tests. On the first `times` deliveries (default 1) of a
request whose JSON body has "status", it waits "sleep_ms", then answers that status with
"body" (text, followed by "pad" x's) and "retry_after" (a Retry-After header) if given; otherwise 200 with
{"echo": body, "delivery": N, "calls": calls seen for this request id, "headers": {...}}.
On a raw queue (application/octet-stream) it answers the bytes upper-cased.
Every call is logged on stderr as "call <request id> delivery <N>".
Usage: endpoint.py PORT (0: a free one); prints its URL on stdout."""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

calls = {}
lock = threading.Lock()


class Endpoint(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        data = self.rfile.read(int(self.headers["Content-Length"]))
        rid = self.headers.get("Pelican-Request-Id")
        delivery = int(self.headers.get("Pelican-Delivery", "0"))
        with lock:
            calls[rid] = calls.get(rid, 0) + 1
            n = calls[rid]
            # One write per line: print() writes the text and its end apart.
            sys.stderr.write(f"call {rid} delivery {delivery}\n")
            sys.stderr.flush()
        if self.headers.get("Content-Type") == "application/octet-stream":
            return self.reply(200, data.upper(), {})  # a raw queue: the bytes, upper-cased
        body = json.loads(data)
        if isinstance(body, dict) and "status" in body and delivery <= body.get("times", 1):
            time.sleep(body.get("sleep_ms", 0) / 1000)
            extra = {"Retry-After": str(body["retry_after"])} if "retry_after" in body else {}
            text = body.get("body", "") + "x" * body.get("pad", 0)
            return self.reply(body["status"], text.encode(), extra)
        headers = {
            k: self.headers.get(k)
            for k in ["Pelican-Request-Id", "Pelican-Delivery", "Pelican-Deadline", "Content-Type"]
        }
        answer = {"echo": body, "delivery": delivery, "calls": n, "headers": headers}
        self.reply(200, json.dumps(answer).encode(), {"Content-Type": "application/json"})

    def reply(self, status, body, headers):
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Endpoint)
server.daemon_threads = True
print(f"http://127.0.0.1:{server.server_port}/work", flush=True)
server.serve_forever()

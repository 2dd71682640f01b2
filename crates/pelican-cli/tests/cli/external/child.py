"""An `--exec` child for the tests (line protocol 1), its misbehaviour chosen by each
request's body, on the body's first `times` deliveries (default 1):
  {"exit": C}        exit at once with code C (a poison request kills every child)
  {"garbage": true}  write a line that is not an answer
  {"sleep_ms": N}    wait N ms before answering
  {"fail": "why"}    fail for good (on every delivery)
Otherwise it answers {"echo": body, "pid": its pid, "delivery": N, "deadline_ms": ...}.
Every request is logged on stderr as "working on <id> delivery <N>"."""

import json
import os
import sys
import threading
import time

hello = json.loads(sys.stdin.readline())
assert hello["pelican"] == 1, hello
lock = threading.Lock()


def write(text):
    with lock:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def log(text):
    # One write per line: print() writes the text and its end apart.
    with lock:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def work(req):
    body, delivery = req["body"], req["delivery"]
    log(f"working on {req['id']} delivery {delivery}")
    now = delivery <= body.get("times", 1)
    if now and "exit" in body:
        os._exit(body["exit"])
    if now and body.get("garbage"):
        write("this is not an answer")
        return
    if now and "sleep_ms" in body:
        time.sleep(body["sleep_ms"] / 1000)
    if "fail" in body:
        write(json.dumps({"id": req["id"], "error": body["fail"], "retry": False}))
        return
    answer = {
        "echo": body,
        "pid": os.getpid(),
        "delivery": delivery,
        "deadline_ms": req.get("deadline_ms"),
    }
    write(json.dumps({"id": req["id"], "ok": answer}))


log("ready")
write(json.dumps({"pelican": 1}))
for line in sys.stdin:
    threading.Thread(target=work, args=(json.loads(line),), daemon=True).start()

#!/usr/bin/env python3
"""The least Redis work a request/response queue on Redis Streams can cost: the commands
pelican's protocol cannot do without, as plain commands in deep pipelines (no Lua, no
per-entry checks, no recovery or dedup bookkeeping beyond the minimum), counted in
instructions of redis-server under callgrind (deterministic, unlike time here).

Per request: XADD of an entry with pelican's fields (`head` and `body`,
docs/PROTOCOL.md); per batch of --batch: XREADGROUP, one XACK of the batch, one reply
XADD with every outcome, XREAD of the replies, XTRIM MINID ~. With --dedup, per request
also the least an index can cost: SET NX GET to claim it on submit, SET GET to record the
outcome. With --scripts (implies --dedup), the same commands, but submissions and
completions are one script call per batch each, as they must be for the check-and-insert
and the gate to be atomic: the least an atomic protocol costs on Redis 7.0. With --gate
(dedup off), completions go through the least atomic gate: one script call per batch, an
XACK of its own per request (only the first acknowledgement of a pending entry may push
an outcome), then the winners' reply XADD and the trim. The ids are given explicitly, so
the whole run is one pipeline, fed by redis-cli --pipe. With --pelican, pelican's own
submit.lua and complete.lua (dedup on, small bodies; as a function library called with
FCALL, as pelican does, or with EVALSHA for the scripts of a build before the library,
`--lua DIR`) do the submitting and completing in
batches of --batch, with XREADGROUP and XREAD between them: the same work as `pelican
bench` without its clients' timing, so a change to a script can be compared to the
instruction.

    python3 scripts/stream-floor.py [--requests 20000] [--batch 100] [--dedup | --scripts | --gate | --pelican [--lua DIR]]

Prints instructions per request (the run's total over --requests: start-up and shut-down
included, as in pelican's measurement with the same method). With --cpu, redis-server
runs on its own instead, and the CPU time it used (INFO cpu, user + system) per request
is printed: the time-based figure `pelican bench` reports as redis_cpu_us_per_req.
"""
import argparse, os, shutil, socket, subprocess, sys, tempfile, time


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


# One call per batch: per request rid, stream id, pending value, body.
SUBMIT = """
for i = 1, #ARGV, 4 do
  if not redis.call('SET', KEYS[2] .. ARGV[i], ARGV[i + 2], 'NX', 'GET', 'PX', 120000) then
    redis.call('XADD', KEYS[1], ARGV[i + 1], 'head', ARGV[i] .. ';p1;1;1;1', 'body', ARGV[i + 3])
  end
end
return 1
"""
# One call per batch: reply id, trim bound, then per request rid, stream id, outcome.
COMPLETE = """
local ids, pairs = {}, {}
for i = 3, #ARGV, 3 do
  redis.call('SET', KEYS[2] .. ARGV[i], ARGV[i + 2], 'GET', 'PX', 60000)
  ids[#ids + 1] = ARGV[i + 1]
  pairs[#pairs + 1] = ARGV[i]
  pairs[#pairs + 1] = ARGV[i + 2]
end
redis.call('XACK', KEYS[1], 'pelican', unpack(ids))
redis.call('XADD', KEYS[3], 'NOMKSTREAM', 'MAXLEN', '~', 100000, ARGV[1], unpack(pairs))
redis.call('XTRIM', KEYS[1], 'MINID', '~', ARGV[2])
return 1
"""


# Without dedup, the least atomic gate: one call per batch, per request an XACK of its
# own (only the first acknowledgement of a pending entry may push an outcome), then the
# reply XADD of the winners and the trim. Reply id, trim bound, then per request rid,
# stream id, outcome (as COMPLETE).
GATE = """
local pairs = {}
for i = 3, #ARGV, 3 do
  if redis.call('XACK', KEYS[1], 'pelican', ARGV[i + 1]) == 1 then
    pairs[#pairs + 1] = ARGV[i]
    pairs[#pairs + 1] = ARGV[i + 2]
  end
end
redis.call('XADD', KEYS[3], 'NOMKSTREAM', 'MAXLEN', '~', 100000, ARGV[1], unpack(pairs))
redis.call('XTRIM', KEYS[1], 'MINID', '~', ARGV[2])
return 1
"""
OUTCOME = 'O{"i":0,"ok":true}'


def workload(n, batch, dedup, scripts, gate=False):
    s, r, g = "pelican:{floor}:stream", "pelican:{floor}:reply:p1", "pelican"
    keys = (s, "pelican:{floor}:req:", r)
    yield resp("XGROUP", "CREATE", s, g, "0", "MKSTREAM")
    yield resp("XADD", r, "1-0", "pelican", "reply stream created")
    ms = 1_800_000_000_000
    body = b'{"i":0,"data":"' + b"x" * 64 + b'"}'
    pending = lambda sid: "P%s;%d;p1;" % (sid, ms + 60000)
    for b0 in range(0, n, batch):
        ids = [("%d-%d" % (ms, i), "%032x" % i) for i in range(b0, min(n, b0 + batch))]
        # submit
        if scripts:
            args = []
            for sid, rid in ids:
                args += [rid, sid, pending(sid), body]
            yield resp("EVAL", SUBMIT, 3, *keys, *args)
        else:
            for sid, rid in ids:
                if dedup:
                    yield resp("SET", keys[1] + rid, pending(sid), "NX", "GET", "PX", 120000)
                head = "%s;p1;%d;%d;%d" % (rid, ms + 60000, ms, 1 if dedup else 0)
                yield resp("XADD", s, sid, "head", head, "body", body)
        yield resp("XREADGROUP", "GROUP", g, "c", "COUNT", batch, "STREAMS", s, ">")
        # complete
        if scripts or gate:
            args = ["%d-0" % (b0 + 2), "%d-%d" % (ms, b0 + batch)]
            for sid, rid in ids:
                args += [rid, sid, OUTCOME]
            yield resp("EVAL", COMPLETE if scripts else GATE, 3, *keys, *args)
        else:
            if dedup:
                for _, rid in ids:
                    yield resp("SET", keys[1] + rid, OUTCOME, "GET", "PX", 60000)
            yield resp("XACK", s, g, *[sid for sid, _ in ids])
            pairs = []
            for _, rid in ids:
                pairs += [rid, OUTCOME]
            yield resp("XADD", r, "NOMKSTREAM", "MAXLEN", "~", 100000, "%d-0" % (b0 + 2), *pairs)
            yield resp("XTRIM", s, "MINID", "~", "%d-%d" % (ms, b0 + batch))
        yield resp("XREAD", "COUNT", batch, "STREAMS", r, "%d-0" % (b0 + 1))


def read_reply(f):
    line = f.readline()
    t, rest = line[:1], line[1:-2]
    if t in (b"+", b"-"):
        return rest if t == b"+" else RuntimeError(rest.decode())
    if t == b":":
        return int(rest)
    if t == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2]
    if t == b"*":
        n = int(rest)
        return None if n < 0 else [read_reply(f) for _ in range(n)]
    raise RuntimeError(f"unexpected reply {line!r}")


def pelican_run(port, n, batch, lua):
    """pelican's scripts (from directory `lua`), dedup on, 64-byte bodies: submit.lua,
    XREADGROUP, complete.lua, XREAD, one batch at a time."""
    lib = open(os.path.join(lua, "lib.lua")).read()
    sextuples = "sextuples" in open(os.path.join(lua, "complete.lua")).read()
    so = socket.create_connection(("127.0.0.1", port))
    f = so.makefile("rb")

    def call(*args):
        so.sendall(resp(*args))
        r = read_reply(f)
        if isinstance(r, RuntimeError):
            raise r
        return r

    if "begin_call" in lib:
        # a function library, as crates/pelican/src/protocol/scripts/library.rs builds it
        code = "#!lua name=pelican_floor\n" + lib + "\n"
        for name in ("submit", "complete"):
            code += ("redis.register_function('pelican_floor_%s', function(KEYS, ARGV)\n"
                     "begin_call()\n%s\nend)\n") % (name, open(os.path.join(lua, name + ".lua")).read())
        call("FUNCTION", "LOAD", "REPLACE", code)
        run, shas = "FCALL", {name: "pelican_floor_" + name for name in ("submit", "complete")}
    else:
        # scripts of a build before the library (lib.lua prepended, EVALSHA)
        run = "EVALSHA"
        shas = {name: call("SCRIPT", "LOAD", lib + "\n" + open(os.path.join(lua, name + ".lua")).read())
                for name in ("submit", "complete")}
    base = "pelican:{floor}:"
    keys = (base + "stream", base + "req:", base + "reply:")
    call("XGROUP", "CREATE", keys[0], "pelican", "0", "MKSTREAM")
    call("XADD", keys[2] + "p1", "*", "pelican", "reply stream created")
    body = b'{"i":0,"data":"' + b"x" * 64 + b'"}'
    now = int(time.time() * 1000)
    last = "0"
    for b0 in range(0, n, batch):
        args = [now, "p1", "pelican", 60000, 100000]
        rids = ["%032x" % i for i in range(b0, min(n, b0 + batch))]
        for rid in rids:
            args += [rid, now + 60000, 120000, "", "", body]
        answers = call(run, shas["submit"], 3, *keys, *args)
        # a new entry's id ("+<sid>" from builds before f7da2d0)
        sids = [a.decode().lstrip("+") for a in answers]
        call("XREADGROUP", "GROUP", "pelican", "c", "COUNT", batch, "STREAMS", keys[0], ">")
        args = ["pelican", 60000, 100000, now]
        for sid, rid in zip(sids, rids):
            # the entry's deadline goes along since complete.lua takes sextuples
            deadline = [now + 60000] if sextuples else []
            args += [sid, rid, "p1", *deadline, "1t", OUTCOME]
        call(run, shas["complete"], 3, *keys, *args)
        got = call("XREAD", "COUNT", 10, "STREAMS", keys[2] + "p1", last)
        if got:
            last = got[0][1][-1][0].decode()
    so.close()
    return f"errors: 0, batches: {(n + batch - 1) // batch}"


def free_port():
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--dedup", action="store_true")
    ap.add_argument("--scripts", action="store_true")
    ap.add_argument("--gate", action="store_true",
                    help="dedup off, completions through the least atomic gate (a script)")
    ap.add_argument("--pelican", action="store_true")
    ap.add_argument("--cpu", action="store_true",
                    help="no valgrind: Redis' CPU time per request instead of instructions")
    ap.add_argument("--lua", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "crates", "pelican", "lua"),
                    help="where --pelican takes the scripts from (another build's, to compare)")
    a = ap.parse_args()
    a.dedup = a.dedup or a.scripts
    for tool in ("redis-server", "redis-cli") + (() if a.cpu else ("valgrind", "callgrind_annotate")):
        if not shutil.which(tool):
            sys.exit(f"stream-floor: {tool} is not on PATH")
    d = tempfile.mkdtemp(prefix="stream-floor-")
    port, out = free_port(), os.path.join(d, "callgrind.out")
    grind = [] if a.cpu else ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    srv = subprocess.Popen(grind + ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                    "--save", "", "--appendonly", "no"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cli = ["redis-cli", "-p", str(port)]
    for _ in range(300):
        if subprocess.run(cli + ["ping"], capture_output=True).stdout.strip() == b"PONG":
            break
        time.sleep(0.1)
    else:
        srv.kill()
        sys.exit("stream-floor: redis-server under valgrind did not start")
    def cpu():
        info = subprocess.run(cli + ["info", "cpu"], capture_output=True).stdout.decode()
        v = dict(l.split(":", 1) for l in info.splitlines() if ":" in l)
        return float(v["used_cpu_user"]) + float(v["used_cpu_sys"])

    cpu0 = cpu()
    try:
        if a.pelican:
            a.dedup = True
            tail = [pelican_run(port, a.requests, a.batch, a.lua)]
        else:
            data = b"".join(workload(a.requests, a.batch, a.dedup, a.scripts, a.gate))
            p = subprocess.run(cli + ["--pipe"], input=data, capture_output=True)
            tail = p.stdout.decode().strip().splitlines()[-1:]
        used = cpu() - cpu0
        stats = subprocess.run(cli + ["info", "commandstats"], capture_output=True).stdout.decode()
        subprocess.run(cli + ["shutdown", "nosave"], capture_output=True)
        srv.wait(timeout=60)
    finally:
        if srv.poll() is None:
            srv.kill()
    errors = [l for l in stats.splitlines() if "failed_calls=0" not in l and "calls=" in l]
    what = (f"dedup={a.dedup} scripts={a.scripts} gate={a.gate} pelican={a.pelican} "
            f"batch={a.batch} requests={a.requests}")
    if a.cpu:
        print(f"{what} redis_cpu_us_per_request={used / a.requests * 1e6:.2f} ({' '.join(tail)})")
    else:
        ann = subprocess.run(["callgrind_annotate", out], capture_output=True).stdout.decode()
        total = next(int(l.split()[0].replace(",", "")) for l in ann.splitlines()
                     if "PROGRAM TOTALS" in l)
        print(f"{what} instructions_per_request={total // a.requests} ({' '.join(tail)})")
    shutil.rmtree(d)
    if errors:
        sys.exit("stream-floor: commands failed: " + "; ".join(errors))


if __name__ == "__main__":
    main()

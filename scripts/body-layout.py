#!/usr/bin/env python3
"""What a large body costs Redis in each of two layouts, without dedup: the least
commands each needs, in deep pipelines on a private redis-server, Redis' own CPU time
per request (INFO cpu, user + system).

  inline   per request: XADD of an entry whose last field is the body; per batch:
           XREADGROUP of the batch (the bodies go out with the entries), one XACK and
           one XDEL of the batch.
  beside   per request: SET of the body at a key of its own, XADD of an entry that
           names it; per batch: XREADGROUP, one MGET of the batch's bodies, one XACK,
           one XDEL and one DEL of the batch's bodies.

Both read every reply (the bodies come back once in each). pelican without dedup uses
the first; with dedup the second (where its scripts need it: docs/PROTOCOL.md, "Stored
bodies"). The question it answers: how much of Redis' time per request the stream's own
copy of a body costs on this machine.

    python3 scripts/body-layout.py [--size 100000] [--requests 20000] [--batch 20] [--rounds 3]

Needs redis-server on PATH; starts its own on a free loopback port.
"""
import argparse, importlib.util, os, shutil, socket, subprocess, sys, tempfile, time

# The RESP encoder of stream-floor.py (its file name is not a module name).
_spec = importlib.util.spec_from_file_location(
    "stream_floor", os.path.join(os.path.dirname(os.path.abspath(__file__)), "stream-floor.py"))
_floor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_floor)
resp = _floor.resp


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def send(self, data):
        self.s.sendall(data)

    def _fill(self):
        chunk = self.s.recv(1 << 20)
        if not chunk:
            raise RuntimeError("redis closed the connection")
        self.buf += chunk

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 2]
                return line
            self._fill()

    def reply(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t in (b"+", b":"):
            return rest
        if t == b"-":
            raise RuntimeError(rest.decode())
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self._fill()
            v = bytes(self.buf[:n])
            del self.buf[: n + 2]
            return v
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RuntimeError("unexpected reply %r" % line)

    def call(self, *args):
        self.send(resp(*args))
        return self.reply()


def cpu(c):
    info = c.call("INFO", "cpu").decode()
    f = dict(l.split(":", 1) for l in info.splitlines() if ":" in l)
    return float(f["used_cpu_user"]) + float(f["used_cpu_sys"])


def entries(reply):
    # XREADGROUP reply: [[stream, [[id, [f, v, ...]], ...]]]
    return reply[0][1] if reply else []


def run(c, layout, size, n, batch):
    body = b"x" * size
    c.call("DEL", "s")
    c.call("XGROUP", "CREATE", "s", "g", "$", "MKSTREAM")
    start = cpu(c)
    for b0 in range(0, n, batch):
        reqs = range(b0, min(b0 + batch, n))
        out = []
        for i in reqs:
            if layout == "inline":
                out.append(resp("XADD", "s", "*", "rid", "r%d" % i, "body", body))
            else:
                out.append(resp("SET", "b:%d" % i, body))
                out.append(resp("XADD", "s", "*", "rid", "r%d" % i, "bref", "b:%d" % i))
        c.send(b"".join(out))
        for _ in out:
            c.reply()
        got = entries(c.call("XREADGROUP", "GROUP", "g", "c", "COUNT", batch, "STREAMS", "s", ">"))
        ids = [e[0] for e in got]
        if layout == "beside":
            refs = [e[1][3] for e in got]
            values = c.call("MGET", *refs)
            assert all(v is not None and len(v) == size for v in values)
            c.send(resp("XACK", "s", "g", *ids) + resp("XDEL", "s", *ids) + resp("DEL", *refs))
            for _ in range(3):
                c.reply()
        else:
            assert all(len(e[1][3]) == size for e in got)
            c.send(resp("XACK", "s", "g", *ids) + resp("XDEL", "s", *ids))
            for _ in range(2):
                c.reply()
    used = cpu(c) - start
    c.call("DEL", "s")
    return used / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=100000)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if not shutil.which("redis-server"):
        sys.exit("body-layout.py: redis-server not found on PATH")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    d = tempfile.mkdtemp()
    srv = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                            "--save", "", "--appendonly", "no", "--dir", d],
                           stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                c = Conn(port)
                c.call("PING")
                break
            except OSError:
                time.sleep(0.05)
        # warm the allocator with one run of each, then alternate
        for layout in ("inline", "beside"):
            run(c, layout, a.size, min(a.requests, 2000), a.batch)
        res = {"inline": [], "beside": []}
        for _ in range(a.rounds):
            for layout in ("inline", "beside"):
                res[layout].append(run(c, layout, a.size, a.requests, a.batch))
        for layout, xs in res.items():
            xs_s = " / ".join("%.1f" % x for x in xs)
            print("%-7s %d B, batches of %d: Redis CPU µs per request %s (median %.1f)"
                  % (layout, a.size, a.batch, xs_s, sorted(xs)[len(xs) // 2]))
    finally:
        srv.terminate()
        srv.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()

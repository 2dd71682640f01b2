#!/usr/bin/env bash
# pelican vs NATS (core request/reply and JetStream) on the peer benchmark's workload.
#
#   scripts/compare-nats.sh [N]        # N rounds, default 4
#
# Each round runs, in this order and each after the machine is quiet (quiet.sh):
#   1. NATS core request/reply:        $PEERS/nats-rpc/run.sh --mode core
#   2. pelican, no dedup:              target/release/pelican bench --json --no-dedup
#   3. NATS JetStream, file storage:   $PEERS/nats-rpc/run.sh --mode jetstream-file
#   4. pelican, dedup on:              target/release/pelican bench --json
# and prints each run's JSON line on stdout as it comes; at the end a table of the
# medians and the ratios: pelican without dedup / NATS core (neither stores anything
# durable) and pelican with dedup / JetStream-file (both keep every request until it is
# answered). Progress and diagnostics go to stderr. Exits non-zero as soon as a run fails.
#
# Env knobs: PEERS, PELICAN_ARGS, QUIET=0, RUN_TIMEOUT=300, PELICAN_BIN (as in
# compare-bullmq.sh). Needs nats-server with JetStream on 127.0.0.1:4222 and Redis on
# 127.0.0.1:6379 (both benchmarks refuse anything but loopback), cargo, python3.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
N="${1:-4}"
PEERS="${PEERS:-$ROOT/../shared/peers}"
RUN_TIMEOUT="${RUN_TIMEOUT:-300}"
PELICAN_ARGS="${PELICAN_ARGS:-}"

die() { echo "compare-nats.sh: $*" >&2; exit 1; }
say() { echo "compare-nats.sh: $*" >&2; }

[[ "$N" =~ ^[1-9][0-9]*$ ]] || die "usage: $0 [N]  (N: rounds, a positive number)"
[ -x "$PEERS/nats-rpc/run.sh" ] || die "no NATS benchmark at $PEERS/nats-rpc/run.sh (set PEERS=<peers folder>)"
command -v python3 >/dev/null || die "python3 not found (it does the medians)"

if [ -n "${PELICAN_BIN:-}" ]; then
  [ -x "$PELICAN_BIN" ] || die "PELICAN_BIN=$PELICAN_BIN is not an executable"
  PELICAN="$PELICAN_BIN"
  say "measuring $PELICAN (PELICAN_BIN)"
else
  say "building the release binary (cargo build --release -p pelican-cli)"
  cargo build --release -p pelican-cli >&2 || die "cargo build failed"
  PELICAN="$ROOT/target/release/pelican"
fi

OUT="$(mktemp -d -t compare-nats.XXXXXX)"
trap 'rm -rf "$OUT"' EXIT

quiet() {
  [ "${QUIET:-1}" = "0" ] && return 0
  if [ -x "$PEERS/quiet.sh" ]; then
    "$PEERS/quiet.sh" || say "the machine did not get quiet; measuring anyway (see 'other' CPU)"
  else
    say "no $PEERS/quiet.sh; not waiting for quiet"
  fi
}

# run <label> <command...>: one run; its JSON line goes to stdout and to $OUT/<label>.jsonl
run() {
  local label="$1"; shift
  quiet
  say "round $round/$N: $label"
  local line
  if ! line="$(timeout "$RUN_TIMEOUT" "$@")"; then
    die "$label failed in round $round (command: $*)"
  fi
  line="$(printf '%s\n' "$line" | tail -n 1)"
  python3 -c 'import json,sys; json.loads(sys.argv[1])' "$line" 2>/dev/null \
    || die "$label printed no JSON line in round $round: $line"
  printf '%s\n' "$line"
  printf '%s\n' "$line" >>"$OUT/$label.jsonl"
}

for round in $(seq 1 "$N"); do
  run nats-core "$PEERS/nats-rpc/run.sh" --mode core
  # shellcheck disable=SC2086
  run pelican-nodedup "$PELICAN" bench --json --no-dedup $PELICAN_ARGS
  run nats-js-file "$PEERS/nats-rpc/run.sh" --mode jetstream-file
  # shellcheck disable=SC2086
  run pelican-dedup "$PELICAN" bench --json $PELICAN_ARGS
done

python3 - "$OUT" "$N" <<'PY'
import json, os, statistics, sys

out, n = sys.argv[1], sys.argv[2]
def load(label):
    with open(os.path.join(out, label + ".jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]
runs = {k: load(k) for k in ("nats-core", "pelican-nodedup", "nats-js-file", "pelican-dedup")}

def med(label, key, sub=None):
    vals = []
    for r in runs[label]:
        v = r.get(key)
        if sub is not None:
            v = (v or {}).get(sub)
        if isinstance(v, (int, float)):
            vals.append(v)
    return statistics.median(vals) if vals else None

def fmt(v, key=""):
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:.0f}"
    if abs(v) >= 10 or key == "tp_cpu_pct":
        return f"{v:.1f}"
    if key == "redis_cmds_per_req":
        return f"{v:.2f}"
    return f"{v:.3f}"

rows = [
    ("throughput req/s", "throughput_rps", None),
    ("tp p50 ms", "tp_p50_ms", None),
    ("tp p99 ms", "tp_p99_ms", None),
    ("lat p50 ms", "lat_p50_ms", None),
    ("lat p99 ms", "lat_p99_ms", None),
    ("redis cmds/req", "redis_cmds_per_req", None),
    ("redis µs/req", "redis_cpu_us_per_req", None),
    ("cpu machine %", "tp_cpu_pct", "machine"),
    ("cpu producer %", "tp_cpu_pct", "producer"),
    ("cpu worker %", "tp_cpu_pct", "worker"),
    ("cpu redis %", "tp_cpu_pct", "redis"),
    ("cpu other %", "tp_cpu_pct", "other"),
]
labels = ["nats-core", "pelican-nodedup", "nats-js-file", "pelican-dedup"]
table = [["median of " + n + " runs"] + labels + ["nodedup/core", "dedup/js-file"]]
for name, key, sub in rows:
    c, nd, js, d = (med(l, key, sub) for l in labels)
    ratio = lambda x, y: "-" if x is None or not y else f"{x / y:.2f}x"
    table.append([name, fmt(c, key), fmt(nd, key), fmt(js, key), fmt(d, key), ratio(nd, c), ratio(d, js)])
widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
print(rule)
for i, r in enumerate(table):
    print("| " + " | ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))) + " |")
    if i == 0:
        print(rule)
print(rule)
print("Ratios: pelican without dedup / NATS core, pelican with dedup / JetStream-file.")
core, js = med("nats-core", "throughput_rps"), med("nats-js-file", "throughput_rps")
checks = [
    ("throughput, dedup on >= 1.5x JetStream-file", med("pelican-dedup", "throughput_rps") / js if js else None, lambda x: x >= 1.5, "x"),
    ("throughput, dedup off >= 0.7x NATS core", med("pelican-nodedup", "throughput_rps") / core if core else None, lambda x: x >= 0.7, "x"),
    ("sequential p50, dedup on <= JetStream-file's", med("pelican-dedup", "lat_p50_ms"), lambda x: x <= (med("nats-js-file", "lat_p50_ms") or 0), " ms"),
]
print("Targets (issue 11), on the medians:")
for name, v, ok, unit in checks:
    verdict = "?" if v is None else ("met" if ok(v) else "MISSED")
    print(f"  {verdict:6} {name}: {'-' if v is None else f'{v:.2f}{unit}'}")
others = [r.get("tp_cpu_pct", {}).get("other") for l in labels for r in runs[l]]
others = [o for o in others if isinstance(o, (int, float))]
if others and max(others) > 10:
    print(f"  note: 'other' CPU reached {max(others):.0f} % of a core in some run: the machine was busy, numbers are noisy")
PY

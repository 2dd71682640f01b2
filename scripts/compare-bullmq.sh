#!/usr/bin/env bash
# pelican vs BullMQ on the peer benchmark's workload, on this machine.
#
#   scripts/compare-bullmq.sh [N]        # N rounds, default 3
#
# Each round runs, in this order and each after the machine is quiet (quiet.sh):
#   1. BullMQ:            $PEERS/bullmq/run.sh
#   2. pelican, dedup on: target/release/pelican bench --json
#   3. pelican, no dedup: target/release/pelican bench --json --no-dedup
# and prints each run's JSON line on stdout as it comes; at the end a table of the
# medians and the ratios pelican/BullMQ. Progress and diagnostics go to stderr. Exits
# non-zero as soon as a run fails.
#
# Env knobs:
#   PEERS=<dir>          the peers folder (default: ../shared/peers from the repo root)
#   BULLMQ_DIR=<dir>     passed on to run.sh (another bullmq version's node_modules)
#   PELICAN_ARGS="..."   extra arguments for `pelican bench` (e.g. "--requests 100000")
#   QUIET=0              do not wait for quiet (quiet.sh's own knobs: QUIET_PCT, QUIET_MAX)
#   RUN_TIMEOUT=300      seconds one run may take
#   PELICAN_BIN=<path>   a pelican binary to measure instead of building this tree's
#                        (e.g. a copy of an earlier build, to compare builds)
# Needs Redis on 127.0.0.1:6379 (both benchmarks refuse anything but loopback), node for
# BullMQ, cargo for the build, python3 for the medians.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
N="${1:-3}"
PEERS="${PEERS:-$ROOT/../shared/peers}"
RUN_TIMEOUT="${RUN_TIMEOUT:-300}"
PELICAN_ARGS="${PELICAN_ARGS:-}"

die() { echo "compare-bullmq.sh: $*" >&2; exit 1; }
say() { echo "compare-bullmq.sh: $*" >&2; }

[[ "$N" =~ ^[1-9][0-9]*$ ]] || die "usage: $0 [N]  (N: rounds, a positive number)"
[ -x "$PEERS/bullmq/run.sh" ] || die "no BullMQ benchmark at $PEERS/bullmq/run.sh (set PEERS=<peers folder>)"
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

OUT="$(mktemp -d -t compare-bullmq.XXXXXX)"
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
  run bullmq "$PEERS/bullmq/run.sh"
  # shellcheck disable=SC2086
  run pelican-dedup "$PELICAN" bench --json $PELICAN_ARGS
  # shellcheck disable=SC2086
  run pelican-nodedup "$PELICAN" bench --json --no-dedup $PELICAN_ARGS
done

python3 - "$OUT" "$N" <<'PY'
import json, os, statistics, sys

out, n = sys.argv[1], sys.argv[2]
def load(label):
    with open(os.path.join(out, label + ".jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]
runs = {k: load(k) for k in ("bullmq", "pelican-dedup", "pelican-nodedup")}

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
labels = ["bullmq", "pelican-dedup", "pelican-nodedup"]
table = [["median of " + n + " runs"] + labels + ["dedup/bullmq", "nodedup/bullmq"]]
for name, key, sub in rows:
    b, d, nd = (med(l, key, sub) for l in labels)
    ratio = lambda x: "-" if x is None or not b else f"{x / b:.2f}x"
    table.append([name, fmt(b, key), fmt(d, key), fmt(nd, key), ratio(d), ratio(nd)])
widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
print(rule)
for i, r in enumerate(table):
    print("| " + " | ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))) + " |")
    if i == 0:
        print(rule)
print(rule)
print("Ratios are pelican/bullmq: for throughput higher is better, for latencies lower is better.")

b = med("bullmq", "throughput_rps")
checks = [
    ("throughput, dedup on >= 3.0x bullmq", med("pelican-dedup", "throughput_rps") / b if b else None, lambda x: x >= 3.0, "x"),
    ("throughput, dedup off >= 5.0x bullmq", med("pelican-nodedup", "throughput_rps") / b if b else None, lambda x: x >= 5.0, "x"),
    ("lat p50 <= 0.25 ms (dedup on)", med("pelican-dedup", "lat_p50_ms"), lambda x: x <= 0.25, " ms"),
    ("lat p99 <= 1.0 ms (dedup on)", med("pelican-dedup", "lat_p99_ms"), lambda x: x <= 1.0, " ms"),
    ("lat p50 <= 0.25 ms (dedup off)", med("pelican-nodedup", "lat_p50_ms"), lambda x: x <= 0.25, " ms"),
    ("lat p99 <= 1.0 ms (dedup off)", med("pelican-nodedup", "lat_p99_ms"), lambda x: x <= 1.0, " ms"),
    ("redis cmds/req <= 12 (dedup on)", med("pelican-dedup", "redis_cmds_per_req"), lambda x: x <= 12, ""),
    ("redis cmds/req <= 6 (dedup off)", med("pelican-nodedup", "redis_cmds_per_req"), lambda x: x <= 6, ""),
]
print("Targets (issue #4), on the medians:")
for name, v, ok, unit in checks:
    verdict = "?" if v is None else ("met" if ok(v) else "MISSED")
    print(f"  {verdict:6} {name}: {'-' if v is None else f'{v:.2f}{unit}'}")
others = [r.get("tp_cpu_pct", {}).get("other") for l in labels for r in runs[l]]
others = [o for o in others if isinstance(o, (int, float))]
if others and max(others) > 10:
    print(f"  note: 'other' CPU reached {max(others):.0f} % of a core in some run: the machine was busy, numbers are noisy")
PY

#!/usr/bin/env bash
# Two pelican builds against each other, on this machine: is B faster than A?
#
#   scripts/compare-builds.sh A B [N]    # A, B: pelican binaries; N pairs (default 4)
#
# Each pair runs `pelican bench --json` with A then B, or B then A (ABBA order, so a
# drift of the machine during the pairs cancels), dedup on and off, each run after the
# machine is quiet, against a private redis-server (no persistence). By default Redis
# runs on CPU 0 and the bench's processes on the others: on this 2-CPU machine kind the
# same build's Redis time per request otherwise lands in one of two bands depending on
# where the scheduler puts the three processes
# (docs/benchmarks/2026-12-03-a7c0e64-queue-name-and-servers.md, "One build, two speeds"),
# which says more about the band a run drew than about the build. At the end, per mode:
# each build's median rate, Redis µs per request and p50, B/A, and every run.
#
# Env knobs:
#   REDIS_CPU=0          CPUs for redis-server (taskset -c); "" for no pinning
#   CLIENT_CPU=1         CPUs for the bench (producer and workers); "" for no pinning
#   BENCH_ARGS="..."     more arguments for `pelican bench` (e.g. --payload-bytes 100000)
#   CALLGRIND=1          instead of timing: redis-server under callgrind, one run per build
#                        and mode of 20,000 requests, and its instructions per request
#   QUIET=0              do not wait for quiet (../shared/peers/quiet.sh)
#   RUN_TIMEOUT=600      seconds one run may take
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PEERS="${PEERS:-$ROOT/../shared/peers}"
RUN_TIMEOUT="${RUN_TIMEOUT:-600}"
BENCH_ARGS="${BENCH_ARGS:-}"
CALLGRIND="${CALLGRIND:-0}"
REDIS_CPU="${REDIS_CPU-0}"
CLIENT_CPU="${CLIENT_CPU-1}"

die() { echo "compare-builds.sh: $*" >&2; exit 1; }
say() { echo "compare-builds.sh: $*" >&2; }

[ $# -ge 2 ] || die "usage: $0 A B [N]  (A, B: pelican binaries; N: pairs)"
A="$1" B="$2" N="${3:-4}"
for b in "$A" "$B"; do
  [ -x "$b" ] || die "$b is not an executable"
done
[[ "$N" =~ ^[1-9][0-9]*$ ]] || die "N (pairs) is a positive number, not '$N'"
for c in redis-server redis-cli python3; do
  command -v "$c" >/dev/null || die "$c not found"
done
if [ "$CALLGRIND" = "1" ]; then
  for c in valgrind callgrind_annotate; do
    command -v "$c" >/dev/null || die "CALLGRIND=1 needs $c"
  done
  N=1
  REDIS_CPU="" CLIENT_CPU=""
fi
RPIN=() CPIN=()
if [ -n "$REDIS_CPU" ] || [ -n "$CLIENT_CPU" ]; then
  command -v taskset >/dev/null || die "pinning needs taskset (or REDIS_CPU= CLIENT_CPU=)"
fi
[ -n "$REDIS_CPU" ] && RPIN=(taskset -c "$REDIS_CPU")
[ -n "$CLIENT_CPU" ] && CPIN=(taskset -c "$CLIENT_CPU")

OUT="$(mktemp -d -t compare-builds.XXXXXX)"
. "$ROOT/scripts/lib/private-server.sh"
trap 'stop_server; rm -rf "$OUT"' EXIT

# run LABEL BIN DEDUP [PROFILE]: one bench on a fresh server, one JSON line
run() {
  local label="$1" bin="$2" dedup="$3" profile="${4:-}" extra=()
  [ "$dedup" = "off" ] && extra+=(--no-dedup)
  [ -n "$profile" ] && extra+=(--requests 20000 --latency-requests 0)
  [ -z "$profile" ] && quiet
  start_server redis-server "$profile"
  # shellcheck disable=SC2086
  local json
  json="$(timeout "$RUN_TIMEOUT" "${CPIN[@]}" "$bin" --redis "redis://127.0.0.1:$PORT" bench \
    --json "${extra[@]}" $BENCH_ARGS 2>"$OUT/bench.err")" \
    || { cat "$OUT/bench.err" >&2; die "pelican bench failed ($label, dedup $dedup)"; }
  stop_server
  local total=""
  if [ -n "$profile" ]; then
    # (awk reads to the end: a reader that stops early would end the pipe with SIGPIPE)
    total="$(callgrind_annotate "$profile" \
      | awk '/PROGRAM TOTALS/ && !t { gsub(",", "", $1); t = $1 } END { print t }')"
  fi
  JSON="$json" LABEL="$label" TOTAL="$total" python3 -c '
import json, os
r = json.loads(os.environ["JSON"])
out = {"build": os.environ["LABEL"], "dedup": r["dedup"], "rate": r["throughput_rps"],
       "p50_ms": r["lat_p50_ms"], "redis_cpu_us_per_req": r["redis_cpu_us_per_req"],
       "bad_answers": r["bad_answers"]}
if os.environ["TOTAL"]:
    out["instructions_per_req"] = int(os.environ["TOTAL"]) // r["requests"]
print(json.dumps(out))' | tee -a "$OUT/runs.jsonl"
}

say "A = $A, B = $B; $N pairs; Redis on CPUs '${REDIS_CPU:-any}', the bench on '${CLIENT_CPU:-any}'"
for pair in $(seq "$N"); do
  order=(A B)
  [ $((pair % 2)) -eq 0 ] && order=(B A)
  for dedup in on off; do
    for label in "${order[@]}"; do
      bin="$A"
      [ "$label" = B ] && bin="$B"
      profile=""
      [ "$CALLGRIND" = "1" ] && profile="$OUT/callgrind.$label.$dedup"
      run "$label" "$bin" "$dedup" "$profile"
    done
  done
  say "pair $pair of $N done"
done

python3 - "$OUT/runs.jsonl" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
grind = "instructions_per_req" in runs[0]
cols = [("rate", "req/s", "{:,.0f}"), ("redis_cpu_us_per_req", "Redis us/req", "{:.1f}"),
        ("p50_ms", "p50 ms", "{:.3f}")]
if grind:
    cols = [("instructions_per_req", "Redis instr/req", "{:,.0f}")]
print("| dedup | build | runs | " + " | ".join(c[1] for c in cols) + " | every run |")
print("|---|---|---|" + "---|" * len(cols) + "---|")
for dedup in (True, False):
    med = {}
    for build in ("A", "B"):
        rs = [r for r in runs if r["dedup"] == dedup and r["build"] == build]
        med[build] = {c: statistics.median(r[c] for r in rs) for c, _, _ in cols}
        every = " / ".join(cols[0][2].format(r[cols[0][0]]) for r in rs)
        print(f"| {'on' if dedup else 'off'} | {build} | {len(rs)} | "
              + " | ".join(f.format(med[build][c]) for c, _, f in cols) + f" | {every} |")
    ratio = " | ".join(f"{med['B'][c] / med['A'][c]:.3f}x" if med["A"][c] else "-"
                       for c, _, _ in cols)
    print(f"| {'on' if dedup else 'off'} | B/A | | {ratio} | |")
if sum(r["bad_answers"] for r in runs):
    sys.exit("compare-builds.sh: bad answers")
EOF

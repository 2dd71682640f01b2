#!/usr/bin/env bash
# The HTTP gateway against the library, on this machine, in one run.
#
#   scripts/compare-gateway.sh [N]       # N rounds, default 3
#
# Each round runs, each after the machine is quiet (../shared/peers/quiet.sh):
#   library       pelican bench --json                      (1,000 in flight, the bench's default)
#   library-256   pelican bench --json --inflight 256
#   gateway-256   pelican bench --json --via-gateway --inflight 256
# odd rounds in that order, even rounds in the reverse, so the medians see every slot
# before and after every other. `--via-gateway` starts `pelican gateway` (one thread, its
# default) and sends the same workload over HTTP/1.1: 256 keep-alive connections, one
# call at a time on each (the load generator is the bench's own client: it writes each
# request in one write and reads the answer by its Content-Length). The latency phase of
# each run is 2,000 calls one at a time, on one connection for the gateway.
# Every run's JSON line goes to stdout as it comes; at the end the medians, the ratios,
# and issue 40's targets: gateway-256 at least half of library's rate, and its
# sequential p50 at most 0.15 ms above library's.
#
# Env knobs:
#   PELICAN_BIN=<path>   a pelican binary to measure instead of building this tree's
#   PELICAN_ARGS="..."   extra arguments for every `pelican bench` (e.g. "--requests 50000")
#   QUIET=0              do not wait for quiet
#   RUN_TIMEOUT=300      seconds one run may take
# Starts its own redis-server (no persistence) on a free loopback port and stops it at
# the end. Needs redis-server, python3.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
N="${1:-3}"
RUN_TIMEOUT="${RUN_TIMEOUT:-300}"
PELICAN_ARGS="${PELICAN_ARGS:-}"
PEERS="${PEERS:-$ROOT/../shared/peers}"

die() { echo "compare-gateway.sh: $*" >&2; exit 1; }
say() { echo "compare-gateway.sh: $*" >&2; }

[[ "$N" =~ ^[1-9][0-9]*$ ]] || die "usage: $0 [N]  (N: rounds, a positive number)"
command -v redis-server >/dev/null || die "redis-server not found"
command -v python3 >/dev/null || die "python3 not found (it does the medians)"

OUT="$(mktemp -d -t compare-gateway.XXXXXX)"
# shellcheck source=lib/private-server.sh
. "$ROOT/scripts/lib/private-server.sh"
trap 'stop_server; rm -rf "$OUT"' EXIT
# shellcheck source=lib/pelican-bin.sh
. "$ROOT/scripts/lib/pelican-bin.sh"

start_server redis-server
URL="redis://127.0.0.1:$PORT"
say "redis-server on $URL; $N rounds; binary $PELICAN"

# run <label> <bench args...>
run() {
  local label="$1"; shift
  quiet
  say "round $round/$N: $label"
  local line
  # shellcheck disable=SC2086
  if ! line="$(timeout "$RUN_TIMEOUT" "$PELICAN" --redis "$URL" bench --json "$@" $PELICAN_ARGS)"; then
    die "$label failed in round $round"
  fi
  line="$(printf '%s\n' "$line" | tail -n 1)"
  python3 -c 'import json,sys; json.loads(sys.argv[1])' "$line" 2>/dev/null \
    || die "$label printed no JSON line in round $round: $line"
  printf '%s\n' "$line"
  printf '%s\n' "$line" >>"$OUT/$label.jsonl"
}

slots=(library library-256 gateway-256)
args_of() {
  case "$1" in
    library) ;;
    library-256) echo "--inflight 256" ;;
    gateway-256) echo "--via-gateway --inflight 256" ;;
  esac
}
for round in $(seq 1 "$N"); do
  order=("${slots[@]}")
  if (( round % 2 == 0 )); then order=(gateway-256 library-256 library); fi
  for label in "${order[@]}"; do
    # shellcheck disable=SC2046
    run "$label" $(args_of "$label")
  done
done

python3 - "$OUT" "$N" "$ROOT/scripts/lib" <<'PY'
import sys
sys.path.insert(0, sys.argv[3])
import medians
from medians import load, med as median, noise_note, per_round, print_table

out, n = sys.argv[1], sys.argv[2]
labels = ["library", "library-256", "gateway-256"]
runs = load(out, labels)
med = lambda label, key, sub=None: median(runs, label, key, sub)
medians.ROWS = medians.ROWS + [("cpu gateway %", "tp_cpu_pct", "gateway"),
                               ("cpu client %", "tp_cpu_pct", "client")]
print_table(runs, n, labels, [("gateway/library", "gateway-256", "library"),
                              ("gateway/library-256", "gateway-256", "library-256")])
per_round(runs, [("gateway/library", "gateway-256", "library"),
                 ("gateway/library-256", "gateway-256", "library-256")])
lib, gw = med("library", "throughput_rps"), med("gateway-256", "throughput_rps")
p50 = med("gateway-256", "lat_p50_ms") - med("library", "lat_p50_ms")
print("Targets (issue 40), on the medians:")
for name, v, ok, unit in [
    ("gateway rate >= 0.5x library's", gw / lib if lib else None, lambda x: x >= 0.5, "x"),
    ("gateway sequential p50 <= library's + 0.15 ms", p50, lambda x: x <= 0.15, " ms"),
]:
    verdict = "?" if v is None else ("met" if ok(v) else "MISSED")
    print(f"  {verdict:6} {name}: {'-' if v is None else f'{v:+.3f}{unit}' if unit == ' ms' else f'{v:.2f}{unit}'}")
noise_note(runs)
PY

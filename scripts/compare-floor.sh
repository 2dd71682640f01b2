#!/usr/bin/env bash
# pelican against the Redis floor for large bodies, on this machine.
#
#   scripts/compare-floor.sh [N] [SIZE...]   # N rounds (default 3); sizes in bytes
#                                            # (default 64 10000 100000 1000000 4000000)
#
# The floor is what Redis itself does with a body of that size: one SET and one GET
# (redis-benchmark -d SIZE; 8 clients for the rate, 1 client for the latency). A request
# through pelican moves its body into Redis once and out once, so
#   floor rate    = 1 / (1 / SET rate + 1 / GET rate)
#   floor latency = SET p50 + GET p50
# Each round runs, for each size, each after the machine is quiet: the floor, and
#   pelican bench --payload-bytes SIZE with dedup on and off for each codec in $CODECS
#   (default "raw json") and each binary; odd rounds in that order, even rounds in the
#   reverse (the floor last), so that the medians of an even number of rounds see every
#   slot equally often before and after every other.
# Every run's figures go to stdout as they come (one JSON line each); at the end a
# table per size: medians, the ratios pelican/floor (rate) and pelican/floor (p50), and
# Redis' CPU time per request (for the floor: per SET + GET pair of its rate run).
#
# Env knobs:
#   PELICAN_BIN=<path>   a pelican binary to measure instead of building this tree's
#   PELICAN_BIN_B=<path> a second binary (another build) measured beside the first in
#                        every run slot (A then B in odd rounds, B then A in even ones);
#                        its rows say "B"
#   CODECS="raw json"    the bench's --codec values to run
#   QUIET=0              do not wait for quiet (../shared/peers/quiet.sh)
#   REDIS_CPU=<list>     run redis-server on these CPUs only (taskset -c), for the floor
#                        and pelican alike: Redis with a core of its own, as in production,
#                        instead of wherever the scheduler puts it beside the clients
#   INFLIGHT=<n>         pelican's requests in flight for every size, instead of
#                        100 MB / size (16 to 1,000)
#   WORKERS=<n>          pelican's worker processes (pelican bench --workers), instead of
#                        the bench's one; B can differ by a wrapper of the same binary.
#                        The large-body targets are measured with WORKERS=2 (the floor is
#                        8 clients; two processes, the least fleet:
#                        docs/benchmarks/2026-12-05-60b5477-two-worker-method.md)
#   RUN_TIMEOUT=600      seconds one run may take
# Starts its own redis-server (no persistence) on a free loopback port and stops it at
# the end. Needs redis-server, redis-benchmark, python3.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
N="${1:-3}"
shift || true
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(64 10000 100000 1000000 4000000)
INFLIGHT="${INFLIGHT:-}"
CODECS="${CODECS:-raw json}"
RUN_TIMEOUT="${RUN_TIMEOUT:-600}"
PEERS="${PEERS:-$ROOT/../shared/peers}"

die() { echo "compare-floor.sh: $*" >&2; exit 1; }
say() { echo "compare-floor.sh: $*" >&2; }

[[ "$N" =~ ^[1-9][0-9]*$ ]] || die "usage: $0 [N] [SIZE...]  (N: rounds, a positive number)"
for s in "${SIZES[@]}"; do
  [[ "$s" =~ ^[1-9][0-9]*$ ]] || die "a size is a positive number of bytes, not '$s'"
done
[ -z "$INFLIGHT" ] || [[ "$INFLIGHT" =~ ^[1-9][0-9]*$ ]] \
  || die "INFLIGHT is a positive number of requests, not '$INFLIGHT'"
WORKERS="${WORKERS:-}"
[ -z "$WORKERS" ] || [[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] \
  || die "WORKERS is a positive number of processes, not '$WORKERS'"
for c in redis-server redis-benchmark python3; do
  command -v "$c" >/dev/null || die "$c not found"
done

. "$ROOT/scripts/lib/pelican-bin.sh"

BINS=("$PELICAN")
if [ -n "${PELICAN_BIN_B:-}" ]; then
  [ -x "$PELICAN_BIN_B" ] || die "PELICAN_BIN_B=$PELICAN_BIN_B is not an executable"
  BINS+=("$PELICAN_BIN_B")
fi

OUT="$(mktemp -d -t compare-floor.XXXXXX)"
RPIN=()
if [ -n "${REDIS_CPU:-}" ]; then
  command -v taskset >/dev/null || die "REDIS_CPU needs taskset"
  RPIN=(taskset -c "$REDIS_CPU")
fi
. "$ROOT/scripts/lib/private-server.sh"
cleanup() {
  stop_server
  rm -rf "$OUT"
}
trap cleanup EXIT
start_server redis-server
say "redis-server $(redis-server --version | grep -o 'v=[0-9.]*') on port $PORT${REDIS_CPU:+ (CPUs $REDIS_CPU)}; sizes ${SIZES[*]}; $N rounds"

# Request counts by size: 2 GB of bodies per run (capped at 20,000 requests), a few
# seconds at 100 KB and 1 MB: runs of 400 MB (under a second) were mostly warm-up there
# (the same build at 1 MB without dedup: 450 req/s over 400 requests, 978 over 4,000).
# At most ~100 MB of bodies in flight (1 MB: 100 in flight, as the issue's own
# measurement); enough latency requests for a p99.
counts() {
  python3 - "$1" "$INFLIGHT" <<'EOF'
import sys
s = int(sys.argv[1])
clamp = lambda v, lo, hi: max(lo, min(hi, v))
req = clamp(2_000_000_000 // s, 300, 20_000)
lat = clamp(200_000_000 // s, 100, 2_000)
inflight = int(sys.argv[2]) if sys.argv[2] else clamp(100_000_000 // s, 16, 1_000)
print(req, lat, inflight)
EOF
}

# Redis' CPU time so far (INFO cpu: user + system), in seconds.
redis_cpu() {
  redis-cli -p "$PORT" info cpu | tr -d '\r' \
    | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.6f\n", s }'
}

# One floor run: SET and GET rates with 8 clients (and Redis' CPU time per SET + GET pair
# in that run), p50s with 1 client.
floor() {
  local size="$1" n rate_n lat_n
  read -r rate_n lat_n _ < <(counts "$size")
  n="$rate_n"
  local rate lat cpu0 cpu1
  cpu0="$(redis_cpu)"
  rate="$(redis-benchmark -p "$PORT" -t set,get -d "$size" -n "$n" -c 8 -r 1000 --csv 2>/dev/null)"
  cpu1="$(redis_cpu)"
  lat="$(redis-benchmark -p "$PORT" -t set,get -d "$size" -n "$lat_n" -c 1 -r 1000 --csv 2>/dev/null)"
  redis-cli -p "$PORT" flushall >/dev/null
  python3 - "$size" "$rate" "$lat" "$n" "$cpu0" "$cpu1" <<'EOF'
import csv, io, json, sys
size, rate, lat = int(sys.argv[1]), sys.argv[2], sys.argv[3]
pairs, cpu = int(sys.argv[4]), float(sys.argv[6]) - float(sys.argv[5])
def rows(text):
    return {r["test"]: r for r in csv.DictReader(io.StringIO(text))}
r, l = rows(rate), rows(lat)
set_rps, get_rps = float(r["SET"]["rps"]), float(r["GET"]["rps"])
set_p50, get_p50 = float(l["SET"]["p50_latency_ms"]), float(l["GET"]["p50_latency_ms"])
print(json.dumps({"system": "floor", "size": size, "set_rps": set_rps, "get_rps": get_rps,
    "rate": round(1 / (1 / set_rps + 1 / get_rps), 1), "set_p50_ms": set_p50,
    "get_p50_ms": get_p50, "p50_ms": round(set_p50 + get_p50, 3),
    "redis_cpu_us_per_req": round(cpu / pairs * 1e6, 1)}))
EOF
}

run_pelican() {
  local size="$1" codec="$2" dedup="$3" bin="$4" label="$5" req lat inflight
  read -r req lat inflight < <(counts "$size")
  local extra=()
  [ "$dedup" = "off" ] && extra+=(--no-dedup)
  [ -n "$WORKERS" ] && extra+=(--workers "$WORKERS")
  timeout "$RUN_TIMEOUT" "$bin" --redis "redis://127.0.0.1:$PORT" bench --json \
    --payload-bytes "$size" --codec "$codec" --requests "$req" --inflight "$inflight" \
    --latency-requests "$lat" --warmup "$(( req / 10 < 100 ? req / 10 : 100 ))" \
    "${extra[@]}" 2>"$OUT/bench.err" \
    | LABEL="$label" python3 -c '
import json, os, sys
r = json.loads(sys.stdin.read())
print(json.dumps({"system": "pelican" + os.environ["LABEL"], "size": r["payload_bytes"], "codec": r["codec"],
  "dedup": r["dedup"], "rate": r["throughput_rps"], "p50_ms": r["lat_p50_ms"],
  "p99_ms": r["lat_p99_ms"], "redis_cpu_us_per_req": r["redis_cpu_us_per_req"],
  "rss_kb_end": r["rss_kb_end"], "faults_per_req": r.get("tp_faults_per_req"),
  "other_cpu_pct": r["tp_cpu_pct"]["other"]}))' \
    || { cat "$OUT/bench.err" >&2; die "pelican bench failed (size $size, $codec, dedup $dedup)"; }
}

# A round's pelican slots: every codec, dedup on and off, every binary. Odd rounds run
# the floor first and the slots in this order, even rounds the slots reversed and the
# floor last, so that no run always follows the same other one (a slot's place in the
# round moved A/B comparisons by 5-14 % when B always ran right after A).
SLOTS=()
for codec in $CODECS; do
  for dedup in on off; do
    for b in "${!BINS[@]}"; do
      SLOTS+=("$codec $dedup $b")
    done
  done
done

floor_slot() {
  say "round $1/$N, $2 bytes: floor"
  quiet
  floor "$2" | tee -a "$OUT/runs"
}

for round in $(seq "$N"); do
  odd=$(( round % 2 ))
  order=("${SLOTS[@]}")
  if [ "$odd" = 0 ]; then
    order=()
    for (( i = ${#SLOTS[@]} - 1; i >= 0; i-- )); do order+=("${SLOTS[$i]}"); done
  fi
  for size in "${SIZES[@]}"; do
    if [ "$odd" = 1 ]; then floor_slot "$round" "$size"; fi
    for slot in "${order[@]}"; do
      read -r codec dedup b <<<"$slot"
      label=""
      [ "$b" = 1 ] && label=" B"
      say "round $round/$N, $size bytes: pelican$label $codec, dedup $dedup"
      quiet
      run_pelican "$size" "$codec" "$dedup" "${BINS[$b]}" "$label" | tee -a "$OUT/runs"
    done
    if [ "$odd" = 0 ]; then floor_slot "$round" "$size"; fi
  done
done

python3 - "$OUT/runs" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = statistics.median
sizes = sorted({r["size"] for r in runs})
print()
print("| size | what | runs | rate req/s | x floor | p50 ms | x floor | p99 ms | Redis CPU us/req |")
print("|---|---|---|---|---|---|---|---|---|")
for s in sizes:
    fl = [r for r in runs if r["system"] == "floor" and r["size"] == s]
    frate, fp50 = med(r["rate"] for r in fl), med(r["p50_ms"] for r in fl)
    fcpu = med(r["redis_cpu_us_per_req"] for r in fl if "redis_cpu_us_per_req" in r)
    print(f"| {s} | Redis floor (SET+GET) | {len(fl)} | {frate:,.0f} | 1 | {fp50:.3f} | 1 | | {fcpu:,.1f} |")
    keys = sorted({(r["codec"], r["dedup"], r["system"]) for r in runs
                   if r["system"].startswith("pelican") and r["size"] == s},
                  key=lambda k: (k[0], not k[1], k[2]))
    for codec, dedup, system in keys:
        ps = [r for r in runs if r["system"] == system and r["size"] == s
              and r["codec"] == codec and r["dedup"] == dedup]
        rate, p50 = med(r["rate"] for r in ps), med(r["p50_ms"] for r in ps)
        p99, cpu = med(r["p99_ms"] for r in ps), med(r["redis_cpu_us_per_req"] for r in ps)
        print(f"| {s} | {system} {codec}, dedup {'on' if dedup else 'off'} | {len(ps)} | {rate:,.0f} | "
              f"{rate / frate:.2f} | {p50:.3f} | {p50 / fp50:.2f} | {p99:.3f} | {cpu:,.1f} |")
EOF

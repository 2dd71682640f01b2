#!/usr/bin/env bash
# pelican's bench on each server it is tested on: Redis 7.0 (redis-server on PATH),
# Valkey 9.1.2 and Redis 8.2.3 (scripts/fetch-servers.sh), same build, same machine.
#
#   scripts/compare-servers.sh [N]       # N rounds (default 3)
#
# Each round runs, for each server in turn (a fresh one on a free loopback port, no
# persistence, stopped after): `pelican bench --json` with dedup on, then off, each after
# the machine is quiet. At the end, per server and mode: medians of the throughput, the
# sequential p50, Redis' CPU per request and commands per request, and every run.
#
# Env knobs:
#   PELICAN_BIN=<path>     a pelican binary to measure instead of building this tree's
#   BENCH_ARGS="..."       more arguments for `pelican bench` (e.g. --payload-bytes 100000)
#   CALLGRIND=1            instead of timing: each server under valgrind's callgrind, one
#                          run per server and mode of --requests (default 20000, no
#                          latency phase), and the server's instructions per request
#                          (the whole run's over the requests: start-up and clean-up
#                          included). Instruction counts do not move with the machine's
#                          load; times do, by 30 % between hours.
#   QUIET=0                do not wait for quiet (../shared/peers/quiet.sh)
#   RUN_TIMEOUT=600        seconds one run may take
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
N="${1:-3}"
RUN_TIMEOUT="${RUN_TIMEOUT:-600}"
PEERS="${PEERS:-$ROOT/../shared/peers}"
BENCH_ARGS="${BENCH_ARGS:-}"
CALLGRIND="${CALLGRIND:-0}"

die() { echo "compare-servers.sh: $*" >&2; exit 1; }
say() { echo "compare-servers.sh: $*" >&2; }

[[ "$N" =~ ^[1-9][0-9]*$ ]] || die "usage: $0 [N]  (N: rounds, a positive number)"
for c in redis-server redis-cli python3; do
  command -v "$c" >/dev/null || die "$c not found"
done
if [ "$CALLGRIND" = "1" ]; then
  for c in valgrind callgrind_annotate; do
    command -v "$c" >/dev/null || die "CALLGRIND=1 needs $c"
  done
  N=1
fi

. "$ROOT/scripts/lib/pelican-bin.sh"

# name and server binary, Redis 7.0 from PATH first
SERVERS=("redis7 $(command -v redis-server)")
while read -r name path; do
  SERVERS+=("$name $path")
done < <("$ROOT/scripts/fetch-servers.sh") || die "scripts/fetch-servers.sh failed"

OUT="$(mktemp -d -t compare-servers.XXXXXX)"
. "$ROOT/scripts/lib/private-server.sh"
trap 'stop_server; rm -rf "$OUT"' EXIT

# run NAME VERSION DEDUP: one bench, its JSON line tagged with the server
run() {
  local name="$1" version="$2" dedup="$3" extra=()
  [ "$dedup" = "off" ] && extra+=(--no-dedup)
  [ "$CALLGRIND" = "1" ] && extra+=(--latency-requests 0)
  # shellcheck disable=SC2086
  timeout "$RUN_TIMEOUT" "$PELICAN" --redis "redis://127.0.0.1:$PORT" bench --json \
    "${extra[@]}" $BENCH_ARGS 2>"$OUT/bench.err" \
    | SERVER="$name" VERSION="$version" python3 -c '
import json, os, sys
r = json.loads(sys.stdin.read())
print(json.dumps({"server": os.environ["SERVER"], "version": os.environ["VERSION"],
  "dedup": r["dedup"], "requests": r["requests"], "rate": r["throughput_rps"],
  "p50_ms": r["lat_p50_ms"], "p99_ms": r["lat_p99_ms"],
  "redis_cpu_us_per_req": r["redis_cpu_us_per_req"],
  "redis_cmds_per_req": r["redis_cmds_per_req"], "bad_answers": r["bad_answers"]}))' \
    || { cat "$OUT/bench.err" >&2; die "pelican bench failed on $name ($dedup dedup)"; }
}

for round in $(seq "$N"); do
  for spec in "${SERVERS[@]}"; do
    read -r name bin <<<"$spec"
    version="$("$bin" --version | grep -o 'v=[0-9.]*' | cut -c3-)"
    for dedup in on off; do
      if [ "$CALLGRIND" = "1" ]; then
        profile="$OUT/callgrind.$name.$dedup"
        start_server "$bin" "$profile"
        line="$(run "$name" "$version" "$dedup")"
        stop_server
        # (awk reads to the end: a reader that stops early would end the pipe with SIGPIPE)
        total="$(callgrind_annotate "$profile" \
          | awk '/PROGRAM TOTALS/ && !t { gsub(",", "", $1); t = $1 } END { print t }')"
        line="$(LINE="$line" TOTAL="$total" python3 -c '
import json, os
r = json.loads(os.environ["LINE"])
r["instructions_per_req"] = int(os.environ["TOTAL"]) // r["requests"]
print(json.dumps(r))')"
      else
        quiet
        start_server "$bin"
        line="$(run "$name" "$version" "$dedup")"
        stop_server
      fi
      echo "$line" | tee -a "$OUT/runs.jsonl"
    done
  done
  say "round $round of $N done"
done

python3 - "$OUT/runs.jsonl" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
keys = []
for r in runs:
    k = (r["server"], r["version"], r["dedup"])
    if k not in keys:
        keys.append(k)
cols = [("rate", "req/s", "{:,.0f}"), ("p50_ms", "p50 ms", "{:.3f}"),
        ("redis_cpu_us_per_req", "Redis us/req", "{:.1f}"),
        ("redis_cmds_per_req", "cmds/req", "{:.2f}")]
if "instructions_per_req" in runs[0]:
    cols = [("instructions_per_req", "Redis instr/req", "{:,.0f}")] + cols
print("| server | dedup | runs | " + " | ".join(c[1] for c in cols) + " | every run (req/s) |")
print("|---|---|---|" + "---|" * len(cols) + "---|")
for name, version, dedup in keys:
    rs = [r for r in runs if (r["server"], r["version"], r["dedup"]) == (name, version, dedup)]
    meds = [f.format(statistics.median(r[c] for r in rs)) for c, _, f in cols]
    every = " / ".join("{:,.0f}".format(r["rate"]) for r in rs)
    print(f"| {name} {version} | {'on' if dedup else 'off'} | {len(rs)} | " + " | ".join(meds)
          + f" | {every} |")
bad = sum(r["bad_answers"] for r in runs)
if bad:
    sys.exit(f"compare-servers.sh: {bad} bad answers")
EOF

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

NAME=compare-bullmq.sh
N_DEFAULT=3
PEER_RUN=bullmq/run.sh
PEER_NAME=BullMQ
# shellcheck source=lib/peers.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/peers.sh"

for round in $(seq 1 "$N"); do
  run bullmq "$PEERS/bullmq/run.sh"
  # shellcheck disable=SC2086
  run pelican-dedup "$PELICAN" bench --json $PELICAN_ARGS
  # shellcheck disable=SC2086
  run pelican-nodedup "$PELICAN" bench --json --no-dedup $PELICAN_ARGS
done

python3 - "$OUT" "$N" "$ROOT/scripts/lib" <<'PY'
import sys
sys.path.insert(0, sys.argv[3])
from medians import load, med as median, noise_note, print_table

out, n = sys.argv[1], sys.argv[2]
labels = ["bullmq", "pelican-dedup", "pelican-nodedup"]
runs = load(out, labels)
med = lambda label, key, sub=None: median(runs, label, key, sub)
print_table(runs, n, labels, [("dedup/bullmq", "pelican-dedup", "bullmq"),
                              ("nodedup/bullmq", "pelican-nodedup", "bullmq")])
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
noise_note(runs)
PY

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
# PELICAN_NODEDUP_ARGS="..." goes to the runs without dedup only (after PELICAN_ARGS): e.g.
# "--prefetch 1024", a worker window like NATS core's, which keeps none
# (docs/benchmarks/2026-12-03-34d2f6e-read-ahead.md), while the runs with dedup keep
# JetStream's 128.
# Env knobs: PEERS, PELICAN_ARGS, QUIET=0, RUN_TIMEOUT=300, PELICAN_BIN (as in
# compare-bullmq.sh). Needs nats-server with JetStream on 127.0.0.1:4222 and Redis on
# 127.0.0.1:6379 (both benchmarks refuse anything but loopback), cargo, python3.
set -euo pipefail

NAME=compare-nats.sh
N_DEFAULT=4
PEER_RUN=nats-rpc/run.sh
PEER_NAME=NATS
# shellcheck source=lib/peers.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/peers.sh"

for round in $(seq 1 "$N"); do
  run nats-core "$PEERS/nats-rpc/run.sh" --mode core
  # shellcheck disable=SC2086
  run pelican-nodedup "$PELICAN" bench --json --no-dedup $PELICAN_ARGS ${PELICAN_NODEDUP_ARGS:-}
  run nats-js-file "$PEERS/nats-rpc/run.sh" --mode jetstream-file
  # shellcheck disable=SC2086
  run pelican-dedup "$PELICAN" bench --json $PELICAN_ARGS
done

python3 - "$OUT" "$N" "$ROOT/scripts/lib" <<'PY'
import sys
sys.path.insert(0, sys.argv[3])
from medians import load, med as median, noise_note, per_round, print_table

out, n = sys.argv[1], sys.argv[2]
labels = ["nats-core", "pelican-nodedup", "nats-js-file", "pelican-dedup"]
runs = load(out, labels)
med = lambda label, key, sub=None: median(runs, label, key, sub)
print_table(runs, n, labels, [("nodedup/core", "pelican-nodedup", "nats-core"),
                              ("dedup/js-file", "pelican-dedup", "nats-js-file")])
print("Ratios: pelican without dedup / NATS core, pelican with dedup / JetStream-file.")
per_round(runs, [("nodedup/core", "pelican-nodedup", "nats-core"),
                 ("dedup/js-file", "pelican-dedup", "nats-js-file")])
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
noise_note(runs)
PY

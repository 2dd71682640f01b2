#!/usr/bin/env bash
# pelican vs RabbitMQ (request/response with Direct Reply-to) on the peer benchmark's workload.
#
#   scripts/compare-rabbitmq.sh [N]        # N rounds, default 3
#
# Each round runs, in this order and each after the machine is quiet (quiet.sh):
#   1. RabbitMQ, transient classic queue:  $PEERS/rabbitmq-rpc/run.sh --mode transient
#   2. pelican, no dedup:                  target/release/pelican bench --json --no-dedup
#   3. RabbitMQ, durable quorum queue:     $PEERS/rabbitmq-rpc/run.sh --mode durable
#   4. pelican, dedup on:                  target/release/pelican bench --json
# and prints each run's JSON line on stdout as it comes; at the end a table of the
# medians and the ratios: pelican without dedup / the transient queue (neither keeps a
# request past a broker restart) and pelican with dedup / the durable quorum queue
# (both keep every request until it is answered). Progress and diagnostics go to stderr.
# Exits non-zero as soon as a run fails.
# Env knobs: PEERS, PELICAN_ARGS, QUIET=0, RUN_TIMEOUT=300, PELICAN_BIN (as in
# compare-bullmq.sh). Needs RabbitMQ on 127.0.0.1:5672 (guest/guest) and Redis on
# 127.0.0.1:6379 (both benchmarks refuse anything but loopback), cargo, python3.
set -euo pipefail

NAME=compare-rabbitmq.sh
N_DEFAULT=3
PEER_RUN=rabbitmq-rpc/run.sh
PEER_NAME=RabbitMQ
# shellcheck source=lib/peers.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/peers.sh"

for round in $(seq 1 "$N"); do
  run rabbitmq-transient "$PEERS/rabbitmq-rpc/run.sh" --mode transient
  # shellcheck disable=SC2086
  run pelican-nodedup "$PELICAN" bench --json --no-dedup $PELICAN_ARGS
  run rabbitmq-durable "$PEERS/rabbitmq-rpc/run.sh" --mode durable
  # shellcheck disable=SC2086
  run pelican-dedup "$PELICAN" bench --json $PELICAN_ARGS
done

python3 - "$OUT" "$N" "$ROOT/scripts/lib" <<'PY'
import sys
sys.path.insert(0, sys.argv[3])
from medians import load, noise_note, per_round, print_table

out, n = sys.argv[1], sys.argv[2]
labels = ["rabbitmq-transient", "pelican-nodedup", "rabbitmq-durable", "pelican-dedup"]
runs = load(out, labels)
pairs = [("nodedup/transient", "pelican-nodedup", "rabbitmq-transient"),
         ("dedup/durable", "pelican-dedup", "rabbitmq-durable")]
print_table(runs, n, labels, pairs)
print("Ratios: pelican without dedup / RabbitMQ transient, pelican with dedup / RabbitMQ durable (quorum).")
per_round(runs, pairs)
noise_note(runs)
PY

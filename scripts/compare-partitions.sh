#!/usr/bin/env bash
# Scaling out: `pelican bench` on one Redis node and on a 3-master Redis Cluster with a
# queue of P partitions, alternating, and what each master did per request.
#
#   scripts/compare-partitions.sh [N] [P...]     # N rounds (default 3), P values (default 1 3 6 12)
#
# Each round runs, each after quiet.sh: the single node (127.0.0.1:6379) with P = 1 and
# with P = 6 (what partitions cost on one node), then a private 3-master cluster (ports
# 31101-31103, started by this script, removed at the end) with every P. Prints each run's
# JSON line on stdout, then per configuration the medians of throughput, Redis CPU per
# request in all and per master, and the busiest master's share.
# Env: PELICAN_BIN (default target/release/pelican, built if missing), PELICAN_ARGS
# (extra bench arguments), QUIET=0, PEERS (the peers folder, for quiet.sh), LAYOUTS
# (partition layouts to run on the cluster, alternating, e.g. "legacy spread"; default:
# the bench's own, a new queue's spread layout), NODE=0 (skip the single-node runs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
N="${1:-3}"; shift || true
PS=("$@"); [ ${#PS[@]} -gt 0 ] || PS=(1 3 6 12)
PEERS="${PEERS:-$ROOT/../shared/peers}"
PELICAN_ARGS="${PELICAN_ARGS:-}"
say() { echo "compare-partitions.sh: $*" >&2; }
die() { say "$*"; exit 1; }
[[ "$N" =~ ^[1-9][0-9]*$ ]] || die "usage: $0 [N] [P...]"
. "$ROOT/scripts/lib/pelican-bin.sh"
LAYOUTS="${LAYOUTS:-}"
NODE="${NODE:-1}"
[ "$NODE" = 0 ] || [ "$(redis-cli -p 6379 ping 2>/dev/null)" = PONG ] || die "no Redis on 127.0.0.1:6379"

DIR="$(mktemp -d -t pelican-cluster.XXXXXX)"
PORTS=(31101 31102 31103)
cleanup() {
  for p in "${PORTS[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT
for p in "${PORTS[@]}"; do
  mkdir -p "$DIR/$p"
  (cd "$DIR/$p" && redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file nodes.conf --save "" --appendonly no --daemonize yes \
    --logfile "$DIR/$p/log")
done
for p in "${PORTS[@]}"; do
  for _ in $(seq 1 50); do [ "$(redis-cli -p "$p" ping 2>/dev/null)" = PONG ] && break; sleep 0.1; done
done
redis-cli --cluster create "${PORTS[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >/dev/null \
  || die "cannot create the cluster"
for _ in $(seq 1 100); do
  ok=1
  for p in "${PORTS[@]}"; do redis-cli -p "$p" cluster info | grep -q 'cluster_state:ok' || ok=0; done
  [ "$ok" = 1 ] && break; sleep 0.1
done
CLUSTER="redis+cluster://127.0.0.1:${PORTS[0]},127.0.0.1:${PORTS[1]},127.0.0.1:${PORTS[2]}"

OUT="$DIR/runs"; mkdir -p "$OUT"
quiet() { [ "${QUIET:-1}" = 0 ] || "$PEERS/quiet.sh" || say "not quiet; measuring anyway"; }
run() {
  local label="$1"; shift
  quiet
  say "round $round/$N: $label"
  local line
  # shellcheck disable=SC2086
  line="$("$PELICAN" "$@" bench --json $PELICAN_ARGS | tail -n 1)" || die "$label failed"
  printf '%s\n' "$line"
  printf '%s\n' "$line" >>"$OUT/$label.jsonl"
}
LABELS=()
[ "$NODE" = 0 ] || LABELS+=(node-p1 node-p6)
for p in "${PS[@]}"; do
  if [ -z "$LAYOUTS" ]; then LABELS+=("cluster-p$p"); else
    for l in $LAYOUTS; do LABELS+=("cluster-p$p-$l"); done
  fi
done
for round in $(seq 1 "$N"); do
  if [ "$NODE" != 0 ]; then
    run node-p1 --redis redis://127.0.0.1:6379
    run node-p6 --redis redis://127.0.0.1:6379 --partitions 6
  fi
  for p in "${PS[@]}"; do
    if [ -z "$LAYOUTS" ]; then
      run "cluster-p$p" --redis "$CLUSTER" --partitions "$p"
    else
      for l in $LAYOUTS; do
        run "cluster-p$p-$l" --redis "$CLUSTER" --partitions "$p" --partition-layout "$l"
      done
    fi
  done
done

python3 - "$OUT" "$N" "${LABELS[@]}" <<'PY'
import json, os, statistics, sys
out, n, labels = sys.argv[1], sys.argv[2], sys.argv[3:]
def load(label):
    with open(os.path.join(out, label + ".jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]
med = statistics.median
print(f"| configuration (median of {n}) | req/s | Redis CPU µs/req, all nodes | per master µs/req, busiest first | per master commands/req, busiest first | busiest master's share | predicted req/s, one core per node |")
print("|---|---|---|---|---|---|---|")
for l in labels:
    runs = load(l)
    rps = med(r["throughput_rps"] for r in runs)
    cpu = med(r["redis_cpu_us_per_req"] for r in runs)
    # Which master is busiest changes from run to run (each run's queue hashes to other
    # slots): per run, the masters busiest first; then the median of each rank.
    ranked = [sorted((x["redis_cpu_us_per_req"] for x in r.get("nodes") or [{"redis_cpu_us_per_req": r["redis_cpu_us_per_req"]}]), reverse=True) for r in runs]
    per = [med(rk[i] for rk in ranked) for i in range(len(ranked[0]))]
    cranked = [sorted((x["redis_cmds_per_req"] for x in r.get("nodes") or [{"redis_cmds_per_req": r.get("redis_cmds_per_req", 0)}]), reverse=True) for r in runs]
    cmds = [med(rk[i] for rk in cranked) for i in range(len(cranked[0]))]
    share = med(max(x["cpu_share"] for x in r["nodes"]) if r.get("nodes") else 1.0 for r in runs)
    pred = med(1e6 / rk[0] for rk in ranked if rk[0])
    print(f"| {l} | {rps:,.0f} | {cpu:.1f} | {' / '.join(f'{x:.1f}' for x in per)} | {' / '.join(f'{x:.2f}' for x in cmds)} | {share:.2f} | {pred:,.0f} |")
PY

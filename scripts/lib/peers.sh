# Shared by the scripts that compare pelican with a peer (compare-bullmq.sh,
# compare-nats.sh): sourced after setting
#   NAME       the script's name (messages, the temporary folder)
#   N_DEFAULT  rounds when none is given
#   PEER_RUN   the peer's run.sh, relative to $PEERS, and PEER_NAME what it is called
# with the script's arguments in "$@". Sets ROOT (and cd's there), N, PEERS,
# RUN_TIMEOUT, PELICAN_ARGS, PELICAN (PELICAN_BIN, or this tree's release build), OUT (a
# temporary folder, removed on exit); defines die, say, quiet and run.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
N="${1:-$N_DEFAULT}"
PEERS="${PEERS:-$ROOT/../shared/peers}"
RUN_TIMEOUT="${RUN_TIMEOUT:-300}"
PELICAN_ARGS="${PELICAN_ARGS:-}"

die() { echo "$NAME: $*" >&2; exit 1; }
say() { echo "$NAME: $*" >&2; }

[[ "$N" =~ ^[1-9][0-9]*$ ]] || die "usage: $0 [N]  (N: rounds, a positive number)"
[ -x "$PEERS/$PEER_RUN" ] || die "no $PEER_NAME benchmark at $PEERS/$PEER_RUN (set PEERS=<peers folder>)"
command -v python3 >/dev/null || die "python3 not found (it does the medians)"

. "$ROOT/scripts/lib/pelican-bin.sh"

OUT="$(mktemp -d -t "$NAME.XXXXXX")"
trap 'rm -rf "$OUT"' EXIT

quiet() {
  [ "${QUIET:-1}" = "0" ] && return 0
  if [ -x "$PEERS/quiet.sh" ]; then
    "$PEERS/quiet.sh" || say "the machine did not get quiet; measuring anyway (see 'other' CPU)"
  else
    say "no $PEERS/quiet.sh; not waiting for quiet"
  fi
}

# run <label> <command...>: one run of round $round; its JSON line goes to stdout and to
# $OUT/<label>.jsonl
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

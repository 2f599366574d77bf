#!/usr/bin/env bash
# Installs the TimescaleDB extension into the machine's PostgreSQL 15, once.
#
# Debian bookworm ships no TimescaleDB binary; Debian trixie ships its source
# package (Apache-only build). We fetch that source through a *private* apt
# configuration (its own sources list and lists folder under the cache, so the
# machine's apt setup is never changed), build it with cmake against
# postgresql-server-dev-15 and `make install` it. The mirror is the one the
# machine's own apt configuration already uses. The build folder is cached, so a
# second machine state (or a wiped /usr) only re-runs `make install`.
set -euo pipefail
cache=${GPUHEALTH_CACHE:-$HOME/.cache/gpu-health}
pg_config=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
work=$cache/timescaledb
log() { echo "install-timescaledb: $*" >&2; }

as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

ensure_packages() {
  local missing=()
  for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
  if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

ensure_packages postgresql-15 postgresql-server-dev-15 cmake make gcc dpkg-dev libssl-dev

extdir=$("$pg_config" --sharedir)/extension
if [[ -f $extdir/timescaledb.control ]] && ls "$("$pg_config" --pkglibdir)"/timescaledb-*.so >/dev/null 2>&1; then
  log "already installed: $(grep default_version "$extdir/timescaledb.control")"
  exit 0
fi

mkdir -p "$work"
src=$(find "$work" -maxdepth 1 -type d -name 'timescaledb-*' | head -n1)
if [[ -z $src ]]; then
  mirror=$(source "$(dirname "$0")/env.sh" && debian_mirror)
  mkdir -p "$work/apt/lists/partial" "$work/apt/parts"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" > "$work/apt/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=$work/apt/parts"
            -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=" -o "APT::Sandbox::User=root")
  log "fetching the trixie source package from $mirror"
  apt-get "${apt_opts[@]}" update -qq
  (cd "$work" && apt-get "${apt_opts[@]}" source -qq timescaledb >/dev/null)
  src=$(find "$work" -maxdepth 1 -type d -name 'timescaledb-*' | head -n1)
fi
log "building $src"
mkdir -p "$src/build"
cd "$src/build"
if [[ ! -f Makefile ]]; then
  cmake .. -DPG_CONFIG="$pg_config" -DAPACHE_ONLY=ON -DREGRESS_CHECKS=OFF -DTAP_CHECKS=OFF \
    -DWARNINGS_AS_ERRORS=OFF -DLINTER=OFF -DSEND_TELEMETRY_DEFAULT=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log" >&2; exit 1; }
fi
make -s -j"$(nproc)" >/dev/null
as_root make -s install >/dev/null
log "installed: $(grep default_version "$extdir/timescaledb.control")"

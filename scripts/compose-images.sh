#!/usr/bin/env bash
# Local stand-ins for the images docker-compose.yml names, for machines that
# reach no image registry (this project's own, and CI): built once, then reused.
#
#   gpu-health-local/debian:bookworm       `debootstrap --variant=minbase bookworm`, imported,
#                                           plus the host's CA certificates
#   gpu-health-local/python:3.11           Debian's Python 3.11 in a venv on PATH (for `python:3.11-slim`)
#   gpu-health-local/kafka:<version>       JRE 17 + the jars of deploy/kafka/pom.xml (for `apache/kafka`)
#   gpu-health-local/timescaledb:<tag>     PostgreSQL 15 + TimescaleDB built by install-timescaledb.sh
#                                           (for `timescale/timescaledb`)
#   gpu-health-local/prometheus:bookworm   Debian's Prometheus (for `prom/prometheus`)
#
# They keep the project's own names and are swapped in by
# deploy/docker/compose.local-images.yml; nothing is tagged with an official
# image's name, so a real `docker pull` is never shadowed. Every build step that
# reaches a package registry trusts the host's CA certificates
# (/usr/local/share/ca-certificates). The debootstrap tarball, the Kafka jars and
# the TimescaleDB build are cached under $GPUHEALTH_CACHE; the engine's layer
# cache makes a second run a few seconds.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
source "$here/env.sh"
work=$GPUHEALTH_CACHE/docker
docker=${DOCKER:-/usr/bin/docker}
log() { echo "compose-images: $*" >&2; }
die() { log "$*"; exit 1; }

: "${GPUHEALTH_TIMESCALEDB_TAG:=2.19-pg15}"
rootfs_image=gpu-health-local/debian-rootfs:bookworm
mkdir -p "$work/logs"

have_image() { "$docker" image inspect "$1" >/dev/null 2>&1; }

rootfs() {
  have_image "$rootfs_image" && return 0
  local tarball=$work/bookworm-minbase.tar
  if [[ ! -f $tarball ]]; then
    command -v debootstrap >/dev/null || {
      log "apt-get install debootstrap"
      local lock=(-o DPkg::Lock::Timeout=600)
      apt-get "${lock[@]}" install -y -qq --no-install-recommends debootstrap >/dev/null 2>&1 ||
        { apt-get "${lock[@]}" update -qq && apt-get "${lock[@]}" install -y -qq --no-install-recommends debootstrap >/dev/null; }
    }
    local mirror tmp
    mirror=$(debian_mirror)
    tmp=$(mktemp -d "$work/rootfs.XXXXXX")
    log "debootstrap --variant=minbase bookworm from $mirror"
    debootstrap --variant=minbase bookworm "$tmp" "$mirror" >"$work/logs/debootstrap.log" 2>&1 ||
      { tail -n 20 "$work/logs/debootstrap.log" >&2; rm -rf "$tmp"; die "debootstrap failed"; }
    cat > "$tmp/etc/apt/sources.list" <<LIST
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian}/debian-security bookworm-security main
LIST
    # An image keeps no package lists or caches of its own.
    rm -rf "$tmp"/var/lib/apt/lists/* "$tmp"/var/cache/apt/*.bin "$tmp"/var/cache/apt/archives/*.deb
    tar --numeric-owner -C "$tmp" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$tmp"
  fi
  log "importing $tarball as $rootfs_image"
  "$docker" import --change 'CMD ["bash"]' --change 'ENV LANG=C.UTF-8' "$tarball" "$rootfs_image" >/dev/null
}

build() { # build NAME DOCKERFILE [docker build options...]
  local name=$1 file=$2; shift 2
  local started=$SECONDS try buildlog=$work/logs/build-${name//[\/:]/_}.log
  # A second try for a registry that dropped a download; the layer cache keeps what worked.
  for try in 1 2; do
    "$docker" build --progress=plain -t "$name" -f "$root/$file" \
      --build-context hostca=/usr/local/share/ca-certificates "$@" "$root" >"$buildlog" 2>&1 && break
    ((try == 2)) && { tail -n 40 "$buildlog" >&2; die "building $name failed"; }
    log "building $name failed; trying once more"
  done
  log "$name ready ($((SECONDS - started)) s)"
}

kafka_jars() {
  [[ -f $GPUHEALTH_KAFKA_LIB/.complete ]] || "$here/services.sh" jars
}

timescaledb_stage() { # TimescaleDB's files as install-timescaledb.sh built them, staged for COPY
  "$here/install-timescaledb.sh"
  local src stage=$work/timescaledb-stage
  src=$(find "$GPUHEALTH_CACHE/timescaledb" -maxdepth 1 -type d -name 'timescaledb-*' | head -n1)
  [[ -n $src && -f $src/build/Makefile ]] || die "no TimescaleDB build under $GPUHEALTH_CACHE/timescaledb"
  if [[ ! -f $stage.stamp || $src/build -nt $stage.stamp ]]; then
    rm -rf "$stage"
    make -s -C "$src/build" install DESTDIR="$stage" >"$work/logs/timescaledb-stage.log" 2>&1 ||
      { tail -n 20 "$work/logs/timescaledb-stage.log" >&2; die "staging TimescaleDB failed"; }
    touch "$stage.stamp"
  fi
  echo "$stage"
}

main() {
  command -v "$docker" >/dev/null || die "no docker CLI at $docker: run scripts/install-docker.sh start"
  rootfs
  build gpu-health-local/debian:bookworm deploy/docker/debian.Dockerfile
  build gpu-health-local/python:3.11 deploy/docker/python.Dockerfile
  kafka_jars
  build "gpu-health-local/kafka:$GPUHEALTH_KAFKA_VERSION" deploy/docker/kafka.Dockerfile \
    --build-context "kafkalibs=$GPUHEALTH_KAFKA_LIB"
  build "gpu-health-local/timescaledb:$GPUHEALTH_TIMESCALEDB_TAG" deploy/docker/timescaledb.Dockerfile \
    --build-context "timescaledb=$(timescaledb_stage)"
  build gpu-health-local/prometheus:bookworm deploy/docker/prometheus.Dockerfile
  # Layers of earlier builds that no tag uses any more.
  "$docker" image prune -f >/dev/null
}

main "$@"

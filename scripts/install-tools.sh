#!/usr/bin/env bash
# Tools the tests use:
#   promtool  (Debian package `prometheus`) - checks the mock exporter's exposition; unpacked
#             into the cache with dpkg -x, which gives the binary without a Prometheus server;
#   chromium + chromium-driver (Debian) - the fleet page's browser test;
#   docker CLI + compose (trixie's, through install-docker.sh) - `docker compose config`
#             validates docker-compose.yml in the unit tests (no engine is started).
#   wrk (Debian) - the API's throughput figure in bench/bench_api.py.
#   systemd-analyze (Debian package `systemd`) - `systemd-analyze verify` checks the collector's unit
#             (deploy/systemd); only the tool is used, no systemd is started.
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$(dirname "$0")/install-docker.sh" install
bin=$GPUHEALTH_CACHE/bin
if [[ ! -x /usr/bin/chromium || ! -x /usr/bin/chromedriver ]]; then
  echo "install-tools: apt-get install chromium chromium-driver" >&2
  as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
  as_root apt-get update -qq >/dev/null
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi
if [[ ! -x /usr/bin/wrk ]]; then
  echo "install-tools: apt-get install wrk" >&2
  as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
  as_root apt-get update -qq >/dev/null
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk >/dev/null
fi
if [[ ! -x /usr/bin/systemd-analyze || ! -d /usr/lib/systemd/system ]]; then
  echo "install-tools: apt-get install systemd (for systemd-analyze)" >&2
  as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
  as_root apt-get update -qq >/dev/null
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
fi
[[ -x $bin/promtool ]] && exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "install-tools: unpacking promtool from Debian's prometheus package" >&2
(cd "$work" && apt-get download -qq -o APT::Sandbox::User=root prometheus >/dev/null 2>&1) || {
  apt-get update -qq >/dev/null 2>&1
  (cd "$work" && apt-get download -qq -o APT::Sandbox::User=root prometheus >/dev/null)
}
dpkg -x "$work"/prometheus_*.deb "$work/x"
mkdir -p "$bin"
install -m 0755 "$work/x/usr/bin/promtool" "$bin/promtool"
"$bin/promtool" --version 2>&1 | head -n1 >&2

#!/usr/bin/env bash
# Small tools the tests use, unpacked into the cache rather than installed:
#   promtool  (Debian package `prometheus`) - checks the mock exporter's exposition.
# Unpacking the .deb with dpkg -x gives the binary without starting a Prometheus server.
set -euo pipefail
source "$(dirname "$0")/env.sh"
bin=$GPUHEALTH_CACHE/bin
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

#!/usr/bin/env bash
# Docker on this machine, for `make compose-test` and the compose file's test.
#
#   install-docker.sh install   the engine, CLI, compose v2 and buildx packages, once
#   install-docker.sh start     install, then start dockerd as root (no systemd) unless one answers
#   install-docker.sh stop      stop the dockerd that `start` started (never someone else's)
#
# Bookworm's own docker.io (20.10) cannot build the project's Dockerfile (heredoc
# RUN), and podman cannot run healthchecks without systemd, so the packages come
# from Debian trixie: docker.io 26, docker-cli, docker-compose 2.26, docker-buildx.
# As install-timescaledb.sh does for its source, apt runs with a *private*
# configuration (its own sources list, pin and lists under the cache): the
# machine's apt setup is never changed. Trixie is pinned below bookworm, so only
# the four packages named (and containerd, which docker.io 26 needs) come from
# trixie; every other dependency is bookworm's, and nothing installed is upgraded.
# The downloaded .debs stay in the cache, for a machine state without them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"
work=$GPUHEALTH_CACHE/docker
log() { echo "install-docker: $*" >&2; }
die() { log "$*"; exit 1; }
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

packages=(docker.io docker-cli docker-compose docker-buildx)
# The CLI these scripts use: trixie's, not whatever else is first on PATH.
docker_bin=/usr/bin/docker

installed() {
  local p
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || return 1
  done
  "$docker_bin" compose version >/dev/null 2>&1 && "$docker_bin" buildx version >/dev/null 2>&1
}

install_packages() {
  installed && return 0
  local m key=/usr/share/keyrings/debian-archive-keyring.gpg
  m=$(debian_mirror)
  mkdir -p "$work/apt/lists/partial" "$work/apt/parts" "$work/apt/preferences.d" "$work/apt/archives/partial"
  cat > "$work/apt/sources.list" <<LIST
deb [signed-by=$key] $m bookworm main
deb [signed-by=$key] $m bookworm-updates main
deb [signed-by=$key] ${m%/debian}/debian-security bookworm-security main
deb [signed-by=$key] $m trixie main
LIST
  printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' > "$work/apt/preferences"
  local apt_opts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=$work/apt/parts"
                  -o "Dir::Etc::Preferences=$work/apt/preferences" -o "Dir::Etc::PreferencesParts=$work/apt/preferences.d"
                  -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache::Archives=$work/apt/archives"
                  -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=" -o "APT::Sandbox::User=root"
                  -o "DPkg::Lock::Timeout=600")  # another apt run (a test tool's install) finishes first
  log "apt-get install ${packages[*]} (trixie, through a private apt configuration)"
  as_root apt-get "${apt_opts[@]}" update -qq
  # Where the package's own scripts start an engine (an init system that allows it),
  # `start` finds it answering and uses it, and never stops it.
  as_root env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y -qq \
    --no-install-recommends "${packages[@]/%//trixie}" >"$work/apt-install.log" 2>&1 ||
    { tail -n 30 "$work/apt-install.log" >&2; die "installing the docker packages failed"; }
  installed || die "docker packages installed, but '$docker_bin compose/buildx version' fail"
  log "installed: $("$docker_bin" version --format '{{.Client.Version}}' 2>/dev/null), $("$docker_bin" compose version --short)"
}

# ------------------------------------------------------------------ the engine
pidfile=$work/dockerd.pid
engine_answers() { timeout 10 "$docker_bin" info >/dev/null 2>&1; }
ours_running() {
  [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null &&
    grep -q dockerd "/proc/$(cat "$pidfile")/cmdline" 2>/dev/null
}

# dockerd turns on IP forwarding, sets the FORWARD policy to DROP and has bridged
# traffic go through iptables (br_netfilter). Harmless to loopback, where the
# native services live, but not what the host had: `stop` puts these back as
# `start` found them, and removes the default bridge, so the host's networking is
# as before once the engine that `start` started is gone.
host_net=$work/host-net.saved
sysctl_value() { if [[ -f /proc/sys/$1 ]]; then cat "/proc/sys/$1"; else echo 0; fi; }

save_host_net() {
  [[ -f $host_net ]] && return 0  # a saved state from before a crashed run is the one to keep
  {
    echo "ip_forward=$(sysctl_value net/ipv4/ip_forward)"
    echo "bridge_iptables=$(sysctl_value net/bridge/bridge-nf-call-iptables)"
    echo "bridge_ip6tables=$(sysctl_value net/bridge/bridge-nf-call-ip6tables)"
    echo "forward_policy=$(iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" {print $3}')"
  } > "$host_net"
}

restore_host_net() {
  [[ -f $host_net ]] || return 0
  local ip_forward bridge_iptables bridge_ip6tables forward_policy
  # shellcheck disable=SC1090  # written by save_host_net
  source "$host_net"
  echo "$ip_forward" > /proc/sys/net/ipv4/ip_forward
  [[ -f /proc/sys/net/bridge/bridge-nf-call-iptables ]] &&
    echo "$bridge_iptables" > /proc/sys/net/bridge/bridge-nf-call-iptables &&
    echo "$bridge_ip6tables" > /proc/sys/net/bridge/bridge-nf-call-ip6tables
  [[ -n $forward_policy ]] && iptables -P FORWARD "$forward_policy"
  ip link show docker0 >/dev/null 2>&1 && ip link delete docker0
  rm -f "$host_net"
  log "host networking restored (ip_forward=$ip_forward, FORWARD policy ${forward_policy:-unchanged})"
}

start_engine() {
  if engine_answers; then log "dockerd already answers"; return 0; fi
  ours_running && die "dockerd (pid $(cat "$pidfile")) runs but does not answer; see $work/dockerd.log"
  [[ $(id -u) -eq 0 ]] || die "dockerd must be started as root"
  mkdir -p "$work/engine"
  save_host_net
  # Images, build cache and volumes live in the cache, beside everything else the
  # project builds; the socket is the standard one, so a plain `docker` finds it.
  log "starting dockerd (data in $work/engine, log in $work/dockerd.log)"
  setsid nohup /usr/sbin/dockerd --data-root "$work/engine" --storage-driver overlay2 \
    --host unix:///var/run/docker.sock --pidfile "$work/dockerd.pid.engine" \
    >>"$work/dockerd.log" 2>&1 </dev/null &
  echo $! > "$pidfile"
  local deadline=$((SECONDS + 90))
  until engine_answers; do
    ours_running || { tail -n 30 "$work/dockerd.log" >&2; die "dockerd exited"; }
    ((SECONDS < deadline)) || { tail -n 30 "$work/dockerd.log" >&2; die "dockerd did not answer in 90 s"; }
    sleep 1
  done
  log "dockerd $("$docker_bin" version --format '{{.Server.Version}}') is up (pid $(cat "$pidfile"))"
}

stop_engine() {
  ours_running || { rm -f "$pidfile"; restore_host_net; return 0; }
  local pid; pid=$(cat "$pidfile")
  log "stopping dockerd (pid $pid)"
  kill -TERM "$pid"
  local deadline=$((SECONDS + 60))
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then log "dockerd did not stop in 60 s; killing it"; kill -KILL "$pid"; break; fi
    sleep 0.5
  done
  rm -f "$pidfile"
  restore_host_net
}

case ${1:-install} in
  install) install_packages ;;
  start) install_packages; start_engine ;;
  stop) stop_engine ;;
  started-by-us) ours_running ;;
  *) die "usage: install-docker.sh install|start|stop" ;;
esac

#!/usr/bin/env bash
# `make compose-test`: the real docker-compose.yml, run on this machine and checked from the host.
#
#   1. Docker (trixie's engine, CLI, compose, buildx) installed if missing, dockerd
#      started as root if none answers (scripts/install-docker.sh);
#   2. the local stand-ins for the registry images built or found in the cache
#      (scripts/compose-images.sh), then the app image on the local Python;
#   3. `docker compose up -d --wait` with deploy/docker/compose.local-images.yml on top
#      (own project name, host ports off the native stack's);
#   4. tests/compose/stack_checks.py from the host: every service healthy or completed,
#      the API counting every mock GPU with verdicts, an injected fault becoming an
#      open alert, kafka-console-consumer and psql inside their containers, Prometheus
#      scraping the node exporters;
#   5. `docker compose down -v`, always (a trap), and dockerd stopped again if this
#      script started it: nothing is left running, whatever failed.
#
# The native services (`make services`) are never touched: they are checked to
# answer on loopback before and after, so docker's bridge and iptables set-up
# cannot have broken them unnoticed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
source "$here/env.sh"
work=$GPUHEALTH_CACHE/docker
export DOCKER=${DOCKER:-/usr/bin/docker}
export GPUHEALTH_COMPOSE_PROJECT=${GPUHEALTH_COMPOSE_PROJECT:-gpu-health-compose-test}
export GPUHEALTH_COMPOSE_FILES=docker-compose.yml:deploy/docker/compose.local-images.yml
py=${GPUHEALTH_VENV:-$GPUHEALTH_CACHE/venv}/bin/python
# The host ports deploy/docker/compose.local-images.yml publishes.
test_ports=(19092 15432 18000 19399 19400 19401 19402 19403 19090)
log() { echo "compose-test: $*" >&2; }
die() { log "$*"; exit 1; }
compose=("$DOCKER" compose -p "$GPUHEALTH_COMPOSE_PROJECT" -f "$root/docker-compose.yml"
         -f "$root/deploy/docker/compose.local-images.yml")
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
started=$SECONDS
mkdir -p "$work/logs"

native_up=()
for p in "$GPUHEALTH_KAFKA_PORT" "$GPUHEALTH_PG_PORT"; do port_open "$p" && native_up+=("$p"); done

# Someone else's engine stays as it was; one that install-docker.sh started (this
# run, or one killed before it could stop it) is stopped at the end.
engine_was_running=0
if timeout 10 "$DOCKER" info >/dev/null 2>&1 && ! "$here/install-docker.sh" started-by-us; then
  engine_was_running=1
fi

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if ((rc != 0)) && timeout 10 "$DOCKER" info >/dev/null 2>&1; then
    log "failed (exit $rc): the stack's state and logs follow"
    timeout 60 "${compose[@]}" ps --all >&2 || true
    timeout 60 "${compose[@]}" logs --no-color --tail 40 >"$work/logs/compose-test-failure.log" 2>&1 || true
    tail -n 150 "$work/logs/compose-test-failure.log" >&2 || true
  fi
  if timeout 10 "$DOCKER" info >/dev/null 2>&1; then
    timeout 180 "${compose[@]}" --profile grafana down -v --remove-orphans --timeout 20 >/dev/null 2>&1 ||
      { log "docker compose down failed"; rc=1; }
    local left
    left=$("$DOCKER" ps -aq --filter "label=com.docker.compose.project=$GPUHEALTH_COMPOSE_PROJECT")
    [[ -z $left ]] || { log "containers left behind: $left"; rc=1; }
  fi
  ((engine_was_running)) || "$here/install-docker.sh" stop || rc=1
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

timeout 900 "$here/install-docker.sh" start

# A stack left over by an interrupted run of this very script is ours to remove;
# a port held by anything else is a collision this run must not walk into.
timeout 180 "${compose[@]}" --profile grafana down -v --remove-orphans --timeout 20 >/dev/null 2>&1 || true
for p in "${test_ports[@]}"; do
  port_open "$p" && die "port $p is taken; deploy/docker/compose.local-images.yml publishes it"
done

t=$SECONDS
timeout 1800 "$here/compose-images.sh"
log "building the app image on the local Python"
for try in 1 2; do  # a second try for a registry that dropped a download
  timeout 900 "${compose[@]}" build setup >"$work/logs/compose-build.log" 2>&1 && break
  ((try == 2)) && { tail -n 40 "$work/logs/compose-build.log" >&2; die "building the app image failed"; }
  log "building the app image failed; trying once more"
done
images_s=$((SECONDS - t))

# Secrets of this run's own: the services refuse the well-known defaults off loopback (and the
# containers reach each other off loopback). Set after env.sh, whose defaults are the native stack's.
secret() { head -c 24 /dev/urandom | base64 | tr -d '/+='; }
GPUHEALTH_DB__PASSWORD=$(secret); GPUHEALTH_API__READER_PASSWORD=$(secret)
GPUHEALTH_API__ACKNOWLEDGER_PASSWORD=$(secret)
GPUHEALTH_DB_SINK_PASSWORD=$(secret); GPUHEALTH_DB_SCORER_PASSWORD=$(secret)
GPUHEALTH_DB_REMEDIATOR_PASSWORD=$(secret); GPUHEALTH_DB_LIFECYCLE_PASSWORD=$(secret)
export GPUHEALTH_DB__PASSWORD GPUHEALTH_API__READER_PASSWORD GPUHEALTH_API__ACKNOWLEDGER_PASSWORD \
  GPUHEALTH_DB_SINK_PASSWORD GPUHEALTH_DB_SCORER_PASSWORD GPUHEALTH_DB_REMEDIATOR_PASSWORD GPUHEALTH_DB_LIFECYCLE_PASSWORD

t=$SECONDS
log "docker compose up -d --wait"
timeout 660 "${compose[@]}" up -d --wait --wait-timeout 600 >"$work/logs/compose-up.log" 2>&1 ||
  { tail -n 40 "$work/logs/compose-up.log" >&2; die "docker compose up did not bring every service up"; }
up_s=$((SECONDS - t))

t=$SECONDS
log "checking the stack from the host"
(cd "$root" && PYTHONPATH=$root timeout 600 "$py" -m pytest -p no:cacheprovider -q tests/compose/stack_checks.py)
checks_s=$((SECONDS - t))

for p in "${native_up[@]}"; do
  port_open "$p" || die "the native service on 127.0.0.1:$p stopped answering while docker ran"
done

t=$SECONDS
timeout 180 "${compose[@]}" --profile grafana down -v --remove-orphans --timeout 20 >/dev/null 2>&1 ||
  die "docker compose down failed"
down_s=$((SECONDS - t))

log "images:"
"$DOCKER" image ls --format '  {{.Repository}}:{{.Tag}}  {{.Size}}' | grep -E 'gpu-health-local/' | sort >&2
log "passed in $((SECONDS - started)) s (images ${images_s} s, up ${up_s} s, checks ${checks_s} s, down ${down_s} s)"

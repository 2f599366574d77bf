#!/usr/bin/env bash
# The pipeline on this machine: `stack.sh up|down|status`, run by `make up` / `make down`.
# Starts scripts.supervise detached with deploy/local-stack.toml, waits until every
# process answers its ready URL, and says where everything is.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
source "$here/env.sh"
py=${GPUHEALTH_VENV:-$GPUHEALTH_CACHE/venv}/bin/python
logs=$GPUHEALTH_RUN/logs
pidfile=$GPUHEALTH_RUN/supervise.pid
spec=$root/deploy/local-stack.toml

running() {
  [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null &&
    grep -qE '(scripts|shared)\.supervise' "/proc/$(cat "$pidfile")/cmdline" 2>/dev/null  # shared.: before 2026-11-28
}

ready_urls() {
  (cd "$root" && PYTHONPATH=$root "$py" - "$spec" <<'PY'
import sys
from pathlib import Path
from scripts.supervise import ready_urls
print(*ready_urls(Path(sys.argv[1])), sep="\n")
PY
)
}

# GPUHEALTH_REMEDIATOR_MODE (`make up REMEDIATOR=live`): what the stack's remediator does. `live` acts on a
# kube-apiserver and Slurm (scripts/kube.sh, scripts/slurm.sh: started here when they are not running) and on
# the mock fleet's GPUs (its reset, reboot and compute check webhooks); its nodes are made Node objects there
# first (no kubelet runs: the mock's hosts are the cluster's nodes). `dry-run` records what it would do and
# reaches for no scheduler (they need not run).
remediator_mode() {
  case $GPUHEALTH_REMEDIATOR_MODE in
    dry-run) GPUHEALTH_REMEDIATOR_SCHEDULERS=false ;;
    live)  # env.sh made GPUHEALTH_REMEDIATOR_DRY_RUN false
      "$here/services.sh" start schedulers
      GPUHEALTH_REMEDIATOR_SCHEDULERS=true
      local kubectl=$GPUHEALTH_CACHE/kube-$GPUHEALTH_KUBE_VERSION/bin/kubectl node
      for node in gpu-node-00 gpu-node-01 gpu-node-02 gpu-node-03; do  # the mock's hosts, as slurm.sh has them
        printf 'apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\n  labels: {nvidia.com/gpu.present: "true"}\n---\n' "$node"
      done | "$kubectl" --kubeconfig="$GPUHEALTH_RUN/kube/admin.kubeconfig" apply -f - >/dev/null
      ;;
    *) echo "stack: GPUHEALTH_REMEDIATOR_MODE is dry-run or live, not '$GPUHEALTH_REMEDIATOR_MODE'" >&2; exit 2 ;;
  esac
  export GPUHEALTH_REMEDIATOR_SCHEDULERS
}

case ${1:-status} in
  up)
    mkdir -p "$logs"
    remediator_mode
    # The scorer's signing key and the remediator's keyring, made once (kept across restarts, never logged)
    (cd "$root" && PYTHONPATH=$root "$py" -m shared.contract.signing keygen "$GPUHEALTH_RUN/keys" --if-missing >/dev/null)
    # The local issuer: a signing key (kept) and a token per role, under $GPUHEALTH_RUN/auth (0700).
    (cd "$root" && PYTHONPATH=$root "$py" -m services.api.local_tokens "$GPUHEALTH_RUN/auth")
    if running; then
      echo "stack: already running (supervisor pid $(cat "$pidfile"))" >&2
    else
      # The supervisor writes its own pid file: `$!` after setsid can be a parent that already left.
      (cd "$root" && PYTHONPATH=$root setsid nohup "$py" -m scripts.supervise "$spec" --logs "$logs" \
         --pidfile "$pidfile" >>"$logs/supervise.log" 2>&1 </dev/null &) >/dev/null 2>&1
      # (the subshell's own output too: `make up | tee` must not wait on a pipe it holds open)
      for _ in $(seq 1 40); do running && break; sleep 0.25; done
      running || { echo "stack: the supervisor did not start; see $logs/supervise.log" >&2; exit 1; }
    fi
    for url in $(ready_urls); do
      for _ in $(seq 1 120); do
        curl -fsS -o /dev/null "$url" 2>/dev/null && break
        sleep 0.5
      done
      curl -fsS -o /dev/null "$url" 2>/dev/null || { echo "stack: $url did not answer; see $logs" >&2; exit 1; }
    done
    echo "stack: every process is up"
    echo
    echo "gpu-health is up:"
    "$here/services.sh" status "$([[ $GPUHEALTH_REMEDIATOR_MODE == live ]] && echo all || echo core)" || true
    echo "  REST API:     http://127.0.0.1:$GPUHEALTH_API_PORT/api/v1/fleet/summary  (OpenAPI: http://127.0.0.1:$GPUHEALTH_API_PORT/docs)"
    echo "  mock fleet:   http://127.0.0.1:$GPUHEALTH_MOCK_BASE_PORT/metrics ... :$((GPUHEALTH_MOCK_BASE_PORT + 3)) (admin, faults, ground truth: :$GPUHEALTH_MOCK_ADMIN_PORT)"
    echo "  metrics:      collector :$GPUHEALTH_COLLECTOR_METRICS_PORT, sink :$GPUHEALTH_SINK_METRICS_PORT, scorer :$GPUHEALTH_SCORER_METRICS_PORT, remediator :$GPUHEALTH_REMEDIATOR_METRICS_PORT, lifecycle :$GPUHEALTH_LIFECYCLE_METRICS_PORT (/metrics)"
    echo "  remediator:   $GPUHEALTH_REMEDIATOR_MODE (make up REMEDIATOR=live acts on kube :$GPUHEALTH_KUBE_PORT, Slurm and the mock's GPUs; make down first to switch)"
    echo "  logs:         $logs/"
    echo "  watch Kafka:  make kafka-console-consumer TOPIC=gpu-metrics-raw"
    echo "  database:     make psql   (try: SELECT * FROM v_fleet_health_summary;)"
    echo "  log in:       tokens per role in $GPUHEALTH_RUN/auth/ (viewer.token, operator.token, admin.token): the page's form takes one"
    echo "  CLI:          GPUHEALTH_TOKEN_FILE=$GPUHEALTH_RUN/auth/viewer.token ${GPUHEALTH_VENV:-$GPUHEALTH_CACHE/venv}/bin/gpuhealth fleet   (also: gpu UUID, alerts; ack ID with operator.token)"
    echo "  stop:         make down"
    ;;
  down)
    if running; then
      pid=$(cat "$pidfile")
      kill -TERM "$pid"
      for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      if kill -0 "$pid" 2>/dev/null; then echo "stack: supervisor $pid did not stop" >&2; exit 1; fi
      echo "stack: stopped"
    else
      echo "stack: not running"
    fi
    rm -f "$pidfile"
    ;;
  status)
    if running; then echo "stack: running (supervisor pid $(cat "$pidfile")), logs in $logs"; else echo "stack: not running"; fi
    ;;
  *) echo "usage: stack.sh up|down|status" >&2; exit 2 ;;
esac

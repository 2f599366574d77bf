# Sourced by the scripts: where things live and which ports the native stack uses.
# Every value can be overridden from the environment; the Python settings'
# defaults (shared/settings/common.py) match these, so nothing needs setting by hand.
: "${GPUHEALTH_CACHE:=$HOME/.cache/gpu-health}"            # downloads, builds, venv
: "${GPUHEALTH_RUN:=$GPUHEALTH_CACHE/run}"                 # broker data, logs, pid files
: "${GPUHEALTH_KAFKA_VERSION:=4.3.1}"
: "${GPUHEALTH_KAFKA_PORT:=9092}"
: "${GPUHEALTH_KAFKA_CONTROLLER_PORT:=9093}"
: "${GPUHEALTH_KAFKA_HEAP:=768m}"
: "${GPUHEALTH_PG_PORT:=55432}"                            # not 5432: never collide with a system PostgreSQL
: "${GPUHEALTH_PG_BIN:=/usr/lib/postgresql/15/bin}"
: "${GPUHEALTH_DB_NAME:=gpu_health}"
: "${GPUHEALTH_DB_USER:=gpuhealth}"
: "${GPUHEALTH_DB_PASSWORD:=gpuhealth}"
: "${GPUHEALTH_DB_READER_PASSWORD:=gpuhealth_reader}"   # the query API's read-only login
: "${GPUHEALTH_DB_ACKNOWLEDGER_PASSWORD:=gpuhealth_acknowledger}"   # the API's login for acknowledging only
: "${GPUHEALTH_DB_SINK_PASSWORD:=gpuhealth_sink}"              # each writing service's own login (schema/0084)
: "${GPUHEALTH_DB_SCORER_PASSWORD:=gpuhealth_scorer}"
: "${GPUHEALTH_DB_REMEDIATOR_PASSWORD:=gpuhealth_remediator}"
: "${GPUHEALTH_DB_LIFECYCLE_PASSWORD:=gpuhealth_lifecycle}"
# The pipeline `make up` runs (deploy/local-stack.toml): every port it listens on.
: "${GPUHEALTH_MOCK_ADMIN_PORT:=9399}"                   # mock fleet: faults, ground truth
: "${GPUHEALTH_MOCK_BASE_PORT:=9400}"                    # mock node i answers on this + i
: "${GPUHEALTH_COLLECTOR_METRICS_PORT:=9500}"
: "${GPUHEALTH_SINK_METRICS_PORT:=9501}"
: "${GPUHEALTH_SCORER_METRICS_PORT:=9502}"                # scorer i (of GPUHEALTH_SCORERS) on this + 10 i
: "${GPUHEALTH_SCORERS:=1}"                               # scorer processes: they share the fleet (`make up SCORERS=3`)
: "${GPUHEALTH_REMEDIATOR_METRICS_PORT:=9503}"
: "${GPUHEALTH_LIFECYCLE_METRICS_PORT:=9505}"
: "${GPUHEALTH_API_PORT:=8000}"
: "${GPUHEALTH_MOCK_OLLAMA_PORT:=11434}"                  # mock Ollama (LLM serving)
: "${GPUHEALTH_LLM_PROXY_PORT:=11435}"                    # the LLM monitor's proxy in front of it
: "${GPUHEALTH_LLM_MONITOR_METRICS_PORT:=9504}"
# PostgreSQL refuses to run as root, and root's home is closed to other users,
# so as root the cluster belongs to `postgres` and lives outside $HOME.
if [[ $(id -u) -eq 0 ]]; then
  : "${GPUHEALTH_PG_DATA:=/var/lib/gpu-health/pg}"
else
  : "${GPUHEALTH_PG_DATA:=$GPUHEALTH_RUN/pg}"
fi
GPUHEALTH_KAFKA_LIB=$GPUHEALTH_CACHE/kafka-$GPUHEALTH_KAFKA_VERSION/lib
GPUHEALTH_KAFKA_BOOTSTRAP=127.0.0.1:$GPUHEALTH_KAFKA_PORT
# The local CA, every Kafka principal's certificate and key, and the servers' (Kafka's, PostgreSQL's): services.sh
# makes them (shared/plumbing/local_pki.py), never in the checkout.
GPUHEALTH_TLS=$GPUHEALTH_RUN/tls
# The four nodes of `make up`'s mock fleet, as the collector's JSON list.
GPUHEALTH_MOCK_URLS=
for _node in 0 1 2 3; do
  GPUHEALTH_MOCK_URLS+="${GPUHEALTH_MOCK_URLS:+,}\"http://127.0.0.1:$((GPUHEALTH_MOCK_BASE_PORT + _node))/metrics\""
done
GPUHEALTH_MOCK_URLS="[$GPUHEALTH_MOCK_URLS]"
unset _node
# The services' own settings follow these unless set explicitly.
: "${GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS:=$GPUHEALTH_KAFKA_BOOTSTRAP}"
# The local broker takes only TLS clients with a certificate of its CA. Unless told otherwise a client
# sourcing this file is the admin (topic set-up, the bin/kafka-* tools); deploy/local-stack.toml gives
# each service of `make up` its own identity.
: "${GPUHEALTH_KAFKA__SECURITY_PROTOCOL:=SSL}"
: "${GPUHEALTH_KAFKA__SSL_CA_LOCATION:=$GPUHEALTH_TLS/ca.pem}"
: "${GPUHEALTH_KAFKA__SSL_CERTIFICATE_LOCATION:=$GPUHEALTH_TLS/admin.pem}"
: "${GPUHEALTH_KAFKA__SSL_KEY_LOCATION:=$GPUHEALTH_TLS/admin.key}"
: "${GPUHEALTH_DB__PORT:=$GPUHEALTH_PG_PORT}"
: "${GPUHEALTH_DB__NAME:=$GPUHEALTH_DB_NAME}"
: "${GPUHEALTH_DB__USER:=$GPUHEALTH_DB_USER}"
: "${GPUHEALTH_DB__PASSWORD:=$GPUHEALTH_DB_PASSWORD}"
# The local PostgreSQL speaks TLS with the local CA's certificate (services.sh): verified, name and all.
: "${GPUHEALTH_DB__SSLMODE:=verify-full}"
: "${GPUHEALTH_DB__SSLROOTCERT:=$GPUHEALTH_TLS/ca.pem}"
: "${GPUHEALTH_API__READER_PASSWORD:=$GPUHEALTH_DB_READER_PASSWORD}"
: "${GPUHEALTH_API__ACKNOWLEDGER_PASSWORD:=$GPUHEALTH_DB_ACKNOWLEDGER_PASSWORD}"
export GPUHEALTH_CACHE GPUHEALTH_RUN GPUHEALTH_KAFKA_VERSION GPUHEALTH_KAFKA_PORT \
  GPUHEALTH_KAFKA_CONTROLLER_PORT GPUHEALTH_KAFKA_HEAP GPUHEALTH_PG_PORT GPUHEALTH_PG_BIN \
  GPUHEALTH_DB_NAME GPUHEALTH_DB_USER GPUHEALTH_DB_PASSWORD GPUHEALTH_DB_READER_PASSWORD GPUHEALTH_DB_ACKNOWLEDGER_PASSWORD GPUHEALTH_PG_DATA \
  GPUHEALTH_DB_SINK_PASSWORD GPUHEALTH_DB_SCORER_PASSWORD GPUHEALTH_DB_REMEDIATOR_PASSWORD GPUHEALTH_DB_LIFECYCLE_PASSWORD \
  GPUHEALTH_KAFKA_LIB GPUHEALTH_KAFKA_BOOTSTRAP GPUHEALTH_TLS \
  GPUHEALTH_MOCK_ADMIN_PORT GPUHEALTH_MOCK_BASE_PORT GPUHEALTH_COLLECTOR_METRICS_PORT GPUHEALTH_SINK_METRICS_PORT \
  GPUHEALTH_SCORER_METRICS_PORT GPUHEALTH_SCORERS GPUHEALTH_REMEDIATOR_METRICS_PORT GPUHEALTH_LIFECYCLE_METRICS_PORT GPUHEALTH_API_PORT GPUHEALTH_MOCK_URLS \
  GPUHEALTH_MOCK_OLLAMA_PORT GPUHEALTH_LLM_PROXY_PORT GPUHEALTH_LLM_MONITOR_METRICS_PORT \
  GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS GPUHEALTH_KAFKA__SECURITY_PROTOCOL GPUHEALTH_KAFKA__SSL_CA_LOCATION \
  GPUHEALTH_KAFKA__SSL_CERTIFICATE_LOCATION GPUHEALTH_KAFKA__SSL_KEY_LOCATION GPUHEALTH_DB__PORT GPUHEALTH_DB__NAME GPUHEALTH_DB__USER GPUHEALTH_DB__PASSWORD GPUHEALTH_DB__SSLMODE GPUHEALTH_DB__SSLROOTCERT \
  GPUHEALTH_API__READER_PASSWORD GPUHEALTH_API__ACKNOWLEDGER_PASSWORD

# The machine's Debian mirror, from its deb822 or one-line apt sources (the
# install scripts fetch trixie's packages and the image base from it).
debian_mirror() {
  local m
  m=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -n1 || true)
  [[ -n $m ]] || m=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep -v security | head -n1 || true)
  [[ -n $m ]] || { echo "no Debian mirror found in the apt configuration" >&2; return 1; }
  echo "$m"
}
# The schedulers the remediator acts through (scripts/kube.sh, scripts/slurm.sh): a real
# kube-apiserver (built from its Go module) on Debian's etcd, and Debian's Slurm daemons.
: "${GPUHEALTH_KUBE_VERSION:=v1.34.3}"
: "${GPUHEALTH_KUBE_PORT:=16443}"
: "${GPUHEALTH_ETCD_PORT:=23790}"
: "${GPUHEALTH_SLURMCTLD_PORT:=16817}"
: "${GPUHEALTH_SLURMD_BASE_PORT:=16900}"                  # slurmd of mock node i listens on this + i
# munged wants every folder above its socket open to all, which root's home is not (as for PostgreSQL).
if [[ $(id -u) -eq 0 ]]; then
  : "${GPUHEALTH_SLURM_DIR:=/var/lib/gpu-health/slurm}"
else
  : "${GPUHEALTH_SLURM_DIR:=$GPUHEALTH_RUN/slurm}"
fi
# `make up REMEDIATOR=live` (GPUHEALTH_REMEDIATOR_MODE=live): the stack's remediator acts, on the kube-apiserver and
# Slurm above and on the mock fleet (its resets, reboots and compute check); `dry-run` (the default) records only.
: "${GPUHEALTH_REMEDIATOR_MODE:=dry-run}"
if [[ $GPUHEALTH_REMEDIATOR_MODE == live ]]; then GPUHEALTH_REMEDIATOR_DRY_RUN=false; else GPUHEALTH_REMEDIATOR_DRY_RUN=true; fi
# Whether the remediator reaches a kube-apiserver and Slurm: scripts/stack.sh sets it (live: yes; dry run: no).
: "${GPUHEALTH_REMEDIATOR_SCHEDULERS:=true}"
export GPUHEALTH_REMEDIATOR_MODE GPUHEALTH_REMEDIATOR_DRY_RUN GPUHEALTH_REMEDIATOR_SCHEDULERS
export GPUHEALTH_KUBE_VERSION GPUHEALTH_KUBE_PORT GPUHEALTH_ETCD_PORT GPUHEALTH_SLURMCTLD_PORT GPUHEALTH_SLURMD_BASE_PORT \
  GPUHEALTH_SLURM_DIR

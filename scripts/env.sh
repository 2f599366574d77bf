# Sourced by the scripts: where things live and which ports the native stack uses.
# Every value can be overridden from the environment; the Python settings'
# defaults (shared/config.py) match these, so nothing needs setting by hand.
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
# PostgreSQL refuses to run as root, and root's home is closed to other users,
# so as root the cluster belongs to `postgres` and lives outside $HOME.
if [[ $(id -u) -eq 0 ]]; then
  : "${GPUHEALTH_PG_DATA:=/var/lib/gpu-health/pg}"
else
  : "${GPUHEALTH_PG_DATA:=$GPUHEALTH_RUN/pg}"
fi
GPUHEALTH_KAFKA_LIB=$GPUHEALTH_CACHE/kafka-$GPUHEALTH_KAFKA_VERSION/lib
GPUHEALTH_KAFKA_BOOTSTRAP=127.0.0.1:$GPUHEALTH_KAFKA_PORT
export GPUHEALTH_CACHE GPUHEALTH_RUN GPUHEALTH_KAFKA_VERSION GPUHEALTH_KAFKA_PORT \
  GPUHEALTH_KAFKA_CONTROLLER_PORT GPUHEALTH_KAFKA_HEAP GPUHEALTH_PG_PORT GPUHEALTH_PG_BIN \
  GPUHEALTH_DB_NAME GPUHEALTH_DB_USER GPUHEALTH_DB_PASSWORD GPUHEALTH_DB_READER_PASSWORD GPUHEALTH_DB_ACKNOWLEDGER_PASSWORD GPUHEALTH_PG_DATA \
  GPUHEALTH_KAFKA_LIB GPUHEALTH_KAFKA_BOOTSTRAP

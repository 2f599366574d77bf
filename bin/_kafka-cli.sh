# Sourced by the bin/kafka-* wrappers: runs one of Apache Kafka's own CLI classes
# from the jars `make services` fetched, against the local broker unless the
# caller names another with --bootstrap-server, as the local broker's admin unless
# the caller gives a --command-config of its own.
set -euo pipefail
_bin=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../scripts/env.sh
source "$_bin/../scripts/env.sh"

kafka_cli() { # kafka_cli MAIN_CLASS ARGS...
  local main=$1; shift
  [[ -f $GPUHEALTH_KAFKA_LIB/.complete ]] || { echo "Kafka jars missing: run 'make services' first" >&2; exit 1; }
  local args=("$@") has_bootstrap=0 has_config=0
  for a in "${args[@]}"; do
    [[ $a == --bootstrap-server* ]] && has_bootstrap=1
    [[ $a == --command-config* || $a == --consumer.config* || $a == --producer.config* ]] && has_config=1
  done
  ((has_bootstrap)) || args=(--bootstrap-server "$GPUHEALTH_KAFKA_BOOTSTRAP" "${args[@]}")
  # The local broker takes only TLS clients with a certificate: these tools are its admin (services.sh).
  if ((!has_config)) && [[ -f $GPUHEALTH_TLS/admin.properties ]]; then
    args=(--command-config "$GPUHEALTH_TLS/admin.properties" "${args[@]}")
  fi
  exec java -Xmx256m -XX:TieredStopAtLevel=1 -Xshare:auto \
    "-Dlog4j2.configurationFile=$_bin/../deploy/kafka/tools-log4j2.properties" \
    -cp "$GPUHEALTH_KAFKA_LIB/*" "$main" "${args[@]}"
}

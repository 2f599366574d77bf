# Sourced by the bin/kafka-* wrappers: runs one of Apache Kafka's own CLI classes
# from the jars `make services` fetched, against the local broker unless the
# caller names another with --bootstrap-server.
set -euo pipefail
_bin=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../scripts/env.sh
source "$_bin/../scripts/env.sh"

kafka_cli() { # kafka_cli MAIN_CLASS ARGS...
  local main=$1; shift
  [[ -f $GPUHEALTH_KAFKA_LIB/.complete ]] || { echo "Kafka jars missing: run 'make services' first" >&2; exit 1; }
  local args=("$@") has_bootstrap=0
  for a in "${args[@]}"; do [[ $a == --bootstrap-server* ]] && has_bootstrap=1; done
  ((has_bootstrap)) || args=(--bootstrap-server "$GPUHEALTH_KAFKA_BOOTSTRAP" "${args[@]}")
  exec java -Xmx256m -XX:TieredStopAtLevel=1 -Xshare:auto \
    "-Dlog4j2.configurationFile=$_bin/../deploy/kafka/tools-log4j2.properties" \
    -cp "$GPUHEALTH_KAFKA_LIB/*" "$main" "${args[@]}"
}

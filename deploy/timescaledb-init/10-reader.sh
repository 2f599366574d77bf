#!/bin/sh
# Runs once, when the timescale/timescaledb container initialises its data folder: the API's logins --
# read-only (its rights come from migration 0006) and for acknowledging alerts (0012) -- and each
# writing service's own login (0084). A data folder made before a login was added gets it with
#   docker compose exec timescaledb psql -U gpuhealth -d gpu_health -c "CREATE ROLE gpuhealth_<service> LOGIN PASSWORD '...'"
# (the migrations give it its rights, whichever comes first).
set -eu
login() {
  psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" -v role="$1" -v pass="$2" <<'SQL'
SELECT format('CREATE ROLE %I LOGIN PASSWORD %L', :'role', :'pass')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') \gexec
SELECT format('ALTER ROLE %I LOGIN PASSWORD %L', :'role', :'pass') \gexec
SQL
}
login gpuhealth_reader "${READER_PASSWORD:-gpuhealth_reader}"
login gpuhealth_acknowledger "${ACKNOWLEDGER_PASSWORD:-gpuhealth_acknowledger}"
login gpuhealth_sink "${SINK_PASSWORD:-gpuhealth_sink}"
login gpuhealth_scorer "${SCORER_PASSWORD:-gpuhealth_scorer}"
login gpuhealth_remediator "${REMEDIATOR_PASSWORD:-gpuhealth_remediator}"
login gpuhealth_lifecycle "${LIFECYCLE_PASSWORD:-gpuhealth_lifecycle}"

#!/bin/bash
# The image's own first-start step (an image's init scripts are its own: a compose
# file must mount single files beside them, not a folder over them): the
# extension in template1 and POSTGRES_DB, and telemetry as TIMESCALEDB_TELEMETRY says.
set -euo pipefail
for db in template1 "$POSTGRES_DB"; do
  psql -X -q -v ON_ERROR_STOP=1 -d "$db" -c 'CREATE EXTENSION IF NOT EXISTS timescaledb'
done
telemetry=${TIMESCALEDB_TELEMETRY:-basic}
echo "timescaledb.telemetry_level = '$telemetry'" >> "$PGDATA/postgresql.conf"

#!/bin/sh
# Runs once, when the timescale/timescaledb container initialises its data folder:
# the query API's read-only login (its rights come from migration 0006) and its login for
# acknowledging alerts (migration 0012).
set -eu
psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" \
  -c "CREATE ROLE gpuhealth_reader LOGIN PASSWORD '${READER_PASSWORD:-gpuhealth_reader}'"
psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" \
  -c "CREATE ROLE gpuhealth_acknowledger LOGIN PASSWORD '${ACKNOWLEDGER_PASSWORD:-gpuhealth_acknowledger}'"

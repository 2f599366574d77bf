#!/bin/bash
# The database's entry point. On the first start (empty $PGDATA): initdb with
# POSTGRES_USER as the superuser, passwords over TCP, then a server listening on
# its Unix socket only runs POSTGRES_DB's creation and /docker-entrypoint-initdb.d
# (*.sh executed or sourced, *.sql through psql), and stops. Nothing on TCP can
# see the database before it is fully initialised. Then `postgres "$@"` runs.
set -euo pipefail
[[ ${1:-} == postgres ]] || exec "$@"
if [[ $(id -u) -eq 0 ]]; then
  mkdir -p "$PGDATA" && chown postgres:postgres "$PGDATA" && chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [[ ! -s $PGDATA/PG_VERSION ]]; then
  : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
  export POSTGRES_USER=${POSTGRES_USER:-postgres}
  export POSTGRES_DB=${POSTGRES_DB:-$POSTGRES_USER}
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  # shellcheck disable=SC2086  # POSTGRES_INITDB_ARGS is a list of options
  initdb -D "$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" -E UTF8 \
    --auth-local=trust --auth-host=scram-sha-256 ${POSTGRES_INITDB_ARGS:-} >/dev/null
  rm -f "$pwfile"
  echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  pg_ctl -D "$PGDATA" -w -t 60 -o "-c listen_addresses=''" start >/dev/null
  export PGHOST=/var/run/postgresql PGUSER=$POSTGRES_USER
  if [[ $POSTGRES_DB != postgres ]]; then
    psql -X -q -v ON_ERROR_STOP=1 -d postgres -v db="$POSTGRES_DB" <<'SQL'
SELECT format('CREATE DATABASE %I', :'db') \gexec
SQL
  fi
  for f in /docker-entrypoint-initdb.d/*; do
    case $f in
      *.sh) echo "docker-entrypoint: running $f" >&2; if [[ -x $f ]]; then "$f"; else . "$f"; fi ;;
      *.sql) echo "docker-entrypoint: running $f" >&2; psql -X -q -v ON_ERROR_STOP=1 -d "$POSTGRES_DB" -f "$f" ;;
    esac
  done
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  echo "docker-entrypoint: database initialised" >&2
fi
exec "$@"

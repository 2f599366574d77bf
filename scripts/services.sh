#!/usr/bin/env bash
# The native stack: a real Apache Kafka broker (KRaft, no ZooKeeper), PostgreSQL 15
# with TimescaleDB, a real kube-apiserver on etcd (scripts/kube.sh) and real Slurm
# daemons (scripts/slurm.sh), all on loopback, all idempotent.
#
#   services.sh start [kafka|postgres|kube|slurm|core|schedulers]   start what is not running, wait until healthy
#     (core: PostgreSQL and Kafka, what `make up` runs on; schedulers: kube-apiserver and Slurm)
#   services.sh stop  [kafka|postgres|kube|slurm]   stop what this script started
#   services.sh status                               exit 0 when all are up
#   services.sh jars                                 fetch the Kafka jars only (the compose Kafka stand-in uses them)
#
# Kafka runs from Maven Central jars with the machine's JDK; PostgreSQL is the
# Debian build plus TimescaleDB compiled by install-timescaledb.sh. Data, logs
# and pid files live under $GPUHEALTH_RUN (see env.sh), never in the checkout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=env.sh
source "$here/env.sh"
me=services
# shellcheck source=lib.sh
source "$here/lib.sh"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.5
  done
  log "$what is up"
}

# ---------------------------------------------------------------- Kafka
kafka_dir=$GPUHEALTH_RUN/kafka
kafka_pidfile=$kafka_dir/kafka.pid

kafka_jars() {
  [[ -f $GPUHEALTH_KAFKA_LIB/.complete ]] && return 0
  command -v mvn >/dev/null || die "Maven (mvn) is needed to fetch the Kafka jars"
  log "fetching Apache Kafka $GPUHEALTH_KAFKA_VERSION jars from Maven Central"
  rm -rf "$GPUHEALTH_KAFKA_LIB"
  mkdir -p "$GPUHEALTH_CACHE"
  mvn -B -f "$root/deploy/kafka/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -Dkafka.version="$GPUHEALTH_KAFKA_VERSION" \
    -DoutputDirectory="$GPUHEALTH_KAFKA_LIB" >"$GPUHEALTH_CACHE/mvn.log" 2>&1 ||
    { tail -n 40 "$GPUHEALTH_CACHE/mvn.log" >&2; die "fetching the Kafka jars failed"; }
  local versions
  versions=$(find "$GPUHEALTH_KAFKA_LIB" -name 'kafka*.jar' -printf '%f\n' | grep -oE '[0-9]+\.[0-9]+\.[0-9]+\.jar$' | sort -u)
  [[ $versions == "$GPUHEALTH_KAFKA_VERSION.jar" ]] || die "org.apache.kafka jars disagree on their version: $versions"
  touch "$GPUHEALTH_KAFKA_LIB/.complete"
}

kafka_running() {
  [[ -f $kafka_pidfile ]] && kill -0 "$(cat "$kafka_pidfile")" 2>/dev/null &&
    grep -q kafka.Kafka "/proc/$(cat "$kafka_pidfile")/cmdline" 2>/dev/null
}

# The servers' TLS material and Kafka's identities (shared/plumbing/local_pki.py): a local CA, the
# broker's and PostgreSQL's certificates, and one client certificate per Kafka principal (CN = principal),
# made once and kept. The Python settings of `make up`'s services point at them (env.sh, local-stack.toml).
local_pki() {
  local venv; venv=$("$here/pyenv.sh")
  (cd "$root" && PYTHONPATH=$root "$venv/bin/python" -m shared.plumbing.local_pki "$GPUHEALTH_TLS" \
    --hosts 127.0.0.1,localhost) >&2
}

# server.properties as this checkout wants it, on stdout.
kafka_properties() {
  cat <<PROPS
# Written by scripts/services.sh; edit env.sh variables instead. A broker running with other
# settings (an older checkout's, without TLS and ACLs) is restarted with these by \`make services\`.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$GPUHEALTH_KAFKA_CONTROLLER_PORT
listeners=BROKER://127.0.0.1:$GPUHEALTH_KAFKA_PORT,CONTROLLER://127.0.0.1:$GPUHEALTH_KAFKA_CONTROLLER_PORT
advertised.listeners=BROKER://127.0.0.1:$GPUHEALTH_KAFKA_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=BROKER
# Identities: TLS on both listeners, and every client shows a certificate of the local CA (mTLS); its
# CN is the principal (CN=scorer -> User:scorer). No certificate, no connection: nobody is anonymous.
listener.security.protocol.map=BROKER:SSL,CONTROLLER:SSL
ssl.client.auth=required
ssl.endpoint.identification.algorithm=https
ssl.keystore.type=PKCS12
ssl.keystore.location=$GPUHEALTH_TLS/broker.p12
ssl.keystore.password=$(cat "$GPUHEALTH_TLS/broker.p12.password")
ssl.truststore.type=PEM
ssl.truststore.location=$GPUHEALTH_TLS/ca.pem
ssl.principal.mapping.rules=RULE:^CN=([A-Za-z0-9._-]+)\$/\$1/,DEFAULT
# Authorisation: what each principal may do is the topic registry's ACLs (\`make topics\` applies them);
# anything no ACL allows is refused. The broker itself and the admin (topic set-up, tests) may anything.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:broker;User:admin
log.dirs=$kafka_dir/data
# One broker: internal topics cannot be replicated.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# Topics are created by \`python -m shared.plumbing.topic_admin\` with their configured partitions
# and retention; a typo in a topic name must not silently create a new topic.
auto.create.topics.enable=false
num.partitions=6
PROPS
}

kafka_start() {
  mkdir -p "$kafka_dir/data" "$kafka_dir/logs"
  local_pki
  local want; want=$(kafka_properties)
  if kafka_running; then
    if [[ $want != "$(cat "$kafka_dir/server.properties" 2>/dev/null)" ]]; then
      log "kafka runs with other settings than this checkout's (TLS, ACLs): restarting it"
      kafka_stop
    else
      port_open "$GPUHEALTH_KAFKA_PORT" && { log "kafka already running (pid $(cat "$kafka_pidfile"))"; return 0; }
      wait_for 90 "kafka" port_open "$GPUHEALTH_KAFKA_PORT" || die "kafka pid $(cat "$kafka_pidfile") is not listening"
      return 0
    fi
  fi
  port_open "$GPUHEALTH_KAFKA_PORT" && die "port $GPUHEALTH_KAFKA_PORT is taken by another process; set GPUHEALTH_KAFKA_PORT"
  command -v java >/dev/null || die "a JDK (java 17+) is needed to run Kafka"
  kafka_jars
  (umask 077; printf '%s\n' "$want" > "$kafka_dir/server.properties")
  local java=(java -Xms256m "-Xmx$GPUHEALTH_KAFKA_HEAP" -XX:+UseG1GC -Djava.awt.headless=true
              "-Dkafka.logs.dir=$kafka_dir/logs"
              "-Dlog4j2.configurationFile=$root/deploy/kafka/log4j2.properties"
              -cp "$GPUHEALTH_KAFKA_LIB/*")
  if [[ ! -f $kafka_dir/data/meta.properties ]]; then
    [[ -f $kafka_dir/cluster.id ]] || "${java[@]}" kafka.tools.StorageTool random-uuid > "$kafka_dir/cluster.id"
    log "formatting KRaft storage (cluster $(cat "$kafka_dir/cluster.id"))"
    "${java[@]}" kafka.tools.StorageTool format -t "$(cat "$kafka_dir/cluster.id")" \
      -c "$kafka_dir/server.properties" --standalone >"$kafka_dir/logs/format.out" 2>&1 ||
      { cat "$kafka_dir/logs/format.out" >&2; die "kafka storage format failed"; }
  fi
  log "starting kafka $GPUHEALTH_KAFKA_VERSION on $GPUHEALTH_KAFKA_BOOTSTRAP"
  setsid nohup "${java[@]}" kafka.Kafka "$kafka_dir/server.properties" \
    >"$kafka_dir/logs/kafka.out" 2>&1 </dev/null &
  echo $! > "$kafka_pidfile"
  wait_for 120 "kafka" port_open "$GPUHEALTH_KAFKA_PORT" ||
    { tail -n 30 "$kafka_dir/logs/kafka.out" "$kafka_dir/logs/server.log" >&2 || true; die "kafka did not come up"; }
}

kafka_stop() {
  if ! kafka_running; then log "kafka is not running"; rm -f "$kafka_pidfile"; return 0; fi
  local pid; pid=$(cat "$kafka_pidfile")
  log "stopping kafka (pid $pid)"
  kill -TERM "$pid"
  local deadline=$((SECONDS + 60))
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then log "kafka did not stop in 60 s; killing it"; kill -KILL "$pid"; fi
    sleep 0.5
  done
  rm -f "$kafka_pidfile"
}

# ---------------------------------------------------------------- PostgreSQL
pg_sock=$GPUHEALTH_PG_DATA/../socket

as_pg() { if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

pg_running() { [[ -f $GPUHEALTH_PG_DATA/PG_VERSION ]] && as_pg "$GPUHEALTH_PG_BIN/pg_ctl" -D "$GPUHEALTH_PG_DATA" status >/dev/null 2>&1; }

pg_psql() { PGOPTIONS="-c client_min_messages=warning" as_pg "$GPUHEALTH_PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$pg_sock" -p "$GPUHEALTH_PG_PORT" -U postgres "$@"; }

postgres_start() {
  "$here/install-timescaledb.sh"
  if ! pg_running; then
    if [[ ! -f $GPUHEALTH_PG_DATA/PG_VERSION ]]; then
      log "initialising a private cluster in $GPUHEALTH_PG_DATA"
      mkdir -p "$GPUHEALTH_PG_DATA" "$pg_sock"
      [[ $(id -u) -eq 0 ]] && chown postgres:postgres "$GPUHEALTH_PG_DATA" "$pg_sock"
      chmod 700 "$GPUHEALTH_PG_DATA" "$pg_sock"
      # Local socket: trust, because the socket folder is private (0700) to the
      # cluster's owner; TCP: passwords (scram-sha-256).
      as_pg "$GPUHEALTH_PG_BIN/initdb" -D "$GPUHEALTH_PG_DATA" -U postgres -E UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
      echo "include 'gpu-health.conf'" | as_pg tee -a "$GPUHEALTH_PG_DATA/postgresql.conf" >/dev/null
    fi
    as_pg tee "$GPUHEALTH_PG_DATA/gpu-health.conf" >/dev/null <<CONF
# Written by scripts/services.sh at every start.
listen_addresses = '127.0.0.1'
port = $GPUHEALTH_PG_PORT
unix_socket_directories = '$(cd "$pg_sock" && pwd)'
shared_preload_libraries = 'timescaledb'
timescaledb.telemetry_level = off
max_connections = 200
# The sink's INSERTs go through shared buffers (a COPY uses a small ring of its own):
# room for a few minutes of a large fleet's rows and indexes saves evicting dirty pages.
shared_buffers = 2GB
# The sink writes ~1 kB of WAL a sample: at the default 1GB, checkpoints (and the
# full-page writes after each) would come every few hundred thousand samples.
max_wal_size = 4GB
checkpoint_timeout = 15min
CONF
    log "starting postgresql on 127.0.0.1:$GPUHEALTH_PG_PORT"
    port_open "$GPUHEALTH_PG_PORT" && die "port $GPUHEALTH_PG_PORT is taken by another process; set GPUHEALTH_PG_PORT"
    as_pg "$GPUHEALTH_PG_BIN/pg_ctl" -D "$GPUHEALTH_PG_DATA" -l "$GPUHEALTH_PG_DATA/server.log" -w -t 60 start >/dev/null ||
      { tail -n 30 "$GPUHEALTH_PG_DATA/server.log" >&2; die "postgresql did not start"; }
  else
    log "postgresql already running"
  fi
  wait_for 60 "postgresql" "$GPUHEALTH_PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$GPUHEALTH_PG_PORT" || die "postgresql is not ready"
  local_pki
  postgres_tls
  # Role, database and extension: idempotent, cheap, so done at every start.
  pg_psql -d postgres -v user="$GPUHEALTH_DB_USER" -v pass="$GPUHEALTH_DB_PASSWORD" -v db="$GPUHEALTH_DB_NAME" \
    -v reader_pass="$GPUHEALTH_DB_READER_PASSWORD" -v ack_pass="$GPUHEALTH_DB_ACKNOWLEDGER_PASSWORD" \
    -v sink_pass="$GPUHEALTH_DB_SINK_PASSWORD" -v scorer_pass="$GPUHEALTH_DB_SCORER_PASSWORD" \
    -v remediator_pass="$GPUHEALTH_DB_REMEDIATOR_PASSWORD" -v lifecycle_pass="$GPUHEALTH_DB_LIFECYCLE_PASSWORD" <<'SQL'
SELECT format('CREATE ROLE %I LOGIN CREATEROLE PASSWORD %L', :'user', :'pass')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'user') \gexec
-- Collation C: text keys (GPU UUIDs in every unique index) compare as bytes, not
-- through the C library's locale; the sink's inserts measured ~15% faster.
SELECT format('CREATE DATABASE %I OWNER %I TEMPLATE template0 LC_COLLATE %L LC_CTYPE %L',
              :'db', :'user', 'C', 'C.UTF-8')
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db') \gexec
-- The query API's read-only login; its rights come from migration 0006.
SELECT format('CREATE ROLE gpuhealth_reader LOGIN PASSWORD %L', :'reader_pass')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpuhealth_reader') \gexec
SELECT format('ALTER ROLE gpuhealth_reader LOGIN PASSWORD %L', :'reader_pass') \gexec
-- The API's login for acknowledging an alert, and nothing else; its rights come from migration 0012.
SELECT format('CREATE ROLE gpuhealth_acknowledger LOGIN PASSWORD %L', :'ack_pass')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpuhealth_acknowledger') \gexec
SELECT format('ALTER ROLE gpuhealth_acknowledger LOGIN PASSWORD %L', :'ack_pass') \gexec
-- One login per service that writes (its rights come from migration 0084): created, or given its login
-- and password again where a migration made it NOLOGIN first or the password changed.
CREATE TEMP TABLE service_logins (role text, pass text);
INSERT INTO service_logins VALUES ('gpuhealth_sink', :'sink_pass'), ('gpuhealth_scorer', :'scorer_pass'),
  ('gpuhealth_remediator', :'remediator_pass'), ('gpuhealth_lifecycle', :'lifecycle_pass');
SELECT format('CREATE ROLE %I LOGIN PASSWORD %L', role, pass) FROM service_logins
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = role) \gexec
SELECT format('ALTER ROLE %I LOGIN PASSWORD %L', role, pass) FROM service_logins \gexec
DROP TABLE service_logins;
-- The other databases are no business of the API's or the services' logins: there, large objects and
-- temporary tables would still be theirs to create. Only the project's owner keeps them.
REVOKE CONNECT, TEMPORARY ON DATABASE postgres, template1 FROM PUBLIC;
SELECT format('GRANT CONNECT, TEMPORARY ON DATABASE postgres, template1 TO %I', :'user') \gexec
SQL
  # TimescaleDB is not a trusted extension: the superuser creates it once, and
  # the migrations' `CREATE EXTENSION IF NOT EXISTS` is then a no-op.
  pg_psql -d "$GPUHEALTH_DB_NAME" -c 'CREATE EXTENSION IF NOT EXISTS timescaledb'
  # What only a superuser can take from every login (large objects, SECURITY DEFINER functions).
  pg_psql -d "$GPUHEALTH_DB_NAME" < "$root/deploy/timescaledb-init/20-least-privilege.sql"
  log "database $GPUHEALTH_DB_NAME ready: $(pg_psql -d "$GPUHEALTH_DB_NAME" -At -c \
    "SELECT 'timescaledb ' || extversion || ', license ' || current_setting('timescaledb.license') FROM pg_extension WHERE extname = 'timescaledb'")"
}

# TLS with the local CA's certificate for PostgreSQL (the services connect with sslmode=verify-full):
# at every start, so a cluster an older checkout made gets it too; reloaded (not restarted) on a change.
postgres_tls() {
  local changed=0 ext src dst
  for ext in crt key; do
    src=$GPUHEALTH_TLS/postgres.$([[ $ext == crt ]] && echo pem || echo key) dst=$GPUHEALTH_PG_DATA/server.$ext
    cmp -s "$src" "$dst" 2>/dev/null && continue
    if [[ $(id -u) -eq 0 ]]; then install -m 0600 -o postgres -g postgres "$src" "$dst"; else install -m 0600 "$src" "$dst"; fi
    changed=1
  done
  local want="# Written by scripts/services.sh at every start: TLS with the local CA's certificate.
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
ssl_min_protocol_version = 'TLSv1.2'"
  if [[ $(cat "$GPUHEALTH_PG_DATA/gpu-health-tls.conf" 2>/dev/null) != "$want" ]]; then
    printf '%s\n' "$want" | as_pg tee "$GPUHEALTH_PG_DATA/gpu-health-tls.conf" >/dev/null
    changed=1
  fi
  grep -q "^include_if_exists 'gpu-health-tls.conf'" "$GPUHEALTH_PG_DATA/postgresql.conf" ||
    { echo "include_if_exists 'gpu-health-tls.conf'" | as_pg tee -a "$GPUHEALTH_PG_DATA/postgresql.conf" >/dev/null; changed=1; }
  if ((changed)); then
    log "postgresql: TLS with the local CA's certificate (reloading)"
    as_pg "$GPUHEALTH_PG_BIN/pg_ctl" -D "$GPUHEALTH_PG_DATA" reload >/dev/null
  fi
}

postgres_stop() {
  if ! pg_running; then log "postgresql is not running"; return 0; fi
  log "stopping postgresql"
  as_pg "$GPUHEALTH_PG_BIN/pg_ctl" -D "$GPUHEALTH_PG_DATA" -m fast -w stop >/dev/null
}

# PostgreSQL, then Kafka; on a first run Kafka's jars download meanwhile (PostgreSQL's start makes the venv).
core_start() {
  local jars
  kafka_jars & jars=$!
  trap 'kill "$jars" 2>/dev/null || true' EXIT  # a failed start leaves no download behind
  postgres_start
  wait "$jars" || die "fetching the Kafka jars failed"
  trap - EXIT
  kafka_start
}

# ---------------------------------------------------------------- main
cmd=${1:-status}; what=${2:-all}
case $cmd in
  start)
    case $what in
      kafka) kafka_start ;; postgres) postgres_start ;; kube) "$here/kube.sh" start ;; slurm) "$here/slurm.sh" start ;;
      core) core_start ;;  # what the pipeline needs (make up)
      schedulers) "$here/kube.sh" start; "$here/slurm.sh" start ;;  # what a live remediator and the tests need
      all) core_start; "$here/kube.sh" start; "$here/slurm.sh" start ;;
      *) die "unknown service $what" ;;
    esac ;;
  stop)
    case $what in
      kafka) kafka_stop ;; postgres) postgres_stop ;; kube) "$here/kube.sh" stop ;; slurm) "$here/slurm.sh" stop ;;
      all) "$here/slurm.sh" stop; "$here/kube.sh" stop; kafka_stop; postgres_stop ;;
      *) die "unknown service $what" ;;
    esac ;;
  jars) kafka_jars ;;
  status)  # all, or core: Kafka and PostgreSQL only
    rc=0
    if kafka_running && port_open "$GPUHEALTH_KAFKA_PORT"; then echo "kafka     up   $GPUHEALTH_KAFKA_BOOTSTRAP (pid $(cat "$kafka_pidfile"))"; else echo "kafka     down"; rc=3; fi
    if pg_running; then echo "postgres  up   127.0.0.1:$GPUHEALTH_PG_PORT/$GPUHEALTH_DB_NAME"; else echo "postgres  down"; rc=3; fi
    if [[ $what != core ]]; then
      "$here/kube.sh" status || rc=3
      "$here/slurm.sh" status || rc=3
    fi
    exit $rc ;;
  *) die "usage: services.sh start|stop|status [kafka|postgres|kube|slurm|core|schedulers]" ;;
esac

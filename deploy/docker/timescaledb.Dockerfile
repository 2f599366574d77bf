# gpu-health-local/timescaledb - stands in for `timescale/timescaledb` where no
# registry is reachable: Debian's PostgreSQL 15 plus the TimescaleDB extension as
# scripts/install-timescaledb.sh builds it (Apache-only, license `apache`), with
# the official image's interface: POSTGRES_USER / _PASSWORD / _DB /
# _INITDB_ARGS, TIMESCALEDB_TELEMETRY, init scripts in /docker-entrypoint-initdb.d
# run once against a socket-only server, data in /var/lib/postgresql/data.
FROM gpu-health-local/debian:bookworm
# No Debian-style cluster: the entry point initialises $PGDATA itself.
RUN mkdir -p /etc/postgresql-common \
    && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf \
    && apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null \
    && rm -rf /var/lib/apt/lists/*
COPY --from=timescaledb . /
# Every new cluster preloads the extension (initdb copies this sample).
RUN echo "shared_preload_libraries = 'timescaledb'" >> /usr/share/postgresql/15/postgresql.conf.sample \
    && mkdir -p /docker-entrypoint-initdb.d /var/lib/postgresql/data /var/run/postgresql \
    && chown postgres:postgres /var/lib/postgresql/data /var/run/postgresql \
    && chmod 700 /var/lib/postgresql/data
COPY deploy/docker/timescaledb/docker-entrypoint.sh /usr/local/bin/
COPY deploy/docker/timescaledb/000_install_timescaledb.sh /docker-entrypoint-initdb.d/
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
STOPSIGNAL SIGINT
EXPOSE 5432
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]

# gpu-health-local/prometheus:bookworm - stands in for `prom/prometheus` where no
# registry is reachable: Debian bookworm's Prometheus with the official image's
# interface (config /etc/prometheus/prometheus.yml, data /prometheus, user
# nobody) and wget for the compose file's healthcheck.
FROM gpu-health-local/debian:bookworm
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus wget >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus && chown nobody:nogroup /prometheus
USER nobody
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus", \
     "--web.console.libraries=/usr/share/prometheus/console_libraries", \
     "--web.console.templates=/usr/share/prometheus/consoles"]

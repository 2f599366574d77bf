# gpu-health-local/kafka - stands in for `apache/kafka` where no registry is
# reachable: Debian's JRE 17 and the jars of deploy/kafka/pom.xml (the very
# jars `make services` runs natively), with the official image's interface:
# KAFKA_* variables become server.properties, storage is formatted on first
# start, the data folder is /var/lib/kafka/data and the CLI tools are
# /opt/kafka/bin/kafka-*.sh.
FROM gpu-health-local/debian:bookworm
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null \
    && rm -rf /var/lib/apt/lists/*
COPY --from=kafkalibs . /opt/kafka/libs/
COPY deploy/kafka/tools-log4j2.properties deploy/docker/kafka/log4j2.properties /opt/kafka/config/
COPY deploy/docker/kafka/run deploy/docker/kafka/kafka-tool /opt/kafka/bin/
RUN cd /opt/kafka/bin \
    && for tool in kafka-console-consumer kafka-console-producer kafka-topics kafka-consumer-groups \
                   kafka-broker-api-versions kafka-storage kafka-metadata-quorum; do ln -s kafka-tool "$tool.sh"; done \
    && useradd --system --uid 1000 --create-home appuser \
    && mkdir -p /var/lib/kafka/data && chown appuser /var/lib/kafka/data /opt/kafka/config
ENV PATH=/opt/kafka/bin:$PATH
USER appuser
EXPOSE 9092
ENTRYPOINT ["/opt/kafka/bin/run"]

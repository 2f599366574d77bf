"""A second, private Apache Kafka broker (KRaft) that a test may stop and start at will.

The shared broker on 9092 serves every engineer's tests and is never stopped; a
test about a broker outage starts this one instead: the same jars `make services`
fetched (scripts/env.sh: $GPUHEALTH_CACHE/kafka-$GPUHEALTH_KAFKA_VERSION/lib), on
free ports, with its data in the test's temporary folder.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

from shared.plumbing.kafka import wait_for_kafka
from shared.settings.common import KafkaSettings
from tests.helpers.ports import free_port
from tests.paths import REPO


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class ThrowawayBroker:
    """One KRaft node (broker and controller) in `folder`; stop() and start() keep its data."""

    def __init__(self, folder: Path) -> None:
        cache = Path(os.environ.get("GPUHEALTH_CACHE", Path.home() / ".cache" / "gpu-health"))
        self.lib = cache / f"kafka-{os.environ.get('GPUHEALTH_KAFKA_VERSION', '4.3.1')}" / "lib"
        assert (self.lib / ".complete").exists(), f"no Kafka jars in {self.lib}: run `make services` once"
        self.folder = folder
        self.port, self.controller_port = free_port(), free_port()
        self.process: subprocess.Popen[bytes] | None = None
        (folder / "logs").mkdir(parents=True, exist_ok=True)
        self.properties = folder / "server.properties"
        self.properties.write_text(
            "\n".join([
                "process.roles=broker,controller", "node.id=1",
                f"controller.quorum.bootstrap.servers=127.0.0.1:{self.controller_port}",
                f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "controller.listener.names=CONTROLLER", "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                f"log.dirs={folder / 'data'}",
                "offsets.topic.replication.factor=1", "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1", "share.coordinator.state.topic.replication.factor=1",
                "share.coordinator.state.topic.min.isr=1", "group.initial.rebalance.delay.ms=0",
                "auto.create.topics.enable=false",
            ]) + "\n"
        )  # fmt: skip
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        subprocess.run(
            [*self._java(), "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.properties),
             "--standalone"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip

    def _java(self) -> list[str]:
        return ["java", "-Xms128m", "-Xmx256m", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
                f"-Dkafka.logs.dir={self.folder / 'logs'}",
                f"-Dlog4j2.configurationFile={REPO / 'deploy' / 'kafka' / 'log4j2.properties'}",
                "-cp", f"{self.lib}/*"]  # fmt: skip

    @property
    def settings(self) -> KafkaSettings:
        return KafkaSettings(bootstrap_servers=f"127.0.0.1:{self.port}")

    def client_env(self) -> dict[str, str]:
        """The GPUHEALTH_KAFKA__* variables of a service reaching this broker: plain connections, so the
        local stack's TLS identity a test's environment may hold is cleared (an empty variable is unset)."""
        return {
            "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": self.settings.bootstrap_servers,
            "GPUHEALTH_KAFKA__SECURITY_PROTOCOL": "PLAINTEXT",
            "GPUHEALTH_KAFKA__SSL_CA_LOCATION": "",
            "GPUHEALTH_KAFKA__SSL_CERTIFICATE_LOCATION": "",
            "GPUHEALTH_KAFKA__SSL_KEY_LOCATION": "",
        }

    def start(self) -> None:
        assert self.process is None, "already running"
        with (self.folder / "logs" / "kafka.out").open("ab") as out:
            self.process = subprocess.Popen(
                [*self._java(), "kafka.Kafka", str(self.properties)], stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 180
        while not _listening(self.port):
            assert self.process.poll() is None, f"the broker exited: see {self.folder / 'logs'}"
            assert time.monotonic() < deadline, "the throwaway broker did not come up"
            threading.Event().wait(0.2)
        wait_for_kafka(self.settings, timeout_s=120)

    def stop(self) -> None:
        """Stop the broker (SIGTERM, as an operator would) and wait until it has gone."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

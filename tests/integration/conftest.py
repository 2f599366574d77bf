"""Fixtures on the real Kafka broker and the real TimescaleDB.

Addresses come from pytest options, then GPUHEALTH_* variables, then the
defaults of the stack `make services` starts; so does the Kafka identity (the
local stack's admin certificate, tests/helpers/kafka.py). If a server is not reachable the
test fails with a message saying so; it is never skipped, so a broken setup
cannot pass CI. Each test gets its own uuid-named topics and its own schema,
dropped afterwards.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from shared.plumbing.db import connect
from shared.plumbing.errors import GpuHealthError
from shared.plumbing.kafka import make_admin, wait_for_kafka
from shared.plumbing.topic_admin import TopicSpec, ensure_topics
from shared.settings.common import DatabaseSettings, KafkaSettings, Settings
from tests.helpers.kafka import local_stack_env
from tests.helpers.topics import isolated_topics


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def settings(request: pytest.FixtureRequest) -> Settings:
    # The local broker takes only clients with a certificate of its CA: unless told otherwise the tests,
    # and the services they start (which inherit this environment), are its admin.
    for name, value in local_stack_env().items():
        os.environ.setdefault(name, value)
    base = Settings()
    bootstrap = request.config.getoption("--kafka-bootstrap-servers")
    if bootstrap:
        base.kafka.bootstrap_servers = bootstrap
    if request.config.getoption("--db-host"):
        base.db.host = request.config.getoption("--db-host")
    if request.config.getoption("--db-port"):
        base.db.port = request.config.getoption("--db-port")
    return base


@pytest.fixture(scope="session")
def kafka_settings(settings: Settings) -> KafkaSettings:
    try:
        wait_for_kafka(settings.kafka, timeout_s=30)
    except GpuHealthError as e:
        pytest.fail(f"{e} - start it with `make services`", pytrace=False)
    return settings.kafka


@pytest.fixture(scope="session")
def db_settings(settings: Settings) -> DatabaseSettings:
    try:
        connect(settings.db).close()
    except GpuHealthError as e:
        pytest.fail(f"{e} - start it with `make services`", pytrace=False)
    return settings.db


def _native(variable: str, default: Path) -> Path:
    return Path(os.environ.get(variable, "")) if os.environ.get(variable) else default


def _run_dir() -> Path:
    cache = _native("GPUHEALTH_CACHE", Path.home() / ".cache" / "gpu-health")
    return _native("GPUHEALTH_RUN", cache / "run")


@pytest.fixture(scope="session")
def kube_admin() -> Path:
    """The kubeconfig of the real kube-apiserver's admin (system:masters): for setting up tests only."""
    path = _run_dir() / "kube" / "admin.kubeconfig"
    if not path.is_file():
        pytest.fail(f"no {path}: start the kube-apiserver with `make services`", pytrace=False)
    return path


@pytest.fixture(scope="session")
def kube_remediator(kube_admin: Path) -> Path:
    """User gpuhealth-remediator's kubeconfig: its rights are what remediator-rbac.yaml grants."""
    return kube_admin.with_name("remediator.kubeconfig")


@pytest.fixture(scope="session")
def kubectl(kube_admin: Path) -> Path:
    """The kubectl built with the kube-apiserver (scripts/kube.sh), of the same release."""
    cache = _native("GPUHEALTH_CACHE", Path.home() / ".cache" / "gpu-health")
    version = os.environ.get("GPUHEALTH_KUBE_VERSION", "v1.34.3")
    path = cache / f"kube-{version}" / "bin" / "kubectl"
    if not path.is_file():
        pytest.fail(f"no {path}: build it with `make services`", pytrace=False)
    return path


@pytest.fixture(scope="session")
def slurm_conf() -> Path:
    """SLURM_CONF of the real slurmctld and the slurmd of nodes gpu-node-00..03 (`make services`)."""
    default = Path("/var/lib/gpu-health/slurm") if os.geteuid() == 0 else _run_dir() / "slurm"
    path = _native("GPUHEALTH_SLURM_DIR", default) / "etc" / "slurm.conf"
    if not path.is_file():
        pytest.fail(f"no {path}: start Slurm with `make services`", pytrace=False)
    return path


@pytest.fixture
def topic_factory(kafka_settings: KafkaSettings) -> Iterator[Callable[..., str]]:
    """Creates topics with unique names; deletes them after the test."""
    admin = make_admin(kafka_settings)
    created: list[str] = []

    def create(partitions: int = 3, prefix: str = "test") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        ensure_topics(admin, [TopicSpec(name=name, partitions=partitions, replication_factor=1)])
        created.append(name)
        return name

    yield create
    if created:
        for future in admin.delete_topics(created, operation_timeout=30).values():
            future.result()


@pytest.fixture
def db_schema(db_settings: DatabaseSettings) -> Iterator[str]:
    """A fresh, empty schema for one test; dropped with everything in it afterwards."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    with connect(db_settings, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    yield name
    with connect(db_settings, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def db_conn(
    db_settings: DatabaseSettings, db_schema: str
) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A connection whose search_path starts with the test's own schema."""
    with connect(db_settings, schema=db_schema) as conn:
        yield conn


@pytest.fixture
def migrated(db_settings: DatabaseSettings, db_schema: str) -> DatabaseSettings:
    """Settings whose connections land in a fresh schema holding the project's migrations."""
    from shared.plumbing.migrate import apply_migrations, discover

    scoped = db_settings.model_copy(update={"search_path": db_schema})
    with connect(scoped) as conn:
        apply_migrations(conn, discover())
    return scoped


@pytest.fixture
def served_api(migrated: DatabaseSettings, request: pytest.FixtureRequest) -> Iterator[str]:
    """The query API on a real port, served as `python -m services.api` serves it (uvicorn in a thread,
    lifespan, limits and all), over a fresh schema. Indirect parametrisation overrides ApiSection fields.
    Callers need a token: tests.helpers.identities (VIEWER.get, as_role("admin")...)."""
    import socket
    import threading

    from services.api.server import api_server
    from tests.helpers.identities import api_app, api_section

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    api = api_section(**getattr(request, "param", {}))
    server = api_server(api_app(migrated, api), api, host="127.0.0.1", port=port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        threading.Event().wait(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def api_schema(served_api: str) -> Any:
    import schemathesis

    return schemathesis.openapi.from_url(served_api + "/openapi.json")


@pytest.fixture
def lifecycle_decided(
    scored: dict[str, Any],
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topic_factory: Callable[..., str],
) -> dict[str, Any]:
    """`scored`, then one run of the lifecycle service over it (no inventory file): its decisions by GPU."""
    from prometheus_client import CollectorRegistry

    from services.lifecycle.loop import LifecycleLoop
    from services.lifecycle.settings import LifecycleSettings
    from shared.plumbing.kafka import JsonProducer, make_producer

    settings = LifecycleSettings(kafka=kafka_settings, db=migrated, topics=isolated_topics(topic_factory))
    loop = LifecycleLoop(
        settings, producer=JsonProducer(make_producer(kafka_settings)), registry=CollectorRegistry()
    )
    result = loop.run_once("once")
    assert result is not None
    loop.producer.flush(30)
    return {r["gpu_uuid"]: r for r in result.rows}


@pytest.fixture
def scored(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topic_factory: Callable[..., str]
) -> dict[str, Any]:
    """One node of 4 GPUs run for a simulated hour through the real pipeline and scored.

    GPU 1 ("sick") had a double-bit ECC error and a strong SBE storm; the others are healthy.
    """
    from evaluation.pipeline import pipeline

    topics = isolated_topics(topic_factory)
    with pipeline(kafka_settings, migrated, topics, nodes=1, gpus=4, hours_back=2) as p:
        p.inject(node=0, gpu=1, kind="dbe", after_s=600)
        p.inject(node=0, gpu=1, kind="sbe_storm", after_s=600, params={"rate_per_hour": 2000})
        p.run(3600)
        p.score()
        return {"sick": p.gpu(0, 1), "well": p.gpu(0, 2), "uuids": [p.gpu(0, i) for i in range(4)]}

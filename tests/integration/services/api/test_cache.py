"""The API's cycle cache: an answer lasts until the scorer's next cycle, then is served stale (for a bounded
while) as it is read again."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluation.pipeline import wait_until
from services.api.deps import state_of
from services.api.settings import ApiSection
from services.scorer.cycle import run_cycle
from services.scorer.rules_config import load_rules
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from shared.store.notify import announce_scored
from tests.helpers.identities import api_app, api_env, as_role
from tests.helpers.ports import free_port
from tests.helpers.service_process import service_process, waiting_on_a_lock

ADD_GPU = """
INSERT INTO gpu_assets (gpu_uuid, model, gpu_index, hostname, cluster, first_seen, last_seen)
VALUES (%s, 'NVIDIA H100 80GB HBM3', 0, 'node-0', 'c1', now(), now())
"""


def add_gpu(db: DatabaseSettings, n: int) -> None:
    with connect(db) as conn:
        conn.execute(ADD_GPU, (f"GPU-{n:08d}-0000-4000-8000-000000000000",))
        conn.commit()


def gpus(client: TestClient) -> tuple[int, int]:
    summary = client.get("/api/v1/fleet/summary")
    listed = client.get("/api/v1/gpus", params={"sort": "hostname"})
    assert summary.status_code == listed.status_code == 200
    return summary.json()["gpus"], listed.json()["total"]


@pytest.fixture
def cached(migrated: DatabaseSettings) -> Iterator[TestClient]:
    app = api_app(migrated, ApiSection(cache_max_age_s=600))
    with TestClient(app, headers=as_role("viewer")) as client:
        wait_until(lambda: state_of(app).cache.listening, 30, "the cache to listen")
        yield client


def test_answers_last_until_the_scorers_next_cycle(migrated: DatabaseSettings, cached: TestClient) -> None:
    add_gpu(migrated, 1)
    assert gpus(cached) == (1, 1)
    add_gpu(migrated, 2)  # not a scoring cycle: the answers of this cycle stand
    assert gpus(cached) == (1, 1)
    with connect(migrated) as conn:  # another tenant's cycle is not this one's
        conn.execute("SELECT pg_notify('gpuhealth_scored', 'someone_else')")
        conn.commit()
    assert gpus(cached) == (1, 1)
    with connect(migrated) as conn:
        run_cycle(conn, datetime.now(UTC), load_rules(), None)  # the scorer's cycle announces itself
    wait_until(lambda: gpus(cached) == (2, 2), 30, "the next cycle's answers")


def announce(db: DatabaseSettings) -> None:
    """A scoring cycle's announcement, as the scorer sends it (pg_notify at the commit)."""
    with connect(db) as conn:
        announce_scored(conn)
        conn.commit()


@contextlib.contextmanager
def gpus_locked(db: DatabaseSettings) -> Iterator[None]:
    """gpu_assets locked by another transaction: any reading of the fleet waits until the block ends."""
    with connect(db) as conn:
        conn.execute("LOCK TABLE gpu_assets IN ACCESS EXCLUSIVE MODE")
        yield
        conn.rollback()


def summary(client: TestClient | httpx.Client, url: str = "") -> tuple[int, str, int]:
    """The summary's GPU count, its Cache-Status and its Age."""
    answer = client.get(url + "/api/v1/fleet/summary")
    assert answer.status_code == 200
    return answer.json()["gpus"], answer.headers["cache-status"], int(answer.headers["age"])


def test_after_a_cycle_the_old_answer_is_served_at_once_then_the_new_one(migrated: DatabaseSettings) -> None:
    app = api_app(migrated, ApiSection(cache_max_age_s=600, cache_max_stale_s=60))
    with TestClient(app, headers=as_role("viewer")) as client:
        wait_until(lambda: state_of(app).cache.listening, 30, "the cache to listen")
        add_gpu(migrated, 1)
        assert summary(client)[:2] == (1, "gpu-health; fwd=miss; stored")
        assert summary(client)[:2] == (1, "gpu-health; hit")
        add_gpu(migrated, 2)
        with gpus_locked(migrated):  # the refresh cannot read until the lock goes
            announce(migrated)
            wait_until(lambda: "ttl=-" in summary(client)[1], 30, "the announcement to be heard")
            started = time.monotonic()
            gpus_now, status, _ = summary(client)
            assert time.monotonic() - started < 2, "the stale answer waited for the refresh"
            assert (gpus_now, status.split("; ")[:2]) == (1, ["gpu-health", "hit"])
            assert state_of(app).cache.refreshes == 1  # one refresh, however many requests met the stale one
        wait_until(lambda: summary(client)[:2] == (2, "gpu-health; hit"), 30, "the refreshed answer")
        assert summary(client)[2] < 30


def test_sigterm_ends_the_api_with_status_0_while_a_refresh_waits_on_the_database(
    migrated: DatabaseSettings,
) -> None:
    port = free_port()
    env = {
        "GPUHEALTH_DB__HOST": migrated.host, "GPUHEALTH_DB__PORT": str(migrated.port),
        "GPUHEALTH_DB__SEARCH_PATH": migrated.search_path or "", "GPUHEALTH_API__PORT": str(port),
        "GPUHEALTH_API__CACHE_MAX_STALE_S": "60", **api_env(),
    }  # fmt: skip
    add_gpu(migrated, 1)
    url = f"http://127.0.0.1:{port}"
    with service_process("api", env) as api, httpx.Client(timeout=10, headers=as_role("viewer")) as client:

        def cached() -> bool:
            assert api.poll() is None, api.stdout.read() if api.stdout else ""
            with contextlib.suppress(httpx.HTTPError):
                return summary(client, url)[1] == "gpu-health; hit"
            return False

        wait_until(cached, 60, "the API to cache the summary")
        with gpus_locked(migrated):
            announce(migrated)
            wait_until(lambda: "ttl=-" in summary(client, url)[1], 30, "a stale answer")
            wait_until(lambda: waiting_on_a_lock(migrated), 30, "the refresh to wait on the lock")
            api.send_signal(signal.SIGTERM)
            out, _ = api.communicate(timeout=30)  # its shutdown cancels the refresh; the lock is still held
    assert api.returncode == 0, out
    assert "Application shutdown complete" in out, out
    assert "Traceback" not in out, out


def test_no_cache_reads_the_database_every_time(migrated: DatabaseSettings) -> None:
    with TestClient(
        headers=as_role("viewer"), app=api_app(migrated, ApiSection(cache_max_age_s=0))
    ) as client:
        add_gpu(migrated, 1)
        assert gpus(client) == (1, 1)
        add_gpu(migrated, 2)
        assert gpus(client) == (2, 2)


def test_an_answer_is_never_older_than_its_max_age(migrated: DatabaseSettings) -> None:
    app = api_app(migrated, ApiSection(cache_max_age_s=0.2))
    with TestClient(app, headers=as_role("viewer")) as client:
        wait_until(lambda: state_of(app).cache.listening, 30, "the cache to listen")
        add_gpu(migrated, 1)
        assert gpus(client) == (1, 1)
        add_gpu(migrated, 2)
        wait_until(lambda: gpus(client) == (2, 2), 30, "the answer to age out")


@pytest.fixture
def two_apps(migrated: DatabaseSettings) -> Iterator[tuple[TestClient, TestClient]]:
    for n in range(12):
        add_gpu(migrated, n)
    with connect(migrated) as conn:
        conn.execute(
            "INSERT INTO gpu_status (gpu_uuid, state, score, grade, action, as_of)"
            " SELECT gpu_uuid, (ARRAY['healthy', 'degraded', 'unhealthy'])[1 + ascii(md5(gpu_uuid)) % 3],"
            " ascii(substr(md5(gpu_uuid), 2)) % 100, 'A', 'none', now() FROM gpu_assets"
        )
        conn.commit()
    app = api_app(migrated, ApiSection(cache_max_age_s=600))
    with (
        TestClient(app, headers=as_role("viewer")) as cached,
        TestClient(headers=as_role("viewer"), app=api_app(migrated, ApiSection(cache_max_age_s=0))) as plain,
    ):
        wait_until(lambda: state_of(app).cache.listening, 30, "the cache to listen")
        yield cached, plain


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    queries=st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "sort": st.sampled_from(["score", "-score", "hostname", "-temp", "power"]),
                "limit": st.integers(1, 15),
                "offset": st.integers(0, 14),
                "state": st.sampled_from(["healthy", "degraded", "unhealthy"]),
                "cluster": st.sampled_from(["c1", "c2"]),
            },
        ),
        min_size=1,
        max_size=4,
    )
)
def test_a_cached_answer_is_the_answer_to_that_very_question(
    two_apps: tuple[TestClient, TestClient], queries: list[dict[str, str | int]]
) -> None:
    """Whatever the order of questions, each cached answer is what the database says to it."""
    cached, plain = two_apps
    for params in queries:
        got, want = cached.get("/api/v1/gpus", params=params), plain.get("/api/v1/gpus", params=params)
        assert got.status_code == want.status_code == 200
        assert got.content == want.content
    assert cached.get("/api/v1/fleet/summary").content == plain.get("/api/v1/fleet/summary").content

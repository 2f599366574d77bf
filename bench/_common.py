"""Helpers for benchmarks: timing, throwaway topics, one printed line per figure."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from shared.plumbing.kafka import make_admin
from shared.plumbing.topic_admin import TopicSpec, ensure_topics
from shared.settings.common import KafkaSettings

if TYPE_CHECKING:
    from services.api.auth import AuthSection


def best_of(runs: int, fn: Callable[[], object]) -> float:
    """The fastest of `runs` wall-clock timings of fn(), in seconds (least disturbed by noise)."""
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        timings.append(time.perf_counter() - start)
    return min(timings)


def report(name: str, value: float, unit: str, baseline_name: str, baseline: float) -> None:
    """One line: the figure, its same-run baseline, and the ratio."""
    ratio = value / baseline if baseline else float("inf")
    print(f"{name}: {_num(value)} {unit}  |  {baseline_name}: {_num(baseline)} {unit}  |  ratio {ratio:.3g}")


def _num(value: float) -> str:
    return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"


@contextmanager
def scratch_topic(settings: KafkaSettings, partitions: int = 6) -> Iterator[str]:
    admin = make_admin(settings)
    name = f"bench-{uuid.uuid4().hex[:10]}"
    ensure_topics(admin, [TopicSpec(name=name, partitions=partitions, replication_factor=1)])
    try:
        yield name
    finally:
        admin.delete_topics([name])[name].result()


def wait_http(url: str, timeout_s: float = 60) -> None:
    """Until `url` answers 200; RuntimeError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer in {timeout_s:.0f} s")
        time.sleep(0.5)


class Callers:
    """The local issuer's callers for a bench (services.api.local_tokens) in a throwaway folder."""

    def __init__(self, directory: Path) -> None:
        from services.api.local_tokens import write_local

        self.directory = directory
        self.files = write_local(directory, days=1)
        self.env = {"GPUHEALTH_AUTH__JWKS_FILE": str(directory / "jwks.json")}

    def auth(self) -> AuthSection:
        from services.api.auth import AuthSection

        return AuthSection(jwks_file=self.directory / "jwks.json")

    def headers(self, role: str = "viewer") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.files[role].read_text().strip()}"}

    def wrk_script(self, role: str = "viewer") -> str:
        """A wrk Lua script that sends the role's token (so it is on no command line)."""
        script = self.directory / f"{role}.lua"
        script.write_text(f'wrk.headers["Authorization"] = "{self.headers(role)["Authorization"]}"\n')
        script.chmod(0o600)
        return str(script)


@contextmanager
def callers() -> Iterator[Callers]:
    with tempfile.TemporaryDirectory(prefix="bench-auth-") as tmp:
        yield Callers(Path(tmp) / "auth")


@functools.cache
def bench_callers() -> Callers:
    """This process's callers, made once; their folder goes when the process ends."""
    tmp = tempfile.mkdtemp(prefix="bench-auth-")
    atexit.register(shutil.rmtree, tmp, True)
    return Callers(Path(tmp) / "auth")

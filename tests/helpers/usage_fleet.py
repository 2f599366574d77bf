"""A simulated fleet whose true usage is known: its samples and process polls, stored as the sink stores them.

A GPU's life is a list of `Run`s: stretches in which its collector reported it
every `poll_s` seconds (with jitter) from one host. A run is cut into `Piece`s
of one kind of work: labels, busy or idle, power, processes. Between runs the
GPU did not report (a gap), or reported from another host (it moved), or its
driver reloaded (`reset`: the energy counter starts again from zero). Inside a
run the collector may restart (`silent`): no samples for a while, the work and
the energy counter going on; it polls again from the moment it is back.

`truth` says, without any of the accounting's interval arithmetic, what each
group used inside a window: the time each piece lasted, what of it was busy,
idle and allocated, and the energy its power drew. `store` writes the samples
into gpu_metrics (ON CONFLICT DO NOTHING, as the sink's careful path), notes their minutes and runs the
rollup's real refresh; the polls go through the sink's own
`workload.insert_process_poll`.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from shared.store import rollup, workload

T0 = datetime(2026, 5, 4, 0, 0, tzinfo=UTC)  # a Monday
GAP_ENERGY_W = 55.0  # what a GPU draws while nobody reports it (its counter still counts)


@dataclass(frozen=True)
class Piece:
    """Work of one kind until `until_s` (seconds from the run's start)."""

    until_s: float
    job: str | None = None
    pod: str | None = None
    namespace: str | None = None
    busy: bool = True
    power_w: float = 400.0
    processes: tuple[tuple[str, str | None], ...] = ()  # (class, user) each
    listed: bool = True  # process polls were taken (False: the class is unknown)


@dataclass(frozen=True)
class Run:
    host: str
    start_s: float  # from T0
    pieces: tuple[Piece, ...]
    poll_s: float = 10.0
    jitter_s: float = 0.0
    reset: bool = False  # the energy counter starts from zero at the run's start
    cluster: str = "c1"
    list_s: float = 30.0  # the process listing's interval (a poll at the first sample at or after each)
    # collector restarts: [from, to) offsets without samples (the work goes on); polls start again at `to`
    silent: tuple[tuple[float, float], ...] = ()

    @property
    def end_s(self) -> float:
        return self.start_s + self.pieces[-1].until_s


@dataclass
class Gpu:
    uuid: str
    runs: list[Run]
    counter_mj: float = 5.0e9  # since the driver loaded before T0
    has_counter: bool = True  # False: the driver gives no energy counter (NULL), only the power gauge
    gauge_scale: float | None = 1.0  # what the power gauge reads, as a share of the true power (None: NULL)


@dataclass
class Sample:
    time: datetime
    gpu: str
    run: Run
    piece: Piece
    energy_mj: int
    listed: bool  # a process poll was taken with it


def uuid_of(i: int, salt: int = 0) -> str:
    return f"GPU-{salt:08x}-{i:04x}-4000-8000-{i:012x}"


def samples(g: Gpu, t0: datetime = T0) -> Iterator[Sample]:
    """The GPU's samples in time order, with its energy counter as the driver would report it."""
    counter, at = g.counter_mj, 0.0
    rng = random.Random(g.uuid)
    for run in g.runs:
        counter = 0.0 if run.reset else counter + GAP_ENERGY_W * 1000 * max(run.start_s - at, 0)
        at = run.start_s
        base, k, next_list = 0.0, 0, 0.0
        length = run.end_s - run.start_s
        # the first sample opens the run (and a restarted collector's first poll); the others come late
        # by up to the jitter
        while True:
            offset = base + k * run.poll_s + (rng.uniform(0, run.jitter_s) if k and run.jitter_s else 0.0)
            if offset >= length:
                break
            restart = next((b for a, b in run.silent if a <= offset < b), None)
            if restart is not None:
                base, k = restart, 0
                continue
            piece = next(p for p in run.pieces if offset < p.until_s)
            t = run.start_s + offset
            counter += _energy_between(run, at - run.start_s, offset)
            at = t
            listed = offset >= next_list
            if listed:
                next_list = (offset // run.list_s + 1) * run.list_s
            yield Sample(t0 + timedelta(seconds=t), g.uuid, run, piece, int(counter), listed)
            k += 1
        counter += _energy_between(run, at - run.start_s, run.end_s - run.start_s)
        at = run.end_s


def _energy_between(run: Run, a: float, b: float) -> float:
    """mJ the run's pieces drew from offset a to b."""
    total, lo = 0.0, 0.0
    for piece in run.pieces:
        hi = piece.until_s
        overlap = max(0.0, min(b, hi) - max(a, lo))
        total += overlap * piece.power_w * 1000
        lo = hi
    return total


def _process_row(**known: Any) -> tuple[Any, ...]:
    """A gpu_processes row in PROCESS_COLUMNS order: what the fleet knows, NULL for the rest."""
    return tuple(known.get(column) for column in workload.PROCESS_COLUMNS)


def store(conn: psycopg.Connection[Any], fleet: list[Gpu], t0: datetime = T0) -> int:
    """Write the fleet's samples and polls (from `t0`) as the sink does, refresh the rollups, commit;
    samples written."""
    rows = []
    polls = []
    for g in fleet:
        for s in samples(g, t0):
            p = s.piece
            gauge = None if g.gauge_scale is None else p.power_w * g.gauge_scale
            rows.append((s.time, g.uuid, s.run.host, s.run.cluster, p.job, p.pod, p.namespace, "mock", "sim",
                         50.0 if p.busy else 0.0, gauge, s.energy_mj if g.has_counter else None))  # fmt: skip
            if p.listed and s.listed:
                poll = (s.time, g.uuid, 0, s.run.host, "sim", "mock", len(p.processes))
                procs = [
                    _process_row(time=s.time, gpu_uuid=g.uuid, pid=100 + j, hostname=s.run.host,
                                 type="compute", used_memory_mib=1000, executable="python", username=user,
                                 classification=cls, rule="sim")
                    for j, (cls, user) in enumerate(p.processes)
                ]  # fmt: skip
                polls.append((poll, procs))
    columns = ("time, gpu_uuid, hostname, cluster, job, pod, namespace, source, collector_id, gpu_util_pct,"
               " power_usage_w, total_energy_mj")  # fmt: skip
    with conn.cursor() as cur:
        # staged, then ON CONFLICT DO NOTHING: a second store of the same samples is a replay
        cur.execute(
            f"CREATE TEMP TABLE stage ON COMMIT DROP AS SELECT {columns} FROM gpu_metrics WITH NO DATA"
        )
        with cur.copy(f"COPY stage ({columns}) FROM STDIN") as copy:
            for r in rows:
                copy.write_row(r)
        cur.execute(f"INSERT INTO gpu_metrics ({columns}) SELECT {columns} FROM stage ON CONFLICT DO NOTHING")
        rollup.note_minutes(cur, [r[0] for r in rows])
        for poll, procs in polls:
            workload.insert_process_poll(cur, poll, procs)
    conn.commit()
    rollup.refresh(conn, timedelta(days=3650))
    return len(rows)


@dataclass
class Truth:
    """Seconds and energy per group key, inside one window."""

    seconds: dict[Any, float] = field(default_factory=lambda: defaultdict(float))
    busy_s: dict[Any, float] = field(default_factory=lambda: defaultdict(float))
    idle_allocated_s: dict[Any, float] = field(default_factory=lambda: defaultdict(float))
    energy_mj: dict[Any, float] = field(default_factory=lambda: defaultdict(float))
    runs: dict[Any, int] = field(default_factory=lambda: defaultdict(int))  # run pieces counted per key
    # the longest interval per key: of the samples, or of the process listing that says who ran
    poll_s: dict[Any, float] = field(default_factory=lambda: defaultdict(float))


def truth(fleet: list[Gpu], by: str, start_s: float, end_s: float) -> Truth:
    """What each `by` key used in [start_s, end_s): from the pieces alone (no samples, no intervals)."""
    t = Truth()
    for g in fleet:
        for run in g.runs:
            piece_start = run.start_s
            for piece in run.pieces:
                a, b = max(piece_start, start_s), min(run.start_s + piece.until_s, end_s)
                piece_start = run.start_s + piece.until_s
                if b <= a:
                    continue
                allocated = bool(piece.job or piece.pod or piece.namespace or piece.processes)
                shares: list[tuple[str | None, str | None, float]]
                if not piece.listed:
                    shares = [("unknown", None, 1.0)]
                elif not piece.processes:
                    shares = [("none", None, 1.0)]
                else:
                    n = len(piece.processes)
                    shares = [(c, u, 1.0 / n) for c, u in piece.processes]
                for cls, user, share in shares:
                    key = {
                        "gpu": g.uuid, "hostname": run.host, "cluster": run.cluster, "job": piece.job,
                        "pod": piece.pod, "namespace": piece.namespace, "class": cls, "user": user,
                    }[by]  # fmt: skip
                    d = (b - a) * share
                    t.seconds[key] += d
                    t.busy_s[key] += d if piece.busy else 0.0
                    t.idle_allocated_s[key] += d if (allocated and not piece.busy) else 0.0
                    t.energy_mj[key] += d * piece.power_w * 1000
                    t.runs[key] += 1
                    t.poll_s[key] = max(t.poll_s[key], run.poll_s, run.list_s)
    return t


def hand_fleet() -> list[Gpu]:
    """Two GPUs polled every 10 s, on the minute, whose figures are easily worked by hand:

    - 1: namespace ml (job train, pod train-0), training by alice, 50 % busy at 300 W, for 1 h:
      360 samples, 1 h; energy from its first reading to its last, 3,590 s x 300 W = 0.29916 kWh.
    - 2: namespace web (pod web-0), an inference process of bob's, idle at 100 W for 30 min (idle
      while allocated), then silent for 30 min, then without labels or processes, busy at 200 W for
      30 min: 0.5 h + 0.5 h; 1,790 s x 100 W = 0.04972 kWh and 1,790 s x 200 W = 0.09944 kWh.
    """
    hour = 3600.0
    return [
        Gpu(uuid_of(1), [Run("n1", 0, (Piece(hour, job="train", pod="train-0", namespace="ml", power_w=300,
                                              processes=(("training", "alice"),)),), list_s=10)]),
        Gpu(uuid_of(2), [
            Run("n1", 0, (Piece(hour / 2, pod="web-0", namespace="web", busy=False, power_w=100,
                                processes=(("inference", "bob"),)),), list_s=10),
            Run("n1", hour, (Piece(hour / 2, power_w=200),), list_s=10),
        ]),
    ]  # fmt: skip

"""The framework callbacks on a fake NVML: a check every N seconds (not every step), on_alert, a stop.

Transformers is driven through its real TrainerCallback, TrainerControl,
TrainerState, TrainingArguments and CallbackHandler (they need no torch).
Lightning and Keras need a tensor framework to install, so they are driven
through the hooks their trainers call (`on_train_batch_end`) with the stop
flag they read (`trainer.should_stop`, `model.stop_training`), on stand-ins
for their Callback base classes.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import CallbackHandler

from gpuhealth.training import Alert, AlertKind, Andon, AndonChecker, AndonThresholds, GpuMonitor, SourceError
from gpuhealth.training.sources import SourceReading
from shared.fakes.scripted_nvml import ScriptedNvml
from tests.paths import REPO

EVERY_S, STEP_S, HEAT_AT = 5.0, 0.5, 32  # a check every 10 steps; the GPU overheats at step 32


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make_andon(nvml: ScriptedNvml, clock: Clock, seen: list[Alert], **options: Any) -> Andon:
    return Andon(
        monitor=GpuMonitor(nvml=nvml, devices=[0, 1]), checker=AndonChecker(AndonThresholds.from_rules()),
        every_s=EVERY_S, stop_on={"thermal"}, on_alert=seen.append, clock=clock, **options,
    )  # fmt: skip


def step_clock(nvml: ScriptedNvml, clock: Clock, step: int) -> None:
    clock.t += STEP_S
    if step == HEAT_AT:
        nvml.temp_c[0] = 90


def assert_stopped_on_thermal(stopped_at: int | None, nvml: ScriptedNvml, seen: list[Alert]) -> None:
    # checks at steps 0, 10, 20, 30, 40: the heat of step 32 is seen at step 40, which stops
    assert stopped_at == 40
    assert nvml.reads == 5
    (alert,) = seen
    assert (alert.kind, alert.severity, alert.gpu_index, alert.value, alert.threshold) == (
        AlertKind.THERMAL, "critical", 0, 90, 82,
    )  # fmt: skip


def test_transformers_trainer_callback_stops_training_on_thermal(tmp_path: Path) -> None:
    from gpuhealth.training.transformers import AndonCallback

    nvml, clock, seen = ScriptedNvml(), Clock(), list[Alert]()
    callback = AndonCallback(make_andon(nvml, clock, seen))
    handler = CallbackHandler(  # type: ignore[no-untyped-call]
        [callback], model=None, processing_class=None, optimizer=None, lr_scheduler=None
    )
    args, state, control = (
        TrainingArguments(output_dir=str(tmp_path), report_to=[]),
        TrainerState(),
        TrainerControl(),
    )
    control = handler.on_train_begin(args, state, control)
    stopped_at = None
    for step in range(100):  # the Trainer's inner loop: on_step_end, then it reads the control
        step_clock(nvml, clock, step)
        control = handler.on_step_begin(args, state, control)
        state.global_step += 1
        control = handler.on_step_end(args, state, control)
        if control.should_training_stop:
            stopped_at = step
            break
    assert_stopped_on_thermal(stopped_at, nvml, seen)
    handler.on_train_end(args, state, control)
    assert not nvml.shut  # an Andon handed in stays open for its owner


def import_on_standin(
    monkeypatch: pytest.MonkeyPatch, module: str, callback_base: type, ours: str
) -> Iterator[types.ModuleType]:
    """Import gpuhealth.training.<ours> against a stand-in `module` (and its parents) holding `Callback`."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules[module].Callback = callback_base  # type: ignore[attr-defined]
    monkeypatch.delitem(sys.modules, f"gpuhealth.training.{ours}", raising=False)
    yield importlib.import_module(f"gpuhealth.training.{ours}")
    sys.modules.pop(f"gpuhealth.training.{ours}", None)


@pytest.fixture
def lightning_standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    class Callback:  # Lightning's base class: every hook is a no-op to override
        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            return None

    yield from import_on_standin(monkeypatch, "lightning.pytorch.callbacks", Callback, "lightning")


def test_lightning_callback_stops_training_on_thermal(lightning_standin: types.ModuleType) -> None:
    nvml, clock, seen = ScriptedNvml(), Clock(), list[Alert]()
    callback = lightning_standin.AndonCallback(make_andon(nvml, clock, seen))
    trainer = SimpleNamespace(should_stop=False, world_size=1)
    stopped_at = None
    for step in range(100):  # the fit loop: the batch-end hook, then it reads trainer.should_stop
        step_clock(nvml, clock, step)
        callback.on_train_batch_end(trainer, None, {"loss": 0.1}, None, step)
        if trainer.should_stop:
            stopped_at = step
            break
    assert_stopped_on_thermal(stopped_at, nvml, seen)


def test_lightning_callback_agrees_a_stop_across_ranks(lightning_standin: types.ModuleType) -> None:
    nvml, clock, seen = ScriptedNvml(), Clock(), list[Alert]()
    decisions: list[bool] = []

    def reduce_boolean_decision(decision: bool, all: bool = True) -> bool:
        decisions.append(decision)
        return True  # another rank saw an alert

    trainer = SimpleNamespace(
        should_stop=False,
        world_size=2,
        strategy=SimpleNamespace(reduce_boolean_decision=reduce_boolean_decision),
    )
    callback = lightning_standin.AndonCallback(make_andon(nvml, clock, seen))
    callback.on_train_batch_end(trainer, None, None, None, 0)
    assert decisions == [False]
    assert trainer.should_stop
    assert seen == []


def test_lightning_callback_owns_and_closes_the_andon_it_builds(lightning_standin: types.ModuleType) -> None:
    nvml = ScriptedNvml()
    callback = lightning_standin.AndonCallback(monitor=GpuMonitor(nvml=nvml, devices=[0]), every_s=60)
    callback.on_train_end(None, None)
    assert nvml.shut
    with pytest.raises(ValueError, match="either"):
        lightning_standin.AndonCallback(callback.andon, every_s=5)


@pytest.fixture
def keras_standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    class Callback:  # Keras' base class: fit() calls set_model, then the batch hooks
        def __init__(self) -> None:
            self.model: Any = None

        def set_model(self, model: Any) -> None:
            self.model = model

    yield from import_on_standin(monkeypatch, "keras.callbacks", Callback, "keras")


def test_keras_callback_stops_training_on_thermal(keras_standin: types.ModuleType) -> None:
    nvml, clock, seen = ScriptedNvml(), Clock(), list[Alert]()
    callback = keras_standin.AndonCallback(make_andon(nvml, clock, seen))
    model = SimpleNamespace(stop_training=False)
    callback.set_model(model)
    stopped_at = None
    for step in range(100):  # fit(): the batch-end hook, then it reads model.stop_training
        step_clock(nvml, clock, step)
        callback.on_train_batch_end(step, {"loss": 0.1})
        if model.stop_training:
            stopped_at = step
            break
    assert_stopped_on_thermal(stopped_at, nvml, seen)


def test_the_loop_helper_checks_every_n_seconds_and_stops() -> None:
    nvml, clock, seen = ScriptedNvml(), Clock(), list[Alert]()
    andon = make_andon(nvml, clock, seen)
    done = []
    for step in andon.steps(range(100)):
        done.append(step)
        step_clock(nvml, clock, step)
    assert done == list(range(40))  # the check before step 40 saw the heat of step 32
    assert nvml.reads == 5
    assert andon.stop_requested
    assert andon.stop_alert == seen[0]


def test_alerts_not_in_stop_on_only_call_the_hook() -> None:
    nvml, clock, seen = ScriptedNvml(), Clock(), list[Alert]()
    nvml.mem_used_mib = [79 * 1024, 10]
    nvml.power_mw = [699_000, 10]
    andon = make_andon(nvml, clock, seen)
    assert list(andon.steps(range(3))) == [0, 1, 2]
    assert {a.kind for a in seen} == {AlertKind.MEMORY_PRESSURE, AlertKind.POWER_LIMIT}
    assert not andon.stop_requested


def test_a_failing_hook_publisher_or_read_never_breaks_training() -> None:
    nvml, clock = ScriptedNvml(), Clock()
    nvml.temp_c = [95, 95]

    def hook(alert: Alert) -> None:
        raise RuntimeError("user code")

    class BrokenPublisher:
        def publish(self, alert: Alert, state: str) -> None:
            raise OSError("broker away")

        def close(self) -> None:
            raise OSError("broker away")

    andon = Andon(
        monitor=GpuMonitor(nvml=nvml, devices=[0, 1]),
        checker=AndonChecker(),
        every_s=1,
        stop_on={AlertKind.THERMAL},
        on_alert=hook,
        publisher=BrokenPublisher(),
        clock=clock,
    )
    assert andon.tick() is True
    assert len(andon.alerts) == 2

    def lost() -> SourceReading:
        raise SourceError("GPU is lost")

    andon.monitor.source.read = lost  # type: ignore[method-assign]
    clock.t += 1
    assert andon.check_now() is None
    assert andon.read_errors == 1
    andon.close()


def test_the_background_watcher_sees_a_hang_while_no_step_runs() -> None:
    nvml = ScriptedNvml()
    nvml.util_pct = [0, 0]
    heard = threading.Event()
    checker = AndonChecker(idle_for_s=0.05, idle_util_pct=5)
    andon = Andon(
        monitor=GpuMonitor(nvml=nvml, devices=[0]),
        checker=checker,
        every_s=0.02,
        background=True,
        stop_on={"idle"},
        on_alert=lambda a: heard.set(),
    )
    try:
        assert heard.wait(10), "no idle alert from the background watcher"
        assert andon.tick() is True
        assert andon.stop_alert is not None
        assert andon.stop_alert.kind is AlertKind.IDLE
        assert andon.stop_alert.value is not None
        assert andon.stop_alert.value >= 0.05
    finally:
        andon.close()
    assert nvml.shut


@pytest.mark.parametrize(
    ("module", "missing", "hint"),
    [
        ("lightning", ["lightning", "pytorch_lightning"], "pip install lightning"),
        ("keras", ["keras", "tensorflow"], "pip install keras"),
        ("transformers", ["transformers"], "pip install transformers"),
    ],
)
def test_a_callback_without_its_framework_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, module: str, missing: list[str], hint: str
) -> None:
    for name in missing:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, f"gpuhealth.training.{module}", raising=False)
    with pytest.raises(ImportError, match=hint):
        importlib.import_module(f"gpuhealth.training.{module}")
    sys.modules.pop(f"gpuhealth.training.{module}", None)


def test_the_library_imports_no_framework_and_no_kafka_client() -> None:
    code = (
        "import sys, gpuhealth.training\n"
        "heavy = ('transformers', 'lightning', 'pytorch_lightning', 'keras', 'tensorflow', 'torch',\n"
        "         'confluent_kafka')\n"
        "print(','.join(m for m in heavy if m in sys.modules))"
    )
    root = REPO
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.stdout.strip() == ""

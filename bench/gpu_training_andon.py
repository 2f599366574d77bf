"""On a real GPU: Lightning and the Transformers Trainer with the Andon callbacks, under real load.

Shows what the callbacks saw (readings, sparklines, alerts, the exported
metrics); a stop when the GPU warms past a threshold set a few degrees above
its starting temperature; alerts from thresholds overridden in code; an
idle/hang alert raised by the background watcher while a step is stuck; and
the training rate with the callback (checks in the training thread, or in the
background) next to the same training without it, measured in the same run.
Writes results.json to the folder given as the first argument.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpuhealth.training import Alert, Andon, AndonChecker, AndonExporter, GpuMonitor, open_source

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
OUT = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
WIDTH, DEPTH, IN = 8192, 6, 1024
results: dict[str, Any] = {}
torch.backends.cuda.matmul.allow_tf32 = True


def alert_row(a: Alert) -> dict[str, Any]:
    return {"kind": a.kind.value, "severity": a.severity, "device": a.device, "value": a.value,
            "threshold": a.threshold, "unit": a.unit, "summary": a.summary}  # fmt: skip


def status_rows(monitor: GpuMonitor) -> list[dict[str, Any]]:
    return [{"device": s.device, "model": s.model, "temp_c": s.temp_c, "slowdown_c": s.slowdown_c,
             "util_pct": s.util_pct, "fb_used_mib": s.fb_used_mib, "fb_total_mib": s.fb_total_mib,
             "power_w": s.power_w, "power_limit_w": s.power_limit_w,
             "clocks_event_reasons": s.clocks_event_reasons} for s in monitor.last]  # fmt: skip


def andon_row(andon: Andon) -> dict[str, Any]:
    uuid = andon.monitor.last[0].uuid if andon.monitor.last else ""
    return {
        "checks": andon.checks, "alerts": [alert_row(a) for a in andon.alerts],
        "stop_alert": alert_row(andon.stop_alert) if andon.stop_alert else None,
        "last_readings": status_rows(andon.monitor), "sparklines": andon.monitor.summary(width=60),
        "temp_series": andon.monitor.series(uuid, "temp_c"),
        "power_series": andon.monitor.series(uuid, "power_w"),
        "util_series": andon.monitor.series(uuid, "util_pct"),
    }  # fmt: skip


def sources() -> None:
    for kind in ("nvml", "smi"):
        t0 = time.perf_counter()
        monitor = GpuMonitor(open_source(kind), devices=[0])
        monitor.read()
        first_ms = (time.perf_counter() - t0) * 1e3
        reads = []
        for _ in range(20):
            t1 = time.perf_counter()
            monitor.read()
            reads.append((time.perf_counter() - t1) * 1e3)
        results[f"source_{kind}"] = {
            "rows": status_rows(monitor), "open_and_first_read_ms": first_ms,
            "read_ms_median_of_20": statistics.median(reads), "read_ms_max": max(reads),
        }  # fmt: skip
        monitor.close()


def temp_now() -> float:
    monitor = GpuMonitor(devices=[0])
    (s,) = monitor.read()
    monitor.close()
    assert s.temp_c is not None
    return s.temp_c


class Load(nn.Module):  # type: ignore[misc]
    """A small MLP made to work: DEPTH square layers of WIDTH, so the GPU draws real power."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(IN, WIDTH), nn.ReLU()]
        for _ in range(DEPTH):
            layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(WIDTH, 1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        y = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(y, labels), "logits": y} if labels is not None else y


def lightning_run(name: str, steps: int, andon: Andon | None, *, close: bool = True) -> dict[str, Any]:
    import lightning.pytorch as pl

    from gpuhealth.training.lightning import AndonCallback

    class Module(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = Load()

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.model(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    data = torch.utils.data.TensorDataset(torch.randn(64 * 512, IN), torch.randn(64 * 512))
    loader = torch.utils.data.DataLoader(data, batch_size=512, shuffle=True)
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, max_steps=steps, max_epochs=-1, logger=False, enable_progress_bar=False,
        enable_checkpointing=False, enable_model_summary=False,
        callbacks=[AndonCallback(andon)] if andon is not None else [],
    )  # fmt: skip
    t0 = time.perf_counter()
    trainer.fit(Module(), loader)
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    row: dict[str, Any] = {
        "global_step": trainer.global_step, "max_steps": steps, "seconds": round(took, 3),
        "steps_per_s": round(trainer.global_step / took, 2), "should_stop": trainer.should_stop,
    }  # fmt: skip
    if andon is not None:
        row |= andon_row(andon)
        if close:
            andon.close()
    results[name] = row
    print(f"{name}: {row['global_step']}/{steps} steps, {row['steps_per_s']} steps/s", flush=True)
    return row


def transformers_run(name: str, steps: int, andon: Andon | None) -> dict[str, Any]:
    from transformers import Trainer, TrainingArguments

    from gpuhealth.training.transformers import AndonCallback

    rows = [{"x": torch.randn(IN), "labels": torch.randn(())} for _ in range(4096)]
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, max_steps=steps, per_device_train_batch_size=256, report_to=[],
            save_strategy="no", logging_strategy="no", disable_tqdm=True, dataloader_num_workers=2,
            learning_rate=1e-5,
        )  # fmt: skip
        trainer = Trainer(
            model=Load(), args=args, train_dataset=rows,
            callbacks=[AndonCallback(andon)] if andon is not None else [],
        )  # fmt: skip
        t0 = time.perf_counter()
        trainer.train()
        took = time.perf_counter() - t0
    row: dict[str, Any] = {
        "global_step": trainer.state.global_step, "max_steps": steps, "seconds": round(took, 3),
        "steps_per_s": round(trainer.state.global_step / took, 2),
    }  # fmt: skip
    if andon is not None:
        row |= andon_row(andon)
        andon.close()
    results[name] = row
    print(f"{name}: {row['global_step']}/{steps} steps, {row['steps_per_s']} steps/s", flush=True)
    return row


def keras_run(name: str, andon: Andon) -> None:
    """Keras 3 on its torch backend, when the machine has Keras at all."""
    import os

    os.environ.setdefault("KERAS_BACKEND", "torch")
    try:
        import keras
    except ImportError as e:
        results[name] = {"skipped": f"keras is not installed here: {e}"}
        return
    from gpuhealth.training.keras import AndonCallback

    model = keras.Sequential(
        [keras.Input((IN,)), keras.layers.Dense(WIDTH, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer="sgd", loss="mse")
    x, y = torch.randn(512 * 200, IN).numpy(), torch.randn(512 * 200).numpy()
    batches: list[int] = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: batches.append(batch))
    t0 = time.perf_counter()
    model.fit(x, y, batch_size=512, epochs=1, verbose=0, callbacks=[counter, AndonCallback(andon)])
    results[name] = {
        "backend": keras.backend.backend(), "seconds": round(time.perf_counter() - t0, 3),
        "batches_run": len(batches), "batches_per_epoch": 200, "stop_training": model.stop_training,
        **andon_row(andon),
    }  # fmt: skip
    andon.close()
    print(f"{name}: stop_training={model.stop_training}", flush=True)


def scrape(port: int, prefix: str) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return [line for line in r.read().decode().splitlines() if line.startswith(prefix)]


def hang_demo() -> None:
    """A step stuck with the GPU idle: the background watcher raises the idle alert meanwhile."""
    seen: list[Alert] = []
    andon = Andon(monitor=GpuMonitor(devices=[0]), checker=AndonChecker(idle_for_s=1.5, idle_util_pct=5),
                  every_s=0.5, background=True, stop_on={"idle"}, on_alert=seen.append)  # fmt: skip
    t0 = time.perf_counter()
    while not seen and time.perf_counter() < t0 + 15:
        time.sleep(0.1)  # the "hung" step
    results["hang_background"] = {
        "alert_after_s": round(time.perf_counter() - t0, 2),
        "alerts": [alert_row(a) for a in seen],
        "stop_requested": andon.tick(),
    }
    andon.close()


def watched(**options: Any) -> Andon:
    return Andon(monitor=GpuMonitor(devices=[0]), **options)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    results["gpu"] = torch.cuda.get_device_name(0)
    sources()
    lightning_run("lightning_warmup", 100, None)
    # the same training three ways, in one run: no callback, checks in the step, checks in the background
    lightning_run("lightning_baseline", 1500, None)
    exporter = AndonExporter(prefix="demo_job")
    port = exporter.serve(0)
    andon = watched(every_s=1, exporter=exporter)
    lightning_run("lightning_rules_file", 1500, andon, close=False)
    results["lightning_rules_file"]["metrics_scraped"] = scrape(port, "demo_job")
    andon.close()
    lightning_run("lightning_rules_background", 1500, watched(every_s=1, background=True))
    start_c = temp_now()
    results["warm_stop_start_temp_c"] = start_c
    lightning_run("lightning_stop_when_warm", 10000, watched(
        every_s=0.5, checker=AndonChecker(thermal_c=start_c + 4), stop_on={"thermal"}))  # fmt: skip
    transformers_run("transformers_baseline", 600, None)
    transformers_run("transformers_rules_file", 600, watched(every_s=1))
    start_c = temp_now()
    results["transformers_stop_start_temp_c"] = start_c
    transformers_run("transformers_overrides_stop_when_warm", 6000, watched(
        every_s=0.5, stop_on={"thermal"},
        checker=AndonChecker(thermal_c=start_c + 3, memory_used_ratio=0.05, power_limit_ratio=0.4),
    ))  # fmt: skip
    keras_run(
        "keras_forced_stop", watched(every_s=0.5, checker=AndonChecker(thermal_c=20), stop_on={"thermal"})
    )
    hang_demo()
    (OUT / "results.json").write_text(json.dumps(results, indent=2, default=str))
    for name, row in results.items():
        print(f"== {name}")
        if not isinstance(row, dict):
            print(f"  {row}")
            continue
        for k, v in row.items():
            if k == "sparklines":
                print(f"  sparklines:\n    {v}")
            elif not k.endswith("_series"):
                print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

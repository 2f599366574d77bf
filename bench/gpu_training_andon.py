"""On a real GPU: Lightning and the Transformers Trainer on a tiny model with the Andon callbacks.

Shows what the callbacks saw (readings, sparklines, alerts, the exported
metrics), a stop forced by a low thermal threshold, an idle/hang alert raised
by the background watcher while a step is stuck, and the training rate with
the callback next to the same loop without it. Writes results.json to the
folder given as the first argument.
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
results: dict[str, Any] = {}


def alert_row(a: Alert) -> dict[str, Any]:
    return {"kind": a.kind.value, "severity": a.severity, "device": a.device, "value": a.value,
            "threshold": a.threshold, "unit": a.unit, "summary": a.summary}  # fmt: skip


def status_rows(monitor: GpuMonitor) -> list[dict[str, Any]]:
    return [{"device": s.device, "model": s.model, "temp_c": s.temp_c, "slowdown_c": s.slowdown_c,
             "util_pct": s.util_pct, "fb_used_mib": s.fb_used_mib, "fb_total_mib": s.fb_total_mib,
             "power_w": s.power_w, "power_limit_w": s.power_limit_w,
             "clocks_event_reasons": s.clocks_event_reasons} for s in monitor.last]  # fmt: skip


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


class Tiny(nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1)
        )

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        y = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(y, labels), "logits": y} if labels is not None else y


def lightning_run(name: str, steps: int, andon: Andon | None) -> dict[str, Any]:
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    from gpuhealth.training.lightning import AndonCallback

    class Module(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = Tiny()

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.model(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    data = torch.utils.data.TensorDataset(torch.randn(steps * 64, 256), torch.randn(steps * 64))
    loader = torch.utils.data.DataLoader(data, batch_size=64)
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, max_steps=steps, max_epochs=1, logger=False, enable_progress_bar=False,
        enable_checkpointing=False, enable_model_summary=False,
        callbacks=[AndonCallback(andon)] if andon is not None else [],
    )  # fmt: skip
    t0 = time.perf_counter()
    trainer.fit(Module(), loader)
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    row: dict[str, Any] = {
        "global_step": trainer.global_step, "max_steps": steps, "seconds": took,
        "steps_per_s": trainer.global_step / took, "should_stop": trainer.should_stop,
    }  # fmt: skip
    if andon is not None:
        row |= andon_row(andon)
    results[name] = row
    return row


def transformers_run(name: str, steps: int, andon: Andon | None) -> dict[str, Any]:
    from transformers import Trainer, TrainingArguments

    from gpuhealth.training.transformers import AndonCallback

    rows = [{"x": torch.randn(256), "labels": torch.randn(())} for _ in range(steps * 32)]
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, max_steps=steps, per_device_train_batch_size=32, report_to=[], save_strategy="no",
            logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        )  # fmt: skip
        trainer = Trainer(
            model=Tiny(), args=args, train_dataset=rows,
            callbacks=[AndonCallback(andon)] if andon is not None else [],
        )  # fmt: skip
        t0 = time.perf_counter()
        trainer.train()
        took = time.perf_counter() - t0
    row: dict[str, Any] = {
        "global_step": trainer.state.global_step, "max_steps": steps, "seconds": took,
        "steps_per_s": trainer.state.global_step / took,
    }  # fmt: skip
    if andon is not None:
        row |= andon_row(andon)
    results[name] = row
    return row


def andon_row(andon: Andon) -> dict[str, Any]:
    return {
        "checks": andon.checks, "alerts": [alert_row(a) for a in andon.alerts],
        "stop_alert": alert_row(andon.stop_alert) if andon.stop_alert else None,
        "last_readings": status_rows(andon.monitor), "sparklines": andon.monitor.summary(width=40),
    }  # fmt: skip


def scrape(port: int, prefix: str) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return [line for line in r.read().decode().splitlines() if line.startswith(prefix)]


def hang_demo() -> None:
    """A step stuck for 4 s with the GPU idle: the background watcher raises the idle alert meanwhile."""
    seen: list[Alert] = []
    andon = Andon(monitor=GpuMonitor(devices=[0]), checker=AndonChecker(idle_for_s=1.5, idle_util_pct=5),
                  every_s=0.5, background=True, stop_on={"idle"}, on_alert=seen.append)  # fmt: skip
    t0 = time.perf_counter()
    deadline = t0 + 10
    while not seen and time.perf_counter() < deadline:
        time.sleep(0.1)  # the "hung" step
    results["hang_background"] = {
        "alert_after_s": time.perf_counter() - t0,
        "alerts": [alert_row(a) for a in seen],
        "stop_requested": andon.tick(),
    }
    andon.close()


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    results["gpu"] = torch.cuda.get_device_name(0)
    sources()
    lightning_run("lightning_warmup", 50, None)
    lightning_run("lightning_baseline", 1000, None)
    exporter = AndonExporter(prefix="demo_job")
    port = exporter.serve(0)
    lightning_run(
        "lightning_rules", 1000, Andon(monitor=GpuMonitor(devices=[0]), every_s=0.5, exporter=exporter)
    )
    results["lightning_rules"]["metrics_scraped"] = scrape(port, "demo_job")
    exporter.close()
    lightning_run(
        "lightning_forced_stop",
        400,
        Andon(
            monitor=GpuMonitor(devices=[0]),
            checker=AndonChecker(thermal_c=20),
            every_s=0.5,
            stop_on={"thermal"},
        ),
    )
    transformers_run("transformers_baseline", 600, None)
    transformers_run("transformers_rules", 600, Andon(monitor=GpuMonitor(devices=[0]), every_s=0.5))
    transformers_run(
        "transformers_forced_stop",
        300,
        Andon(
            monitor=GpuMonitor(devices=[0]),
            checker=AndonChecker(thermal_c=20),
            every_s=0.5,
            stop_on={"thermal"},
        ),
    )
    hang_demo()
    (OUT / "results.json").write_text(json.dumps(results, indent=2, default=str))
    for name, row in results.items():
        print(f"== {name}")
        if isinstance(row, dict):
            for k, v in row.items():
                print(f"  {k}: {v}" if k != "sparklines" else f"  sparklines:\n{v}")
        else:
            print(f"  {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

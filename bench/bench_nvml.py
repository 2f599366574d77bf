"""NVML read latency per GPU on a fake NVML whose every call costs what it cost on an H100.

The fake (tests/unit/fake_nvml.py) spends, per call, the median the real call
took on an H100 with driver 580 (tests/data/h100/nvml-per-call.json: the
issue's recording where it has the call, else issue 17's own measurements),
and per field of a field-values call what that field cost alone. The figures:

- a poll's read (fast fields; the slow ones, energy and the thermal violation
  counter, are read every 30 s), and a read that fetches every field;
- the same-run baseline: what the previous read paid for PCIe traffic alone,
  two nvmlDeviceGetPcieThroughput calls per GPU (they sample for 20 ms each).

On the H100 itself (issue 17's run): 49.5 ms per read before, 0.98 ms idle and
0.76 ms under load after (median of 300), 5.3 ms for a read of every field.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import report
from gpuhealth.gpu.nvml_source import NvmlSource
from shared.fakes.nvml import FakeNvml

COSTS = json.loads((Path(__file__).resolve().parents[1] / "tests/data/h100/nvml-per-call.json").read_text())
RECORDED = {  # the recording, by the call it timed
    "nvmlDeviceGetUtilizationRates": "util", "nvmlDeviceGetTemperature": "temp",
    "nvmlDeviceGetPowerUsage": "power", "nvmlDeviceGetPcieThroughput": "pcie_tx",
}  # fmt: skip
GPUS = 8


def costed_fake() -> FakeNvml:
    calls = dict(COSTS["in_read_ms"])
    calls.update({name: COSTS["recorded_per_call_ms"][key] for name, key in RECORDED.items()})
    fields = {int(k): v for k, v in COSTS["field_alone_ms"].items()}
    return FakeNvml(call_cost_ms=calls, field_cost_ms=fields, gpus=GPUS)


def per_gpu_ms(source: NvmlSource, reads: int) -> float:
    timings = []
    for _ in range(reads):
        start = time.perf_counter()
        source.read()
        timings.append((time.perf_counter() - start) * 1000 / GPUS)
    return statistics.median(timings)


def main() -> int:
    fake = costed_fake()
    poll = NvmlSource(fake, pcie_sampler=False)
    everything = NvmlSource(costed_fake(), slow_every_s=0, pcie_sampler=False)
    poll.read()  # the first read also fetches the slow fields
    read_ms = per_gpu_ms(poll, 50)
    full_ms = per_gpu_ms(everything, 20)
    fake.calls.clear()
    poll.read()
    calls_per_gpu = len(fake.calls) / GPUS
    start = time.perf_counter()
    for handle in range(GPUS):
        for counter in (fake.NVML_PCIE_UTIL_TX_BYTES, fake.NVML_PCIE_UTIL_RX_BYTES):
            fake.nvmlDeviceGetPcieThroughput(handle, counter)
    pcie_ms = (time.perf_counter() - start) * 1000 / GPUS
    baseline = "previous read's two PCIe throughput calls"
    report("NVML read per GPU, poll (fake H100 costs)", read_ms, "ms", baseline, pcie_ms)
    report("NVML read per GPU, every field (fake H100 costs)", full_ms, "ms", baseline, pcie_ms)
    print(f"NVML calls per GPU per poll: {calls_per_gpu:.1f} (one nvmlDeviceGetFieldValues batch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What `nvidia-smi -q -x` adds to the CSV query: each GPU's temperature thresholds.

`--query-gpu` has no field for the slowdown and shutdown temperatures, so the
SMI source reads them once per GPU from the XML report. Drivers write them in
one of two ways:

- absolute (before r550): ``<gpu_temp_slow_threshold>87 C``,
  ``<gpu_temp_max_threshold>92 C``;
- relative to the GPU's T.Limit (r550 and later): ``<gpu_temp_tlimit>55 C`` is
  how far the GPU is below its T.Limit temperature now, and
  ``<gpu_temp_slow_tlimit_threshold>-2 C`` says slowdown starts 2 °C past it.
  So slowdown = current + tlimit - slow_tlimit_threshold (on the recorded H100:
  32 + 55 + 2 = 89 °C, NVML's own value).

nvidia-smi writes the GPU recovery action as words ("None", "GPU Reset", ...);
`recovery_action_code` turns them into NVML's code.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET  # the report comes from the local driver's own tool

from .driver_codes import GpuRecoveryAction
from .readings import MetricValue

_DEGREES = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*C\s*$")
_ACTION_WORDS = {
    "none": GpuRecoveryAction.NONE,
    "gpureset": GpuRecoveryAction.GPU_RESET,
    "reset": GpuRecoveryAction.GPU_RESET,
    "nodereboot": GpuRecoveryAction.NODE_REBOOT,
    "reboot": GpuRecoveryAction.NODE_REBOOT,
    "drainp2p": GpuRecoveryAction.DRAIN_P2P,
    "drainandreset": GpuRecoveryAction.DRAIN_AND_RESET,
}


def recovery_action_code(text: str) -> int | None:
    """NVML's recovery action code for nvidia-smi's words (or a number); None when unknown."""
    cleaned = text.strip()
    if re.fullmatch(r"[0-9]{1,3}", cleaned):  # ASCII only: str.isdigit() takes '²' too
        return int(cleaned) if int(cleaned) <= 255 else None
    word = re.sub(r"[^a-z0-9]", "", cleaned.lower())
    action = _ACTION_WORDS.get(word)
    return int(action) if action is not None else None


def _degrees(node: ET.Element | None, tag: str) -> float | None:
    if node is None:
        return None
    match = _DEGREES.match(node.findtext(tag) or "")
    return float(match[1]) if match else None


def _threshold(temps: ET.Element | None, absolute: str, relative: str) -> MetricValue:
    value = _degrees(temps, absolute)
    if value is not None:
        return value
    now, tlimit, offset = (_degrees(temps, t) for t in ("gpu_temp", "gpu_temp_tlimit", relative))
    if now is None or tlimit is None or offset is None:
        return None
    return now + tlimit - offset


def parse_smi_xml(text: str) -> dict[str, dict[str, MetricValue]]:
    """GPU UUID -> slowdown and shutdown temperature (°C), from `nvidia-smi -q -x`.

    Raises ValueError when the text is not an nvidia-smi XML report.
    """
    try:
        root = ET.fromstring(text)  # noqa: S314 - trusted local tool; expat refuses entity bombs
    except ET.ParseError as e:
        raise ValueError(f"not an XML report: {e}") from e
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"not an nvidia-smi report: root element <{root.tag}>")
    out: dict[str, dict[str, MetricValue]] = {}
    for gpu in root.iter("gpu"):
        uuid = (gpu.findtext("uuid") or "").strip()
        if not uuid:
            continue
        temps = gpu.find("temperature")
        out[uuid] = {
            "slowdown_temp_c": _threshold(temps, "gpu_temp_slow_threshold", "gpu_temp_slow_tlimit_threshold"),
            "shutdown_temp_c": _threshold(temps, "gpu_temp_max_threshold", "gpu_temp_max_tlimit_threshold"),
        }
    return out

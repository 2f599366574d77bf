"""The Slurm driver: drain a node with a reason naming the finding, watch it drain, resume only its own.

Through Slurm's own clients (`scontrol`, `sinfo`) with the configured
SLURM_CONF, as a user with Slurm's operator rights (nothing more is asked).
A drain is the remediator's when its reason starts with ``gpu-health:``; a
node drained, down or given a reason by someone else is left as it is and
never resumed. `sinfo -o %T` tells *draining* (jobs still running) from
*drained*, which its JSON in Slurm 22.05 does not.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from .base import DriverError, DriverResult, SchedulerName

REASON_PREFIX = "gpu-health:"
# States where the node takes no new work whoever put it there (sinfo %T, suffixes such as `*` dropped).
OUT_OF_SERVICE = frozenset({"drained", "draining", "down", "fail", "failing", "maint", "reboot", "unknown"})
_SUFFIXES = "*~#!%$@^-+"
_FIELD_SEPARATOR = "\x1f"  # no node name, state word or reason holds a unit separator


def reason_for(finding: str, plan_id: int) -> str:
    """The drain reason: the prefix that marks it as the remediator's, the finding, the plan."""
    safe = re.sub(r"[^A-Za-z0-9_.:/ -]+", "-", finding)[:120]
    return f"{REASON_PREFIX} {safe} (remediation {plan_id})"


class SlurmDriver:
    name: SchedulerName = "slurm"

    def __init__(
        self,
        *,
        slurm_conf: Path | None,
        bin_dir: Path | None = None,
        past_deadline: str = "fail",
        timeout_s: float = 30.0,
    ) -> None:
        self.env = dict(os.environ)
        if slurm_conf is not None:
            self.env["SLURM_CONF"] = str(slurm_conf)
        self.bin_dir = bin_dir
        self.past_deadline = past_deadline
        self.timeout_s = timeout_s

    def close(self) -> None:
        return None

    def _run(self, tool: str, *args: str) -> str:
        program = str(self.bin_dir / tool) if self.bin_dir else tool
        try:
            done = subprocess.run(
                [program, *args],
                env=self.env,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise DriverError(f"{tool} {' '.join(args)}: {e}", retriable=True) from e
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[:300]
            # slurmctld not answering is worth another try; an unknown node or a refused update is not
            retriable = "Unable to contact slurm controller" in said or "Socket timed out" in said
            raise DriverError(f"{tool} {' '.join(args)}: exit {done.returncode}: {said}", retriable=retriable)
        return done.stdout

    def state(self, node: str) -> tuple[str, str]:
        """The node's state word (draining, drained, idle, mixed, allocated, down...) and its reason."""
        out = self._run(
            "sinfo",
            "--noheader",
            "--Node",
            f"--nodes={node}",
            f"--format=%N{_FIELD_SEPARATOR}%T{_FIELD_SEPARATOR}%E",
        )
        for line in out.splitlines():
            fields = line.split(_FIELD_SEPARATOR, 2)
            if len(fields) == 3 and fields[0].strip() == node:
                reason = fields[2].strip()
                return fields[1].strip().rstrip(_SUFFIXES).lower(), "" if reason == "none" else reason
        raise DriverError(f"Slurm knows no node {node}", retriable=False)

    def _update(self, node: str, *settings: str) -> None:
        self._run("scontrol", "update", f"nodename={node}", *settings)

    def take_out(self, node: str, *, finding: str, plan_id: int) -> DriverResult:
        state, reason = self.state(node)
        if reason.startswith(REASON_PREFIX):
            return DriverResult("ok", {"state": state, "reason": reason, "already": True})
        if state in OUT_OF_SERVICE or reason:
            return DriverResult(
                "not_owned",
                {"state": state, "reason": reason},
                "drained or down by someone else: left as it is, never resumed by the remediator",
            )
        new_reason = reason_for(finding, plan_id)
        self._update(node, "state=drain", f"reason={new_reason}")
        state, reason = self.state(node)
        return DriverResult("ok", {"state": state, "reason": reason})

    def drain(self, node: str, *, past_deadline: bool) -> DriverResult:
        state, reason = self.state(node)
        response = {"state": state, "reason": reason}
        if state in ("drained", "down"):
            return DriverResult("ok", response)
        if state != "draining":
            return DriverResult(
                "failed", response, f"the node is {state}, no longer draining: someone resumed it"
            )
        if not past_deadline:
            return DriverResult("in_progress", response)
        if self.past_deadline == "proceed":
            return DriverResult("ok", {**response, "forced": True})
        return DriverResult("failed", response, "jobs still running on the node at the drain's deadline")

    def put_back(self, node: str) -> DriverResult:
        state, reason = self.state(node)
        if not reason.startswith(REASON_PREFIX):
            if state not in OUT_OF_SERVICE and not reason:
                return DriverResult("ok", {"state": state, "already": True})
            return DriverResult(
                "not_owned",
                {"state": state, "reason": reason},
                "the drain does not carry the remediator's reason: left drained",
            )
        self._update(node, "state=resume")
        state, reason = self.state(node)
        return DriverResult("ok", {"state": state, "reason": reason})

"""The exec/webhook driver: what runs on the node itself (a GPU reset, a reboot request, the compute check).

Each operation is configured as a command (an argument list, run without a
shell, e.g. ``["ssh", "{node}", "sudo", "nvidia-smi", "-r", "-i", "{gpu_uuid}"]``)
or a webhook (a POST of JSON naming the operation, the node and the GPUs, to a
janitor or a node agent). Placeholders are the node, a GPU's UUID and index,
and the plan; each value was checked against its pattern before it gets here.
Exit 0 or a 2xx answer is success. An operation not configured fails, saying
so: the remediator never guesses how to reset a GPU.

A webhook's credentials go in `headers` (secrets, masked in logs), never in its
URL: a URL with user information or a secret-named query parameter is refused at
start. What a run records (the plan's record, `gpu-remediations`, the API) names
the operation, how it ran (`exec` or `webhook`), its outcome and output; never the
command line nor the URL, which may carry hosts and secrets the record's readers
should not see.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Mapping
from typing import Any, Literal

import httpx
from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

from shared.settings.common import Section

from .base import DriverResult

Operation = Literal["reset_gpu", "reboot", "compute_check"]
_PLACEHOLDER = re.compile(r"\{(node|gpu_uuid|gpu_index|plan_id)\}")
_SECRET_NAME = re.compile(r"token|key|secret|passw|pwd|auth|sig|credential", re.IGNORECASE)


def fill(template: str, values: dict[str, str]) -> str:
    """`template` with its placeholders replaced; nothing else in it is read (no format-string attributes)."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


class Command(Section):
    """One operation: `argv` (run here) or `url` (POSTed to), per GPU or once per node."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid", frozen=True)

    argv: list[str] | None = Field(default=None, min_length=1)
    """The command and its arguments, run without a shell; placeholders filled in."""
    url: str | None = Field(default=None, pattern=r"^https?://")
    """A webhook: POSTed a JSON object naming the operation, the node, the GPU(s) and the plan. No
    credentials in it (refused): put them in `headers`."""
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    """A webhook's request headers, e.g. `{"Authorization": "Bearer ..."}` (secret: masked in logs)."""
    per_gpu: bool = True
    """Once per GPU of the plan (true) or once for the node (false)."""
    timeout_s: float = Field(default=120.0, gt=0, le=3600)
    """Seconds it may take; past that it has failed."""

    @field_validator("url")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parsed = httpx.URL(value)
        secret_query = [k for k in parsed.params if _SECRET_NAME.search(k)]
        if parsed.userinfo or secret_query:
            raise ValueError(
                "a webhook URL carries no credentials (user info, token/key query parameters):"
                " put them in `headers`"
            )
        return value

    @model_validator(mode="after")
    def _one(self) -> Command:
        if (self.argv is None) == (self.url is None):
            raise ValueError("give argv or url, one of them")
        return self


class NodeExec:
    """Runs the configured operations; each answer is a DriverResult (`exec` or `webhook` in the record)."""

    def __init__(self, commands: Mapping[Operation, Command]) -> None:
        self.commands = commands

    def driver_of(self, operation: Operation) -> Literal["exec", "webhook"]:
        command = self.commands.get(operation)
        return "webhook" if command is not None and command.url else "exec"

    def run(self, operation: Operation, *, node: str, gpus: dict[str, int], plan_id: int) -> DriverResult:
        command = self.commands.get(operation)
        if command is None:
            return DriverResult("failed", {}, f"no command is configured for {operation}")
        targets: list[dict[str, Any]] = (
            [{"gpu_uuid": uuid, "gpu_index": index} for uuid, index in sorted(gpus.items())]
            if command.per_gpu
            else [
                {
                    "gpu_uuid": ",".join(sorted(gpus)),
                    "gpu_index": ",".join(str(i) for i in sorted(gpus.values())),
                }
            ]
        )
        answers = []
        for target in targets:
            values = {"node": node, "plan_id": str(plan_id), **{k: str(v) for k, v in target.items()}}
            answer = (
                self._command(command, values) if command.argv else self._webhook(command, operation, values)
            )
            answers.append(answer)
            if not answer["ok"]:
                return DriverResult("failed", {"runs": answers}, f"{operation} failed: {answer['said']}")
        return DriverResult("ok", {"runs": answers})

    @staticmethod
    def _command(command: Command, values: dict[str, str]) -> dict[str, Any]:
        assert command.argv is not None
        argv = [fill(part, values) for part in command.argv]
        started = time.perf_counter()
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, errors="replace", timeout=command.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            # not str(e): a timeout's message repeats the command line
            if isinstance(e, subprocess.TimeoutExpired):
                failed = f"timed out after {command.timeout_s:g} s"
            else:
                failed = f"{type(e).__name__}: {e.strerror}"
            return {"ok": False, "said": failed[:300], "seconds": round(time.perf_counter() - started, 3)}
        said = (done.stdout + done.stderr).strip()[-300:]
        return {
            "ok": done.returncode == 0,
            "exit": done.returncode,
            "said": said,
            "seconds": round(time.perf_counter() - started, 3),
        }

    @staticmethod
    def _webhook(command: Command, operation: str, values: dict[str, str]) -> dict[str, Any]:
        assert command.url is not None
        started = time.perf_counter()
        body = {"operation": operation, **values}
        headers = {name: value.get_secret_value() for name, value in command.headers.items()}
        try:
            response = httpx.post(command.url, json=body, headers=headers, timeout=command.timeout_s)
        except httpx.HTTPError as e:
            return {
                "ok": False,
                "said": f"{type(e).__name__}: {str(e).replace(command.url, '<webhook>')}"[:300],
            }
        return {
            "ok": response.is_success,
            "status": response.status_code,
            "said": response.text[:300],
            "seconds": round(time.perf_counter() - started, 3),
        }

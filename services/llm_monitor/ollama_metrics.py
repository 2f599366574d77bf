"""The arithmetic of one Ollama request: what its response says, what the client saw, and what follows.

Ollama reports durations in nanoseconds in its final object (`done: true`):
`load_duration`, `prompt_eval_duration`, `eval_duration`, `total_duration`,
with `prompt_eval_count` and `eval_count` tokens. From them: tokens per
second = eval_count / eval_duration (seconds), and time per output token =
eval_duration / eval_count. Time to first token is measured on the client's
side: from the request's arrival at the proxy to the first chunk that carries
generated text (`response` for /api/generate, `message.content` for
/api/chat), so it includes loading, queueing and prompt evaluation as a user
feels them. A non-streamed answer shows no first token, so it has no TTFT.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from shared.contract.models_workload import LlmSession

_NS_PER_MS = 1_000_000
_MAX_LINE = 1 << 20  # an NDJSON line longer than this is not an answer chunk this meter reads
_MAX_TPS = 10_000_000.0
# A token chunk after the first changes nothing in the session: spotted without parsing it.
# Ollama writes `"done":false`; a server or proxy that re-encodes may add blanks.
_NOT_DONE = re.compile(rb'"done"\s*:\s*false\b')


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**10 else None


def _ms(value: Any) -> float | None:
    n = (
        _count(value)
        if not isinstance(value, float)
        else (value if math.isfinite(value) and value >= 0 else None)
    )
    return None if n is None or n / _NS_PER_MS > 86_400_000 else n / _NS_PER_MS


def _has_token(chunk: dict[str, Any]) -> bool:
    if isinstance(chunk.get("response"), str) and chunk["response"]:
        return True
    message = chunk.get("message")
    return isinstance(message, dict) and (bool(message.get("content")) or bool(message.get("tool_calls")))


@dataclass(slots=True)
class SessionMeter:
    """Fed the response body as it streams; `session()` turns what it saw into an LlmSession."""

    endpoint: Literal["/api/generate", "/api/chat"]
    model: str
    started: float  # perf_counter at the request's arrival
    started_wall: datetime = field(default_factory=lambda: datetime.now(UTC))
    first_token: float | None = None
    final: dict[str, Any] | None = None
    error: str | None = None
    chunks: int = 0
    _pending: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes, now: float | None = None) -> None:
        """Body bytes as they arrive (any split); complete lines are parsed, the rest kept."""
        if b"\n" not in data:
            self._pending += data
            if len(self._pending) > _MAX_LINE:
                self._pending.clear()  # a line that big is not a chunk: stop buffering it
            return
        lines = data.split(b"\n")  # one split per read, not a copy and a shift per line
        if self._pending:
            self._pending += lines[0]
            lines[0] = bytes(self._pending)
            self._pending.clear()
        if len(tail := lines.pop()) <= _MAX_LINE:
            self._pending += tail
        for line in lines:
            self._line(line, now)

    def finish(self, now: float | None = None) -> None:
        """The body ended: a last line without a newline (a non-streamed answer) is parsed too."""
        if self._pending.strip():
            self._line(bytes(self._pending), now)
        self._pending.clear()

    def _line(self, line: bytes, now: float | None) -> None:
        if not line.strip():
            return
        if self.first_token is not None and _NOT_DONE.search(line) and b'"error"' not in line:
            self.chunks += 1  # a token after the first: nothing in it changes the session
            return
        try:
            chunk = json.loads(line)
        except ValueError:
            return
        if not isinstance(chunk, dict):
            return
        self.chunks += 1
        if isinstance(chunk.get("error"), str):
            self.error = chunk["error"][:500]
        if self.first_token is None and _has_token(chunk):
            self.first_token = now if now is not None else time.perf_counter()
        if chunk.get("done") is True:
            self.final = chunk
            model = chunk.get("model")
            if isinstance(model, str) and model and model.isprintable() and len(model) <= 253:
                self.model = model

    def session(
        self,
        *,
        status: int,
        streamed: bool,
        ended: float,
        source: Literal["proxy", "probe"],
        monitor_id: str,
        server: str,
    ) -> LlmSession:
        f = self.final or {}
        completion, eval_ms = _count(f.get("eval_count")), _ms(f.get("eval_duration"))
        tps = completion / (eval_ms / 1000) if completion and eval_ms else None
        tpot = eval_ms / completion if completion and eval_ms is not None else None
        if tps is not None and tps > _MAX_TPS:
            tps = tpot = None  # e.g. a million tokens in a nanosecond: not a measurement
        ok = 200 <= status < 300 and self.error is None and self.final is not None
        error = self.error or (None if ok else f"HTTP {status}" if status >= 300 else "no final chunk")
        return LlmSession(
            request_id=uuid.uuid4().hex,
            time=self.started_wall,
            source=source,
            monitor_id=monitor_id,
            server=server,
            endpoint=self.endpoint,
            model=self.model[:253] or "unknown",
            streamed=streamed,
            http_status=status,
            ok=ok,
            error=error,
            prompt_tokens=_count(f.get("prompt_eval_count")),
            completion_tokens=completion,
            load_ms=_ms(f.get("load_duration")),
            prompt_eval_ms=_ms(f.get("prompt_eval_duration")),
            eval_ms=eval_ms,
            total_ms=_ms(f.get("total_duration")),
            ttft_ms=max(self.first_token - self.started, 0.0) * 1000
            if streamed and self.first_token is not None
            else None,
            wall_ms=max(ended - self.started, 0.0) * 1000,
            tokens_per_s=tps,
            tpot_ms=tpot,
        )


def request_facts(body: bytes) -> tuple[str, bool]:
    """The model a request names and whether it asks for streaming (Ollama's default is to stream)."""
    try:
        request = json.loads(body) if body else {}
    except ValueError:
        return "unknown", True
    if not isinstance(request, dict):
        return "unknown", True
    model = request.get("model")
    model = model if isinstance(model, str) and model and model.isprintable() else "unknown"
    return model[:253], request.get("stream") is not False

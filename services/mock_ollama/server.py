"""The mock Ollama: the endpoints the monitor uses, answering with Ollama's shapes and plausible timings.

Each model has a profile: its size, how long it takes to load, how fast it
evaluates the prompt and generates. A model not loaded pays its load time and
then stays loaded for `keep_alive_s`. Streamed answers (the default, as in
Ollama) are NDJSON lines in chunked transfer encoding, one per token, written
as they are generated; the last line has `done: true` and the durations in
nanoseconds. Timings are nominal times multiplied by `time_scale` (1 = real
time, 0.01 for fast tests) and the reported durations are the time slept; with
`time_scale=0` nothing sleeps and the nominal durations are reported.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpuhealth.contract.wire_time import wire_time
from shared.plumbing.running import serve_until

VERSION = "0.6.8"
_WORDS = [
    "the",
    "GPU",
    "fleet",
    "is",
    "healthy",
    "and",
    "every",
    "node",
    "reports",
    "its",
    "temperature",
    "power",
    "memory",
    "and",
    "clocks",
    "while",
    "the",
    "scheduler",
    "places",
    "training",
    "jobs",
    "and",
    "inference",
    "servers",
    "answer",
    "requests",
    "quickly",
]


@dataclass(frozen=True, slots=True)
class ModelProfile:
    size_bytes: int
    load_s: float
    prompt_tokens_per_s: float
    tokens_per_s: float
    family: str
    parameter_size: str
    quantization: str = "Q4_K_M"


MODELS: dict[str, ModelProfile] = {
    "llama3.1:8b": ModelProfile(4_920_753_328, 1.8, 2400.0, 95.0, "llama", "8.0B"),
    "qwen2.5:0.5b": ModelProfile(397_821_319, 0.4, 9000.0, 310.0, "qwen2", "494.03M"),
    "mistral:7b": ModelProfile(4_113_301_824, 1.6, 2600.0, 105.0, "llama", "7.2B"),
}


class MockOllama:
    """The state behind the HTTP handler: which models are loaded, until when."""

    def __init__(
        self,
        *,
        time_scale: float = 1.0,
        keep_alive_s: float = 300.0,
        models: dict[str, ModelProfile] | None = None,
    ) -> None:
        self.time_scale, self.keep_alive_s = time_scale, keep_alive_s
        self.models = models or MODELS
        self.loaded: dict[str, float] = {}  # name -> expiry (epoch s)
        self.requests = 0
        self._lock = threading.Lock()

    def _sleep(self, nominal_s: float) -> float:
        """Sleep the scaled time; returns the duration to report, in seconds."""
        if self.time_scale <= 0:
            return nominal_s
        time.sleep(nominal_s * self.time_scale)
        return nominal_s * self.time_scale

    def load(self, name: str) -> float:
        """Load the model if it is not loaded; the load duration to report (s)."""
        with self._lock:
            self.requests += 1
            now = time.time()
            cold = self.loaded.get(name, 0) < now
            self.loaded[name] = now + self.keep_alive_s
        return self._sleep(self.models[name].load_s) if cold else self._sleep(0.002)

    def ps(self) -> dict[str, Any]:
        now = time.time()
        with self._lock:
            live = {n: exp for n, exp in self.loaded.items() if exp >= now}
        return {
            "models": [
                {
                    "name": n,
                    "model": n,
                    "size": self.models[n].size_bytes,
                    "size_vram": self.models[n].size_bytes,
                    "digest": hashlib.sha256(n.encode()).hexdigest(),
                    "expires_at": wire_time(datetime.fromtimestamp(exp, UTC)),
                    "details": {
                        "format": "gguf",
                        "family": self.models[n].family,
                        "parameter_size": self.models[n].parameter_size,
                        "quantization_level": self.models[n].quantization,
                    },
                }
                for n, exp in sorted(live.items())
            ]
        }

    def answer(self, request: dict[str, Any], chat: bool) -> tuple[int, list[str], dict[str, Any]]:
        """Tokens to generate and the request's counters; the caller paces and writes them."""
        text = json.dumps(request.get("messages") if chat else request.get("prompt", ""))
        digest = hashlib.sha256(text.encode()).digest()
        prompt_tokens = 12 + len(text.split()) * 4 // 3
        raw_options = request.get("options")
        options: dict[str, Any] = raw_options if isinstance(raw_options, dict) else {}
        limit = options.get("num_predict")
        count = 16 + digest[0] % 48
        if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
            count = min(count, limit)
        tokens = [("" if i == 0 else " ") + _WORDS[(digest[i % 32] + i) % len(_WORDS)] for i in range(count)]
        return prompt_tokens, tokens, options


def _as_ollama_writes(value: Any) -> bytes:
    """JSON without blanks, as Ollama (Go's encoding/json) writes it."""
    return json.dumps(value, separators=(",", ":")).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    ollama: MockOllama

    def setup(self) -> None:
        super().setup()
        # Head and body are separate writes: without this, Nagle + delayed ACK add ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, value: Any) -> None:
        body = _as_ollama_writes(value)
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/api/version":
            self._json(200, {"version": VERSION})
        elif path == "/api/ps":
            self._json(200, self.ollama.ps())
        elif path == "/api/tags":
            self._json(
                200,
                {
                    "models": [
                        {"name": n, "model": n, "size": p.size_bytes} for n, p in self.ollama.models.items()
                    ]
                },
            )
        elif path == "/":
            body = b"Ollama is running"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._json(404, {"error": f"no endpoint {path}"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(min(length, 16 * 1024 * 1024))
        if path not in ("/api/generate", "/api/chat"):
            self._json(404, {"error": f"no endpoint {path}"})
            return
        try:
            request = json.loads(raw)
            assert isinstance(request, dict)
            assert isinstance(request.get("model"), str)
        except (ValueError, AssertionError):
            self._json(400, {"error": "invalid request: a JSON object with a model is required"})
            return
        if request["model"] not in self.ollama.models:
            self._json(404, {"error": f'model "{request["model"]}" not found, try pulling it first'})
            return
        self._generate(request, chat=path == "/api/chat")

    def _generate(self, request: dict[str, Any], chat: bool) -> None:
        o, name = self.ollama, request["model"]
        profile = o.models[name]
        started = time.perf_counter()
        load_s = o.load(name)
        prompt_tokens, tokens, _ = o.answer(request, chat)
        prompt_s = o._sleep(prompt_tokens / profile.prompt_tokens_per_s)
        stream = request.get("stream") is not False

        def chunk(token: str, done: bool) -> dict[str, Any]:
            c: dict[str, Any] = {"model": name, "created_at": wire_time(datetime.now(UTC))}
            if chat:
                c["message"] = {"role": "assistant", "content": token}
            else:
                c["response"] = token
            c["done"] = done
            return c

        if stream:
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
        eval_s = 0.0
        step = 1 / profile.tokens_per_s
        first = time.perf_counter()
        for i, token in enumerate(tokens):
            # Paced on a schedule, as a GPU generates: a late wake-up does not push every later token back.
            eval_s += step * o.time_scale if o.time_scale > 0 else step
            if o.time_scale > 0:
                time.sleep(max(0.0, first + (i + 1) * step * o.time_scale - time.perf_counter()))
            if stream:
                line = _as_ollama_writes(chunk(token, False)) + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
        final = chunk("" if stream else "".join(tokens), True)
        total_s = time.perf_counter() - started if o.time_scale > 0 else load_s + prompt_s + eval_s
        final.update(
            {
                "done_reason": "stop" if len(tokens) >= 16 else "length",
                "total_duration": int(max(total_s, load_s + prompt_s + eval_s) * 1e9),
                "load_duration": int(load_s * 1e9),
                "prompt_eval_count": prompt_tokens,
                "prompt_eval_duration": int(prompt_s * 1e9),
                "eval_count": len(tokens),
                "eval_duration": int(eval_s * 1e9),
            }
        )
        if stream:
            line = _as_ollama_writes(final) + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(line), line))
        else:
            self._json(200, final)


class MockOllamaServer:
    """The mock on a port (0: any free one), served from a thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 11434, *, time_scale: float = 1.0) -> None:
        self.ollama = MockOllama(time_scale=time_scale)
        handler = type("Handler", (_Handler,), {"ollama": self.ollama})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="mock-ollama", daemon=True)

    def start(self) -> MockOllamaServer:
        self._thread.start()
        return self

    def run(self, stop: threading.Event) -> None:
        """Serve until `stop` is set; the port is given back however it ends."""
        serve_until(self, stop)

    def stop(self) -> None:
        """Stop serving and give the port back; safe twice, and before start()."""
        if self._thread.is_alive():  # shutdown() waits for serve_forever, so only a started server
            self.httpd.shutdown()
            self._thread.join(timeout=5)
        self.httpd.server_close()

    def __enter__(self) -> MockOllamaServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

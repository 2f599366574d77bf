"""LLM session arithmetic on recorded Ollama answers, vLLM scraping, and Ollama's /api/ps."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.llm_monitor.ollama_metrics import SessionMeter, request_facts
from services.llm_monitor.servers import VllmScraper, loaded_models
from shared.contract.models import to_json
from shared.contract.models_workload import LlmSession, parse_llm_message
from shared.plumbing.errors import ContractError
from tests.paths import DATA

DATA = DATA
GENERATE = (DATA / "ollama" / "generate-stream.ndjson").read_bytes()
CHAT = (DATA / "ollama" / "chat-stream.ndjson").read_bytes()


def _session(
    meter: SessionMeter, *, status: int = 200, streamed: bool = True, ended: float = 3.0
) -> LlmSession:
    return meter.session(
        status=status,
        streamed=streamed,
        ended=ended,
        source="proxy",
        monitor_id="m",
        server="http://127.0.0.1:11434",
    )


def test_a_recorded_streamed_generate_gives_ollamas_figures_and_the_derived_ones() -> None:
    meter = SessionMeter(endpoint="/api/generate", model="llama3.1:8b", started=1.0)
    lines = GENERATE.splitlines(keepends=True)
    meter.feed(lines[0], now=3.330)  # the first token reaches the client 2.33 s after the request
    for line in lines[1:]:
        meter.feed(line, now=3.400)
    s = _session(meter, ended=3.420)
    assert (s.prompt_tokens, s.completion_tokens) == (16, 9)
    assert s.load_ms == pytest.approx(2203.911542)
    assert s.prompt_eval_ms == pytest.approx(121.337)
    assert s.eval_ms == pytest.approx(79.104)
    assert s.total_ms == pytest.approx(2417.356021)
    assert s.tokens_per_s == pytest.approx(9 / 0.079104)  # eval_count / eval_duration
    assert s.tpot_ms == pytest.approx(79.104 / 9)
    assert s.ttft_ms == pytest.approx(2330.0)
    assert s.wall_ms == pytest.approx(2420.0)
    assert s.ok
    assert s.error is None
    assert s.streamed


def test_a_recorded_chat_stream_counts_message_content_as_tokens() -> None:
    meter = SessionMeter(endpoint="/api/chat", model="unknown", started=0.0)
    for i, line in enumerate(CHAT.splitlines(keepends=True)):
        meter.feed(line, now=0.05 + i * 0.003)
    s = _session(meter, ended=0.08)
    assert s.model == "qwen2.5:0.5b"  # the answer names the model
    assert s.ttft_ms == pytest.approx(50.0)
    assert s.tokens_per_s == pytest.approx(7 / 0.021875)
    assert s.tpot_ms == pytest.approx(21.875 / 7)


def test_a_non_streamed_answer_has_ollamas_figures_but_no_client_ttft() -> None:
    meter = SessionMeter(endpoint="/api/generate", model="mistral:7b", started=0.0)
    meter.feed((DATA / "ollama" / "generate-nostream.json").read_bytes(), now=0.3)
    meter.finish(now=0.3)  # no trailing newline: parsed when the body ends
    s = _session(meter, streamed=False, ended=0.32)
    assert s.ttft_ms is None
    assert s.completion_tokens == 3
    assert s.tokens_per_s == pytest.approx(100.0)


def test_an_error_answer_is_a_failed_session_with_ollamas_reason() -> None:
    meter = SessionMeter(endpoint="/api/generate", model="llama3.1:70b", started=0.0)
    meter.feed((DATA / "ollama" / "error-stream.ndjson").read_bytes())
    s = _session(meter, status=500)
    assert not s.ok
    assert s.error is not None
    assert "more system memory" in s.error
    assert s.tokens_per_s is None
    assert s.ttft_ms is None


def test_a_stream_cut_short_is_a_failed_session() -> None:
    meter = SessionMeter(endpoint="/api/generate", model="llama3.1:8b", started=0.0)
    meter.feed(GENERATE.splitlines(keepends=True)[0], now=0.1)
    s = _session(meter)
    assert not s.ok
    assert s.error == "no final chunk"
    assert s.ttft_ms == pytest.approx(100.0)


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(0, len(GENERATE)), max_size=40))
def test_any_split_of_the_stream_gives_the_same_session(cuts: list[int]) -> None:
    meter = SessionMeter(endpoint="/api/generate", model="x", started=0.0)
    edges = [0, *sorted(cuts), len(GENERATE)]
    for a, b in itertools.pairwise(edges):
        meter.feed(GENERATE[a:b], now=1.0)
    s = _session(meter)
    assert s.completion_tokens == 9
    assert s.tokens_per_s == pytest.approx(9 / 0.079104)
    assert s.ttft_ms == pytest.approx(1000.0)


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=2000) | st.text(max_size=500).map(str.encode))
def test_any_answer_bytes_make_a_valid_session(body: bytes) -> None:
    meter = SessionMeter(endpoint="/api/chat", model="m", started=0.0)
    meter.feed(body, now=0.5)
    meter.finish(now=0.5)
    session = _session(meter)
    assert parse_llm_message(json.dumps(to_json(session))) == session


@settings(max_examples=200, deadline=None)
@given(
    final=st.dictionaries(
        st.sampled_from(
            [
                "eval_count",
                "eval_duration",
                "load_duration",
                "prompt_eval_count",
                "prompt_eval_duration",
                "total_duration",
                "done",
                "model",
            ]
        ),
        st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats() | st.text(max_size=20),
    )
)
def test_hostile_final_objects_never_break_the_arithmetic(final: dict[str, object]) -> None:
    meter = SessionMeter(endpoint="/api/generate", model="m", started=0.0)
    meter.feed(json.dumps({**final, "done": True}).encode() + b"\n")
    s = _session(meter)
    assert s.tokens_per_s is None or s.tokens_per_s >= 0


@pytest.mark.parametrize(
    ("body", "facts"),
    [
        (b'{"model":"llama3.1:8b","prompt":"hi"}', ("llama3.1:8b", True)),
        (b'{"model":"llama3.1:8b","stream":false}', ("llama3.1:8b", False)),
        (b'{"model":"bad\\u0000name"}', ("unknown", True)),
        (b"[1,2]", ("unknown", True)),
        (b"not json", ("unknown", True)),
        (b"", ("unknown", True)),
    ],
)
def test_request_facts(body: bytes, facts: tuple[str, bool]) -> None:
    assert request_facts(body) == facts


def test_vllm_scrapes_become_per_interval_figures() -> None:
    scraper = VllmScraper("http://10.0.0.7:8000")
    first = scraper.status((DATA / "vllm-metrics-1.txt").read_text(), "m")
    assert first.models[0].name == "meta-llama/Llama-3.1-8B-Instruct"
    assert (first.requests_running, first.requests_waiting, first.kv_cache_usage_ratio) == (3.0, 1.0, 0.125)
    assert first.ttft_ms is None
    assert first.prompt_tokens is None
    second = scraper.status((DATA / "vllm-metrics-2.txt").read_text(), "m")
    assert second.ttft_ms == pytest.approx(75.0)  # (7.5 - 6.0) s / (120 - 100) requests
    assert second.tpot_ms == pytest.approx(12.0)  # (619 - 499) s / (59900 - 49900) tokens
    assert (second.prompt_tokens, second.completion_tokens) == (2500, 10000)
    restarted = scraper.status((DATA / "vllm-metrics-1.txt").read_text(), "m")
    assert restarted.prompt_tokens is None
    assert restarted.ttft_ms is None


def test_ollama_ps_keeps_sane_models_only() -> None:
    ps = {
        "models": [
            {
                "name": "llama3.1:8b",
                "size": 6654289920,
                "size_vram": 6654289920,
                "expires_at": "2026-11-20T09:19:02.2-08:00",
            },
            {"name": "forever:1b", "size": 1, "size_vram": -5, "expires_at": "2318-08-19T00:00:00Z"},
            {"name": "", "size": 1},
            {"name": "x\u0007"},
            "junk",
            {"size": 3},
        ]
    }
    models = loaded_models(ps)
    assert [m.name for m in models] == ["llama3.1:8b", "forever:1b"]
    assert models[0].vram_bytes == 6654289920
    assert models[0].expires_at is not None
    assert models[0].expires_at.isoformat() == "2026-11-20T17:19:02.200000+00:00"
    assert models[1].vram_bytes is None
    assert models[1].expires_at is None
    assert loaded_models("nonsense") == []
    assert loaded_models({"models": None}) == []


@pytest.mark.parametrize(
    "raw",
    [
        b"{}",
        b'{"kind":"gossip"}',
        b"[]",
        b"nope",
        b'{"kind":"session","schema_version":2}',
        b'{"kind":"server","schema_version":1,"time":"2026-11-20T09:00:00Z","monitor_id":"m","server":"s","engine":"tgi","up":true}',
    ],
)
def test_bad_llm_messages_are_refused(raw: bytes) -> None:
    with pytest.raises(ContractError):
        parse_llm_message(raw)

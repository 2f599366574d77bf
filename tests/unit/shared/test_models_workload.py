"""The workload topics' contract refuses what PostgreSQL cannot store (NUL, lone surrogates) in free text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.contract.models_workload import parse_gpu_processes, parse_llm_message
from shared.plumbing.errors import ContractError

PROCESSES = {
    "schema_version": 1,
    "time": "2026-11-22T10:00:00.000Z",
    "source": "nvml",
    "collector_id": "node-1",
    "hostname": "node-1",
    "gpu_uuid": "GPU-0d4fd739-df4d-1372-4667-da389026090c",
    "gpu_index": 0,
    "processes": [
        {"pid": 42, "type": "compute", "classification": "training", "rule": "training-script",
         "executable": "/usr/bin/python3", "command_line": "python3 train.py"},
    ],
}  # fmt: skip
SESSION = {
    "schema_version": 1,
    "kind": "session",
    "request_id": "0" * 32,
    "time": "2026-11-22T10:00:00.000Z",
    "source": "proxy",
    "monitor_id": "mon",
    "server": "ollama",
    "endpoint": "/api/generate",
    "model": "llama3.1:8b",
    "streamed": True,
    "http_status": 500,
    "ok": False,
    "error": "upstream failed",
    "wall_ms": 12.5,
}


def _with(message: dict[str, object], path: tuple[str | int, ...], text: str) -> str:
    copy = json.loads(json.dumps(message))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = text
    return json.dumps(copy)  # lone surrogates travel as \\udXXX escapes, as a hostile producer sends them


FREE_TEXT = [
    (parse_gpu_processes, PROCESSES, ("processes", 0, "command_line")),
    (parse_gpu_processes, PROCESSES, ("processes", 0, "executable")),
    (parse_llm_message, SESSION, ("error",)),
]
unstorable = st.one_of(st.just("\x00"), st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"]))


@pytest.mark.parametrize(("parse", "message", "path"), FREE_TEXT)
@settings(max_examples=60, deadline=None)
@given(head=st.text(max_size=50), bad=unstorable, tail=st.text(max_size=50))
def test_text_postgresql_cannot_store_is_refused(
    parse: object, message: dict[str, object], path: tuple[str | int, ...], head: str, bad: str, tail: str
) -> None:
    with pytest.raises(ContractError):
        parse(_with(message, path, head + bad + tail))  # type: ignore[operator]


@pytest.mark.parametrize(("parse", "message", "path"), FREE_TEXT)
@settings(max_examples=60, deadline=None)
@given(
    text=st.text(
        alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=200
    )
)
def test_any_other_text_is_kept_as_sent(
    parse: object, message: dict[str, object], path: tuple[str | int, ...], text: str
) -> None:
    parsed = parse(_with(message, path, text))  # type: ignore[operator]
    value: object = parsed
    for step in path:
        value = value[step] if isinstance(step, int) else getattr(value, step)  # type: ignore[index]
    assert value == text

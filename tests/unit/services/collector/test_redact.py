"""Command lines leave the node without their secrets (services/collector/redact.py): the values of
secret-named flags, of KEY=VALUE arguments and URLs' user information are masked, the rest kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.collector.proc_info import ProcReader
from services.collector.process_sources import MockProcesses
from services.collector.redact import MASK, redact_argv, redact_command

SECRET_FLAGS = [
    "--token", "--hf-token", "--api-key", "--password", "--db-passwd", "-pwd", "--secret", "--client-secret",
    "--aws_secret_access_key", "--auth", "--cookie", "--private-key",
]  # fmt: skip
PLAIN = st.text(
    st.characters(whitelist_categories=("Ll", "Lu", "Nd"), whitelist_characters="._/"),
    min_size=1,
    max_size=20,
)
USER = st.from_regex(r"[a-z][a-z0-9._-]{0,15}", fullmatch=True)
SECRET = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="&;,@/#?"),
                 min_size=8, max_size=40).map(lambda s: "S3cr" + s)  # fmt: skip


@pytest.mark.parametrize(
    ("command", "redacted"),
    [
        ("python train.py --hf-token hf_abc123 --lr 0.1", "python train.py --hf-token *** --lr 0.1"),
        ("vllm serve m --api-key=sk-1 --port 8000", "vllm serve m --api-key=*** --port 8000"),
        ("env AWS_SECRET_ACCESS_KEY=xyz python x.py", "env AWS_SECRET_ACCESS_KEY=*** python x.py"),
        ("psql postgres://alice:pw@db:5432/gh", "psql postgres://***@db:5432/gh"),
        ("curl https://h/x?token=abc&page=2", "curl https://h/x?token=***&page=2"),
        ("torchrun --nproc_per_node 8 train.py", "torchrun --nproc_per_node 8 train.py"),
        ("app --password", "app --password"),  # no value to hide
    ],
)
def test_known_shapes(command: str, redacted: str) -> None:
    assert redact_command(command) == redacted


@settings(max_examples=300)
@given(program=PLAIN, flag=st.sampled_from(SECRET_FLAGS), secret=SECRET, joined=st.booleans(),
       before=st.lists(PLAIN, max_size=4), after=st.lists(PLAIN, max_size=4))  # fmt: skip
def test_a_secret_flags_value_never_survives(
    program: str, flag: str, secret: str, joined: bool, before: list[str], after: list[str]
) -> None:
    argv = [program, *before, *([f"{flag}={secret}"] if joined else [flag, secret]), *after]
    out = redact_argv(argv)
    assert secret not in " ".join(out)
    assert len(out) == len(argv)  # nothing lost or merged: the other arguments stay where they were
    assert out[0] == program


@settings(max_examples=300)
@given(
    name=st.from_regex(r"[A-Z_][A-Z0-9_]{0,15}", fullmatch=True),
    secret=SECRET,
    args=st.lists(PLAIN, max_size=4),
)
def test_a_key_value_arguments_value_never_survives(name: str, secret: str, args: list[str]) -> None:
    out = redact_argv(["env", f"{name}={secret}", "python", *args])
    assert out[1] == f"{name}={MASK}"
    assert out[2:] == ["python", *redact_argv(args)]


@settings(max_examples=300)
@given(
    scheme=st.sampled_from(["https", "postgres", "redis", "s3", "git+ssh"]),
    user=USER,
    secret=SECRET,
    host=st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
    prefix=st.sampled_from(["", "--url=", "x="]),
)
def test_url_user_information_never_survives(
    scheme: str, user: str, secret: str, host: str, prefix: str
) -> None:
    out = redact_command(f"tool {prefix}{scheme}://{user}:{secret}@{host}/path")
    assert secret not in out
    if prefix != "x=":  # (a KEY=VALUE argument's whole value is masked)
        assert f"@{host}/path" in out


@settings(max_examples=300)
@given(argv=st.lists(st.text(max_size=30), max_size=12))
def test_any_command_line_keeps_its_shape(argv: list[str]) -> None:
    out = redact_argv(argv)
    assert len(out) == len(argv)
    for before, after in zip(argv, out, strict=True):
        assert after == before or MASK in after


def test_the_collector_publishes_redacted_lines_unless_opted_in(tmp_path: Path) -> None:
    p = tmp_path / "4242"
    p.mkdir()
    (p / "cmdline").write_bytes(
        b"python3\x00serve.py\x00--api-key\x00sk live 1\x00DB_URL=postgres://u:p@db/x\x00"
    )
    (p / "stat").write_text("4242 (python3) S " + " ".join(["0"] * 50) + "\n")
    os.symlink("/usr/bin/python3", p / "exe")
    assert ProcReader(tmp_path).read(4242).command_line == "python3 serve.py --api-key *** DB_URL=***"
    full = ProcReader(tmp_path, full_command_lines=True).read(4242).command_line
    assert full == "python3 serve.py --api-key sk live 1 DB_URL=postgres://u:p@db/x"
    mock = MockProcesses("http://127.0.0.1:9/metrics")
    assert mock._command("x --token abc") == "x --token ***"

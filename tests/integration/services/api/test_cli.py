"""`gpuhealth`, the CLI as the venv installs it: plain text, and a refused request reported as refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.api import cli
from tests.helpers.identities import VIEWER, identities, token_args
from tests.paths import REPO

LAUNCHER = Path(sys.executable).parent / "gpuhealth"


def gpuhealth(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "GPUHEALTH_URL", "GPUHEALTH_TOKEN_FILE")
    }
    return subprocess.run([str(LAUNCHER), *args], capture_output=True, text=True, timeout=60, check=False,
                          cwd="/", env={**clean, **env})  # fmt: skip


def test_the_venv_has_gpuhealth_on_its_path_and_it_runs_from_anywhere(
    served_api: str, scored: dict[str, Any]
) -> None:
    assert LAUNCHER.is_file(), "scripts/pyenv.sh did not install the gpuhealth launcher"
    viewer = str(identities().token_file("viewer"))
    fleet = gpuhealth("fleet", "--top", "2", GPUHEALTH_URL=served_api, GPUHEALTH_TOKEN_FILE=viewer)
    assert fleet.returncode == 0, fleet.stderr
    lines = fleet.stdout.splitlines()
    assert lines[0].startswith("GPUs 4  healthy 3  degraded 0  unhealthy 1")
    assert "open alerts: 2 critical" in lines[1]
    assert "{" not in fleet.stdout  # no raw dicts
    assert "BAD unhealthy" in fleet.stdout
    detail = gpuhealth("--url", served_api, "--token-file", viewer, "gpu", scored["sick"])
    assert detail.returncode == 0, detail.stderr
    assert "memory" in detail.stdout
    assert "volatile_dbe" in detail.stdout
    assert "{" not in detail.stdout
    listed = gpuhealth("alerts", "--url", served_api, "--token-file", viewer)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("2 unresolved alert(s)")
    assert "gpu-node-00" in listed.stdout


def test_a_refused_request_is_reported_as_refused_with_status_and_message(
    served_api: str, scored: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        cli.main(
            [*token_args("viewer"), "--url", served_api, "gpu", "GPU-00000000-0000-0000-0000-000000000000"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "refused GET /api/v1/gpus/GPU-00000000-0000-0000-0000-000000000000: 404 Not Found: no GPU" in err
    assert "cannot reach" not in err
    alert_id = VIEWER.get(served_api + "/api/v1/alerts").json()["alerts"][0]["id"]
    assert cli.main([*token_args("viewer"), "--url", served_api, "ack", str(alert_id)]) == 2
    err = capsys.readouterr().err
    assert f"refused POST /api/v1/alerts/{alert_id}/acknowledge: 403" in err
    assert cli.main([*token_args("operator"), "--url", served_api, "ack", str(alert_id)]) == 0
    assert "acknowledged by local-operator" in capsys.readouterr().out
    assert cli.main([*token_args("operator"), "--url", served_api, "ack", str(alert_id)]) == 2
    assert "409 Conflict" in capsys.readouterr().err
    assert cli.main([*token_args("viewer"), "--url", "http://127.0.0.1:9", "fleet"]) == 1
    assert "cannot reach the gpu-health API at http://127.0.0.1:9" in capsys.readouterr().err


def test_the_cli_takes_no_key_or_token_on_its_command_line_and_says_where_tokens_are(
    served_api: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for flag in ("--key", "--by"):
        with pytest.raises(SystemExit):
            cli.main([*token_args("operator"), "--url", served_api, "ack", "1", flag, "x"])
    capsys.readouterr()
    # no token file and no terminal to ask on: it says what to do, and calls nothing
    clean = {k: v for k, v in os.environ.items() if k != "GPUHEALTH_TOKEN_FILE"}
    for args, said in (
        (["fleet"], "GPUHEALTH_TOKEN_FILE"),
        (["--token-file", str(tmp_path / "none"), "fleet"], "cannot read the token file"),
    ):
        refused = subprocess.run(
            [sys.executable, "-m", "services.api.cli", "--url", served_api, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            env={**clean, "PYTHONPATH": str(REPO)},
        )
        assert refused.returncode == 2, refused.stderr
        assert said in refused.stderr, refused.stderr


@given(counts=st.dictionaries(st.sampled_from(["critical", "warning", "info"]), st.integers(0, 10**6)))
@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
def test_alert_counts_read_as_words(counts: dict[str, int]) -> None:
    text = cli.counts(counts)
    assert "{" not in text
    assert "'" not in text
    if not any(counts.values()):
        assert text == "none"
    for severity, n in counts.items():
        assert (f"{n} {severity}" in text) == (n > 0)

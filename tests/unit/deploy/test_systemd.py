"""The collector's systemd unit and env file: valid to systemd, each setting documented, each variable real.

`systemd-analyze verify` reads the unit as systemd does, in a scratch root holding the unit, the
entry point it runs and systemd's own targets; any warning it prints fails. No systemd runs as PID 1
where the tests run, so this is the floor: the unit is verified, not started.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from services.collector.settings import CollectorSettings
from shared.plumbing.errors import ConfigError
from shared.settings.common import ShutdownSettings, load_settings
from shared.settings.env import accepted_names
from tests.paths import REPO

SYSTEMD = REPO / "deploy" / "systemd"
UNIT = SYSTEMD / "gpu-health-collector.service"
ENV_FILE = SYSTEMD / "gpu-health-collector.env"
DOC = REPO / "docs" / "from-mock-to-fleet.md"
SYSTEM_UNITS = Path("/usr/lib/systemd/system")  # systemd's own targets, which the unit's dependencies name
ENV_NAME = re.compile(r"\b(GPUHEALTH_[A-Z0-9_]+)=")


def unit_settings(text: str, section: str) -> list[tuple[str, str]]:
    """`(key, value)` of every setting in one section of a unit file, in order (comments left out)."""
    settings: list[tuple[str, str]] = []
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = line.strip("[]")
        elif current == section:
            key, _, value = line.partition("=")
            settings.append((key.strip(), value.strip()))
    return settings


def env_file_values(text: str) -> dict[str, str]:
    """The variables an EnvironmentFile= sets: `KEY=VALUE` lines, one pair of outer quotes removed."""
    values = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not KEY=VALUE: {raw!r}"
        assert key == key.strip(), f"a space around the name: {raw!r}"
        assert not set(value) & {"\\", "$"}, f"{key}: no escapes or expansions, as systemd reads them"
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    return values


def documented_settings(text: str) -> list[tuple[str, str]]:
    """`(key, value)` of every row of the page's table of the unit's settings."""
    table = text.split("### The unit's settings, each with its reason", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([A-Za-z]+)=([^`]*)` \| (.+) \|$", table, re.MULTILINE)
    for key, _, reason in rows:
        assert len(reason.strip()) > 10, f"{key}: no reason given"
    return [(key, value) for key, value, _ in rows]


@pytest.fixture(scope="module")
def systemd_analyze() -> Path:
    found = shutil.which("systemd-analyze")
    missing = (
        "no systemd-analyze (Debian's systemd package): run scripts/install-tools.sh (make test-unit does)"
    )
    assert found, missing
    assert SYSTEM_UNITS.is_dir(), missing
    return Path(found)


def analyze(
    systemd_analyze: Path, unit_text: str, root: Path, *command: str
) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze <command> --root=<root>` on the unit, in a scratch root that holds what it names."""
    entry = root / "opt" / "gpu-health" / "venv" / "bin" / "gpuhealth-collector"
    entry.parent.mkdir(parents=True)
    entry.write_text("#!/bin/sh\n")
    entry.chmod(0o755)
    shutil.copytree(SYSTEM_UNITS, root / "usr" / "lib" / "systemd" / "system", symlinks=True)
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    (root / "etc" / "systemd" / "system" / UNIT.name).write_text(unit_text)
    return subprocess.run(
        [str(systemd_analyze), *command, f"--root={root}", UNIT.name],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def verify(systemd_analyze: Path, unit_text: str, root: Path) -> subprocess.CompletedProcess[str]:
    return analyze(systemd_analyze, unit_text, root, "verify", "--man=no")


def test_systemd_analyze_verifies_the_unit_without_a_warning(systemd_analyze: Path, tmp_path: Path) -> None:
    done = verify(systemd_analyze, UNIT.read_text(), tmp_path)
    said = f"systemd-analyze verify ({done.returncode}):\n{done.stdout}{done.stderr}"
    assert done.returncode == 0, said
    assert not (done.stdout + done.stderr).strip(), said


def test_the_verification_fails_on_a_setting_systemd_does_not_take(
    systemd_analyze: Path, tmp_path: Path
) -> None:
    """What the check above relies on: a misspelt key and a bad value are both warned of."""
    broken = UNIT.read_text().replace("NoNewPrivileges=yes", "NoNewPrivilege=yes\nDeviceAllow=/dev/kmsg rx")
    done = verify(systemd_analyze, broken, tmp_path)
    assert "Unknown key 'NoNewPrivilege'" in done.stderr, done.stderr
    assert "Invalid device rights" in done.stderr, done.stderr


def test_the_sandbox_exposes_no_more_than_the_docs_say(systemd_analyze: Path, tmp_path: Path) -> None:
    done = analyze(systemd_analyze, UNIT.read_text(), tmp_path, "security", "--offline=yes", "--no-pager")
    measured = re.search(r"Overall exposure level for \S+: (\d+\.\d)", done.stdout)
    documented = re.search(r"exposure (\d+\.\d) of 10", DOC.read_text())
    assert measured, done.stdout + done.stderr
    assert documented, "the docs give no exposure figure"
    assert float(measured[1]) <= float(documented[1]), (
        f"systemd-analyze security: exposure {measured[1]}, the docs say {documented[1]}"
    )


def test_every_setting_of_the_unit_is_in_the_docs_table_and_every_row_is_in_the_unit() -> None:
    in_unit = unit_settings(UNIT.read_text(), "Service")
    in_doc = documented_settings(DOC.read_text())
    assert len(in_unit) == len(set(in_unit)), "a setting repeated in the unit"
    missing, extra = sorted(set(in_unit) - set(in_doc)), sorted(set(in_doc) - set(in_unit))
    assert not missing, f"in the unit, not in the docs table: {missing}"
    assert not extra, f"in the docs table, not in the unit: {extra}"


def test_the_hardening_the_issue_asks_for_is_there() -> None:
    settings = dict(unit_settings(UNIT.read_text(), "Service"))
    for key, value in {
        "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
        "User": "gpu-health", "AmbientCapabilities": "CAP_SYSLOG", "CapabilityBoundingSet": "CAP_SYSLOG",
        "ProtectProc": "default", "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "SystemCallFilter": "@system-service", "MemoryDenyWriteExecute": "yes", "Restart": "on-failure",
        "KillSignal": "SIGTERM", "ProtectKernelLogs": "no", "PrivateDevices": "no", "DevicePolicy": "closed",
    }.items():  # fmt: skip
        assert settings.get(key) == value, f"{key}={settings.get(key)}, wanted {value}"
    assert settings["ExecStart"].endswith("/bin/gpuhealth-collector")
    assert "DynamicUser" not in settings, "a dedicated user, for the reasons in the docs table"


def test_systemd_waits_longer_than_the_collectors_own_shutdown_deadline() -> None:
    stop_s = float(dict(unit_settings(UNIT.read_text(), "Service"))["TimeoutStopSec"])
    field = ShutdownSettings.model_fields["timeout_s"]
    configured = float(
        env_file_values(ENV_FILE.read_text()).get("GPUHEALTH_SHUTDOWN__TIMEOUT_S", field.default)
    )
    assert stop_s > max(configured, field.default), (
        f"TimeoutStopSec={stop_s} must exceed the collector's shutdown deadline ({configured} s)"
    )


def test_every_variable_named_in_the_env_file_and_the_unit_is_a_collector_setting() -> None:
    """Commented examples included: each name is one the collector's settings model reads."""
    exact, open_prefixes = accepted_names(CollectorSettings)
    named = set(ENV_NAME.findall(ENV_FILE.read_text())) | set(ENV_NAME.findall(UNIT.read_text()))
    unknown = sorted(n for n in named if n not in exact and not n.startswith(tuple(open_prefixes)))
    assert named, "no GPUHEALTH_* variable found"
    assert not unknown, f"not collector settings: {unknown}"


def test_the_env_file_and_the_units_environment_load_as_the_collectors_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What systemd hands the collector is valid to it, values and all (%d and %S as systemd fills them)."""
    for name in list(os.environ):
        if name.startswith("GPUHEALTH_"):
            monkeypatch.delenv(name)
    unit_env = {
        key: value.replace("%d", "/run/credentials/" + UNIT.name).replace("%S", "/var/lib")
        for key, value in (
            item.split("=", 1) for k, item in unit_settings(UNIT.read_text(), "Service") if k == "Environment"
        )
    }
    for key, value in (unit_env | env_file_values(ENV_FILE.read_text())).items():  # the file wins
        monkeypatch.setenv(key, value)
    try:
        settings = load_settings(CollectorSettings)
    except ConfigError as e:
        pytest.fail(f"the unit's settings do not load: {e}")
    assert settings.kafka.security_protocol == "SSL"
    assert settings.collector.kernel_log == "kmsg"
    assert settings.collector.spool_file() == Path("/var/lib/gpu-health-collector/spool.jsonl")
    assert settings.kafka.ssl_key_location == f"/run/credentials/{UNIT.name}/kafka-client.key"


def test_no_secret_is_set_in_the_env_file_or_the_unit() -> None:
    secret = re.compile(r"^\s*(?:Environment=)?(GPUHEALTH_\w*(?:PASSWORD|SECRET|TOKEN)\w*)=", re.MULTILINE)
    for path in (ENV_FILE, UNIT):
        assert not secret.findall(path.read_text()), f"{path.name} sets a secret: use collector-secrets.env"

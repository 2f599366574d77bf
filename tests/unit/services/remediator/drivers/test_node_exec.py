"""The exec driver: placeholders filled, nothing else read; real commands' exits; an unset operation fails."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from services.remediator.drivers.node_exec import Command, NodeExec, fill

GPUS = {"GPU-00000001-0000-4000-8000-000000000000": 0, "GPU-00000002-0000-4000-8000-000000000000": 1}


def test_placeholders_are_filled() -> None:
    values = {"node": "n1", "gpu_uuid": "GPU-1", "gpu_index": "3", "plan_id": "9"}
    assert fill("{node}:{gpu_uuid}/{gpu_index}#{plan_id}", values) == "n1:GPU-1/3#9"


VALUES = {"node": "N", "gpu_uuid": "U", "gpu_index": "I", "plan_id": "P"}


@given(st.text(max_size=200).filter(lambda t: not any("{" + k + "}" in t for k in VALUES)))
def test_a_template_without_placeholders_is_left_as_it_is(template: str) -> None:
    assert fill(template, VALUES) == template


def test_format_string_tricks_are_not_read() -> None:
    for trick in ("{node.__class__}", "{0}", "{}", "{node!r}", "{node:>10}", "{{plan_id"):
        assert fill(trick, VALUES) == trick


def test_a_command_runs_per_gpu_and_its_exit_decides() -> None:
    ok = NodeExec({"reset_gpu": Command(argv=["sh", "-c", 'echo "reset $0 on $1"', "{gpu_uuid}", "{node}"])})
    result = ok.run("reset_gpu", node="n1", gpus=GPUS, plan_id=1)
    assert result.status == "ok"
    assert [run["said"] for run in result.response["runs"]] == [f"reset {u} on n1" for u in sorted(GPUS)]
    failing = NodeExec(
        {"compute_check": Command(argv=["sh", "-c", "echo mismatch >&2; exit 3"], per_gpu=False)}
    )
    result = failing.run("compute_check", node="n1", gpus=GPUS, plan_id=1)
    assert result.status == "failed"
    assert result.response["runs"][0]["exit"] == 3
    assert "mismatch" in (result.reason or "")


def test_a_command_that_cannot_run_or_hangs_fails() -> None:
    absent = NodeExec({"reboot": Command(argv=["/nonexistent/reboot"], per_gpu=False)})
    assert absent.run("reboot", node="n", gpus=GPUS, plan_id=1).status == "failed"
    slow = NodeExec({"reboot": Command(argv=["sleep", "5"], per_gpu=False, timeout_s=0.2)})
    assert slow.run("reboot", node="n", gpus=GPUS, plan_id=1).status == "failed"


def test_an_operation_not_configured_fails_saying_so() -> None:
    result = NodeExec({}).run("reset_gpu", node="n", gpus=GPUS, plan_id=1)
    assert result.status == "failed"
    assert result.reason == "no command is configured for reset_gpu"


def test_a_command_is_argv_or_url() -> None:
    with pytest.raises(ValidationError):
        Command()
    with pytest.raises(ValidationError):
        Command(argv=["true"], url="http://x")
    with pytest.raises(ValidationError):
        Command(url="file:///etc/passwd")
    assert NodeExec({"reboot": Command(url="http://janitor/reboot")}).driver_of("reboot") == "webhook"


def test_a_webhook_is_posted_the_operation_and_its_answer_decides() -> None:
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    received: list[dict[str, str]] = []
    authorized: list[str | None] = []

    class Janitor(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            authorized.append(self.headers.get("Authorization"))
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(202 if received[-1]["node"] == "n1" else 503)
            self.end_headers()
            self.wfile.write(b"queued")

        def log_message(self, *args: object) -> None:
            return None

    server = HTTPServer(("127.0.0.1", 0), Janitor)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/reboot"
        janitor = NodeExec(
            {"reboot": Command(url=url, per_gpu=False, headers={"Authorization": "Bearer janitor-s3cret"})}
        )
        done = janitor.run("reboot", node="n1", gpus=GPUS, plan_id=7)
        assert done.status == "ok"
        gpus = {"gpu_uuid": ",".join(sorted(GPUS)), "gpu_index": "0,1"}
        assert received == [{"operation": "reboot", "node": "n1", "plan_id": "7", **gpus}]
        assert authorized == ["Bearer janitor-s3cret"]  # the credential goes in a header
        recorded = json.dumps(done.response)
        assert url not in recorded  # the record names neither the URL nor the credential
        assert "janitor-s3cret" not in recorded
        refused = janitor.run("reboot", node="n2", gpus=GPUS, plan_id=8)
        assert (refused.status, refused.response["runs"][0]["status"]) == ("failed", 503)
    finally:
        server.shutdown()
    unreachable = NodeExec({"reboot": Command(url=url, per_gpu=False, timeout_s=1)})
    failed = unreachable.run("reboot", node="n1", gpus=GPUS, plan_id=9)
    assert failed.status == "failed"
    assert url not in json.dumps(failed.response)


@pytest.mark.parametrize(
    "url", ["https://user:pw@janitor/reboot", "https://janitor/reboot?token=abc", "https://j/r?api_key=x&a=1"]
)
def test_a_webhook_url_with_credentials_is_refused_at_start(url: str) -> None:
    with pytest.raises(ValueError, match="headers"):
        Command(url=url)


def test_a_commands_record_holds_no_command_line() -> None:
    import json

    secret = "--password=hunter2"
    done = NodeExec({"reboot": Command(argv=["sh", "-c", "exit 0", secret], per_gpu=False)})
    ran = done.run("reboot", node="n1", gpus=GPUS, plan_id=1)
    assert ran.status == "ok"
    assert "hunter2" not in json.dumps(ran.response)
    slow = NodeExec({"reboot": Command(argv=["sh", "-c", "sleep 5", secret], per_gpu=False, timeout_s=0.2)})
    assert "hunter2" not in json.dumps(slow.run("reboot", node="n1", gpus=GPUS, plan_id=2).response)

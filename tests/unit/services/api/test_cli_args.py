"""`gpuhealth`'s command table: every command parses, the API and token options go before or after it, and
what a command returns is printed or written where its export says."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from services.api import cli
from services.api.cli_args import Command, Export, arg, parser


def test_every_command_of_the_table_is_one_subcommand_in_its_order(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parser(cli.__doc__, cli.COMMANDS).parse_args(["--help"])
    listed = " ".join(capsys.readouterr().out.split())  # argparse wraps at the terminal's width
    assert "{" + ",".join(cli.COMMANDS) + "}" in listed
    for name, command in cli.COMMANDS.items():
        assert command.help in listed, name


@pytest.mark.parametrize("where", ["before", "after"])
def test_the_api_and_the_token_file_go_before_or_after_the_command(where: str) -> None:
    shared = ["--url", "http://api:1", "--token-file", "/t"]
    argv = [*shared, "gpu", "GPU-1"] if where == "before" else ["gpu", "GPU-1", *shared]
    args = parser(None, cli.COMMANDS).parse_args(argv)
    assert (args.url, args.token_file, args.command, args.uuid) == ("http://api:1", "/t", "gpu", "GPU-1")


def test_a_command_added_to_a_table_is_parsed_and_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    table = {
        "say": Command("say it", lambda c, a: f"{a.word} via {c.base_url}", (arg("word"),)),
        "dump": Command("write it", lambda c, a: Export(b"a,b\n", a.to), (arg("to"),)),
    }
    monkeypatch.setattr(cli, "COMMANDS", table)
    token = tmp_path / "token"
    token.write_text("t\n")
    assert cli.main(["--token-file", str(token), "--url", "http://api:1", "say", "hi"]) == 0
    assert capsys.readouterr().out == "hi via http://api:1\n"
    assert cli.main(["dump", str(tmp_path / "out.csv"), "--token-file", str(token)]) == 0
    assert (tmp_path / "out.csv").read_bytes() == b"a,b\n"


def test_an_api_that_cannot_be_reached_is_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(client: httpx.Client, args: object) -> str:
        raise httpx.ConnectError("refused")

    monkeypatch.setattr(cli, "COMMANDS", {"fleet": Command("f", unreachable)})
    token = tmp_path / "token"
    token.write_text("t\n")
    assert cli.main(["--token-file", str(token), "fleet"]) == 1

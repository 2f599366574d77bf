"""`gpuhealth`'s commands as data (services.api.cli.COMMANDS): each one's help, arguments and what it runs.

An argument is `arg(*flags, **what argparse's add_argument takes)`; a command
returns the text it prints, or an Export: bytes for a file (- : stdout).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

Arg = tuple[tuple[str, ...], dict[str, Any]]


def arg(*flags: str, **kwargs: Any) -> Arg:
    return flags, kwargs


@dataclass(frozen=True, slots=True)
class Export:
    data: bytes
    to: str  # a file, or - for stdout


@dataclass(frozen=True, slots=True)
class Command:
    help: str
    run: Callable[[httpx.Client, argparse.Namespace], str | Export]
    arguments: tuple[Arg, ...] = ()


def parser(description: str | None, commands: Mapping[str, Command]) -> argparse.ArgumentParser:
    """The command line: the API and the token (before or after the command), and `commands`."""
    top = argparse.ArgumentParser(
        prog="gpuhealth", description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    shared = (
        arg(
            "--url",
            default=os.environ.get("GPUHEALTH_URL", "http://127.0.0.1:8000"),
            help="the gpu-health API (default: $GPUHEALTH_URL or %(default)s)",
        ),
        arg(
            "--token-file",
            default=os.environ.get("GPUHEALTH_TOKEN_FILE"),
            help="a file holding your bearer token (default: $GPUHEALTH_TOKEN_FILE; "
            "else asked for on the terminal)",
        ),
    )
    for flags, kwargs in shared:
        top.add_argument(*flags, **kwargs)
    subparsers = top.add_subparsers(dest="command", required=True)
    for name, command in commands.items():
        sub = subparsers.add_parser(name, help=command.help)
        for flags, kwargs in command.arguments:
            sub.add_argument(*flags, **kwargs)
        for flags, _ in shared:  # --url and --token-file after the command too
            sub.add_argument(*flags, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return top

"""Command lines with their secrets taken out, before they leave the node.

Real command lines carry tokens and passwords (`--hf-token hf_...`, `DB_PASSWORD=... python`,
`postgres://user:pass@db/...`). Unless `GPUHEALTH_PROCESSES__FULL_COMMAND_LINES` opts in, the
collector publishes each command line with, replaced by `***`:

- the value of a flag whose name says it holds a secret (token, key, password, passwd, pwd,
  secret, credential, auth, cookie, session, signature): `--api-key=V`, `--api-key V`, `-password V`;
- the value of every `KEY=VALUE` argument (environment assignments, `key=value` overrides), and of
  any `NAME=VALUE` inside an argument whose name says secret (`?token=V&...`);
- the user information of a URL (`scheme://user:pass@host` -> `scheme://***@host`).

What stays: the program, its plain arguments, the names of flags and keys, so a process can still
be told apart (and classified) without what it was trusted with.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MASK = "***"
SECRET_WORDS = r"(?:token|key|passw(?:or)?d|pwd|secret|credential|auth|cookie|session|signature|private)"  # noqa: S105
# A flag naming a secret: its value is the rest of the argument after `=`, or else the next argument.
SECRET_FLAG = re.compile(rf"^(-{{1,2}}[A-Za-z0-9_.-]*{SECRET_WORDS}[A-Za-z0-9_.-]*)(=(.*))?$", re.IGNORECASE)
# A whole argument NAME=VALUE (not a flag).
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_.:-]*)=(.+)$", re.DOTALL)
# NAME=VALUE anywhere in an argument (a URL's query, a list of options), NAME saying secret.
INNER_SECRET = re.compile(rf"([A-Za-z0-9_.-]*{SECRET_WORDS}[A-Za-z0-9_.-]*=)([^&;,\s]+)", re.IGNORECASE)
# scheme://userinfo@ : everything between :// and the last @ before the host's end.
USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]+@")


def redact_argument(arg: str) -> str:
    """One argument with a URL's user information and secret-named NAME=VALUE values masked."""
    arg = USERINFO.sub(rf"\g<1>{MASK}@", arg)
    return INNER_SECRET.sub(rf"\g<1>{MASK}", arg)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """`argv` with the values of secret flags, of KEY=VALUE arguments and URL user information masked."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and arg and not arg.startswith("-"):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        if flag := SECRET_FLAG.match(arg):
            if flag.group(2) is None:
                out.append(arg)
                hide_next = True
            else:
                out.append(f"{flag.group(1)}={MASK}")
            continue
        if not arg.startswith("-") and (pair := ASSIGNMENT.match(arg)):
            out.append(f"{pair.group(1)}={MASK}")
            continue
        out.append(redact_argument(arg))
    return out


def redact_command(command: str) -> str:
    """A command line (arguments joined by spaces) with its secrets masked, as :func:`redact_argv` does."""
    return " ".join(redact_argv(command.split(" ")))

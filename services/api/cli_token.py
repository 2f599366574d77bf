"""The `gpuhealth` CLI's bearer token: from a file (`--token-file`, `$GPUHEALTH_TOKEN_FILE`) or asked for.

Never from the command line, where other users of the machine (`ps`) and the shell's history see it.
`make up` writes a token per role under `$GPUHEALTH_RUN/auth/`.
"""

from __future__ import annotations

import getpass
import sys
from pathlib import Path

from shared.plumbing.errors import GpuHealthError


class TokenError(GpuHealthError):
    """No token to call the API with."""


def read_token(token_file: str | None) -> str:
    """The bearer token: from `token_file` (the first line), else asked for on a terminal."""
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as e:
            raise TokenError(f"cannot read the token file {token_file}: {e.strerror}") from e
        if not token:
            raise TokenError(f"the token file {token_file} is empty")
        return token
    if sys.stdin.isatty():
        token = getpass.getpass("gpu-health bearer token: ").strip()
        if token:
            return token
    raise TokenError(
        "no token: set --token-file or $GPUHEALTH_TOKEN_FILE (`make up` writes "
        "$GPUHEALTH_RUN/auth/viewer.token, operator.token, admin.token)"
    )

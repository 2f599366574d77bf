"""`python -m services.api.local_tokens DIR`: the local mode's issuer, for `make up` and the tests.

Writes, under DIR (mode 0700; every file 0600):

- `signing-key.pem`: an Ed25519 private key (PKCS8), made once and kept;
- `jwks.json`: its public key, the JWKS the API verifies against (`GPUHEALTH_AUTH__JWKS_FILE`);
- `viewer.token`, `operator.token`, `admin.token`: a JWT per role (subject `local-ROLE`, issuer
  `gpu-health-local`, audience `gpu-health`), issued afresh each run, valid `--days`;
- `viewer.header`, ...: the same as an `Authorization: Bearer` line, for `curl -H @FILE` (so no
  token is ever on a command line).

Nothing here prints a token: it says where the files are. The directory is under
`$GPUHEALTH_RUN` (never in the repository). A deployment uses its own OIDC issuer instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .auth import RANK

ISSUER = "gpu-health-local"
AUDIENCE = "gpu-health"
KID = "local-1"


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path.with_suffix(path.suffix + ".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(path.with_suffix(path.suffix + ".tmp"), path)


def signing_key(directory: Path) -> Ed25519PrivateKey:
    """The directory's signing key, made (and written) the first time."""
    path = directory / "signing-key.pem"
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise SystemExit(f"{path} is not an Ed25519 key")
        return key
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write(path, pem)
    return key


def jwks(key: Ed25519PrivateKey) -> dict[str, Any]:
    public: dict[str, Any] = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(key.public_key()))
    return {"keys": [{**public, "kid": KID, "use": "sig", "alg": "EdDSA"}]}


def issue(
    key: Ed25519PrivateKey,
    subject: str,
    role: str,
    *,
    days: float = 30,
    issuer: str = ISSUER,
    audience: str = AUDIENCE,
    now: float | None = None,
) -> str:
    """A token for `subject` with `role`, signed by `key`."""
    now = time.time() if now is None else now
    claims = {
        "iss": issuer,
        "aud": audience,
        "sub": subject,
        "gpuhealth_role": role,
        "iat": int(now),
        "nbf": int(now),
        "exp": int(now + days * 86400),
    }
    return jwt.encode(claims, key, algorithm="EdDSA", headers={"kid": KID})


def write_local(directory: Path, *, days: float = 30) -> dict[str, Path]:
    """Key (kept), JWKS and one token per role under `directory`; the token files by role."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    key = signing_key(directory)
    _write(directory / "jwks.json", json.dumps(jwks(key), indent=2).encode() + b"\n")
    files = {}
    for role in RANK:
        files[role] = directory / f"{role}.token"
        token = issue(key, f"local-{role}", role, days=days)
        _write(files[role], token.encode() + b"\n")
        _write(directory / f"{role}.header", f"Authorization: Bearer {token}\n".encode())
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.api.local_tokens",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument("--days", type=float, default=30, help="how long the tokens are valid")
    args = parser.parse_args(argv)
    files = write_local(args.directory, days=args.days)
    sys.stderr.write(f"local tokens ({', '.join(files)}) in {args.directory}/\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Signed verdicts and alerts: Ed25519 over a message's canonical bytes, bound to its topic and key.

The scorer signs every message it writes to gpu-health and gpu-alerts with its
private key; the remediator holds only public keys (a keyring) and acts on
nothing it cannot verify, so neither it nor anyone who takes its secrets can
forge a verdict. What is signed::

    b"gpu-health-sig-v1\\n" + topic + b"\\n" + key + b"\\n" + canonical_bytes(value)

with :func:`shared.contract.chain.canonical_bytes` over the parsed JSON value (so only a
change of content counts, not of spacing), `topic` the topic's name and `key`
the message's key bytes (empty when it has none). A topic name has no newline
and canonical JSON has none outside its escapes, so the three parts cannot be
shifted into one another; binding topic and key stops a signed verdict being
replayed onto another topic or another GPU's key. The value's bytes travel as
they always did; two headers carry the signature:

- ``gh-kid``: the key id, the first 16 hex digits of the SHA-256 of the raw
  32-byte public key;
- ``gh-sig``: the 64-byte signature, base64.

Rotation: generate a new pair, add its public key to the keyring (both keys are
then trusted), point the scorer at the new private key, and once no message
signed with the old one can still be in flight (the remediator's `max_age_s`),
remove the old public key. The keyring is a file of PEM public keys, one block
each, or a directory of ``*.pem`` files.

    python -m shared.contract.signing keygen DIR [--name scorer] [--if-missing]
    python -m shared.contract.signing kid FILE...

`keygen` writes DIR/private/NAME.key (PKCS8 PEM, mode 0600, the scorer's) and
DIR/trusted/NAME.pem (the public key, for the remediator's keyring) and prints
the key id and the two paths, never a key. `kid` prints the key id of each key
in the files (private keys, public keys or keyrings).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import os
import re
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import Field

from shared.contract.chain import canonical_bytes, parse_canonical_input
from shared.plumbing.errors import ConfigError, ContractError
from shared.settings.common import Section

CONTEXT = b"gpu-health-sig-v1\n"
KID_HEADER = "gh-kid"
SIG_HEADER = "gh-sig"
_KID = re.compile(r"^[0-9a-f]{16}$")
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z ]+)-----.+?-----END \1-----", re.DOTALL)
_HEADER_LIMIT = 256  # bytes of one header's value: a key id or a signature is far shorter

# Why a message is not believed, as the remediator counts it (with its own: stale, future, unknown_gpu, ...)
Reason = Literal["unsigned", "unknown_key", "bad_signature", "invalid"]

# Kafka's headers as confluent-kafka gives them: (name, value) pairs, value bytes or None
Headers = Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None


class SigningSettings(Section):
    """Signed verdicts and alerts (shared/contract/signing.py): the scorer signs, the remediator verifies."""

    private_key_file: Path | None = None
    """The scorer's Ed25519 private key (PKCS8 PEM, readable by its owner only), made by `python -m
    shared.contract.signing keygen`; unset: its messages go unsigned, and a remediator refuses them."""
    trusted_keys_file: Path | None = None
    """The remediator's keyring: a file of PEM public keys, or a directory of `*.pem`; several keys while
    one is rotated out. The remediator needs it: it acts on signed messages only."""
    max_age_s: float = Field(default=900.0, gt=0, le=7 * 86400)
    """The remediator refuses a verdict or alert whose own time is older than this (stale, or replayed)."""
    max_future_s: float = Field(default=60.0, ge=0, le=3600)
    """The remediator refuses a verdict or alert whose own time is further ahead of its clock than this."""


class UntrustedError(ContractError):
    """A message whose signature does not hold: `reason` (a metric label) and a detail without secrets."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: Reason = reason
        self.detail = detail


def key_id(public: Ed25519PublicKey) -> str:
    """The first 16 hex digits of the SHA-256 of the raw 32-byte public key."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def signed_bytes(topic: str, key: bytes | None, value: Any) -> bytes:
    """What is signed for a message of `topic` with `key` and the JSON `value` (a parsed object)."""
    if "\n" in topic:
        raise ContractError("a topic name cannot hold a newline")
    return CONTEXT + topic.encode() + b"\n" + (key or b"") + b"\n" + canonical_bytes(value)


class Signer:
    """Signs the scorer's messages with its private key."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.kid = key_id(private.public_key())

    def sign(self, topic: str, key: bytes | None, value: Any) -> bytes:
        return self._private.sign(signed_bytes(topic, key, value))

    def headers(self, topic: str, key: str | None, value: Any) -> dict[str, bytes]:
        """The gh-kid and gh-sig headers of the message `value` produced to `topic` under `key`."""
        signature = self.sign(topic, key.encode() if key is not None else None, value)
        return {KID_HEADER: self.kid.encode(), SIG_HEADER: base64.b64encode(signature)}

    @classmethod
    def load(cls, path: Path) -> Signer:
        """The private key in `path`; ConfigError when unreadable, not Ed25519, or readable by others."""
        try:
            mode = path.stat().st_mode
            data = path.read_bytes()
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the signing key: {e.strerror}") from e
        if mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
            raise ConfigError(f"{path}: the signing key is readable or writable by others (chmod 0600 it)")
        try:
            private = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as e:  # no detail: it could quote the key
            raise ConfigError(f"{path}: not an unencrypted PEM private key") from e
        if not isinstance(private, Ed25519PrivateKey):
            raise ConfigError(f"{path}: the signing key must be Ed25519")
        return cls(private)


def load_signer(settings: SigningSettings) -> Signer | None:
    """The scorer's signer, None when no private key is configured."""
    return None if settings.private_key_file is None else Signer.load(settings.private_key_file)


def _public_keys(path: Path, data: bytes) -> list[Ed25519PublicKey]:
    keys = []
    for block in _PEM_BLOCK.finditer(data):
        if block.group(1) != b"PUBLIC KEY":
            raise ConfigError(
                f"{path}: holds a {block.group(1).decode()} block: a keyring holds public keys only"
            )
        try:
            public = serialization.load_pem_public_key(block.group(0))
        except ValueError as e:
            raise ConfigError(f"{path}: a PEM block is not a public key") from e
        if not isinstance(public, Ed25519PublicKey):
            raise ConfigError(f"{path}: a key is not Ed25519")
        keys.append(public)
    return keys


@dataclass(frozen=True, slots=True)
class Verified:
    """A message whose signature holds: its parsed JSON object, and the key id that signed it."""

    value: dict[str, Any]
    kid: str


class Keyring:
    """The public keys the remediator trusts, by key id."""

    def __init__(self, keys: Mapping[str, Ed25519PublicKey]) -> None:
        if not keys:
            raise ConfigError("the keyring holds no key: nothing could be verified")
        self.keys = dict(keys)

    @classmethod
    def of(cls, *publics: Ed25519PublicKey) -> Keyring:
        return cls({key_id(p): p for p in publics})

    @classmethod
    def load(cls, path: Path) -> Keyring:
        """The keys of a file of PEM public keys, or of every `*.pem` in a directory; ConfigError when it
        is unreadable, holds anything but Ed25519 public keys, or no key at all."""
        try:
            files = sorted(path.glob("*.pem")) if path.is_dir() else [path]
            found = [key for file in files for key in _public_keys(file, file.read_bytes())]
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the trusted keys: {e.strerror}") from e
        if not found:
            raise ConfigError(f"{path}: no public key in it: the remediator would believe nothing")
        return cls.of(*found)

    def verify(self, *, topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> Verified:
        """The message's parsed value when its signature holds for `topic` and `key`; else UntrustedError."""
        kid_raw, sig_raw = _one(headers, KID_HEADER), _one(headers, SIG_HEADER)
        if kid_raw is None and sig_raw is None:
            raise UntrustedError("unsigned", "no gh-kid and gh-sig headers")
        if kid_raw is None or sig_raw is None:
            raise UntrustedError("bad_signature", "only one of gh-kid and gh-sig")
        kid = kid_raw.decode("ascii", "replace")
        if not _KID.match(kid):
            raise UntrustedError("bad_signature", "gh-kid is not 16 hex digits")
        public = self.keys.get(kid)
        if public is None:
            raise UntrustedError("unknown_key", f"key {kid} is not in the keyring")
        try:
            signature = base64.b64decode(sig_raw, validate=True)
        except (binascii.Error, ValueError) as e:
            raise UntrustedError("bad_signature", "gh-sig is not base64") from e
        if len(signature) != 64:  # an Ed25519 signature
            raise UntrustedError("bad_signature", f"gh-sig holds {len(signature)} bytes, not 64")
        if value is None:
            raise UntrustedError("invalid", "the message has no value")
        try:
            parsed = parse_canonical_input(value)
            public.verify(signature, signed_bytes(topic, key, parsed))
        except InvalidSignature as e:
            raise UntrustedError("bad_signature", f"the signature does not hold for key {kid}") from e
        except ContractError as e:
            raise UntrustedError("invalid", str(e)[:200]) from e
        return Verified(parsed, kid)


def _one(headers: Headers, name: str) -> bytes | None:
    """The value of header `name`, None when absent; UntrustedError when repeated, empty or oversized."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    found = [value for header, value in pairs if header == name]
    if not found:
        return None
    if len(found) > 1:
        raise UntrustedError("bad_signature", f"{name} appears {len(found)} times")
    value = found[0]
    raw = value.encode() if isinstance(value, str) else value
    if not raw or len(raw) > _HEADER_LIMIT:
        raise UntrustedError("bad_signature", f"{name} is empty or too long")
    return raw


def keygen(directory: Path, name: str = "scorer", *, if_missing: bool = False) -> tuple[str, Path, Path]:
    """A new key pair: DIR/private/NAME.key (0600) and DIR/trusted/NAME.pem; (key id, private, public).

    With `if_missing`, a pair already there is kept (its id returned); otherwise an existing file is an
    error, never overwritten."""
    if not re.match(r"^[A-Za-z0-9._-]{1,64}$", name) or name.startswith("."):
        raise ConfigError(f"key name {name!r}: letters, digits, '.', '_' and '-' only")
    private_path, public_path = directory / "private" / f"{name}.key", directory / "trusted" / f"{name}.pem"
    if if_missing and private_path.exists() and public_path.exists():
        return Signer.load(private_path).kid, private_path, public_path
    private = Ed25519PrivateKey.generate()
    (directory / "private").mkdir(mode=0o700, parents=True, exist_ok=True)
    (directory / "trusted").mkdir(mode=0o755, parents=True, exist_ok=True)
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as e:
        raise ConfigError(f"{private_path} exists: a key is never overwritten (use another --name)") from e
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public_path.write_bytes(public)
    return key_id(private.public_key()), private_path, public_path


def key_ids(path: Path) -> list[str]:
    """The key id of each key in `path`: a private key, or a keyring (file or directory)."""
    data = b"" if path.is_dir() else path.read_bytes()
    if b"PRIVATE KEY" in data:
        return [Signer.load(path).kid]
    return sorted(Keyring.load(path).keys)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shared.contract.signing", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("keygen", help="a new key pair: DIR/private/NAME.key and DIR/trusted/NAME.pem")
    gen.add_argument("directory", type=Path)
    gen.add_argument("--name", default="scorer", help="the pair's file name (default: scorer)")
    gen.add_argument("--if-missing", action="store_true", help="keep the pair when both files exist")
    ids = commands.add_parser("kid", help="the key id of each key in the files")
    ids.add_argument("files", type=Path, nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.command == "keygen":
            kid, private, public = keygen(args.directory, args.name, if_missing=args.if_missing)
            print(f"key {kid}: private {private}, public {public}")
        else:
            for path in args.files:
                print(f"{path}: {' '.join(key_ids(path))}")
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

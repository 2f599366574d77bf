"""A kubeconfig read into what an HTTPS client needs: the server, the CA, the client's certificate or token.

Only what the remediator needs of the format (clusters, users, contexts, the
current context; inline `-data` or file paths, relative to the file; a bearer
token or token file). Exec and auth-provider plugins are refused with a clear
error rather than half-supported, and so is `insecure-skip-tls-verify`: the
remediator can cordon a fleet, so it always checks whom it talks to.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shared.plumbing.errors import ConfigError


@dataclass(frozen=True)
class KubeAccess:
    server: str
    ssl_context: ssl.SSLContext
    headers: dict[str, str] = field(default_factory=dict)
    user: str = ""


def _named(entries: Any, name: str, what: str, path: Path) -> dict[str, Any]:
    for entry in entries or []:
        if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get(what), dict):
            return dict(entry[what])
    raise ConfigError(f"{path}: no {what} named {name!r}")


def _material(section: dict[str, Any], key: str, base: Path, path: Path) -> bytes | None:
    """A PEM item given inline (`key-data`, base64) or as a file (`key`, relative to the kubeconfig)."""
    if section.get(f"{key}-data"):
        try:
            return base64.b64decode(str(section[f"{key}-data"]), validate=True)
        except (binascii.Error, ValueError) as e:
            raise ConfigError(f"{path}: {key}-data is not base64: {e}") from e
    if section.get(key):
        file = base / str(section[key])
        try:
            return file.read_bytes()
        except OSError as e:
            raise ConfigError(f"{path}: cannot read {key} {file}: {e}") from e
    return None


def _load_client_cert(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # ssl loads a certificate chain from files only: a private folder, removed at once.
    with tempfile.TemporaryDirectory(prefix="gpuhealth-kube-") as folder:
        cert_file, key_file = Path(folder) / "client.crt", Path(folder) / "client.key"
        for file, data in ((cert_file, cert), (key_file, key)):
            fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        context.load_cert_chain(cert_file, key_file)


def load_kubeconfig(path: Path, context_name: str | None = None) -> KubeAccess:
    """The access `path` describes (its current context unless named); ConfigError saying what is wrong."""
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the kubeconfig: {e}") from e
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: not a kubeconfig")
    name = context_name or config.get("current-context")
    if not name:
        raise ConfigError(f"{path}: no current-context and none named")
    ctx = _named(config.get("contexts"), str(name), "context", path)
    cluster = _named(config.get("clusters"), str(ctx.get("cluster")), "cluster", path)
    user = _named(config.get("users"), str(ctx.get("user")), "user", path)
    base = path.parent
    server = str(cluster.get("server") or "")
    if not server.startswith("https://"):
        raise ConfigError(f"{path}: the cluster's server must be an https:// URL, not {server!r}")
    if cluster.get("insecure-skip-tls-verify"):
        raise ConfigError(f"{path}: insecure-skip-tls-verify is refused: give the cluster's CA")
    if "exec" in user or "auth-provider" in user:
        raise ConfigError(
            f"{path}: exec and auth-provider credentials are not supported: use a certificate or a token"
        )
    ssl_context = ssl.create_default_context()
    ca = _material(cluster, "certificate-authority", base, path)
    try:
        if ca is not None:
            ssl_context.load_verify_locations(cadata=ca.decode("ascii"))
        cert = _material(user, "client-certificate", base, path)
        key = _material(user, "client-key", base, path)
        if (cert is None) != (key is None):
            raise ConfigError(f"{path}: a client certificate needs its key, and a key its certificate")
        if cert is not None and key is not None:
            _load_client_cert(ssl_context, cert, key)
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{path}: unusable certificate or key: {e}") from e
    headers: dict[str, str] = {}
    token = user.get("token")
    if not token and user.get("tokenFile"):
        try:
            token = (base / str(user["tokenFile"])).read_text().strip()
        except OSError as e:
            raise ConfigError(f"{path}: cannot read tokenFile: {e}") from e
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return KubeAccess(
        server=server.rstrip("/"), ssl_context=ssl_context, headers=headers, user=str(ctx.get("user"))
    )

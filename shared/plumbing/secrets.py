"""Secrets in settings: masked wherever settings are logged, and known defaults refused off loopback.

`masked` is what a log line may show of a settings tree: every ``SecretStr`` is ``**********`` (pydantic
does that), and so is every value of a mapping (``GPUHEALTH_KAFKA__EXTRA``, headers, ...) whose key names a
secret (``sasl.password``, ``ssl.key.pem``, ``Authorization``, ...), and the user info of any URL
(``https://user:pass@host`` shows as ``https://***@host``).

`default_secrets_off_loopback` names each secret still at a value everybody knows (the project's own
defaults, the user name again, ``change-me``...) in a section that reaches past this machine (its
``host``, ``bootstrap_servers``, ``bind`` or ``url`` is not loopback): a service refuses to start with one
(shared.plumbing.service.start_service), so a password that is fine on a laptop never guards a fleet.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, SecretStr

MASK = "**********"
# A mapping's key whose value is a secret: librdkafka's and HTTP's names among them.
SECRET_KEY = re.compile(
    r"(password|passwd|secret|token|credential|api[._-]?key|private|jaas|authorization|cookie|"
    r"(^|[._-])key\.pem$|(^|[._-])keystore\.key$|(^|[._-])key$)",
    re.IGNORECASE,
)
URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@")
# Values everybody knows: this project's defaults (scripts/env.sh, .env.example) and the usual suspects.
KNOWN_DEFAULTS = frozenset(
    {
        "gpuhealth",
        "gpuhealth_reader",
        "gpuhealth_acknowledger",
        "gpuhealth_sink",
        "gpuhealth_scorer",
        "gpuhealth_remediator",
        "gpuhealth_lifecycle",
        "gpu_health",
        "postgres",
        "admin",
        "change-me",
        "changeme",
        "change_me",
        "password",
        "secret",
        "test",
        "test-key-123",
        "",
    }
)
# The fields of a section that say where it reaches.
REACH_FIELDS = ("host", "bootstrap_servers", "bind", "url", "base_url")


def mask_value(key: str, value: Any) -> Any:
    """`value` as a log may show it, under `key` (a mapping's key or a field's name)."""
    if isinstance(value, dict):
        return {k: mask_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_value(key, v) for v in value]
    if isinstance(value, str):
        if value and SECRET_KEY.search(key) and not key.lower().endswith(("location", "file", "path")):
            return MASK
        return URL_USERINFO.sub(r"\g<scheme>***@", value)
    return value


def masked(settings: BaseModel) -> dict[str, Any]:
    """The settings as a dict fit for a log line: no secret in it, whatever its shape."""
    dumped = settings.model_dump(mode="json")
    return {k: mask_value(k, v) for k, v in dumped.items()}


def is_loopback(address: str) -> bool:
    """Whether `address` (host, host:port, a list of them, a URL, a Unix socket's folder) stays here."""
    parts = [p.strip() for p in address.split(",") if p.strip()]
    if not parts:
        return True
    return all(_one_loopback(p) for p in parts)


def _one_loopback(address: str) -> bool:
    if address.startswith("/"):
        return True  # a Unix socket
    host = (
        urlsplit(address if "://" in address else f"//{address}").hostname
        if not _bare_ipv6(address)
        else address
    )
    if host is None:
        return False
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bare_ipv6(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 6
    except ValueError:
        return False


def _sections(model: BaseModel, path: str) -> Iterator[tuple[str, BaseModel]]:
    yield path, model
    for name in type(model).model_fields:
        value = model.__dict__.get(name)  # not getattr: a deprecated field warns on every read
        if isinstance(value, BaseModel):
            yield from _sections(value, f"{path}__{name}".upper() if path else name.upper())


def default_secrets_off_loopback(settings: BaseModel, prefix: str = "GPUHEALTH_") -> list[str]:
    """Each secret of `settings` still at a well-known value where its section reaches past loopback."""
    found = []
    for path, section in _sections(settings, ""):
        fields = type(section).model_fields
        reach = [str(section.__dict__[f]) for f in REACH_FIELDS if f in fields and section.__dict__.get(f)]
        if not reach or all(is_loopback(r) for r in reach):
            continue
        user = str(section.__dict__.get("user") or section.__dict__.get("sasl_username") or "")
        for name in fields:
            value = section.__dict__.get(name)
            if not isinstance(value, SecretStr):
                continue
            secret = value.get_secret_value()
            if secret.lower() in KNOWN_DEFAULTS or (user and secret == user):
                where = f"{prefix}{path}__{name.upper()}" if path else f"{prefix}{name.upper()}"
                found.append(f"{where} is a well-known default, and {', '.join(reach)} is not loopback")
    return found

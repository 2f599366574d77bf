"""Every message the scorer announces names its GPU's host, alerts included (gpu-alerts and gpu-health).

Applied to a cycle's messages before they are produced, from the inventory
(gpu_assets), so an alert about a GPU that has just left the fleet still says
where it was. A GPU missing from the inventory gets "" rather than no field,
so consumers always find the key.
"""

from __future__ import annotations

from typing import Any

from shared.store import fleet

from .messages import Message, named


def with_hostnames(conn: Any, messages: list[Message]) -> list[Message]:
    missing = sorted({key for _, key, value in messages if not value.hostname})
    hosts: dict[str, str] = {}
    if missing:
        hosts = fleet.hostnames(conn, missing)
    messages[:] = named(messages, hosts)
    return messages

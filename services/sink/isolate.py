"""Finding the records PostgreSQL refuses in a batch: halve a refused part until each culprit stands alone.

Both the samples writer and the records loop store a batch in one
transaction; when the database refuses it for a data reason
(DataRefusedError), the batch is stored again part by part, each part under a
savepoint, and a refused part is halved: k bad records among n cost about
k log n tries, and every record that can be stored is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from shared.plumbing.errors import DataRefusedError

T = TypeVar("T")


def split_refused(
    items: Sequence[T], store_part: Callable[[list[T]], DataRefusedError | None]
) -> list[tuple[T, DataRefusedError]]:
    """Store `items` part by part with `store_part` (which stores a part whole, or nothing of it and
    returns the refusal); the records refused on their own, each with the database's refusal."""
    refused: list[tuple[T, DataRefusedError]] = []
    parts = [list(items)] if items else []
    while parts:
        part = parts.pop()
        fault = store_part(part)
        if fault is None:
            continue
        if len(part) > 1:
            half = len(part) // 2
            parts += [part[half:], part[:half]]  # the first half is tried first
            continue
        refused.append((part[0], fault))
    return refused

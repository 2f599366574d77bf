"""psycopg's own binary COPY form of a row: what shared.fastcopy must produce byte for byte."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import postgres
from psycopg._copy_base import format_row_binary
from psycopg.adapt import Transformer
from psycopg.pq import Format


def binary_row(row: Sequence[Any], types: Sequence[str]) -> bytes:
    """The row as psycopg's binary COPY writes it (field count first), each value as `types`."""
    transformer = Transformer()
    transformer.set_dumper_types([postgres.types[t].oid for t in types], Format.BINARY)
    out = bytearray()
    format_row_binary(row, transformer, out)
    return bytes(out)

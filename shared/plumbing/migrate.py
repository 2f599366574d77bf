"""Schema migrations: apply `schema/NNNN_name.sql` in order, each exactly once.

Applied versions are recorded in `schema_migrations` with a checksum; a file
edited after it was applied is an error rather than silently skipped. One
advisory lock serialises concurrent runners (several services starting at
once). Each migration runs in its own transaction, so a failing file leaves
nothing half-applied. Command line: ``python -m shared.plumbing.migrate [--schema S]``.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import re
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from shared.plumbing.db import connect
from shared.plumbing.errors import DatabaseError, GpuHealthError, MigrationError
from shared.plumbing.logging import setup_logging
from shared.settings.common import DatabaseSettings, Settings, load_settings
from shared.store import migrations as store
from shared.store.server import create_schema, current_schema, drop_schema, set_search_path, timescale_info

log = logging.getLogger(__name__)

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schema"
_FILENAME = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def discover(directory: Path = SCHEMA_DIR) -> list[Migration]:
    """The migrations in `directory`, ordered; malformed names and duplicate versions raise."""
    if not directory.is_dir():
        raise MigrationError(f"migration folder {directory} does not exist")
    migrations: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILENAME.match(path.name)
        if not match:
            raise MigrationError(f"{path.name}: migration files are named NNNN_lower_snake.sql")
        version = int(match["version"])
        if version in migrations:
            raise MigrationError(f"{path.name}: version {version:04d} is used twice")
        text = path.read_text(encoding="utf-8")
        if not text.strip():
            raise MigrationError(f"{path.name}: migration is empty")
        migrations[version] = Migration(version=version, name=match["name"], sql=text)
    return [migrations[v] for v in sorted(migrations)]


def apply_migrations(
    conn: psycopg.Connection[tuple[object, ...]], migrations: list[Migration]
) -> list[Migration]:
    """Apply the migrations not yet recorded; return those applied by this call.

    Runs in the schema first on the connection's search_path.
    """
    if conn.autocommit:
        raise MigrationError("apply_migrations needs a connection with autocommit off")
    applied_now: list[Migration] = []
    schema = current_schema(conn)
    # The applied files call TimescaleDB's functions unqualified: its schema follows this one while
    # they run, and the connection is bound to this schema alone again afterwards.
    set_search_path(conn, schema, then_extensions=True)
    store.lock_runners(conn)
    try:
        recorded = store.recorded_checksums(conn)
        for migration in migrations:
            if migration.version in recorded:
                if recorded[migration.version] != migration.checksum:
                    raise MigrationError(
                        f"{migration.version:04d}_{migration.name}.sql was changed after it was"
                        " applied; add a new migration instead of editing an applied one"
                    )
                continue
            log.info("applying migration %04d_%s", migration.version, migration.name)
            try:
                store.apply_migration(
                    conn,
                    version=migration.version,
                    name=migration.name,
                    checksum=migration.checksum,
                    statements=migration.sql,
                )
            except DatabaseError as e:
                raise MigrationError(f"{migration.version:04d}_{migration.name}.sql failed: {e}") from e
            applied_now.append(migration)
    finally:
        store.unlock_runners(conn)
        set_search_path(conn, schema)
    return applied_now


def check_migrated(
    conn: psycopg.Connection[tuple[object, ...]], migrations: list[Migration] | None = None
) -> None:
    """A service's start check: every migration this build knows is applied in the connection's schema.

    MigrationError naming the schema and what it lacks (a half-applied upgrade, a mistyped schema), so
    the service refuses to start instead of failing later, table by table.
    """
    schema = current_schema(conn)
    known = discover() if migrations is None else migrations
    applied = store.applied_versions(conn)
    if applied is None:
        raise MigrationError(
            f"schema {schema} holds no migrations: run `python -m shared.plumbing.migrate` into it first"
        )
    missing = [f"{m.version:04d}_{m.name}" for m in known if m.version not in applied]
    if missing:
        raise MigrationError(
            f"schema {schema} lacks migrations {', '.join(missing)}:"
            " apply them (python -m shared.plumbing.migrate)"
        )


@contextmanager
def migrated_schema(db: DatabaseSettings, prefix: str) -> Iterator[DatabaseSettings]:
    """A throwaway schema with every migration applied (benches, evaluations); dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with connect(db, autocommit=True) as conn:
        create_schema(conn, name)
    scoped = db.model_copy(update={"search_path": name})
    try:
        with connect(scoped) as conn:
            apply_migrations(conn, discover())
        yield scoped
    finally:
        with connect(db, autocommit=True) as conn:
            drop_schema(conn, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.plumbing.migrate", description=__doc__)
    parser.add_argument("--schema", help="apply into this schema (default: the role's search_path)")
    parser.add_argument("--dir", type=Path, default=SCHEMA_DIR, help="migration folder")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(Settings)
        setup_logging(settings.log.level, json_format=settings.log.json_format, service="migrate")
        with connect(settings.db, schema=args.schema) as conn:
            applied = apply_migrations(conn, discover(args.dir))
            info = timescale_info(conn)
    except GpuHealthError as e:
        log.error("%s", e)
        return 1
    log.info(
        "migrations done",
        extra={
            "applied": [f"{m.version:04d}_{m.name}" for m in applied],
            "timescaledb": info.version,
            "license": info.license,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

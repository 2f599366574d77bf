"""SQL lives in shared/store/ only: every string literal elsewhere in the code is checked for SQL's shape.

The scan reads each .py file under services/, shared/, evaluation/, bench/ and
gpuhealth/ (shared/store/ aside; migrations are .sql files in schema/) with
`ast`, and looks at every string the code can run: constants, f-strings (each
``{...}`` read as a name) and ``+`` of those, split at ``;``. Docstrings and
other bare string statements are never executed, so they are not read. A
string is SQL when one of its statements

- starts with a statement verb in CAPITALS in its shape (``SELECT x``,
  ``INSERT INTO t``, ``UPDATE t SET``, ``DELETE FROM t``, ``COPY t FROM``,
  ``CREATE TABLE``/``ALTER``/``DROP``, ``TRUNCATE``, ``WITH n AS (``,
  ``LISTEN``/``NOTIFY``, ``LOCK``, ``VACUUM``, ``ANALYZE``, ``SET x =``, ``GRANT``...);
- starts with a verb in lower case in its full grammatical shape *and* holds
  SQL syntax (``(``, ``*``, ``=``, ``::``, a quoted literal, ``;``, a named
  or numbered bind parameter): prose never has both;
- starts with a CAPITAL clause (`` WHERE a = %s``, `` ORDER BY``, ``ON CONFLICT``):
  a fragment of a statement built in parts;
- calls a function only PostgreSQL has (``pg_notify(``, advisory locks,
  ``show_chunks(``/``drop_chunks(``, ``time_bucket(``, ``set_config(``) or casts
  with ``::regclass``-like syntax.

A call of psycopg's ``sql.SQL(...)`` is SQL whatever it holds. Titlecase and
lowercase prose (log messages, CLI help, Prometheus help: "select the GPUs to
show", "create topic", "Delete from the list") is not SQL.
"""

from __future__ import annotations

import ast
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.paths import REPO

SCANNED = ("services", "shared", "evaluation", "bench", "gpuhealth")
STORE = REPO / "shared" / "store"
# The benches' synthetic fleets: fixtures that fill scratch schemas, kept beside the benches, out of the
# production store and the wheel. The only other file allowed SQL.
BENCH_FLEETS = REPO / "bench" / "fleets.py"

# A name: plain, "quoted", schema-qualified, or a str.format field standing for one ({} / {table}).
_ID = r'(?:"[^"]+"|[A-Za-z_][\w$]*|\{\w*\})(?:\s*\.\s*(?:"[^"]+"|[A-Za-z_][\w$]*|\{\w*\}))*'
_OBJECT = (
    r"(?:OR\s+REPLACE\s+)?(?:(?:TEMP|TEMPORARY|UNLOGGED|UNIQUE|MATERIALIZED|GLOBAL|LOCAL)\s+)*"
    r"(?:TABLE|INDEX|VIEW|SCHEMA|EXTENSION|FUNCTION|PROCEDURE|TRIGGER|ROLE|USER|TYPE|SEQUENCE|POLICY|DOMAIN"
    r"|DATABASE|PUBLICATION|SUBSCRIPTION|AGGREGATE|RULE|OWNED)\b"
)
# Statement verbs written in CAPITALS, in their shape (case-sensitive).
_UPPER = re.compile(
    r"(?:EXPLAIN\s+(?:ANALYZE\s+)?)?(?:"
    rf"SELECT\s+\S|INSERT\s+INTO\s+{_ID}|UPDATE\s+(?:ONLY\s+)?{_ID}(?:\s+(?:AS\s+)?{_ID})?\s+SET\s"
    rf"|DELETE\s+FROM\s+{_ID}|COPY\s+(?:\(|{_ID}).*?\b(?:FROM|TO)\b|(?:CREATE|ALTER|DROP)\s+{_OBJECT}"
    rf"|TRUNCATE\s+(?:TABLE\s+)?{_ID}|WITH\s+(?:RECURSIVE\s+)?{_ID}(?:\s*\([^)]*\))?\s+AS\s+"
    rf"(?:NOT\s+)?(?:MATERIALIZED\s+)?\(|(?:LISTEN|UNLISTEN|NOTIFY)\s+{_ID}|LOCK\s+(?:TABLE\s+)?{_ID}"
    rf"|VACUUM\b|ANALYZE\b|SET\s+(?:LOCAL\s+|SESSION\s+)?{_ID}\s*(?:=|TO\b)|(?:GRANT|REVOKE)\s+\S"
    rf"|REFRESH\s+MATERIALIZED\s+VIEW\b|CALL\s+{_ID}\s*\()",
    re.DOTALL,
)
# The same verbs in lower (or any) case: only their full shape counts, and only beside SQL syntax.
_SELECT_LIST = (
    rf"(?:\*|\d|{_ID}\(|{_ID}::|[A-Za-z_]\w*\.[A-Za-z_]|{_ID}\s*,\s*{_ID}.*?\bFROM\s+{_ID}"
    rf"|{_ID}\s+FROM\s+{_ID}\s+(?:WHERE|JOIN|ORDER\s+BY|GROUP\s+BY|LIMIT)\b)"
)
_ANY_CASE = re.compile(
    rf"(?:SELECT\s+(?:DISTINCT\s+)?{_SELECT_LIST}"
    rf"|INSERT\s+INTO\s+{_ID}\s*(?:\(|VALUES\b|SELECT\b|DEFAULT\s+VALUES\b)"
    rf"|UPDATE\s+{_ID}(?:\s+(?:AS\s+)?{_ID})?\s+SET\s+{_ID}\s*="
    rf"|DELETE\s+FROM\s+{_ID}(?:\s+(?:AS\s+)?{_ID})?\s+(?:WHERE|USING|RETURNING)\b"
    rf"|COPY\s+(?:\(\s*SELECT\b|{_ID}\s*(?:\([^)]*\))?\s+(?:FROM\s+STDIN|TO\s+STDOUT|FROM\s+'|TO\s+'))"
    rf"|(?:CREATE|ALTER|DROP)\s+{_OBJECT}\s*(?:IF\s+(?:NOT\s+)?EXISTS\s+)?{_ID}\s*(?:\(|\Z|AS\b|ON\b|ADD\b)"
    rf"|TRUNCATE\s+(?:TABLE\s+)?{_ID}\s*(?:\Z|CASCADE\b|RESTART\b)"
    rf"|WITH\s+(?:RECURSIVE\s+)?{_ID}\s+AS\s+(?:NOT\s+)?(?:MATERIALIZED\s+)?\(\s*SELECT\b"
    rf"|LOCK\s+TABLE\s+{_ID})",
    re.IGNORECASE | re.DOTALL,
)
_SYNTAX = re.compile(r"[(*=;]|::|'[^']*'|%\(\w+\)s|\$\d")
# A statement built in parts: a fragment that starts with a clause in CAPITALS (case-sensitive).
_CLAUSE = re.compile(
    r"(?:WHERE|AND|OR|FROM|(?:LEFT\s+|RIGHT\s+|INNER\s+|CROSS\s+|FULL\s+)?JOIN|ON\s+CONFLICT|ORDER\s+BY"
    r"|GROUP\s+BY|RETURNING|VALUES|HAVING|LIMIT|OFFSET|UNION(?:\s+ALL)?|DO\s+(?:UPDATE|NOTHING))"
    r"\s+(?:\(|\*|%|\$\d|[A-Za-z_\"]\S*\s*(?:[=<>(,]|::|\Z|\bIS\b|\bIN\b|ASC\b|DESC\b|\bAND\b|\bLIMIT\b)|SET\b)",
    re.DOTALL,
)
# Only PostgreSQL calls these or writes casts this way (any case, anywhere in the string).
_POSTGRES_ONLY = re.compile(
    r"\b(?:pg_notify|pg_(?:try_)?advisory_(?:xact_)?(?:un)?lock(?:_shared)?|show_chunks|drop_chunks"
    r"|time_bucket|set_config|current_setting|make_interval|hashtext)\s*\("
    r"|\w::(?:regclass|jsonb?|timestamptz|timestamp|interval|bigint|int[248]?|integer|smallint|text|oid"
    r"|float[48]|numeric|date|boolean|uuid)\b",
    re.IGNORECASE,
)
_LEADING = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/|\()*", re.DOTALL)


def is_sql(text: str) -> bool:
    """Whether `text` (a string literal's value) holds SQL, by the rules in the module docstring."""
    if _POSTGRES_ONLY.search(text):
        return True
    for piece in text.split(";"):
        statement = _LEADING.sub("", piece, count=1)
        if _UPPER.match(statement) or _CLAUSE.match(statement):
            return True
        if _ANY_CASE.match(statement) and _SYNTAX.search(statement):
            return True
    return False


def _text(node: ast.AST) -> str | None:
    """The value of a string expression: a constant, an f-string (``{...}`` as a name), or ``+`` of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        return node.value if isinstance(node.value, str) else node.value.decode("latin-1")
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(part) or "_f_" for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def _is_sql_composition(node: ast.Call) -> bool:
    """psycopg's ``sql.SQL(...)`` (``psycopg.sql.SQL(...)``, a bare ``SQL(...)``): SQL, whatever it holds."""
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "SQL") or (
        isinstance(func, ast.Attribute)
        and func.attr == "SQL"
        and (
            (isinstance(func.value, ast.Name) and func.value.id == "sql")
            or (isinstance(func.value, ast.Attribute) and func.value.attr == "sql")
        )
    )


def sql_lines(source: str) -> list[int]:
    """The lines of `source` where SQL starts (outside docstrings and bare string statements)."""
    tree = ast.parse(source)
    skipped = {
        id(part)
        for stmt in ast.walk(tree)
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant | ast.JoinedStr)
        for part in ast.walk(stmt.value)
    }
    found: set[int] = set()
    seen: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_sql_composition(node):
            found.add(node.lineno)
        if not isinstance(node, ast.expr) or id(node) in skipped or id(node) in seen:
            continue
        text = _text(node)
        if text is None:
            continue
        seen.update(id(child) for child in ast.walk(node))  # one string, read whole
        if is_sql(text):
            found.add(node.lineno)
    return sorted(found)


def sql_outside_store() -> dict[str, list[int]]:
    """file (relative to the repository) -> lines holding SQL, for every scanned file that has some."""
    found = {}
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            if STORE in path.parents or path == BENCH_FLEETS:
                continue
            lines = sql_lines(path.read_text(encoding="utf-8"))
            if lines:
                found[path.relative_to(REPO).as_posix()] = lines
    return found


def test_no_sql_outside_the_store() -> None:
    found = sql_outside_store()
    named = [f"{f}:{line}" for f, lines in found.items() for line in lines]
    assert not named, "SQL outside shared/store/ (move it into a shared.store module):\n" + "\n".join(named)


def test_the_store_itself_is_seen_as_sql() -> None:
    """The detector finds the statements where they belong (so a silent detector cannot pass the scan)."""
    for module in ("archive.py", "retention.py", "migrations.py", "server.py", "archive_duckdb.py"):
        assert sql_lines((STORE / module).read_text(encoding="utf-8")), module
    assert sql_lines(BENCH_FLEETS.read_text(encoding="utf-8")), BENCH_FLEETS


SQL = [
    "SELECT 1",
    "SELECT count(*) FROM gpu_metrics",
    "\n    SELECT a.gpu_uuid\n      FROM gpu_assets a\n     WHERE a.rack = %(rack)s\n",
    "SELECT pg_advisory_lock(%s)",
    "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
    "UPDATE gpu_alerts SET state = 'resolved' WHERE id = %s",
    "DELETE FROM sink_dead_letters WHERE delivered_at < now()",
    "COPY gpu_metrics (time, gpu_uuid) FROM STDIN (FORMAT BINARY)",
    "COPY {} ({}) FROM STDIN (FORMAT BINARY)",
    "COPY (SELECT * FROM r) TO STDOUT (FORMAT csv)",
    "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY)",
    "CREATE TEMP TABLE _stage (x int) ON COMMIT DROP",
    "ALTER TABLE gpu_metrics ADD COLUMN x int",
    "DROP SCHEMA test CASCADE",
    "TRUNCATE _stage_metrics, _stage_latest",
    "WITH latest AS (SELECT max(time) FROM gpu_latest) SELECT * FROM latest",
    "LISTEN gpuhealth_scored",
    "NOTIFY gpuhealth_scored",
    "LOCK TABLE gpu_metrics IN SHARE MODE",
    "VACUUM ANALYZE gpu_metrics",
    "ANALYZE",
    "SET statement_timeout = 5000",
    "SET TimeZone = 'UTC'",
    "GRANT SELECT ON gpu_metrics TO api_reader",
    "EXPLAIN ANALYZE SELECT * FROM gpu_latest",
    "BEGIN; DELETE FROM x",
    "-- the newest\nSELECT * FROM gpu_latest",
    " WHERE gpu_uuid = %(g)s AND time >= %(from)s",
    " ORDER BY time DESC LIMIT 1",
    "ON CONFLICT (gpu_uuid, time) DO NOTHING",
    "pg_try_advisory_lock(%s, hashtext(current_schema()))",
    "SELECT pg_notify('gpuhealth_scored', current_schema())",
    "%s::regclass",
    "select * from gpu_metrics where gpu_uuid = %(g)s",
    "select count(*) from gpu_latest",
    "insert into gpu_alerts (gpu_uuid) values (%s)",
    "update gpu_alerts set state = 'open' where id = $1",
    "delete from gpu_events where time < %(t)s",
    "copy gpu_metrics from stdin (format binary)",
    "create table t (x int)",
    "with recent as (select 1) select * from recent",
]
PROSE = [
    "select the GPUs to show",
    "Select which GPUs to list (repeatable).",
    "select GPUs by label (repeatable)",
    "create topic",
    "cannot create topic %s: %s",
    "Delete from the list",
    "delete from disk",
    "DELETE goes to /faults/<id>",
    "update the settings, then restart",
    "Update gpu inventory set by the collector",
    "drop the chunk (it was archived)",
    "dropping %s by its range would drop other chunks; left alone",
    "copy the file to the archive",
    "raw binary COPY",
    "binary COPY TO STDOUT rows/s",
    "archive rows/s (read+write+fsync+verify+drop)",
    "With care: as (rarely) needed",
    "listen on %s:%d",
    "cannot listen on",
    "insert into the queue",
    "Chunks dropped by retention, per table.",
    "Rows selected from the stream per second.",
    "a DuckDB query over gpu_metrics, gpu_events, gpu_metrics_1min",
    "only rows from this time (ISO 8601, UTC if no zone)",
    "retention skipped this round: %s",
    "forgot %d delivered dead letters",
    "the straight COPY was refused, taking the careful path: %s",
    "Truncate long names to 40 characters.",
    "lock held by another sink; skipping",
    "set to 0 to disable",
    "order by score (lowest first)",
    "where the collector finds dcgm-exporter",
    "",
]


@pytest.mark.parametrize("text", SQL)
def test_statements_and_fragments_are_sql(text: str) -> None:
    assert is_sql(text)


@pytest.mark.parametrize("text", PROSE)
def test_prose_that_mentions_sql_words_is_not_sql(text: str) -> None:
    assert not is_sql(text)


_SQL_WORDS = (
    "select from where update set delete insert into create drop alter table view index copy to stdin with as"
    " listen notify lock truncate vacuum analyze order by group join values returning and or the rows gpus"
    " chunk chunks archive retention metrics fleet node each per second is in on"
)
_WORDS = st.sampled_from(_SQL_WORDS.split(" "))


@given(
    words=st.lists(_WORDS, min_size=1, max_size=12),
    titled=st.booleans(),
    seps=st.lists(st.sampled_from([" ", " ", ", ", " - ", ": %s ", " %d "]), min_size=12, max_size=12),
    end=st.sampled_from(["", ".", ": %s", "..."]),
)
def test_sentences_of_sql_words_are_not_sql(
    words: list[str], titled: bool, seps: list[str], end: str
) -> None:
    """Log lines, help and Prometheus help built from SQL's own words, without SQL's syntax or CAPITALS."""
    text = "".join(w + s for w, s in zip(words, seps, strict=False)).rstrip(" ,-:%sd") + end
    assert not is_sql(text.capitalize() if titled else text)


_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)


@given(
    table=_NAMES,
    columns=st.lists(_NAMES, min_size=1, max_size=5),
    verb=st.sampled_from(["select", "insert", "update", "delete", "copy"]),
    upper=st.booleans(),
    where=st.booleans(),
)
def test_generated_statements_are_sql(
    table: str, columns: list[str], verb: str, upper: bool, where: bool
) -> None:
    """In CAPITALS any of them; in lower case each carries SQL's syntax (a parenthesis, `=`, `*`)."""
    cols = ", ".join(columns)
    text = {
        "select": f"select {cols} from {table} where {columns[0]} = %s"
        if where
        else f"select {cols}, count(*) from {table}",
        "insert": f"insert into {table} ({cols}) values ({', '.join(['%s'] * len(columns))})",
        "update": f"update {table} set {columns[0]} = %s" + (" where id = %s" if where else ""),
        "delete": f"delete from {table} where {columns[0]} = %s",
        "copy": f"copy {table} ({cols}) from stdin (format binary)",
    }[verb]
    assert is_sql(text.upper() if upper else text), text


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ('"""SELECT * FROM gpu_metrics is what a docstring may show."""\n', []),
        ('def f():\n    "DELETE FROM x WHERE a = 1"\n', []),
        ('q = f"SELECT {cols} FROM {table}"\n', [1]),
        ('q = "select * " + "from gpu_metrics where a = %s"\n', [1]),
        ('q = ("INSERT INTO t (a)"\n     " VALUES (%s)")\n', [1]),
        ("q = sql.SQL(text).format(name)\n", [1]),
        ("q = psycopg.sql.SQL(text)\n", [1]),
        ("from psycopg.sql import SQL\nq = SQL(text)\n", [2]),
        ('log.info("select %d GPUs from %s", n, rack)\n', []),
        ('parser.add_argument("--sql", help="a query over gpu_metrics")\n', []),
        ('Counter("rows_selected_total", "Rows selected from the stream.")\n', []),
        ('b = b"COPY x FROM STDIN"\n', [1]),
    ],
)
def test_the_scan_reads_code_strings_not_docstrings(source: str, lines: list[int]) -> None:
    assert sql_lines(source) == lines

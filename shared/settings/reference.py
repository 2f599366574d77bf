"""The configuration reference, written from the settings models: docs/configuration.md, names.py.

    python -m shared.settings.reference           # write both (make docs)
    python -m shared.settings.reference --check   # exit 1 if either is stale

Every field of every settings tree becomes one row: its variable, type and
constraints, default (secrets masked) and description (the field's docstring,
shared.settings.common.Section). shared/settings/names.py holds the names alone, for the
check at start of variables nothing reads (shared.settings.env). The trees are
named in :data:`TREES` as strings and imported only here, by this tool: no
service imports another's settings. A unit test holds TREES to every Settings
subclass in the code, and both files to what this writes.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from shared.settings.common import Settings
from shared.settings.env import NESTED, OTHER_VARIABLES, PREFIX, accepted_names, is_mapping, model_in

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "configuration.md"
NAMES_MODULE = REPO / "shared" / "settings" / "names.py"

# (who reads it, "module:Settings subclass"); the first is the sections every service shares.
TREES: tuple[tuple[str, str], ...] = (
    ("every service", "shared.settings.common:Settings"),
    ("every service", "shared.plumbing.otlp:OtlpSettings"),
    ("`python -m services.mock_dcgm`", "services.mock_dcgm.settings:MockDcgmSettings"),
    ("`python -m services.collector`", "services.collector.settings:CollectorSettings"),
    ("`python -m services.sink` (and its one-shot commands)", "services.sink.settings:SinkSettings"),
    ("`python -m services.scorer`", "services.scorer.settings:ScorerSettings"),
    ("`python -m services.remediator`", "services.remediator.settings:RemediatorSettings"),
    ("`python -m services.api`", "services.api.settings:ApiSettings"),
    ("`python -m services.llm_monitor`", "services.llm_monitor.settings:LlmSettings"),
    ("`python -m services.mock_ollama`", "services.mock_ollama.settings:MockOllamaSettings"),
    ("`python -m services.lifecycle`", "services.lifecycle.settings:LifecycleSettings"),
    (
        "`python -m services.verifier` and `services.verifier.oplog`",
        "services.verifier.settings:VerifierSettings",
    ),
)

MASK = "**********"


@dataclass(frozen=True, slots=True)
class Row:
    variable: str
    type: str
    default: str
    description: str


@dataclass(frozen=True, slots=True)
class Block:
    """One section of one tree: its rows under a heading."""

    variable: str
    title: str
    read_by: str
    rows: tuple[Row, ...]


def load_tree(path: str) -> type[Settings]:
    module, _, name = path.partition(":")
    tree = getattr(importlib.import_module(module), name)
    if not (isinstance(tree, type) and issubclass(tree, Settings)):
        raise TypeError(f"{path} is not a Settings subclass")
    return tree


def _words(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None))
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"JSON list of {_type_name(args[0])}" if args else "JSON list"
    if origin is dict or annotation is dict:
        return "JSON object" + (f" of {_type_name(args[1])}" if len(args) == 2 else "")
    names = {str: "string", int: "integer", float: "number", bool: "`true` or `false`", Path: "path"}
    if annotation in names:
        return names[annotation]
    if annotation is SecretStr:
        return "secret string"
    return getattr(annotation, "__name__", str(annotation))


def _number(value: float) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _constraints(field: FieldInfo) -> list[str]:
    shown = []
    for item in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if isinstance(item, getattr(annotated_types, attr.capitalize())):
                shown.append(f"{sign} {_number(getattr(item, attr))}")
        if isinstance(item, annotated_types.MinLen) and item.min_length > 0:
            shown.append(f"at least {item.min_length} long")
        if isinstance(item, annotated_types.MaxLen):
            shown.append(f"at most {item.max_length} long")
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            shown.append(f"matching `{pattern}`")
    return shown


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return f"`{MASK}`"
    if isinstance(value, Path):
        return f"`{_relative(value)}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{_number(value)}`"
    if isinstance(value, list | dict):
        return f"`{json.dumps(value)}`"
    if value == "":
        return '`""`'
    return f"`{value}`"


def _default(field: FieldInfo) -> str:
    factory = field.default_factory
    if factory is None:
        return "" if field.default is PydanticUndefined else _shown(field.default)
    if isinstance(factory, type) or getattr(factory, "__name__", "") == "<lambda>":
        return _shown(factory())  # type: ignore[call-arg]
    # computed where it runs (the host's name, say): the call is the default
    return f"`{factory.__module__.lstrip('_')}.{factory.__qualname__}()`"


def rows(model: type[BaseModel], prefix: str) -> Iterator[Row]:
    for name, field in model.model_fields.items():
        variable = (prefix + (field.alias or name)).upper()
        nested = model_in(field.annotation)
        if nested is not None:
            yield from rows(nested, variable + NESTED)
            continue
        kind = ", ".join([_type_name(field.annotation), *_constraints(field)])
        description = _words(field.description)
        if is_mapping(field.annotation):
            description += f" One key each: `{variable}{NESTED}<key>`."
        yield Row(variable, kind, _default(field), description.strip())


def blocks() -> list[Block]:
    """Every section of every tree, in TREES order; a section shared by trees is listed once."""
    seen: set[str] = set()
    out = []
    for read_by, path in TREES:
        for name, field in load_tree(path).model_fields.items():
            section = model_in(field.annotation)
            variable = (PREFIX + (field.alias or name)).upper()
            if section is None or variable in seen:
                continue
            seen.add(variable)
            title = _words(inspect.cleandoc(section.__doc__ or "").split("\n\n")[0])
            title = title.removeprefix(f"{variable}{NESTED}*").lstrip(": ").strip()
            title = title[:1].upper() + title[1:]
            out.append(Block(variable, title, read_by, tuple(rows(section, variable + NESTED))))
    return out


HEADER = """\
# Configuration reference

<!-- Written by `make docs` (`python -m shared.settings.reference`) from the settings models: edit their
field docstrings, not this file. A unit test fails when it is stale. -->

Every service reads its settings from `GPUHEALTH_*` environment variables
(pydantic-settings). Sections are nested with `__`: `GPUHEALTH_SINK__LANES=4`
sets `lanes` of the sink's section. Names are read without regard to case; an
empty value counts as unset. Lists and objects are JSON
(`GPUHEALTH_COLLECTOR__DCGM_URLS='["http://10.0.0.5:9400/metrics"]'`), and a
whole section can be given as one JSON object (`GPUHEALTH_LOG='{"level": "DEBUG"}'`).

At start each service logs its configuration once, secrets masked. An invalid
value stops it with exit status 2 and a message naming the variable. A
`GPUHEALTH_*` variable that nothing reads (a misspelled one, say) is named in a
warning, with the closest name that is read.
"""


def render_doc(all_blocks: list[Block]) -> str:
    lines = [HEADER, "## Sections", ""]
    lines += [f"- [`{b.variable}__*`](#{b.variable.lower()}): {b.title}" for b in all_blocks]
    lines.append("- [Variables read outside the settings](#variables-read-outside-the-settings)")
    for b in all_blocks:
        lines += ["", f'<a id="{b.variable.lower()}"></a>', "", f"## `{b.variable}__*`", ""]
        lines += [f"{b.title} Read by {b.read_by}.", ""]
        lines += ["| variable | type | default | description |", "|---|---|---|---|"]
        lines += [f"| `{r.variable}` | {r.type} | {r.default} | {r.description} |" for r in b.rows]
    lines += [
        "",
        "## Variables read outside the settings",
        "",
        "The native stack's scripts, compose and the tools read these; no settings model does.",
        "",
        "| variable | default | read by | description |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{v.name}` | {v.default} | {v.read_by} | {v.description} |" for v in OTHER_VARIABLES]
    return "\n".join(lines) + "\n"


def render_names(trees: list[type[Settings]]) -> str:
    exact: set[str] = set()
    open_prefixes: set[str] = set()
    for tree in trees:
        more_exact, more_open = accepted_names(tree)
        exact |= more_exact
        open_prefixes |= more_open
    names = "".join(f'        "{n}",\n' for n in sorted(exact))
    prefixes = "".join(f'        "{p}",\n' for p in sorted(open_prefixes))
    return (
        '"""Every GPUHEALTH_* name the settings models read: written by `make docs`, not by hand."""\n\n'
        "from __future__ import annotations\n\n"
        f"NAMES: frozenset[str] = frozenset(\n    {{\n{names}    }}\n)\n\n"
        "# A mapping setting also takes one variable per key under these.\n"
        f"OPEN_PREFIXES: frozenset[str] = frozenset(\n    {{\n{prefixes}    }}\n)\n"
    )


def outputs() -> dict[Path, str]:
    """What the two files should hold."""
    return {
        DOC: render_doc(blocks()),
        NAMES_MODULE: render_names([load_tree(path) for _, path in TREES]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.settings.reference", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale, writing nothing")
    args = parser.parse_args(argv)
    wanted = outputs()
    stale = [path for path, text in wanted.items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{_relative(path)} is stale: run `make docs`", file=sys.stderr)
        return 1 if stale else 0
    for path, text in wanted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {_relative(path)}")
    return 0


def _relative(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


if __name__ == "__main__":
    sys.exit(main())

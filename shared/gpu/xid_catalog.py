"""NVIDIA's XID catalogue as this project reads it: config/xid-catalog.csv, one reviewed row per code.

Each row keeps NVIDIA's facts as NVIDIA states them (mnemonic, the models the code
applies to, the immediate and investigatory actions; tests/unit/shared/test_xid_catalog.py
checks them against a copy of NVIDIA's catalogue) and this project's judgement of
them: the code's class, the action it recommends, the verdict's severity, how long
one occurrence holds it, and a description in this project's words.

The immediate action is mapped onto this project's actions by one table (the rules
file's `[xid_catalog.nvidia_actions]`). A row whose action is not the mapped one, or
whose NVIDIA action is a workflow or absent, says why in `reason`: a catalogue row
without one is refused, so every deliberate difference is written down.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.contract.models_health import Action
from shared.plumbing.errors import ConfigError

XidClass = Literal["application", "hardware", "driver", "unused"]
XID_CLASSES: tuple[XidClass, ...] = get_args(XidClass)
# "info": recorded and counted by pattern rules, but not a finding by itself.
XidSeverity = Literal["unhealthy", "degraded", "info"]
# The GPU families NVIDIA's catalogue has a column for.
CatalogModel = Literal["a100", "h100", "b100", "gb200"]
CATALOG_MODELS: tuple[CatalogModel, ...] = get_args(CatalogModel)
# The workflows the scorer implements (services/scorer/workflows.py): what accompanies the XID decides.
Workflow = Literal["xid_13", "xid_31", "xid_45", "xid_48", "nvlink", "nvlink5", "xid_154"]

COLUMNS = (
    "code",
    "mnemonic",
    "class",
    "models",
    "nvidia_action",
    "nvidia_investigation",
    "workflow",
    "action",
    "severity",
    "clear_after_s",
    "reason",
    "description",
)
_MAX_ROWS = 10_000
_OneLine = Annotated[str, Field(max_length=600, pattern=r"^[^\x00-\x1f\x7f]*$")]
# A workflow's reason may go bit by bit (XID 74's registers): room for that, still one line.
_Reason = Annotated[str, Field(max_length=1500, pattern=r"^[^\x00-\x1f\x7f]*$")]


class XidEntry(BaseModel):
    """One XID code: NVIDIA's facts, and what this project does about it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: int = Field(ge=1, le=100_000)
    mnemonic: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Z0-9_ /]+$")]
    xid_class: XidClass
    models: frozenset[CatalogModel]  # empty: NVIDIA lists it for none of them
    nvidia_action: Annotated[str, Field(max_length=60, pattern=r"^[A-Z0-9_]*$")]  # "": NVIDIA gives none
    nvidia_investigation: _OneLine
    workflow: Workflow | None
    action: Action
    severity: XidSeverity
    clear_after_s: int | None = Field(gt=0)  # None: the rules file's windows.xid_s
    reason: _Reason  # why this row's action is not NVIDIA's mapped one ("" where it is)
    description: Annotated[str, Field(min_length=1, max_length=300, pattern=r"^[^\x00-\x1f\x7f]*$")]

    @property
    def name(self) -> str:
        return self.description

    def listed_for(self, model: str) -> bool | None:
        """Whether NVIDIA lists this code for the GPU model (None: a model with no column)."""
        family = catalog_family(model)
        return None if family is None else family in self.models


def catalog_family(model: str) -> CatalogModel | None:
    """The catalogue column a GPU model falls under: Ampere A100/A800/A30, Hopper H100/H200/H800/GH200,
    Blackwell B100/B200/B300, Grace-Blackwell GB200/GB300; None for anything else."""
    words = model.upper().replace("-", " ").split()
    for word in words:
        if word.startswith(("GB200", "GB300")):
            return "gb200"
        if word.startswith(("B100", "B200", "B300")):
            return "b100"
        if word.startswith(("H100", "H200", "H800", "H20", "GH200")):
            return "h100"
        if word.startswith(("A100", "A800", "A30")):
            return "a100"
    return None


def parse_catalog(text: str, *, source: str = "xid catalogue") -> dict[int, XidEntry]:
    """The catalogue's rows by code; ConfigError names the line and field of the first bad one."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = tuple(reader.fieldnames or ())
    except csv.Error as e:
        raise ConfigError(f"{source}: {e}") from None
    if header != COLUMNS:
        raise ConfigError(f"{source}: the header must be {','.join(COLUMNS)}")
    entries: dict[int, XidEntry] = {}
    try:
        rows = list(reader)
    except csv.Error as e:
        raise ConfigError(f"{source} line {reader.line_num}: {e}") from None
    for line, row in enumerate(rows, start=2):
        if len(entries) >= _MAX_ROWS:
            raise ConfigError(f"{source}: more than {_MAX_ROWS} rows")
        if None in row or any(value is None for value in row.values()):
            raise ConfigError(f"{source} line {line}: expected {len(COLUMNS)} fields")
        try:
            entry = _entry(row)
        except (ValidationError, ValueError) as e:
            raise ConfigError(f"{source} line {line}: {_reason(e)}") from None
        if entry.code in entries:
            raise ConfigError(f"{source} line {line}: XID {entry.code} is listed twice")
        entries[entry.code] = entry
    return entries


def _entry(row: Mapping[str, str]) -> XidEntry:
    code = row["code"].strip()
    if not code.isdigit():
        raise ValueError(f"code: {code[:20]!r} is not a whole number")
    clear = row["clear_after_s"].strip()
    if clear and not clear.isdigit():
        raise ValueError(f"clear_after_s: {clear[:20]!r} is not a whole number")
    return XidEntry.model_validate(
        {
            "code": int(code),
            "mnemonic": row["mnemonic"],
            "xid_class": row["class"],
            "models": frozenset(row["models"].split()),
            "nvidia_action": row["nvidia_action"],
            "nvidia_investigation": row["nvidia_investigation"],
            "workflow": row["workflow"] or None,
            "action": row["action"],
            "severity": row["severity"],
            "clear_after_s": int(clear) if clear else None,
            "reason": row["reason"],
            "description": row["description"],
        }
    )


def _reason(e: ValidationError | ValueError) -> str:
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"{where}: {first['msg']}"
    return str(e)


def is_workflow(nvidia_action: str) -> bool:
    """NVIDIA's actions that depend on what accompanies the XID (a workflow, or XID 154's guidance)."""
    return nvidia_action.startswith("WORKFLOW_") or nvidia_action == "XID_154"


def check_against_mapping(entries: Iterable[XidEntry], mapping: Mapping[str, Action]) -> None:
    """Every row's action is NVIDIA's, mapped, or the row says why not; workflows name theirs."""
    for e in entries:
        where = f"XID {e.code} ({e.mnemonic})"
        if is_workflow(e.nvidia_action):
            if e.workflow is None:
                raise ConfigError(
                    f"{where}: NVIDIA's action {e.nvidia_action} is a workflow; name the workflow"
                )
            if not e.reason:
                raise ConfigError(f"{where}: a workflow's default action needs a reason")
        elif not e.nvidia_action:
            if not e.reason:
                raise ConfigError(f"{where}: NVIDIA gives no action, so the chosen one needs a reason")
        elif e.nvidia_action not in mapping:
            raise ConfigError(
                f"{where}: NVIDIA action {e.nvidia_action} is not in [xid_catalog.nvidia_actions]"
            )
        elif e.action != mapping[e.nvidia_action] and not e.reason:
            raise ConfigError(
                f"{where}: action {e.action} differs from NVIDIA's {e.nvidia_action} "
                f"({mapping[e.nvidia_action]}) without a reason"
            )


def load_catalog(path: Path, mapping: Mapping[str, Action]) -> dict[int, XidEntry]:
    """Read and check the catalogue file; ConfigError says what is wrong and where."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"xid catalogue {path}: {e}") from e
    entries = parse_catalog(text, source=f"xid catalogue {path}")
    check_against_mapping(entries.values(), mapping)
    return entries


AgreementKind = Literal["agrees", "differs", "workflow", "no_nvidia_action"]


def agreement_of(entry: XidEntry, mapping: Mapping[str, Action]) -> AgreementKind:
    """How a row's action stands against NVIDIA's immediate action, mapped onto this project's."""
    if is_workflow(entry.nvidia_action):
        return "workflow"
    if not entry.nvidia_action:
        return "no_nvidia_action"
    return "agrees" if mapping.get(entry.nvidia_action) == entry.action else "differs"


def agreement_table(
    entries: Iterable[XidEntry], mapping: Mapping[str, Action]
) -> dict[XidClass, dict[AgreementKind, int]]:
    """Per class: how many codes agree with NVIDIA's action, differ (each with its reason), are
    decided by a workflow, or have no NVIDIA action to compare with."""
    kinds: tuple[AgreementKind, ...] = get_args(AgreementKind)
    table: dict[XidClass, dict[AgreementKind, int]] = {c: dict.fromkeys(kinds, 0) for c in XID_CLASSES}
    for entry in entries:
        table[entry.xid_class][agreement_of(entry, mapping)] += 1
    return table

"""GPUHEALTH_* variables that nothing reads: each is named at start, with the closest name that is read.

pydantic-settings ignores a variable it has no field for, so a misspelled
``GPUHEALTH_SINK__LANSE=4`` would change nothing and say nothing. At start
(shared.plumbing.service) the environment's ``GPUHEALTH_*`` names are compared, without
regard to case as pydantic-settings reads them, with every name a settings
model of the project accepts (shared.settings.names, written from the models by
``make docs``, and the starting service's own models), and with the variables
that scripts and tools read (:data:`OTHER_VARIABLES`); one warning names the
rest.
"""

from __future__ import annotations

import difflib
import logging
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from shared.settings import names as config_names

log = logging.getLogger(__name__)

PREFIX = "GPUHEALTH_"
NESTED = "__"
# Names longer than this are compared by their start only: the comparison costs their length squared.
COMPARED_CHARS = 200


@dataclass(frozen=True, slots=True)
class OtherVariable:
    """A GPUHEALTH_* variable read outside the settings models: by the scripts, compose or a tool."""

    name: str
    default: str
    read_by: str
    description: str


_NATIVE = "scripts/env.sh"
_COMPOSE = "docker-compose.yml"
OTHER_VARIABLES: tuple[OtherVariable, ...] = (
    OtherVariable("GPUHEALTH_CACHE", "`~/.cache/gpu-health`", _NATIVE, "Downloads, builds and the venv."),
    OtherVariable("GPUHEALTH_RUN", "`$GPUHEALTH_CACHE/run`", _NATIVE, "Broker data, logs and pid files."),
    OtherVariable(
        "GPUHEALTH_VENV", "`$GPUHEALTH_CACHE/venv`", "Makefile", "The Python venv `make venv` builds."
    ),
    OtherVariable("GPUHEALTH_KAFKA_VERSION", "`4.3.1`", _NATIVE, "The Kafka release the native stack runs."),
    OtherVariable("GPUHEALTH_KAFKA_HEAP", "`768m`", _NATIVE, "The native broker's Java heap."),
    OtherVariable("GPUHEALTH_KAFKA_PORT", "`9092`", f"{_NATIVE}, {_COMPOSE}", "Kafka's port on the host."),
    OtherVariable(
        "GPUHEALTH_KAFKA_CONTROLLER_PORT", "`9093`", _NATIVE, "The native broker's KRaft controller."
    ),
    OtherVariable(
        "GPUHEALTH_KAFKA_BOOTSTRAP",
        "`127.0.0.1:$GPUHEALTH_KAFKA_PORT`",
        _NATIVE,
        "Set by the scripts: the native broker's address, for `GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS`.",
    ),
    OtherVariable(
        "GPUHEALTH_KAFKA_LIB",
        "`$GPUHEALTH_CACHE/kafka-<version>/lib`",
        _NATIVE,
        "Set by the scripts: the Kafka jars `bin/` runs.",
    ),
    OtherVariable(
        "GPUHEALTH_TLS",
        "`$GPUHEALTH_RUN/tls`",
        _NATIVE,
        "Set by the scripts: the local CA, each Kafka principal's certificate and key, the servers'.",
    ),
    OtherVariable("GPUHEALTH_PG_PORT", "`55432`", f"{_NATIVE}, {_COMPOSE}", "PostgreSQL's port on the host."),
    OtherVariable(
        "GPUHEALTH_PG_DATA",
        "`$GPUHEALTH_RUN/pg` (as root: `/var/lib/gpu-health/pg`)",
        _NATIVE,
        "The native PostgreSQL's data folder.",
    ),
    OtherVariable("GPUHEALTH_PG_BIN", "`/usr/lib/postgresql/15/bin`", _NATIVE, "PostgreSQL's programs."),
    OtherVariable("GPUHEALTH_DB_NAME", "`gpu_health`", _NATIVE, "The database the native stack creates."),
    OtherVariable(
        "GPUHEALTH_DB_USER",
        "`gpuhealth`",
        _NATIVE,
        "The database's owner: the migrations, and the sink (its retention).",
    ),
    OtherVariable("GPUHEALTH_DB_PASSWORD", "`gpuhealth`", _NATIVE, "The owner's password."),
    OtherVariable(
        "GPUHEALTH_DB_READER_PASSWORD", "`gpuhealth_reader`", _NATIVE, "The API's read-only login's password."
    ),
    OtherVariable(
        "GPUHEALTH_DB_ACKNOWLEDGER_PASSWORD",
        "`gpuhealth_acknowledger`",
        _NATIVE,
        "The password of the API's login for acknowledging alerts.",
    ),
    OtherVariable(
        "GPUHEALTH_DB_SINK_PASSWORD",
        "`gpuhealth_sink`",
        f"{_NATIVE}, {_COMPOSE}",
        "The password of the sink's own login (`gpuhealth_sink`, schema/0084).",
    ),
    OtherVariable(
        "GPUHEALTH_DB_SCORER_PASSWORD",
        "`gpuhealth_scorer`",
        f"{_NATIVE}, {_COMPOSE}",
        "The password of the scorer's own login (`gpuhealth_scorer`, schema/0084).",
    ),
    OtherVariable(
        "GPUHEALTH_DB_REMEDIATOR_PASSWORD",
        "`gpuhealth_remediator`",
        f"{_NATIVE}, {_COMPOSE}",
        "The password of the remediator's own login (`gpuhealth_remediator`, schema/0084).",
    ),
    OtherVariable(
        "GPUHEALTH_DB_LIFECYCLE_PASSWORD",
        "`gpuhealth_lifecycle`",
        f"{_NATIVE}, {_COMPOSE}",
        "The password of the lifecycle's own login (`gpuhealth_lifecycle`, schema/0084).",
    ),
    OtherVariable(
        "GPUHEALTH_MOCK_ADMIN_PORT",
        "`9399`",
        f"{_NATIVE}, {_COMPOSE}",
        "The mock fleet's admin port (`make up`).",
    ),
    OtherVariable(
        "GPUHEALTH_MOCK_BASE_PORT",
        "`9400`",
        _NATIVE,
        "The mock fleet's first node port (`make up`); node i: + i.",
    ),
    OtherVariable(
        "GPUHEALTH_MOCK_URLS",
        "the four mock nodes",
        _NATIVE,
        "Set by the scripts: the mock nodes' URLs as a JSON list, for the collector.",
    ),
    OtherVariable(
        "GPUHEALTH_COLLECTOR_METRICS_PORT", "`9500`", _NATIVE, "The collector's `/metrics` (`make up`)."
    ),
    OtherVariable("GPUHEALTH_SINK_METRICS_PORT", "`9501`", _NATIVE, "The sink's `/metrics` (`make up`)."),
    OtherVariable(
        "GPUHEALTH_SCORER_METRICS_PORT",
        "`9502`",
        _NATIVE,
        "The scorer's `/metrics` (`make up`); the i-th of several on this + 10 i.",
    ),
    OtherVariable(
        "GPUHEALTH_SCORERS",
        "`1`",
        _NATIVE,
        "Scorer processes `make up` runs (`make up SCORERS=3`); they share the fleet.",
    ),
    OtherVariable(
        "GPUHEALTH_REMEDIATOR_MODE",
        "`dry-run`",
        _NATIVE,
        "What `make up`'s remediator does (`make up REMEDIATOR=live`): `dry-run` records only; `live` acts on"
        " a kube-apiserver and Slurm (started for it) and on the mock fleet's GPUs.",
    ),
    OtherVariable(
        "GPUHEALTH_REMEDIATOR_DRY_RUN",
        "`true` (`false` when `GPUHEALTH_REMEDIATOR_MODE` is `live`)",
        _NATIVE,
        "Set by scripts/env.sh from `GPUHEALTH_REMEDIATOR_MODE`, for the stack file.",
    ),
    OtherVariable(
        "GPUHEALTH_REMEDIATOR_SCHEDULERS",
        "`true`",
        _NATIVE,
        "Whether `make up`'s remediator reaches the kube-apiserver and Slurm: set by scripts/stack.sh (live:"
        " yes; dry run, which needs no scheduler: no).",
    ),
    OtherVariable(
        "GPUHEALTH_REMEDIATOR_METRICS_PORT", "`9503`", _NATIVE, "The remediator's `/metrics` (`make up`)."
    ),
    OtherVariable(
        "GPUHEALTH_LIFECYCLE_METRICS_PORT",
        "`9505`",
        _NATIVE,
        "The lifecycle decisions' `/metrics` (`make up`).",
    ),
    OtherVariable("GPUHEALTH_API_PORT", "`8000`", f"{_NATIVE}, {_COMPOSE}", "The API's port on the host."),
    OtherVariable(
        "GPUHEALTH_MOCK_OLLAMA_PORT", "`11434`", _NATIVE, "The stand-in Ollama's port (`make up`)."
    ),
    OtherVariable("GPUHEALTH_LLM_PROXY_PORT", "`11435`", _NATIVE, "The LLM monitor's proxy (`make up`)."),
    OtherVariable(
        "GPUHEALTH_LLM_MONITOR_METRICS_PORT", "`9504`", _NATIVE, "The LLM monitor's `/metrics` (`make up`)."
    ),
    OtherVariable("GPUHEALTH_MOCK_NODE_PORTS", "`9400-9403`", _COMPOSE, "The mock nodes' ports on the host."),
    OtherVariable(
        "GPUHEALTH_KUBE_VERSION", "`v1.34.3`", _NATIVE, "The kube-apiserver release `make services` builds."
    ),
    OtherVariable("GPUHEALTH_KUBE_PORT", "`16443`", _NATIVE, "The native kube-apiserver's port."),
    OtherVariable("GPUHEALTH_ETCD_PORT", "`23790`", _NATIVE, "Its etcd's client port (peers on this + 10)."),
    OtherVariable("GPUHEALTH_SLURMCTLD_PORT", "`16817`", _NATIVE, "The native slurmctld's port."),
    OtherVariable(
        "GPUHEALTH_SLURMD_BASE_PORT", "`16900`", _NATIVE, "The slurmd of mock node i listens on this + i."
    ),
    OtherVariable(
        "GPUHEALTH_SLURM_DIR",
        "`/var/lib/gpu-health/slurm` (root), else `$GPUHEALTH_RUN/slurm`",
        _NATIVE,
        "Slurm's configuration, state and munge socket (`SLURM_CONF` is `etc/slurm.conf` in it).",
    ),
    OtherVariable("GPUHEALTH_PROMETHEUS_PORT", "`9090`", _COMPOSE, "Prometheus's port on the host."),
    OtherVariable("GPUHEALTH_GRAFANA_PORT", "`3000`", _COMPOSE, "Grafana's port on the host."),
    OtherVariable(
        "GPUHEALTH_COMPOSE_PROJECT",
        "`gpu-health-compose-test`",
        "scripts/compose-test.sh",
        "The compose project `make compose-test` runs.",
    ),
    OtherVariable(
        "GPUHEALTH_COMPOSE_FILES",
        "`docker-compose.yml:deploy/docker/compose.local-images.yml`",
        "scripts/compose-test.sh",
        "The compose files `make compose-test` runs.",
    ),
    OtherVariable(
        "GPUHEALTH_TIMESCALEDB_TAG",
        "`2.19-pg15`",
        "scripts/compose-images.sh",
        "The tag of the local TimescaleDB image `make compose-test` builds.",
    ),
    OtherVariable(
        "GPUHEALTH_URL", "`http://127.0.0.1:8000`", "the `gpuhealth` CLI", "The API the CLI talks to."
    ),
    OtherVariable(
        "GPUHEALTH_TOKEN_FILE",
        "unset (the CLI prompts, on a terminal)",
        "the `gpuhealth` CLI",
        "A file holding the caller's bearer token (`make up` writes one per role under"
        " `$GPUHEALTH_RUN/auth/`).",
    ),
    OtherVariable(
        "GPUHEALTH_JOB_ID",
        "`SLURM_JOB_ID`, `TORCHELASTIC_RUN_ID`, `JOB_ID`, else host-pid",
        "gpuhealth.training",
        "The training job's id in the alerts it publishes.",
    ),
    OtherVariable(
        "GPUHEALTH_JOB_NAME",
        "`SLURM_JOB_NAME`",
        "gpuhealth.training",
        "The training job's name in its alerts.",
    ),
)


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds (`Section` or `Section | None`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [m for a in typing.get_args(annotation) if (m := model_in(a)) is not None]
        return models[0] if len(models) == 1 else None
    return None


def is_mapping(annotation: Any) -> bool:
    """Whether an annotation is a dict (or an optional one): a setting that takes any key."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(is_mapping(a) for a in typing.get_args(annotation))
    return annotation is dict or origin is dict


def accepted_names(model: type[BaseModel], prefix: str = PREFIX) -> tuple[frozenset[str], frozenset[str]]:
    """What pydantic-settings reads for `model` from the environment: (exact names, open prefixes).

    A section is read whole as JSON (`GPUHEALTH_LOG`) or field by field (`GPUHEALTH_LOG__LEVEL`); a
    mapping takes one variable per key as well (`GPUHEALTH_KAFKA__EXTRA__<key>`), hence the prefixes.
    Names are upper case.
    """
    exact: set[str] = set()
    open_prefixes: set[str] = set()
    for name, field in model.model_fields.items():
        full = (prefix + (field.alias or name)).upper()
        exact.add(full)
        nested = model_in(field.annotation)
        if nested is not None:
            inner_exact, inner_open = accepted_names(nested, full + NESTED)
            exact |= inner_exact
            open_prefixes |= inner_open
        elif is_mapping(field.annotation):
            open_prefixes.add(full + NESTED)
    return frozenset(exact), frozenset(open_prefixes)


def known_names(*models: type[BaseModel]) -> tuple[frozenset[str], frozenset[str]]:
    """Every name read: the project's settings (as last written), `models`' own, and OTHER_VARIABLES."""
    exact = set(config_names.NAMES) | {v.name for v in OTHER_VARIABLES}
    open_prefixes = set(config_names.OPEN_PREFIXES)
    for model in models:
        more_exact, more_open = accepted_names(model)
        exact |= more_exact
        open_prefixes |= more_open
    return frozenset(exact), frozenset(open_prefixes)


def unknown_variables(
    names: Iterable[str], exact: frozenset[str], open_prefixes: frozenset[str]
) -> dict[str, str]:
    """Each GPUHEALTH_* name (any case) that nothing reads -> the closest name that is read, sorted."""
    unknown = {}
    for name in names:
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper in exact:
            continue
        if any(upper.startswith(p) and len(upper) > len(p) for p in open_prefixes):
            continue
        unknown[name] = closest(upper, exact | open_prefixes)
    return dict(sorted(unknown.items()))


def closest(name: str, candidates: Iterable[str]) -> str:
    """The candidate most like `name` (difflib's ratio; ties: the first in sorted order)."""
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(name.upper()[:COMPARED_CHARS])
    best, best_ratio = "", -1.0
    for candidate in sorted(candidates):
        matcher.set_seq1(candidate)
        if matcher.real_quick_ratio() <= best_ratio or matcher.quick_ratio() <= best_ratio:
            continue
        ratio = matcher.ratio()
        if ratio > best_ratio:
            best, best_ratio = candidate, ratio
    return best


def warn_unknown_variables(environ: Mapping[str, str], *models: type[BaseModel]) -> dict[str, str]:
    """Log one warning naming every GPUHEALTH_* variable nothing reads, with the closest known name each."""
    unknown = unknown_variables(environ, *known_names(*models))
    if unknown:
        listed = "; ".join(f"{name!a} (closest: {near})" for name, near in unknown.items())
        log.warning(
            "%d GPUHEALTH_* variable(s) are read by nothing and change nothing: %s",
            len(unknown),
            listed,
            extra={"unknown_variables": unknown},
        )
    return unknown

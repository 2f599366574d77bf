"""`python -m services.verifier {identity,compute,audit,describe,snapshot,diff}`: GPU proof, kept.

Exit status: 0 when the answer is good (GPUs read, check passed, chain intact,
run trustworthy), 1 when it is not, 2 when the command itself could not run
(bad arguments or unreadable files). Reports go to stdout, diagnostics to
stderr. Kafka (compute, audit) is configured as every service is
(GPUHEALTH_KAFKA__*, GPUHEALTH_TOPICS__VERIFICATIONS), and how long the broker
may take by GPUHEALTH_VERIFIER__KAFKA_TIMEOUT_S (settings.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.contract.models_verify import Outcome, RecordKind, SystemIdentity, parse_system, record_json
from shared.gpu.gpu_identity import GpuUnavailableError, no_gpu_identity, open_reader
from shared.plumbing.errors import ContractError, GpuHealthError

if TYPE_CHECKING:
    from .backends import Backend, Device
    from .compute import CheckResult, MatmulSpec
    from .settings import VerifierSettings

log = logging.getLogger("services.verifier")


def _write(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text + "\n")
    else:
        out.write_text(text + "\n")
        print(f"wrote {out}", file=sys.stderr)


def _settings() -> VerifierSettings:
    from .settings import load_verifier_settings

    return load_verifier_settings()


def _topic(args: argparse.Namespace) -> str:
    from .build import topic_of

    return str(args.topic) if args.topic else topic_of(_settings())


def cmd_identity(args: argparse.Namespace) -> int:
    try:
        reader = open_reader()
    except GpuUnavailableError as e:
        _write(json.dumps(record_json(no_gpu_identity(args.hostname)), indent=2), args.out)
        print(f"identity: no GPU could be read ({e}); host facts only", file=sys.stderr)
        return 1
    try:
        identity = reader.identity(args.hostname)
    finally:
        reader.close()
    _write(json.dumps(record_json(identity), indent=2), args.out)
    return 0


def _spec(args: argparse.Namespace) -> MatmulSpec:
    from .compute import MatmulSpec

    m, k, n = args.shape or (args.size, args.size, args.size)
    return MatmulSpec(
        m=m,
        k=k,
        n=n,
        dtype=args.dtype,
        warmup=args.warmup,
        repeats=args.repeats,
        min_speedup=args.min_speedup,
        rtol=args.rtol,
        seed=args.seed,
    )


def _check_fields(
    args: argparse.Namespace, backend: Backend, device: Device, spec: MatmulSpec, result: CheckResult
) -> dict[str, Any]:
    """A compute check's record, but for what the chain adds (time, seq, prev_sha256)."""
    return {
        "kind": RecordKind.COMPUTE_CHECK,
        "gpu_uuid": device.uuid,
        "hostname": args.hostname,
        "verifier_id": args.hostname,
        "gpu_index": device.index,
        "gpu_model": device.name or None,
        "name": "matmul",
        "backend": backend.name,
        "device": f"cuda:{device.index}",
        "input_shape": [spec.m, spec.k, spec.n],
        "dtype": spec.dtype,
        "outcome": result.outcome,
        "reason": result.reason,
        "device_ms": result.device_ms,
        "cpu_ms": result.cpu_ms,
        "speedup": result.speedup,
        "repeats": spec.repeats,
        "warmup": spec.warmup,
        "rtol": spec.tolerance,
        "max_rel_err": result.max_rel_err,
        "min_speedup": spec.min_speedup,
        "result": result.result,
    }


def _verdict_line(device: Device, result: CheckResult) -> str:
    timing = (
        f"GPU {result.device_ms:.3f} ms, {result.speedup:.1f}x"
        if result.device_ms is not None and result.speedup is not None
        else "no timing"
    )
    err = f", max rel err {result.max_rel_err:.2e}" if result.max_rel_err is not None else ""
    return (
        f"GPU {device.index} {device.name} {device.uuid}: {result.outcome.value.upper()} "
        f"({timing}{err}){': ' + result.reason if result.reason else ''}"
    )


def cmd_compute(args: argparse.Namespace) -> int:
    from .backends import find_backend
    from .build import build_chain
    from .compute import check_device, reference

    spec = _spec(args)
    backend, reasons = find_backend(args.backend)
    if backend is None:
        print(f"compute: FAIL, no GPU to check: {'; '.join(reasons)}. The check never falls back to the CPU.")
        return 1
    devices = [d for d in backend.devices() if args.gpu is None or d.index in args.gpu]
    if not devices:
        print(f"compute: FAIL, none of GPUs {args.gpu} exists")
        return 1
    chain = build_chain(publish=not args.no_publish, topic=args.topic)
    ref, (m, k, n) = reference(spec), (spec.m, spec.k, spec.n)
    print(
        f"matmul {m}x{k} @ {k}x{n} {spec.dtype}: CPU reference {ref.cpu_ms:.3f} ms (numpy, median of "
        f"{spec.repeats} after {spec.warmup} warm-up); tolerance rtol={spec.tolerance:g}, "
        f"required speed-up {spec.min_speedup:g}x; backend {backend.name}"
    )
    failed = 0
    for device in devices:
        result = check_device(backend, device, ref, spec)
        failed += result.outcome is not Outcome.PASS
        print(_verdict_line(device, result))
        if device.uuid is None:
            print(f"GPU {device.index}: the backend gives no UUID, so it cannot be recorded", file=sys.stderr)
            continue
        record = chain.append(_check_fields(args, backend, device, spec, result))
        where = "not published (--no-publish)" if args.no_publish else f"recorded on {_topic(args)}"
        print(f"  {where}: seq {record.seq}, prev_sha256 {record.prev_sha256[:16]}…")
        if args.json:
            print(json.dumps(record_json(record)))
    print(
        f"compute: {'PASS' if not failed else 'FAIL'} ({len(devices) - failed}/{len(devices)} GPU(s) passed)"
    )
    return 1 if failed else 0


def cmd_audit(args: argparse.Namespace) -> int:
    from .chainlog import audit_topic

    settings = _settings()
    timeout_s = settings.verifier.kafka_timeout_s if args.timeout_s is None else args.timeout_s
    report = audit_topic(settings.kafka, _topic(args), timeout_s)
    print(f"audit of {_topic(args)}: {report.records} record(s), {len(report.heads)} GPU chain(s)")
    for uuid, head in sorted(report.heads.items()):
        print(f"  {uuid}: {head.seq + 1} record(s), head sha256 {head.sha256[:16]}… at offset {head.offset}")
    first = report.first_broken
    if first is None:
        print("audit: INTACT, every link holds")
        return 0
    print(f"audit: BROKEN, first broken link: {first.describe()}")
    for other in report.broken[1:]:
        print(f"  also broken: {other.describe()}")
    return 1


def _load_identity(path: Path) -> SystemIdentity:
    """An identity file, or a snapshot's identity."""
    from .snapshot import parse_snapshot

    raw = path.read_bytes()
    value = json.loads(raw)
    return (
        parse_snapshot(raw).identity if isinstance(value, dict) and "identity" in value else parse_system(raw)
    )


def cmd_describe(args: argparse.Namespace) -> int:
    from .describe import describe

    if args.identity is not None:
        identity = _load_identity(args.identity)
    else:
        try:
            reader = open_reader()
        except GpuUnavailableError as e:
            print(f"describe: no GPU could be read ({e}); accelerator fields stay empty", file=sys.stderr)
            identity = no_gpu_identity(args.hostname)
        else:
            identity = reader.identity(args.hostname)
            reader.close()
    given: dict[str, str | int] = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        given[key] = int(value) if value.isdigit() else value
    description, left = describe(identity, given)
    _write(json.dumps(description, indent=2), args.out)
    if left:
        print(f"describe: fill in by hand ({len(left)}): {', '.join(left)}", file=sys.stderr)
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    from .snapshot import take_snapshot

    try:
        reader = open_reader()
    except GpuUnavailableError as e:
        print(f"snapshot: FAIL, {e}", file=sys.stderr)
        return 1
    try:
        snap = take_snapshot(reader, args.hostname, window_s=args.window_s)
    finally:
        reader.close()
    args.out.write_text(json.dumps(snap.model_dump(mode="json"), indent=2) + "\n")
    for gpu in snap.gpus:
        print(
            f"GPU {gpu.index} {gpu.uuid}: memory used {gpu.memory_used_mib} MiB, "
            f"average power {gpu.avg_power_w} W, compute processes {gpu.processes}"
        )
    print(f"snapshot written to {args.out} (identity sha256 {snap.identity.identity_sha256[:16]}…)")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from .snapshot import diff, parse_snapshot

    before, after = parse_snapshot(args.before.read_bytes()), parse_snapshot(args.after.read_bytes())
    report = diff(
        before,
        after,
        max_memory_delta_mib=args.max_memory_delta_mib,
        max_power_delta_w=args.max_power_delta_w,
    )
    print(report.render())
    return 0 if report.trusted else 1


def _shape(text: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and 0 < int(p) <= 65536 for p in parts):
        raise argparse.ArgumentTypeError("expected MxKxN, e.g. 4096x4096x4096")
    return int(parts[0]), int(parts[1]), int(parts[2])


def _bounded(low: float, high: float) -> Any:
    """An argparse type: a finite number within [low, high]."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not low <= value <= high:  # NaN fails this too
            raise argparse.ArgumentTypeError(f"{text} is outside [{low:g}, {high:g}]")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.verifier", description=__doc__)
    p.add_argument("--hostname", default=socket.gethostname(), help="this node's name in records")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("identity", help="GPU and host identity as JSON (NVML, else nvidia-smi)")
    s.add_argument("--out", type=Path)

    s = sub.add_parser("compute", help="matrix product on each GPU vs the CPU; recorded on the audit log")
    s.add_argument("--size", type=int, default=2000, choices=range(1, 65537), metavar="N")
    s.add_argument("--shape", type=_shape, help="MxKxN instead of a square --size")
    s.add_argument("--dtype", default="float32", choices=("float32", "float64", "float16", "bfloat16"))
    s.add_argument("--warmup", type=int, default=3, choices=range(0, 1001), metavar="N")
    s.add_argument("--repeats", type=int, default=10, choices=range(1, 1001), metavar="N")
    s.add_argument("--rtol", type=_bounded(0, 1), help="relative tolerance (default by dtype)")
    s.add_argument("--min-speedup", type=_bounded(0, 1e6), default=2.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--backend", default="auto", choices=("auto", "torch", "cupy"))
    s.add_argument("--gpu", type=int, action="append", help="only this GPU (repeatable)")
    s.add_argument("--no-publish", action="store_true", help="print only; do not append to the audit log")
    s.add_argument("--json", action="store_true", help="also print each record as JSON")
    s.add_argument("--topic")

    s = sub.add_parser("audit", help="re-read the audit log and check every link")
    s.add_argument("--topic")
    s.add_argument(
        "--timeout-s", type=_bounded(1, 3600), help="default GPUHEALTH_VERIFIER__KAFKA_TIMEOUT_S (60)"
    )

    s = sub.add_parser("describe", help="MLPerf Inference systems/<name>.json from identity")
    s.add_argument("--identity", type=Path, help="an identity or snapshot file instead of this machine")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help="a field you know (repeatable)")
    s.add_argument("--out", type=Path)

    s = sub.add_parser("snapshot", help="identity and GPU load, before or after a benchmark run")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--window-s", type=_bounded(0, 3600), default=2.0)

    s = sub.add_parser("diff", help="compare two snapshots; non-zero exit when the run cannot be trusted")
    s.add_argument("before", type=Path)
    s.add_argument("after", type=Path)
    s.add_argument("--max-memory-delta-mib", type=_bounded(0, 1e9), default=512.0)
    s.add_argument("--max-power-delta-w", type=_bounded(0, 1e6), default=30.0)
    return p


COMMANDS = {
    "identity": cmd_identity,
    "compute": cmd_compute,
    "audit": cmd_audit,
    "describe": cmd_describe,
    "snapshot": cmd_snapshot,
    "diff": cmd_diff,
}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return COMMANDS[args.command](args)
    except (OSError, ValueError, KeyError) as e:
        print(f"{args.command}: cannot run: {e}", file=sys.stderr)
        return 2
    except ContractError as e:  # an input file that is not what it claims to be
        print(f"{args.command}: cannot run: {e}", file=sys.stderr)
        return 2
    except GpuHealthError as e:
        print(f"{args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""The remediator its settings describe: the policy, the keyring, the node map, the drivers, the consumer and
the producer (`build_remediator`); and the service `python -m services.remediator` runs
(`RemediatorService`).

Drivers are built only when enabled, and only for a live run: a dry run
reaches no scheduler, so it needs no kubeconfig and no Slurm. A driver
enabled without what it needs is a ConfigError at start.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry

from shared.plumbing.errors import ConfigError, GpuHealthError
from shared.plumbing.kafka import JsonProducer, make_consumer, make_producer
from shared.plumbing.running import Loop, ServiceRun, stopped

from .drivers.base import SchedulerDriver
from .drivers.kubeconfig import load_kubeconfig
from .drivers.kubernetes import KubernetesDriver
from .drivers.node_exec import NodeExec
from .drivers.slurm import SlurmDriver
from .executor import Executor
from .findings import load_node_map
from .loop import RemediatorLoop
from .policy import Policy, load_policy
from .settings import RemediatorSection, RemediatorSettings
from .steps import Steps
from .trust import Trust

log = logging.getLogger("services.remediator")


def build_schedulers(cfg: RemediatorSection, policy: Policy) -> list[SchedulerDriver]:
    """The enabled scheduler drivers (none in a dry run); ConfigError when one lacks what it needs."""
    if cfg.dry_run:
        return []
    schedulers: list[SchedulerDriver] = []
    if cfg.kubernetes.enabled:
        if cfg.kubernetes.kubeconfig is None:
            raise ConfigError(
                "GPUHEALTH_REMEDIATOR__KUBERNETES__KUBECONFIG is needed when Kubernetes is enabled"
            )
        access = load_kubeconfig(cfg.kubernetes.kubeconfig, cfg.kubernetes.context)
        schedulers.append(KubernetesDriver(access, drain=policy.drain, timeout_s=cfg.kubernetes.timeout_s))
    if cfg.slurm.enabled:
        schedulers.append(
            SlurmDriver(
                slurm_conf=cfg.slurm.conf,
                bin_dir=cfg.slurm.bin_dir,
                past_deadline=policy.drain.slurm_past_deadline,
                timeout_s=cfg.slurm.timeout_s,
            )
        )
    return schedulers


def build_remediator(
    settings: RemediatorSettings, *, registry: CollectorRegistry, producer: JsonProducer | None = None
) -> RemediatorLoop:
    """The loop `settings` describe; ConfigError for an invalid policy, node map or driver setting."""
    cfg = settings.remediator
    policy = load_policy(cfg.policy_file)
    trust = Trust.from_settings(cfg.signing)
    nodes = load_node_map(cfg.node_map_file)
    schedulers = build_schedulers(cfg, policy)
    steps = Steps(
        policy=policy,
        schedulers=schedulers,
        node_exec=NodeExec(cfg.exec),
        nodes=nodes,
        look_s=cfg.drain_look_s,
    )
    executor = Executor(
        db=settings.db, policy=policy, steps=steps, dry_run=cfg.dry_run, retry_s=cfg.step_retry_s
    )

    def close() -> None:
        for scheduler in schedulers:
            scheduler.close()

    return RemediatorLoop(
        db=settings.db,
        topics=settings.topics,
        policy=policy,
        nodes=nodes,
        dry_run=cfg.dry_run,
        consumer=make_consumer(settings.kafka, group_id=cfg.consumer_group),
        producer=JsonProducer(make_producer(settings.kafka)) if producer is None else producer,
        executor=executor,
        registry=registry,
        trust=trust,
        batch_size=cfg.batch_size,
        poll_timeout_s=cfg.poll_timeout_s,
        on_close=close,
    )


class RemediatorService:
    """`python -m services.remediator`: the remediator and its /metrics, once the database is there."""

    def __init__(self, settings: RemediatorSettings) -> None:
        """GpuHealthError for the policy, the node map or a driver's settings."""
        self.settings = settings
        self.registry = CollectorRegistry()
        self.loop = build_remediator(settings, registry=self.registry)
        if settings.remediator.dry_run:
            log.info("dry run: every decision and step is recorded, nothing is carried out")

    def start(self, life: ServiceRun) -> Loop:
        cfg = self.settings.remediator
        try:
            life.serve_metrics(self.registry, cfg.metrics_port, cfg.metrics_bind, database=self.settings.db)
        except (GpuHealthError, OSError):  # it cannot start: what was built for it is released
            self.loop.close_unstarted()
            raise
        return self.loop  # the producer is flushed and the consumer closed however it ends

    def stopped(self) -> int:
        return stopped(log)

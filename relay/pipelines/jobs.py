"""What `ktm relay`, `ktm backup` and `ktm restore` run: a pipeline on the engine's runner.

The runner (relay.engine.driver.runner) is the same for all three; each job gives it its
pipeline, and the pipeline gets the runner's status through `Pipeline.bind`.
"""

from __future__ import annotations

import threading

from relay.config import Config
from relay.engine.driver.runner import Runner, RunSummary
from relay.engine.driver.sidecar import Sidecar
from relay.engine.metrics import Metrics
from relay.engine.pipeline import Pipeline
from relay.filters import FilterSpec, load_filters
from relay.pipelines.backup.driver import BackupPipeline
from relay.pipelines.relay.driver import RelayPipeline
from relay.pipelines.restore.driver import RestoreOptions, RestorePipeline

__all__ = ["RunSummary", "backup_job", "relay_job", "restore_job"]


def relay_job(
    cfg: Config,
    *,
    stop_at_end: bool,
    stop_event: threading.Event,
    metrics: Metrics,
    filters: tuple[FilterSpec, ...] | None = None,
    master: str | None = None,
    failover: bool = False,
    dry_run: bool = False,
) -> Runner:
    """Kafka to Kafka. `dry_run` (ktm check) creates no topic and starts no chore; `filters`
    default to the config's (its sections and the --filter files)."""
    pipeline = RelayPipeline(
        cfg,
        stop_event=stop_event,
        metrics=metrics,
        failover=failover,
        dry_run=dry_run,
        filters=load_filters(cfg) if filters is None else filters,
    )
    verifier = _verifier(cfg, "relay", metrics, failover, dry_run)
    return _runner(cfg, pipeline, stop_at_end, stop_event, metrics, master, verifier)


def _verifier(
    cfg: Config, kind: str, metrics: Metrics, failover: bool, dry_run: bool = False
) -> tuple[Sidecar, ...]:
    """`[verify].follow`: the job proves its own copy as it goes."""
    if not cfg.verify.follow or dry_run:
        return ()
    from relay.pipelines.verify.follow import FollowSidecar

    return (FollowSidecar(cfg, kind, metrics, failover),)


def backup_job(
    cfg: Config,
    *,
    stop_at_end: bool,
    stop_event: threading.Event,
    metrics: Metrics,
    filters: tuple[FilterSpec, ...] | None = None,
    master: str | None = None,
    failover: bool = False,
) -> Runner:
    """Kafka to store segments."""
    pipeline = BackupPipeline(
        cfg,
        stop_event=stop_event,
        metrics=metrics,
        failover=failover,
        filters=load_filters(cfg) if filters is None else filters,
    )
    verifier = _verifier(cfg, "backup", metrics, failover)
    return _runner(cfg, pipeline, stop_at_end, stop_event, metrics, master, verifier)


def restore_job(
    cfg: Config,
    *,
    stop_at_end: bool,
    stop_event: threading.Event,
    metrics: Metrics,
    options: RestoreOptions | None = None,
    master: str | None = None,
) -> Runner:
    """Store segments to Kafka."""
    pipeline = RestorePipeline(
        cfg, stop_event=stop_event, metrics=metrics, options=options or RestoreOptions()
    )
    verifier = _verifier(cfg, "restore", metrics, False)
    return _runner(cfg, pipeline, stop_at_end, stop_event, metrics, master, verifier)


def _runner(
    cfg: Config,
    pipeline: Pipeline,
    stop_at_end: bool,
    stop_event: threading.Event,
    metrics: Metrics,
    master: str | None,
    sidecars: tuple[Sidecar, ...],
) -> Runner:
    return Runner(
        cfg,
        pipeline,
        stop_at_end=stop_at_end,
        stop_event=stop_event,
        metrics=metrics,
        master=master,
        sidecars=sidecars,
    )

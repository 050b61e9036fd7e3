"""The three pipelines as runners: what `ktm relay`, `ktm backup` and `ktm restore` run."""

from __future__ import annotations

import threading
from typing import Any

from relay.config import Config
from relay.engine.driver.runner import Runner, RunSummary
from relay.engine.metrics import Metrics
from relay.filters import FilterSpec, load_filters
from relay.pipelines.backup.driver import BackupPipeline
from relay.pipelines.mirror.driver import RelayPipeline
from relay.pipelines.restore.driver import RestoreOptions, RestorePipeline

__all__ = ["Backup", "Relay", "Restore", "RunSummary"]


class _FromSources(Runner):
    """A job that reads `[[sources]]`; `filters` default to the config's (its sections and the
    --filter files)."""

    pipeline_class: type[RelayPipeline] | type[BackupPipeline]

    def __init__(
        self,
        cfg: Config,
        *,
        stop_at_end: bool,
        stop_event: threading.Event,
        metrics: Metrics,
        filters: tuple[FilterSpec, ...] | None = None,
        master: str | None = None,
        failover: bool = False,
        **extra: bool,
    ):
        pipeline = self.pipeline_class(
            cfg,
            stop_event=stop_event,
            metrics=metrics,
            filters=load_filters(cfg) if filters is None else filters,
            failover=failover,
            **extra,
        )
        super().__init__(
            cfg, pipeline, stop_at_end=stop_at_end, stop_event=stop_event,
            metrics=metrics, master=master,
        )  # fmt: skip


class Relay(_FromSources):
    """Kafka to Kafka. `dry_run=True` (ktm check) creates no topic and starts no chore."""

    pipeline_class = RelayPipeline
    pipeline: RelayPipeline

    def __init__(self, cfg: Config, **kwargs: Any):
        super().__init__(cfg, **kwargs)
        self.pipeline.status = self.status  # group sync reads the acknowledged offsets


class Backup(_FromSources):
    """Kafka to store segments."""

    pipeline_class = BackupPipeline


class Restore(Runner):
    """Store segments to Kafka."""

    def __init__(
        self,
        cfg: Config,
        *,
        stop_at_end: bool,
        stop_event: threading.Event,
        metrics: Metrics,
        options: RestoreOptions | None = None,
        master: str | None = None,
    ):
        options = options or RestoreOptions()
        self.options = options
        pipeline = RestorePipeline(cfg, stop_event=stop_event, metrics=metrics, options=options)
        super().__init__(
            cfg, pipeline, stop_at_end=stop_at_end, stop_event=stop_event,
            metrics=metrics, master=master,
        )  # fmt: skip
        pipeline.status = self.status  # shows what start-up waits for (--follow)

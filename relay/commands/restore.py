"""`ktm restore`: store segments into Kafka topics, exactly once; optionally the consumer-group
offsets too (translated), or following the store as segments land."""

from __future__ import annotations

import threading

import click

from relay.commands.common import Options, run_pipeline
from relay.config import Config
from relay.engine.driver.runner import Runner
from relay.pipelines.restore.driver import RestoreOptions

NEEDS = frozenset({"target", "store"})


def restore(opts: Options, options: RestoreOptions, groups: bool) -> int:
    if options.from_time is not None and options.until_time is not None:
        if options.from_time >= options.until_time:
            raise click.BadParameter("--from-time must be before --until-time")

    def build(cfg: Config, stop: threading.Event) -> Runner:
        from relay.engine.metrics import Metrics
        from relay.pipelines.jobs import restore_job

        return restore_job(
            cfg,
            stop_at_end=not options.follow,
            stop_event=stop,
            metrics=Metrics(per_partition=cfg.app.partition_metrics),
            options=options,
            master=opts.master,
        )

    def carry(cfg: Config, runner: Runner) -> None:
        from relay.pipelines.restore.translate import carry_groups

        carry_groups(cfg, runner.routes, runner.pipeline.timeout)  # type: ignore[attr-defined]

    return run_pipeline(opts, NEEDS, build, carry if groups else None)

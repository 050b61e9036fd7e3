"""`ktm relay` and `ktm backup`: read `[[sources]]` until stopped or (--stop-at-end) the end
offsets seen at start-up; write to `[target]` (relay) or into `[store]` segments (backup)."""

from __future__ import annotations

import threading

from relay.commands.common import Options, run_pipeline
from relay.config import Config
from relay.engine.driver.runner import Runner

NEEDS = {"relay": frozenset({"sources", "target"}), "backup": frozenset({"sources", "store"})}


def relay(opts: Options) -> int:
    return _from_sources(opts, "relay")


def backup(opts: Options) -> int:
    return _from_sources(opts, "backup")


def _from_sources(opts: Options, kind: str) -> int:
    def build(cfg: Config, stop: threading.Event) -> Runner:
        from relay.engine.metrics import Metrics
        from relay.pipelines.jobs import backup_job, relay_job

        job = relay_job if kind == "relay" else backup_job
        return job(
            cfg,
            stop_at_end=opts.stop_at_end,
            stop_event=stop,
            metrics=Metrics(per_partition=cfg.app.partition_metrics),
            master=opts.master,
            failover=opts.mode == "failover",
        )

    return run_pipeline(opts, NEEDS[kind], build)

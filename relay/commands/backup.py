"""`ktm backup`: Kafka partitions into store segments, exactly once."""

from __future__ import annotations

import threading

from relay.commands.common import Options, run_pipeline
from relay.config import Config
from relay.driver.runner import Runner

NEEDS = frozenset({"sources", "store"})


def backup(opts: Options) -> int:
    def build(cfg: Config, stop: threading.Event) -> Runner:
        from relay.driver.jobs import Backup
        from relay.driver.metrics import Metrics

        return Backup(
            cfg,
            stop_at_end=opts.stop_at_end,
            stop_event=stop,
            metrics=Metrics(),
            master=opts.master,
            failover=opts.mode == "failover",
        )

    return run_pipeline(opts, NEEDS, build)

"""`ktm relay`: Kafka to Kafka, until stopped or (--stop-at-end) the end offsets seen at start."""

from __future__ import annotations

import threading

from relay.commands.common import Options, run_pipeline
from relay.config import Config
from relay.driver.runner import Runner

NEEDS = frozenset({"sources", "target"})


def relay(opts: Options) -> int:
    def build(cfg: Config, stop: threading.Event) -> Runner:
        from relay.driver.jobs import Relay
        from relay.driver.metrics import Metrics

        return Relay(
            cfg,
            stop_at_end=opts.stop_at_end,
            stop_event=stop,
            metrics=Metrics(),
            master=opts.master,
            failover=opts.mode == "failover",
        )

    return run_pipeline(opts, NEEDS, build)

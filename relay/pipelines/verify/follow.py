"""`ktm verify --follow`: verifying behind a running copy, pass after pass, until a signal.

Each pass reads what the copy wrote since the last one (every destination partition up to its
end at that moment) and the source alongside, and settles: a source record below the highest
one the copy holds that it does not hold is missing (a copy writes each partition in order).
Between passes the follower rests `[verify].interval`. It exports how far each source partition
is proven (`ktm_verified_next_offset`), what differs (`ktm_verify_mismatches_total`) and the age
of its last pass, and logs each kind of mismatch once per partition, with its offsets.

It runs beside the relay (or backup, or restore) as a process of its own, reading both sides
only: it needs no part in the copy's group and slows it by no more than its reads.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from relay.engine.batch import run_on
from relay.engine.metrics import Metrics, MetricsServer
from relay.pipelines.verify import report
from relay.pipelines.verify.driver import VerifyPipeline
from relay.pipelines.verify.spec import PartitionReport

if TYPE_CHECKING:
    from relay.config import Config
    from relay.engine.spark import Engine

log = logging.getLogger(__name__)


class Follower:
    """The driver's side of the passes: metrics and log lines from the states they hand back."""

    def __init__(self, pipeline: VerifyPipeline, metrics: Metrics):
        self.pipeline, self.metrics = pipeline, metrics
        self._counted: dict[tuple[object, str], int] = {}  # (partition, kind) -> exported
        self._compared: dict[object, int] = {}
        self._last_pass = time.monotonic()
        self.passes = 0
        copy = pipeline.plan.kind
        metrics.verify_age.labels(copy).set_function(lambda: self.age)

    def one_pass(self, engine: Engine) -> None:
        run_on(self.pipeline, engine)
        self._last_pass = time.monotonic()
        self.passes += 1
        for work, state in zip(self.pipeline.plan.works, self.pipeline.states, strict=True):
            if state is None:
                continue
            for feeder in state.feeders:
                self._export(feeder.report, feeder.cursor)
            for stray in state.reports(work)[len(state.feeders) :]:
                self._export(stray, None)

    def _export(self, one: PartitionReport, verified_next: int | None) -> None:
        m = self.metrics
        # records naming no source are counted under their destination partition
        topic, partition = one.key or (f"{one.dest[0]} (destination)", one.dest[1])
        labels = (topic, str(partition))
        if verified_next is not None:
            m.verified_next.labels(*labels).set(verified_next)
        compared = self._compared.get(one.key or one.dest, 0)
        m.verified.labels(*labels).inc(one.compared - compared)
        self._compared[one.key or one.dest] = one.compared
        first = {f.kind: f for f in one.first}
        for kind, count in one.counts:
            seen = self._counted.get((one.key or one.dest, kind), 0)
            if count > seen:
                m.verify_mismatches.labels(*labels, kind).inc(count - seen)
                if not seen:
                    log.warning("verify: %s: %s %d (first: %s)", report.name(one), kind,
                                count - seen, report.where(first[kind]))  # fmt: skip
                self._counted[(one.key or one.dest, kind)] = count
        if one.not_verified and (one.key or one.dest, "not verified") not in self._counted:
            log.warning("verify: %s was not verified: %s", report.name(one), one.not_verified)
            self._counted[(one.key or one.dest, "not verified")] = 1

    @property
    def age(self) -> float:
        return time.monotonic() - self._last_pass

    @property
    def mismatches(self) -> int:
        return sum(count for (_, kind), count in self._counted.items() if kind != "not verified")


def follow(cfg: Config, pipeline: VerifyPipeline, engine: Engine) -> int:
    """Passes until SIGINT/SIGTERM; exit 0 when nothing differed, 1 otherwise."""
    from relay.commands.common import install_signal_handlers

    stop = threading.Event()
    install_signal_handlers(stop)
    metrics = Metrics(per_partition=True)
    follower = Follower(pipeline, metrics)
    server = None
    if cfg.verify.metrics_addr is not None:
        stale = max(30.0, 10 * cfg.verify.interval)
        server = MetricsServer(metrics, cfg.verify.metrics_addr, lambda: _health(follower, stale))
    log.info("verify --follow: %d destination partition(s) of a %s, a pass every %.1fs",
             len(pipeline.plan.works), pipeline.plan.kind, cfg.verify.interval)  # fmt: skip
    try:
        while not stop.is_set():
            follower.one_pass(engine)
            stop.wait(cfg.verify.interval)
    finally:
        if server is not None:
            server.close()
    log.info("verify --follow stopped after %d passes: %s", follower.passes,
             report.summary(pipeline.reports()))  # fmt: skip
    return 1 if follower.mismatches else 0


def _health(follower: Follower, stale: float) -> tuple[bool, dict[str, object]]:
    """Healthy while nothing differs and passes keep coming."""
    age = follower.age
    ok = follower.mismatches == 0 and age < stale
    return ok, {"passes": follower.passes, "mismatches": follower.mismatches,
                "last_pass_age": round(age, 1)}  # fmt: skip

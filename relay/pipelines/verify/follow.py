"""`ktm verify --follow`: verifying behind a running copy, pass after pass, until a signal.

Each pass reads what the copy wrote since the last one (every destination partition up to its
end at that moment) and the source alongside, and settles: a source record below the highest
one the copy holds that it does not hold is missing (a copy writes each partition in order).
Between passes the follower rests `[verify].interval`. It exports how far each source partition
is proven (`ktm_verified_next_offset`), what differs (`ktm_verify_mismatches_total`) and the age
of its last pass, and logs each kind of mismatch once per partition, with its offsets.

It runs beside the relay (or backup, or restore) as a process of its own, reading both sides
only: it needs no part in the copy's group and slows it by no more than its reads; or, with
`[verify].follow = true`, inside the copy's own process (`FollowSidecar`): on a task slot of its
Spark, exporting on the copy's /metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from relay.engine.batch import run_on
from relay.engine.driver.seams import Batches, Engine
from relay.engine.metrics import Metrics
from relay.engine.metrics_server import MetricsServer
from relay.errors import KtmError
from relay.pipelines.verify import report
from relay.pipelines.verify.driver import VerifyPipeline
from relay.pipelines.verify.spec import PartitionReport

if TYPE_CHECKING:
    from relay.config import Config
    from relay.engine.spark import Spark

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


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

    def one_pass(self, engine: Batches) -> None:
        run_on(self.pipeline, engine)  # type: ignore[arg-type]
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
        which = one.key or one.dest
        if verified_next is not None:
            m.verified_next.labels(*labels).set(verified_next)
        m.verified.labels(*labels).inc(one.compared - self._compared.get(which, 0))
        self._compared[which] = one.compared
        first = {f.kind: f for f in one.first}
        for kind, count in one.counts:
            seen = self._counted.get((which, kind), 0)
            if count > seen:
                m.verify_mismatches.labels(*labels, kind).inc(count - seen)
                if not seen:
                    log.warning(
                        "verify: %s: %s %d (first: %s)",
                        report.name(one),
                        kind,
                        count,
                        report.where(first[kind]),
                    )
                self._counted[(which, kind)] = count
        if one.not_verified and (which, "not verified") not in self._counted:
            log.warning("verify: %s was not verified: %s", report.name(one), one.not_verified)
            self._counted[(which, "not verified")] = 1

    @property
    def age(self) -> float:
        return time.monotonic() - self._last_pass

    @property
    def mismatches(self) -> int:
        return sum(count for (_, kind), count in self._counted.items() if kind != "not verified")


class _Slots:
    """An engine as a sidecar sees it: its own slots only."""

    def __init__(self, engine: Engine, slots: int):
        self.engine, self.slots = engine, slots

    def run_batch(self, tasks: Sequence[T], run: Callable[[T], R]) -> list[R]:
        return self.engine.run_batch(tasks, run)


class FollowSidecar:
    """`[verify].follow = true`: the copy's own process verifies what it copies, pass after
    pass on one task slot of its Spark (relay.engine.driver.sidecar)."""

    slots = 1

    def __init__(self, cfg: Config, kind: str, metrics: Metrics, failover: bool = False):
        self.cfg, self.kind, self.metrics, self.failover = cfg, kind, metrics, failover
        self.follower: Follower | None = None

    def run(self, engine: Engine, stop: threading.Event) -> None:
        from relay.pipelines.verify.plan import plan_verify

        while self.follower is None and not stop.is_set():
            try:
                plan = plan_verify(self.cfg, self.kind, self.failover, None, follow=True)
                timeout = self.cfg.source_pool.request_timeout * 5
                self.follower = Follower(VerifyPipeline(plan, timeout, follow=True), self.metrics)
            except KtmError as exc:  # a cluster not there yet: the copy waits for it too
                log.warning("verify: cannot plan yet (%s); trying again", exc)
                stop.wait(max(self.cfg.verify.interval, 5.0))
        log.info("verify: following the %s's copy on one task slot", self.kind)
        mine = _Slots(engine, self.slots)
        while not stop.is_set():
            try:
                self.follower.one_pass(mine)  # type: ignore[union-attr]
            except KtmError as exc:
                log.warning("verify: a pass failed (%s); trying again", exc)
            stop.wait(self.cfg.verify.interval)


def follow(cfg: Config, pipeline: VerifyPipeline, engine: Spark, stop: threading.Event) -> int:
    """Passes until `stop` is set (SIGINT/SIGTERM); exit 0 when nothing differed, 1 otherwise."""
    metrics = Metrics(per_partition=True)
    follower = Follower(pipeline, metrics)
    server = None
    if cfg.verify.metrics_addr is not None:
        stale = max(30.0, 10 * cfg.verify.interval)
        server = MetricsServer(metrics, cfg.verify.metrics_addr, lambda: _health(follower, stale))
    log.info(
        "verify --follow: %d destination partition(s) of a %s, a pass every %.1fs",
        len(pipeline.plan.works),
        pipeline.plan.kind,
        cfg.verify.interval,
    )
    try:
        while not stop.is_set():
            follower.one_pass(engine)
            stop.wait(cfg.verify.interval)
    finally:
        if server is not None:
            server.close()
    log.info(
        "verify --follow stopped after %d passes: %s",
        follower.passes,
        report.summary(pipeline.reports()),
    )
    return 1 if follower.mismatches else 0


def _health(follower: Follower, stale: float) -> tuple[bool, dict[str, object]]:
    """Healthy while nothing differs and passes keep coming."""
    age = follower.age
    ok = follower.mismatches == 0 and age < stale
    return ok, {
        "passes": follower.passes,
        "mismatches": follower.mismatches,
        "last_pass_age": round(age, 1),
    }

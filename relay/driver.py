"""The driver: checks the clusters, plans, runs epochs on Spark, retries, stops.

It never moves records itself. Each epoch is one Spark job with one task per source partition;
between epochs it records metrics, decides retries and plans the next epoch from the offsets the
tasks reported as acknowledged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception

from relay import kafka_io
from relay.config import ClusterConfig, Config
from relay.engine import Engine, default_master, make_log_dir
from relay.errors import KafkaSetupError, RelayError
from relay.filters import FilterSpec
from relay.metrics import Metrics
from relay.plan import PartitionRoute, PartitionTask, SourcePartition, TaskResult, plan_routes
from relay.resume import SourceOffsets, relayed_offsets, resume_points, source_offsets

log = logging.getLogger(__name__)

T = TypeVar("T")
STARTUP_ATTEMPTS_WHEN_FOREVER = 5  # "-1 = forever" applies once the relay has started


class RetriableEpochError(RelayError):
    """Some tasks failed with a retriable error; `side` is "source" or "target"."""

    def __init__(self, message: str, side: str):
        super().__init__(message)
        self.side = side


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int  # -1 = forever
    backoff_min: float
    backoff_max: float

    def wait(self, attempt: int) -> float:
        return float(min(self.backoff_max, self.backoff_min * 2 ** max(0, attempt - 1)))


@dataclass
class RunSummary:
    relayed: int = 0
    filtered: int = 0
    epochs: int = 0
    elapsed: float = 0.0
    epoch_overhead: float = 0.0
    spark_start: float = 0.0
    stopped_by_signal: bool = False
    next_offsets: dict[SourcePartition, int] = field(default_factory=dict)


class Relay:
    def __init__(
        self,
        cfg: Config,
        *,
        stop_at_end: bool,
        stop_event: threading.Event,
        metrics: Metrics,
        filters: tuple[FilterSpec, ...] = (),
        master: str | None = None,
    ):
        self.cfg = cfg
        self.source: ClusterConfig = cfg.sources[0]
        self.stop_at_end = stop_at_end
        self.stop_event = stop_event
        self.metrics = metrics
        self.filters = filters
        self.master_override = master
        self.timeout = cfg.source_pool.request_timeout * 5 + 5
        self.routes: list[PartitionRoute] = []
        self.next: dict[SourcePartition, int] = {}
        self.stop_offsets: dict[SourcePartition, int] = {}
        self.summary = RunSummary()
        self.engine: Engine | None = None
        self.log_path: str | None = None

    # ---- set-up -------------------------------------------------------------------------

    def prepare(self) -> None:
        """Check both clusters and topics, then find every partition's resume point."""
        cfg = self.cfg
        names = [r.source for r in cfg.topics]
        src_counts = self._startup(
            "source", lambda: kafka_io.partition_counts(self.source, names, self.timeout)
        )
        dst_counts = self._startup(
            "target",
            lambda: kafka_io.partition_counts(
                cfg.target.cluster, [r.target for r in cfg.topics], self.timeout
            ),
        )
        where = kafka_io.describe(self.source)
        self.routes = plan_routes(cfg.topics, src_counts, dst_counts, where)
        offsets = self._startup(
            "source", lambda: source_offsets(self.source, self.routes, self.timeout)
        )
        points = self._startup(
            "target",
            lambda: resume_points(
                self.source,
                cfg.target.cluster,
                self.routes,
                cfg.app.group_id,
                offsets,
                self.timeout,
            ),
        )
        self.next = {key: point.offset for key, point in points.items()}
        if self.stop_at_end:
            self.stop_offsets = dict(offsets.end)
        self._record_lag(offsets)

    def _startup(self, side: str, fn: Callable[[], T]) -> T:
        policy = self._policy(side)
        if policy.max_retries < 0:
            policy = RetryPolicy(
                STARTUP_ATTEMPTS_WHEN_FOREVER, policy.backoff_min, policy.backoff_max
            )
        cluster = self.source if side == "source" else self.cfg.target.cluster
        try:
            for attempt in self._retrying(lambda _: policy, kafka_io.is_retriable):
                with attempt:
                    return fn()
        except KafkaSetupError:
            raise
        except Exception as exc:
            if kafka_io.is_retriable(exc):
                raise KafkaSetupError(
                    f"{side} {kafka_io.describe(cluster)}: unreachable after "
                    f"{policy.max_retries + 1} attempts: {exc}"
                ) from exc
            raise KafkaSetupError(f"{side} {kafka_io.describe(cluster)}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover - reraise=True

    # ---- running ------------------------------------------------------------------------

    def run(self) -> RunSummary:
        started = time.monotonic()
        try:
            if self._pending():
                self._start_engine()
            while not self.stop_event.is_set():
                todo = self._pending()
                if not todo:
                    log.info("reached the end offsets seen at start-up")
                    break
                for attempt in self._retrying(self._epoch_policy, _is_retriable_epoch):
                    with attempt:
                        self._epoch(todo, attempt.retry_state.attempt_number)
        finally:
            self.summary.elapsed = time.monotonic() - started
            self.summary.stopped_by_signal = self.stop_event.is_set()
            self.summary.next_offsets = dict(self.next)
            self.close()
        return self.summary

    def close(self) -> None:
        if self.engine is not None:
            engine, self.engine = self.engine, None
            engine.stop()

    def _start_engine(self) -> None:
        slots = len(self.routes)
        master = self.master_override or self.cfg.spark.master or default_master(slots)
        log_dir = make_log_dir()
        began = time.monotonic()
        self.engine = Engine(self.cfg.spark, master, log_dir)
        self.log_path = str(self.engine.log_path)
        self.summary.spark_start = time.monotonic() - began
        log.info("spark started master=%s in %.1fs", master, self.summary.spark_start)
        log.debug("spark log: %s", self.engine.log_path)

    def _pending(self) -> list[PartitionRoute]:
        if not self.stop_at_end:
            return list(self.routes)
        return [r for r in self.routes if self.next[r.key] < self.stop_offsets[r.key]]

    def _epoch(self, todo: list[PartitionRoute], attempt: int = 1) -> None:
        if self.stop_event.is_set():
            return
        if attempt > 1:
            self._resync(todo)
        tasks = [self._task(route) for route in todo]
        assert self.engine is not None
        began = time.monotonic()
        try:
            results = self.engine.run_epoch(tasks)
        except RelayError as exc:
            raise RetriableEpochError(str(exc), "target") from exc
        wall = time.monotonic() - began
        self._record(results, wall)
        failures = [r for r in results if r.error_kind]
        if failures:
            self._fail(failures)

    def _task(self, route: PartitionRoute) -> PartitionTask:
        return PartitionTask(
            source=self.source,
            target=self.cfg.target,
            route=route,
            start=self.next[route.key],
            stop=self.stop_offsets.get(route.key) if self.stop_at_end else None,
            deadline=self.cfg.spark.epoch_duration,
            group_id=self.cfg.app.group_id,
            filters=self.filters,
        )

    def _resync(self, todo: list[PartitionRoute]) -> None:
        """After a failed epoch, records may have landed without their ack reaching us."""
        relayed = relayed_offsets(self.cfg.target.cluster, todo, self.timeout)
        for route in todo:
            if route.key in relayed and relayed[route.key] + 1 > self.next[route.key]:
                log.info(
                    "resync topic=%s partition=%s offset=%s (delivered without ack)",
                    route.topic,
                    route.partition,
                    relayed[route.key] + 1,
                )
                self.next[route.key] = relayed[route.key] + 1

    def _fail(self, failures: list[TaskResult]) -> None:
        for r in failures:
            self.metrics.errors.labels(r.error_kind).inc()
            log.warning(
                "task failed kind=%s topic=%s partition=%s next_offset=%s: %s",
                r.error_kind,
                r.key[0],
                r.key[1],
                r.next_offset,
                r.error,
            )
        fatal = [r for r in failures if not r.retriable]
        first = (fatal or failures)[0]
        where = f"{first.key[0]}[{first.key[1]}] at offset {first.next_offset}"
        if fatal:
            raise RelayError(f"{first.error_kind} error on {where}: {first.error}")
        side = first.error_kind or "target"
        raise RetriableEpochError(f"{side} error on {where}: {first.error}", side)

    # ---- bookkeeping --------------------------------------------------------------------

    def _record(self, results: list[TaskResult], wall: float) -> None:
        m = self.metrics
        by_key = {r.key: r for r in self.routes}
        for r in results:
            route = by_key[r.key]
            labels = (
                route.topic,
                str(route.partition),
                route.target_topic,
                str(route.target_partition),
            )
            m.consumed.labels(*labels).inc(r.consumed)
            m.produced.labels(*labels).inc(r.produced)
            m.bytes_produced.labels(route.target_topic).inc(r.produced_bytes)
            for filter_id, count in r.filtered.items():
                m.filtered.labels(filter_id, route.topic).inc(count)
                self.summary.filtered += count
            self.next[r.key] = max(self.next[r.key], r.next_offset)
            m.next_offset.labels(route.topic, str(route.partition)).set(self.next[r.key])
            if r.highwater is not None:
                lag = max(0, r.highwater - self.next[r.key])
                m.lag.labels(route.topic, str(route.partition)).set(lag)
            self.summary.relayed += r.produced
        busiest = max((r.elapsed for r in results), default=0.0)
        m.epoch_duration.observe(wall)
        m.epoch_overhead.inc(max(0.0, wall - busiest))
        self.summary.epoch_overhead += max(0.0, wall - busiest)
        self.summary.epochs += 1
        log.info(
            "epoch %d: %d records in %.2fs (%d partitions, total %d)",
            self.summary.epochs,
            sum(r.produced for r in results),
            wall,
            len(results),
            self.summary.relayed,
        )

    def _record_lag(self, offsets: SourceOffsets) -> None:
        for key, end in offsets.end.items():
            self.metrics.lag.labels(key[0], str(key[1])).set(max(0, end - self.next[key]))
            self.metrics.next_offset.labels(key[0], str(key[1])).set(self.next[key])

    # ---- retries ------------------------------------------------------------------------

    def _policy(self, side: str) -> RetryPolicy:
        if side == "source":
            pool = self.cfg.source_pool
            return RetryPolicy(pool.max_retries, pool.backoff_min, pool.backoff_max)
        target = self.cfg.target
        return RetryPolicy(target.max_retries, target.backoff_min, target.backoff_max)

    def _sleep(self, seconds: float) -> None:
        self.stop_event.wait(seconds)  # a signal ends a backoff at once

    def _epoch_policy(self, exc: BaseException | None) -> RetryPolicy:
        return self._policy(getattr(exc, "side", "target"))

    def _retrying(
        self,
        policy_for: Callable[[BaseException | None], RetryPolicy],
        retriable: Callable[[BaseException], bool],
    ) -> Retrying:
        """A tenacity loop whose bounds come from the config side that failed.

        The wait uses the stop event, so a signal interrupts a backoff at once.
        """

        def exhausted(state: RetryCallState) -> bool:
            exc = state.outcome.exception() if state.outcome else None
            policy = policy_for(exc)
            if self.stop_event.is_set():
                return True
            return policy.max_retries >= 0 and state.attempt_number > policy.max_retries

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return policy_for(exc).wait(state.attempt_number)

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            side = getattr(exc, "side", "startup")
            self.metrics.retries.labels(side).inc()
            log.warning(
                "attempt %d failed, retrying in %.1fs: %s",
                state.attempt_number,
                wait(state),
                exc,
            )

        return Retrying(
            retry=retry_if_exception(retriable),
            stop=exhausted,
            wait=wait,
            sleep=self._sleep,
            before_sleep=before_sleep,
            reraise=True,
        )


def _is_retriable_epoch(exc: BaseException) -> bool:
    return isinstance(exc, RetriableEpochError) or kafka_io.is_retriable(exc)

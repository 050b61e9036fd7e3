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

from relay import kafka_io
from relay.config import Config
from relay.engine import Engine, default_master, make_log_dir
from relay.errors import KafkaSetupError, RelayError
from relay.failover import Decision, SourcePool
from relay.filters import FilterSpec
from relay.metrics import Metrics
from relay.plan import PartitionRoute, PartitionTask, SourcePartition, TaskResult, plan_routes
from relay.resume import (
    check_continuity,
    relayed_offsets,
    relayed_records,
    resume_points,
    source_offsets,
)
from relay.retry import RetriableEpochError, RetryPolicy, policy_for, retrying
from relay.status import Status

log = logging.getLogger(__name__)

T = TypeVar("T")


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
        failover: bool = False,
    ):
        self.cfg = cfg
        self.pool = SourcePool(cfg.sources, cfg.source_pool, metrics, failover)
        self.stop_at_end = stop_at_end
        self.stop_event = stop_event
        self.metrics = metrics
        self.filters = filters
        self.master_override = master
        self.timeout = cfg.source_pool.request_timeout * 5 + 5
        self.routes: list[PartitionRoute] = []
        self.status = Status(metrics, cfg.app.stuck_after)
        self.stop_offsets: dict[SourcePartition, int] = {}
        self.summary = RunSummary()
        self.engine: Engine | None = None
        self.log_path: str | None = None
        self._source_trouble = False

    # ---- set-up -------------------------------------------------------------------------

    def prepare(self) -> None:
        """Check the clusters and topics, pick the source node, find every resume point."""
        cfg, target = self.cfg, self.cfg.target.cluster
        names = [r.source for r in cfg.topics]
        src_counts = self._startup(
            "source", lambda: self.pool.partition_counts(names, self.timeout)
        )
        dst_counts = self._startup(
            "target",
            lambda: kafka_io.partition_counts(target, [r.target for r in cfg.topics], self.timeout),
        )
        self.routes = plan_routes(
            cfg.topics, src_counts, dst_counts, self.pool.describe_all(), kafka_io.describe(target)
        )
        relayed = self._startup(
            "target", lambda: relayed_offsets(target, self.routes, self.timeout)
        )
        keys = [r.key for r in self.routes]
        relayed_next = {key: offset + 1 for key, offset in relayed.items()}
        self._startup("source", lambda: self.pool.start(keys, relayed_next))
        source = self.pool.active
        offsets = self._startup("source", lambda: source_offsets(source, self.routes, self.timeout))
        points = self._startup(
            "source",
            lambda: resume_points(
                source, self.routes, cfg.app.group_id, offsets, relayed, self.timeout
            ),
        )
        if self.stop_at_end:
            self.stop_offsets = self.pool.boot_ends() or dict(offsets.end)
        self.status.active_node = source.name
        self.status.start(
            self.routes,
            {key: point.offset for key, point in points.items()},
            offsets.end,
            self.stop_offsets if self.stop_at_end else None,
        )

    def _startup(self, side: str, fn: Callable[[], T]) -> T:
        policy = policy_for(self.cfg, side).bounded()
        if side == "source":
            where = "source " + self.pool.describe_all()
        else:
            where = kafka_io.describe(self.cfg.target.cluster)
        try:
            for attempt in retrying(
                lambda _: policy, kafka_io.is_retriable, self.stop_event, self.metrics
            ):
                with attempt:
                    return fn()
        except kafka_io.TLSHandshakeError as exc:
            raise KafkaSetupError(f"{where}: {exc}") from exc
        except KafkaSetupError:
            raise
        except Exception as exc:
            if kafka_io.is_retriable(exc):
                tries = policy.max_retries + 1
                raise KafkaSetupError(
                    f"{where}: unreachable after {tries} attempt{'s' if tries > 1 else ''}: {exc}"
                ) from exc
            raise KafkaSetupError(f"{where}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover - reraise=True

    # ---- running ------------------------------------------------------------------------

    def run(self) -> RunSummary:
        started = time.monotonic()
        try:
            if self._pending():
                self._start_spark()
            while not self.stop_event.is_set() and self.engine is not None:
                todo = self._pending()
                if not todo:
                    log.info("reached the end offsets seen at start-up")
                    break
                policy = self._epoch_policy
                for attempt in retrying(policy, _is_retriable_epoch, self.stop_event, self.metrics):
                    with attempt:
                        self._epoch(todo, attempt.retry_state.attempt_number)
        finally:
            self.summary.elapsed = time.monotonic() - started
            self.summary.stopped_by_signal = self.stop_event.is_set()
            self.summary.next_offsets = self.status.next_offsets()
            snap = self.status.snapshot()
            self.summary.relayed, self.summary.filtered = snap.relayed, snap.filtered
            self.summary.epochs = self.status.epochs
            self.summary.epoch_overhead = self.status.epoch_overhead
            self.close()
        return self.summary

    def close(self) -> None:
        self.pool.close()
        if self.engine is not None:
            engine, self.engine = self.engine, None
            engine.stop()

    def _start_spark(self) -> None:
        try:
            self._start_engine()
        except Exception as exc:
            if not self.stop_event.is_set():
                raise
            # The stop signal reached Spark's JVM while it was starting; nothing ran yet.
            log.warning("stopping: Spark was stopped while starting (%s)", exc)

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
        done = self.status.next_offsets()
        return [r for r in self.routes if done[r.key] < self.stop_offsets[r.key]]

    def _epoch(self, todo: list[PartitionRoute], attempt: int = 1) -> None:
        if self.stop_event.is_set():
            return
        if attempt > 1:
            self._resync(todo)
        try:
            decision = self.pool.next_switch(
                self.status.next_offsets(), urgent=self._source_trouble
            )
        except ConnectionError as exc:
            raise RetriableEpochError(str(exc), "source") from exc
        if decision is not None:
            self._switch(decision)
        self.status.observe_nodes(self.pool.views(), self.pool.active.name)
        nexts = self.status.next_offsets()
        tasks = [self._task(route, nexts[route.key]) for route in todo]
        assert self.engine is not None
        began = time.monotonic()
        try:
            results = self.engine.run_epoch(tasks)
        except RelayError as exc:
            if self.stop_event.is_set():
                # A stop signal sent to the whole process group (systemd, Ctrl+C in some
                # shells) also ends Spark's JVM mid-epoch. Nothing is lost: offsets only
                # moved for acknowledged records, and the next start resumes from the
                # destination's provenance headers.
                log.warning("stopping: the epoch ended with Spark (%s)", exc)
                return
            raise RetriableEpochError(str(exc), "target") from exc
        wall = time.monotonic() - began
        self.status.record_epoch(results, wall)
        self._log_epoch(results, wall)
        failures = [r for r in results if r.error_kind]
        self._source_trouble = any(r.error_kind == "source" for r in failures)
        if failures:
            self._fail(failures)

    def _task(self, route: PartitionRoute, start: int) -> PartitionTask:
        return PartitionTask(
            source=self.pool.active,
            target=self.cfg.target,
            route=route,
            start=start,
            stop=self.stop_offsets.get(route.key) if self.stop_at_end else None,
            deadline=self.cfg.spark.epoch_duration,
            group_id=self.cfg.app.group_id,
            filters=self.filters,
        )

    def _resync(self, todo: list[PartitionRoute]) -> None:
        """After a failed epoch, records may have landed without their ack reaching us."""
        relayed = relayed_offsets(self.cfg.target.cluster, todo, self.timeout)
        for (topic, partition), offset in relayed.items():
            if self.status.advance((topic, partition), offset + 1):
                log.info(
                    "resync topic=%s partition=%s offset=%s (delivered without ack)",
                    topic,
                    partition,
                    offset + 1,
                )

    def _switch(self, decision: Decision) -> None:
        """Move to another node: resume from the destination's provenance, after checking
        that the new node's record at the last relayed offset is the one relayed."""
        new = self.pool.node(decision.node)
        relayed = relayed_records(self.cfg.target.cluster, self.routes, self.timeout)
        check_continuity(new, relayed, self.cfg.source_pool.on_mismatch, self.timeout)
        for key, (offset, _) in relayed.items():
            self.status.advance(key, offset + 1)
        nexts = self.status.next_offsets()
        resume = ", ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(nexts.items()))
        log.warning(
            "failover from=%s to=%s reason=%s resume: %s",
            self.pool.active.name,
            new.name,
            decision.reason,
            resume,
        )
        self.pool.switch(decision)

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

    def _log_epoch(self, results: list[TaskResult], wall: float) -> None:
        log.info(
            "epoch %d: %d records in %.2fs (%d partitions, total %d)",
            self.status.epochs,
            sum(r.produced for r in results),
            wall,
            len(results),
            self.status.snapshot().relayed,
        )

    # ---- retries ------------------------------------------------------------------------

    def _epoch_policy(self, exc: BaseException | None) -> RetryPolicy:
        return policy_for(self.cfg, getattr(exc, "side", "target"))


def _is_retriable_epoch(exc: BaseException) -> bool:
    return isinstance(exc, RetriableEpochError) or kafka_io.is_retriable(exc)

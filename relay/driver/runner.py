"""The driver: plans, runs rounds on Spark, watches live progress, fails over, retries, stops.

It never moves records itself. Spark starts on a background thread while the clusters are
checked. Each round is one Spark job with at most one task per slot, each task serving a group
of partitions until the driver stops it; between rounds the driver re-plans the groups from the
offsets the tasks reported as acknowledged.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import TracebackType

from relay.channel import ControlServer, Report
from relay.clients.settings import is_retriable
from relay.config import Config
from relay.driver.failover import Decision, SourcePool
from relay.driver.groups import Groups, Load, group_index, plan_groups, worth_replanning
from relay.driver.metrics import Metrics
from relay.driver.retry import RetriableRoundError, RetryPolicy, policy_for, retrying
from relay.driver.rounds import TICK, Round
from relay.driver.setup import Startup
from relay.driver.status import Status
from relay.engine import Engine, default_master, make_log_dir
from relay.errors import RelayError
from relay.filters import FilterSpec
from relay.resume import check_continuity, delivered, destination_next_offsets
from relay.spec import GroupResult, GroupTask, PartitionRoute, PartitionWork, SourcePartition

log = logging.getLogger(__name__)

LEASE = 5.0  # seconds a task keeps writing without hearing from the driver
REPORT_INTERVAL = 0.5  # seconds between a task's progress reports


@dataclass
class RunSummary:
    relayed: int = 0
    filtered: int = 0
    rounds: int = 0
    elapsed: float = 0.0
    spark_start: float = 0.0
    first_record: float | None = None  # seconds from start to the first acknowledged record
    slots: int = 0
    stopped_by_signal: bool = False
    next_offsets: dict[SourcePartition, int] = field(default_factory=dict)


class Relay:
    """`with Relay(...) as relay: relay.prepare(); relay.run()`; closing is idempotent."""

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
        self.stop_at_end = stop_at_end
        self.stop_event = stop_event
        self.metrics = metrics
        self.filters = filters
        self.master_override = master
        self.pool = SourcePool(cfg.sources, cfg.source_pool, metrics, failover)
        self.status = Status(metrics, cfg.app.stuck_after)
        self.startup = Startup(cfg, self.pool, stop_event, metrics)
        self.timeout = self.startup.timeout
        self.routes: list[PartitionRoute] = []
        self.stop_offsets: dict[SourcePartition, int] = {}
        self.summary = RunSummary()
        self.engine: Engine | None = None
        self.log_path: str | None = None
        self.channel: ControlServer | None = None
        self._begun = time.monotonic()
        self._engine_start: Future[Engine] | None = None
        self._round: Round | None = None
        self._round_id = 0
        self._groups: dict[SourcePartition, int] = {}
        self._source_trouble = False
        self._gap_from: float | None = None
        self._closed = False
        self._resources = ExitStack()
        self._resources.callback(self.pool.close)

    def __enter__(self) -> Relay:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ---- set-up -------------------------------------------------------------------------

    def begin_spark(self, partitions: int = 0) -> None:
        """Start Spark (and its Python workers) on a thread, so it overlaps the cluster checks."""
        if self._engine_start is None:
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ktm-spark-start")
            self._engine_start = executor.submit(self._start_engine, partitions)
            executor.shutdown(wait=False)
            self._resources.callback(self._stop_engine)

    def prepare(self, start_spark: bool = False) -> None:
        """Check the clusters and topics, pick the source node, find every next offset.

        With `start_spark`, Spark starts in the background as soon as the partition count is
        known, while the destination tails and offsets are read."""
        on_routes = (lambda routes: self.begin_spark(len(routes))) if start_spark else None
        plan = self.startup.plan(self.stop_at_end, on_routes)
        self.routes = plan.routes
        self.stop_offsets = plan.stops or {}
        self.status.active_node = self.pool.active.name
        self.status.start(plan.routes, plan.next_offsets, plan.ends, plan.stops)

    def _start_engine(self, partitions: int) -> Engine:
        count = partitions or len(self.cfg.topics) * 64
        master = self.master_override or self.cfg.spark.master or default_master(count)
        began = time.monotonic()
        engine = Engine(self.cfg.spark, master, make_log_dir())
        engine.warm_up()
        self.summary.spark_start = time.monotonic() - began
        self.log_path = str(engine.log_path)
        log.info(
            "spark started master=%s slots=%d in %.1fs",
            engine.master,
            engine.slots,
            self.summary.spark_start,
        )
        log.debug("spark log: %s", engine.log_path)
        return engine

    def _ensure_engine(self) -> Engine:
        if self.engine is None:
            self.begin_spark(len(self.routes))
            assert self._engine_start is not None
            self.engine = self._engine_start.result()
            self.metrics.task_slots.set(self.engine.slots)
            self.summary.slots = self.engine.slots
            host = self.engine.driver_host
            self.channel = ControlServer(
                host, self.cfg.spark.control_port, secrets.token_urlsafe(24), LEASE, self._report
            )
            self._resources.callback(self.channel.close)
        return self.engine

    def _stop_engine(self) -> None:
        if self._engine_start is None:
            return
        try:
            engine = self._engine_start.result()
        except Exception as exc:  # noqa: BLE001 - it failed to start: nothing to stop
            log.debug("spark start failed: %s", exc)
            return
        if self._round_id:
            engine.close_workers()
        engine.stop()

    # ---- running ------------------------------------------------------------------------

    def run(self) -> RunSummary:
        try:
            if self._pending():
                self._ensure_engine()
            while not self.stop_event.is_set():
                todo = self._pending()
                if not todo:
                    log.info("reached the end offsets seen at start-up")
                    break
                for attempt in retrying(
                    self._round_policy, _is_retriable_round, self.stop_event, self.metrics
                ):
                    with attempt:
                        self._round_once(todo, attempt.retry_state.attempt_number)
        finally:
            self._summarize()
            self.close()
        return self.summary

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._resources.close()

    def _pending(self) -> list[PartitionRoute]:
        if not self.stop_at_end:
            return list(self.routes)
        done = self.status.next_offsets()
        return [r for r in self.routes if done[r.key] < self.stop_offsets[r.key]]

    def _round_once(self, todo: list[PartitionRoute], attempt: int) -> None:
        if self.stop_event.is_set():
            return
        if attempt > 1:
            self._resync(todo)
        self._fail_over_if_needed(urgent=self._source_trouble)
        engine = self._ensure_engine()
        assert self.channel is not None
        groups = self._plan(todo, engine.slots)
        self._round_id += 1
        tasks = [self._task(self._round_id, i, group) for i, group in enumerate(groups)]
        current = Round(self._round_id, groups, engine.submit(self._round_id, tasks))
        self._round = current
        while not current.job.wait(TICK):
            self._watch(current, len(tasks))
        try:
            results = current.job.results()
        except RelayError as exc:  # the job itself failed (a lost worker): re-read and retry
            if self.stop_event.is_set():
                log.info("stopping: the last round ended with Spark (%s)", exc)
                return
            raise RetriableRoundError(str(exc), "target") from exc
        engine.refresh_slots()
        wall = time.monotonic() - current.started
        self._gap_from = current.stop_asked_at or time.monotonic()
        for result in results:
            self.status.apply((result.round_id, result.task_id, result.attempt), result.partitions)
        self.status.record_round(wall, current.stop_reason or "end")
        failures = [r for r in results if r.error is not None]
        self._source_trouble = any(r.error and r.error.kind == "source" for r in failures)
        log.info(
            "round %d ended (%s) after %.1fs: %d tasks, %d records relayed so far",
            current.round_id,
            current.stop_reason or "done",
            wall,
            len(tasks),
            self.status.snapshot().relayed,
        )
        if failures:
            self._fail(failures)

    def _plan(self, todo: list[PartitionRoute], slots: int) -> Groups:
        rows = self.status.rows()
        loads = [Load(r.key, rows[r.key].lag or 0, rows[r.key].rate) for r in todo]
        groups = plan_groups(loads, slots, self._groups)
        self._groups = group_index(groups)
        return groups

    def _task(self, round_id: int, task_id: int, group: tuple[SourcePartition, ...]) -> GroupTask:
        assert self.channel is not None
        nexts = self.status.next_offsets()
        by_key = {r.key: r for r in self.routes}
        works = tuple(
            PartitionWork(by_key[key], nexts[key], self.stop_offsets.get(key)) for key in group
        )
        return GroupTask(
            round_id=round_id,
            task_id=task_id,
            source=self.pool.active,
            target=self.cfg.target,
            partitions=works,
            group_id=self.cfg.app.group_id,
            channel=self.channel.address,
            lease=LEASE,
            report_interval=REPORT_INTERVAL,
            filters=self.filters,
        )

    def _report(self, report: Report) -> None:
        """A task's live report (channel thread)."""
        result = report.result
        self.status.apply(
            (report.round_id, report.task_id, report.attempt), result.partitions, result.latencies
        )
        current = self._round
        if current is not None:
            current.on_report(report)

    def _watch(self, current: Round, tasks: int) -> None:
        """Every tick while a round runs: gauges, and whether the round should end."""
        assert self.channel is not None
        if self._gap_from is not None and self.channel.connected(current.round_id) >= tasks:
            self.metrics.round_gap.inc(time.monotonic() - self._gap_from)
            self._gap_from = None
        self.status.observe_nodes(self.pool.views(), self.pool.active.name)
        reason = self._end_reason(current)
        if reason is not None:
            current.ask_to_stop(reason, self.channel)
        if current.overdue():
            current.cancel()

    def _end_reason(self, current: Round) -> str | None:
        if self.stop_event.is_set():
            return "stop"
        if current.failed():
            return "error"
        try:
            if self.pool.next_switch(self.status.next_offsets(), urgent=False) is not None:
                return "failover"
        except ConnectionError:
            return "failover"  # the active node is down and none can serve: end, then retry
        if current.stalled():
            return "lost"
        if self._should_replan(current):
            return "rebalance"
        return None

    def _should_replan(self, current: Round) -> bool:
        """Re-plan when a task is done (its slot idles) or every rebalance_interval, and only
        if a fresh plan finishes the work clearly sooner."""
        now, finished = time.monotonic(), len(current.finished_results())
        due = now - current.last_replan_check >= self.cfg.spark.rebalance_interval
        if not (due or finished > current.replan_checked_finished):
            return False
        current.last_replan_check, current.replan_checked_finished = now, finished
        rows = self.status.rows()
        pending = {r.key for r in self._pending()}
        live = [tuple(k for k in group if k in pending) for group in current.groups]
        loads = {k: Load(k, rows[k].lag or 0, rows[k].rate) for k in pending}
        rate = max(sum(row.rate for row in rows.values()) / max(len(live), 1), 1.0)
        return worth_replanning(live, loads, len(current.groups), rate)

    def _resync(self, todo: list[PartitionRoute]) -> None:
        """After a failed round, records may have landed without their ack reaching us."""
        found = destination_next_offsets(self.cfg.target.cluster, todo, self.timeout)
        for (topic, partition), next_offset in found.items():
            if self.status.advance((topic, partition), next_offset):
                log.info(
                    "resync topic=%s partition=%s next_offset=%s (delivered without ack)",
                    topic,
                    partition,
                    next_offset,
                )

    def _fail_over_if_needed(self, urgent: bool) -> None:
        try:
            decision = self.pool.next_switch(self.status.next_offsets(), urgent=urgent)
        except ConnectionError as exc:
            raise RetriableRoundError(str(exc), "source") from exc
        if decision is not None:
            self._switch(decision)
        self.status.observe_nodes(self.pool.views(), self.pool.active.name)

    def _switch(self, decision: Decision) -> None:
        """Move to another node: resume from the destination's provenance, after checking
        that the new node's record at the last relayed offset is the one relayed."""
        new = self.pool.node(decision.node)
        at_destination = delivered(self.cfg.target.cluster, self.routes, self.timeout)
        check_continuity(new, at_destination, self.cfg.source_pool.on_mismatch, self.timeout)
        for key, last in at_destination.items():
            self.status.advance(key, last.next_offset)
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

    def _fail(self, failures: list[GroupResult]) -> None:
        errors = [r.error for r in failures if r.error is not None]
        for error in errors:
            self.metrics.errors.labels(error.kind).inc()
            log.warning(
                "task failed kind=%s partition=%s: %s", error.kind, error.key, error.message
            )
        fatal = [e for e in errors if not e.retriable]
        first = (fatal or errors)[0]
        where = f" on {first.key[0]}[{first.key[1]}]" if first.key else ""
        if fatal:
            raise RelayError(f"{first.kind} error{where}: {first.message}")
        side = "source" if first.kind == "source" else "target"
        raise RetriableRoundError(f"{first.kind} error{where}: {first.message}", side)

    def _summarize(self) -> None:
        snap = self.status.snapshot()
        s = self.summary
        s.elapsed = time.monotonic() - self._begun
        s.stopped_by_signal = self.stop_event.is_set()
        s.next_offsets = self.status.next_offsets()
        s.relayed, s.filtered, s.rounds = snap.relayed, snap.filtered, self.status.rounds
        if self.status.first_ack_at is not None:
            s.first_record = self.status.first_ack_at - self._begun
            self.metrics.first_record.set(s.first_record)

    def _round_policy(self, exc: BaseException | None) -> RetryPolicy:
        return policy_for(self.cfg, getattr(exc, "side", "target"))


def _is_retriable_round(exc: BaseException) -> bool:
    return isinstance(exc, RetriableRoundError) or is_retriable(exc)

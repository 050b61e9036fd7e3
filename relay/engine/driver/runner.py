"""The driver: plans, runs rounds on Spark, watches live progress, fails over, retries, stops.

It never moves records itself. Spark starts on a background thread while the clusters are
checked, and the process joins its group (relay.engine.driver.membership) meanwhile. Each round
is one Spark job with at most one task per slot, each task serving some of the partitions this
process owns, until the driver stops it; between rounds the driver re-plans from the offsets the
tasks reported as acknowledged. What differs between relay, backup and restore is behind
relay.engine.pipeline.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from types import TracebackType
from typing import TYPE_CHECKING

from relay.clients.kept import keep_clients
from relay.clients.settings import is_retriable
from relay.config import Config
from relay.engine.channel import Report
from relay.engine.driver.backend import SparkBackend
from relay.engine.driver.held import settle_hold
from relay.engine.driver.limits import Shares
from relay.engine.driver.ownership import Ownership
from relay.engine.driver.retry import RetriableRoundError, RetryPolicy, policy_for, retrying
from relay.engine.driver.rounds import TICK, Round, await_quiet, raise_for, settle
from relay.engine.driver.seams import Backend, Channel, Engine, Members
from relay.engine.driver.sidecar import Sidecar, Sidecars
from relay.engine.driver.standing import Standing
from relay.engine.driver.status import Status
from relay.engine.driver.summary import RunSummary, summarize
from relay.engine.driver.task_plan import TaskPlan, TaskPlanner, load_of
from relay.engine.metrics import Metrics
from relay.engine.pipeline import Pipeline, Progress
from relay.errors import KtmError, RelayError, StoppedWhileWaiting
from relay.spec import (
    ChannelAddress,
    PartitionRoute,
    SourcePartition,
    TaskResult,
    TaskSpec,
)

if TYPE_CHECKING:
    from relay.engine.executor.sides import Sides

log = logging.getLogger(__name__)

ALL_CORES = 1 << 16  # "as many partitions as can come": local Spark takes every core
REVOKE_WAIT = 20.0  # seconds a rebalance waits for the round to stop before cancelling it


class Runner:
    """`with Runner(...) as run: run.prepare(); run.run()`; closing is idempotent."""

    def __init__(
        self,
        cfg: Config,
        pipeline: Pipeline,
        *,
        stop_at_end: bool,
        stop_event: threading.Event,
        metrics: Metrics,
        master: str | None = None,
        backend: Backend | None = None,
        sidecars: tuple[Sidecar, ...] = (),
    ):
        self.cfg, self.pipeline = cfg, pipeline
        self.sidecars = Sidecars(sidecars)  # beside the rounds, on slots of their own
        self.stop_at_end, self.stop_event, self.metrics = stop_at_end, stop_event, metrics
        self.status = Status(metrics, cfg.app.stuck_after)
        self.ownership = Ownership(cfg, pipeline.kind, metrics)
        self.backend = backend or self._spark(master)
        self.summary = RunSummary()
        self._begun = time.monotonic()
        self._round: Round | None = None
        self._round_id = 0
        self.tasks = TaskPlanner()
        self._source_trouble = False
        self.shares = Shares(cfg.limits, metrics)  # this process's share of [limits]
        self.standing = Standing(
            pipeline, self.status, self.ownership, self.shares, metrics, stop_at_end
        )
        self.stops = self.standing.stops
        self._unsure = False  # tasks lost their lease: where their partitions stand is unknown
        self._gap_from: float | None = None
        self._submit = threading.Lock()  # planning + submitting a round vs. a rebalance
        self._closed = False
        self._resources = ExitStack()  # closed in the reverse order:
        self._resources.callback(self.ownership.close)  # last: left while Spark stops
        self._resources.callback(self.pipeline.close)
        self._resources.callback(self.backend.stop)
        self._resources.callback(self.sidecars.stop)  # before Spark stops

    def _spark(self, master: str | None) -> Backend:
        """Spark as the backend (tests pass one of their own: the driver's logic alone). Leases
        last a quarter of the group session (relay.engine.driver.membership), renewed 4 times
        as often."""
        return SparkBackend(
            self.cfg.spark,
            master,
            self.metrics,
            self.ownership.lease_for,
            self._report,
            renew_every=self.cfg.app.session_timeout / 16,
            stopping=self.stop_event,
            hold_for=self.ownership.hold_for,
        )

    def __enter__(self) -> Runner:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def log_path(self) -> str | None:
        return self.backend.log_path

    @property
    def routes(self) -> list[PartitionRoute]:
        return self.standing.routes

    # ---- set-up -------------------------------------------------------------------------

    def prepare(self, start_spark: bool = False) -> None:
        """Check the clusters and topics, find every next offset. With `start_spark`, Spark
        starts and the group is joined in the background as soon as the partitions are known,
        while the destination tails and offsets are read."""
        # The driver's thread asks each cluster things again and again (the plan, the tails
        # after every rebalance or failure, failover checks): its clients stay open until the
        # runner closes, instead of a bootstrap (3-4 round trips) per question.
        self._resources.enter_context(keep_clients())
        self.pipeline.head_start()
        if start_spark:
            self.backend.launch()  # the JVM starts while the partitions are asked for
            self._join_early()
        routes = self._partitions()
        if start_spark:
            self._begin(routes)
        self.standing.start(self.pipeline.resume(routes, self.stop_at_end))

    def _partitions(self) -> list[PartitionRoute]:
        """The pipeline's partitions; while it waits for some (restore --follow), the status
        says what for and it is asked again."""
        while True:
            found = self.pipeline.partitions()
            self.status.waiting_topics = dict(found.waiting)
            if found.routes is not None:
                return found.routes
            if self.stop_event.wait(found.again_in):
                waits = "; ".join(f"{topic}: {what}" for topic, what in found.waiting.items())
                raise StoppedWhileWaiting(f"{self.pipeline.kind}: stopped while waiting ({waits})")

    def _begin(self, routes: list[PartitionRoute]) -> None:
        self.shares.own(len(routes), len(routes))  # all, until the group says else
        self.backend.begin(self._slots_for(routes), functools.partial(self._warm_spec, routes))
        self._join(routes)

    def _slots_for(self, routes: list[PartitionRoute]) -> int:
        """The partitions local Spark sizes its slots for: with [discover] patterns, more may
        come while running, so the machine's cores (and a slot for each sidecar)."""
        return len(routes) + self.sidecars.slots if not self.cfg.discover.include else ALL_CORES

    def _join_early(self) -> None:
        """Join while the partitions are asked for, when the topics are known from the config:
        the broker holds a new group's first join ~3 s, which then covers the partition counts
        (a second across a long link) instead of following them."""
        if not self.cfg.discover.include and self.pipeline.group_topics:
            self._join(None)

    def _join(self, routes: list[PartitionRoute] | None) -> Members:
        joined = self.ownership.membership is not None
        pipeline = self.pipeline
        keys = None if routes is None else [r.key for r in routes]
        membership = self.ownership.join(
            pipeline.coordinator, pipeline.group_topics, keys, self._on_revoke
        )
        if not joined:
            self._resources.callback(self.ownership.leave)  # first: others may take over
        return membership

    # ---- running ------------------------------------------------------------------------

    def run(self) -> RunSummary:
        try:
            if self.standing.pending():
                membership = self._join(self.routes)
                if self.ownership.may_hold():  # a new group's first join is held seconds
                    self._rounds(self.standing.pending(), held=True)
                membership.wait_assigned(self.stop_event)
            while not self.stop_event.is_set():
                if self.standing.follow():
                    self.stop_event.wait(TICK)  # the source did not answer: tried next turn
                self._take_changes()
                owned = self.standing.owned()
                todo = [r for r in self.standing.pending() if owned is not None and r.key in owned]
                if not todo:
                    if owned is not None and self.stop_at_end:
                        log.info("reached the end offsets seen at start-up")
                        break  # every partition this process owns reached its stop offset
                    self._tick(self.status.next_offsets())  # chores go on while standing by
                    self.stops.look(self.routes)
                    self.stop_event.wait(TICK)  # rebalancing, or nothing of ours to do
                    continue
                self._rounds(todo)
        finally:
            self.stops.confirm(math.inf)  # unexplained when the run ends: counted
            self._summarize()
            self.close()
        return self.summary

    def _rounds(self, todo: list[PartitionRoute], held: bool = False) -> None:
        """A round, retried while it fails retriably; a cluster that still does not answer when
        the retries are spent ends the run with what it last said, not as an internal error."""
        try:
            for attempt in retrying(
                self._round_policy, _is_retriable_round, self.stop_event, self.metrics
            ):
                with attempt:
                    self._round_once(todo, attempt.retry_state.attempt_number, held)
        except Exception as exc:
            if isinstance(exc, KtmError) or not _is_retriable_round(exc):
                raise
            raise RelayError(f"gave up retrying: {type(exc).__name__}: {exc}") from exc

    def _warm_spec(
        self, routes: list[PartitionRoute], channel: ChannelAddress, slots: int
    ) -> tuple[TaskSpec, Callable[..., Sides]]:
        """What each slot's worker opens as soon as Spark is up, while the plan goes on and the
        group forms (Pipeline.warm_task)."""
        rates = self.shares.of_task(min(slots, len(routes)))
        return self.pipeline.warm_task(routes, channel, rates), self.pipeline.sides

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._resources.close()

    def _round_once(self, todo: list[PartitionRoute], attempt: int, held: bool = False) -> None:
        if self.stop_event.is_set():
            return
        if attempt > 1 or self._unsure:
            self.standing.resync(todo, "delivered without ack")
            self._unsure = False
        self.standing.fail_over(todo, self._source_trouble)
        engine, channel = self.backend.ready(self._slots_for(self.routes))
        self.sidecars.start(engine)
        current = self._submit_round(todo, engine, channel, held)
        if current is None:  # the group rebalanced, or cannot vouch for this process now
            self.stop_event.wait(0 if held else TICK)
            return  # the caller re-reads the ownership
        while not self._round_ended(current, channel):
            self._watch(current)
        try:
            results = current.job.results()
        except RelayError as exc:  # the job itself failed (a lost worker): re-read and retry
            self.status.record_round(
                time.monotonic() - current.started, "cancelled" if current.cancelled else "failed"
            )
            await_quiet(current, self.backend.channel)
            if self.stop_event.is_set():
                log.info("stopping: the last round ended with Spark (%s)", exc)
                return
            raise RetriableRoundError(str(exc), "target") from exc
        engine.refresh_slots()
        self._finish_round(current, results)

    def _round_ended(self, current: Round, channel: Channel) -> bool:
        """Waits a tick for the round's end; a held round's tick ends as soon as the group's
        first assignment comes, which confirms or stops it (relay.engine.driver.held)."""
        if not current.held:
            return current.job.wait(TICK)
        membership = self.ownership.membership
        assert membership is not None
        membership.await_assignment(TICK)
        settle_hold(current, self.standing, self.ownership, self.status, channel)
        return current.job.wait(0)

    def _submit_round(
        self, todo: list[PartitionRoute], engine: Engine, channel: Channel, held: bool = False
    ) -> Round | None:
        with self._submit:
            if not (self.ownership.may_hold() if held else self.ownership.holds()):
                # rebalanced, or its tasks would get no lease and end at once: a round a tick,
                # each a Spark job (seen: 20 rounds in 3 s while a killed broker's group
                # coordinator moved)
                return None
            plan = self._plan(todo, max(1, engine.slots - self.sidecars.slots))
            share = self.shares.of_task(len(plan))
            self._round_id += 1
            round_id = self._round_id
            tasks = [
                self.pipeline.task(round_id, index, works, channel.address, share)
                for index, works in enumerate(self.standing.works(plan))
            ]
            self.ownership.begin_round(round_id, held)
            job = engine.submit(round_id, tasks, self.pipeline.sides)
            self._round = Round(round_id, plan, job, held)
            self.backend.used = True
        return self._round

    def _finish_round(self, current: Round, results: list[TaskResult]) -> None:
        self._gap_from = current.stop_asked_at or time.monotonic()
        outcome = settle(current, results, self.status)
        self._source_trouble = outcome.source_trouble
        self._unsure = self._unsure or outcome.lost_lease
        failures, halted = self.stops.halt_failures(outcome.failures, self.routes)
        self._unsure = self._unsure or halted  # a halted task's producer was dropped: re-read
        if failures:
            raise_for(failures, self.metrics)

    def _plan(self, todo: list[PartitionRoute], slots: int) -> TaskPlan:
        rows = self.status.rows()
        return self.tasks.plan([load_of(rows[r.key]) for r in todo], slots)

    # ---- while a round runs (main thread, channel thread, membership thread) ------------

    def _report(self, report: Report) -> None:
        """A task's live report (channel thread)."""
        result = report.result
        self.status.apply(
            (report.round_id, report.task_id, report.attempt),
            result.partitions,
            result.latencies,
            result.trouble,
            result.throttled,
        )
        current = self._round
        if current is not None:
            current.on_report(report)

    def _on_revoke(self) -> None:
        """The group rebalances (membership thread, before it rejoins): stop writing, wait
        until every task flushed and committed, and only then let the rebalance go on."""
        with self._submit:
            current = self._round
            if current is None or current.job.wait(0):
                return
            channel = self.backend.channel
            assert channel is not None
            current.ask_to_stop("membership", channel)
            if not current.job.wait(REVOKE_WAIT):
                current.cancel()
                current.job.wait(REVOKE_WAIT)

    def _watch(self, current: Round) -> None:
        """Every tick while a round runs: gauges, and whether the round should end."""
        channel = self.backend.channel
        assert channel is not None
        if self._gap_from is not None and channel.connected(current.round_id) >= len(current.tasks):
            self.metrics.round_gap.inc(max(0.0, time.monotonic() - self._gap_from))
            self._gap_from = None
        self.status.observe_nodes(self.pipeline.views(), self.pipeline.active_source())
        nexts = self.status.next_offsets()  # one copy a tick: thousands of partitions
        self._tick(nexts)
        if self.stops.look(self.routes):
            current.ask_to_stop("recreated", channel)
        reason = self._end_reason(current, nexts)
        if reason is not None:
            current.ask_to_stop(reason, channel)
        if current.overdue():
            current.cancel()

    def _tick(self, nexts: dict[SourcePartition, int]) -> None:
        """The pipeline's chores, shown the run's progress; the partitions it found must halt
        halt (the relay: partitions its destination lacks)."""
        progress = Progress(nexts, self.status.owned)
        for halt in self.pipeline.tick(progress):
            self.status.halts.add(halt.route, halt.offset, halt.reason)

    def _end_reason(self, current: Round, nexts: dict[SourcePartition, int]) -> str | None:
        if self.stop_event.is_set():
            return "stop"
        if current.failed():
            return "error"
        if not self.ownership.holds(current.round_id):
            return "membership"
        if self.pipeline.wants_switch(nexts):
            return "failover"
        if self.pipeline.has_changes():
            return "new partitions"
        if current.stalled():
            return "lost"
        if self._should_replan(current):
            return "rebalance"
        return None

    def _should_replan(self, current: Round) -> bool:
        if not current.replan_due(self.cfg.spark.rebalance_interval):
            return False
        pending = {r.key for r in self.standing.pending()}
        return current.replan_pays(self.status.rows(), pending)

    # ---- between rounds ---------------------------------------------------------------------

    def _take_changes(self) -> None:
        """Partitions found while running join the plan; the process rejoins its group with
        them (the members must agree on the partitions they share)."""
        if not self.ownership.settled():
            return  # rejoin only from a settled group: leaving mid-rebalance can stall it
        plan = self.pipeline.changes()
        if plan is None:
            return
        self.standing.add(plan)
        if self.ownership.membership is not None:
            self.ownership.rejoin(self.pipeline.group_topics, [r.key for r in self.routes])
        else:  # nothing to relay until now: join for the first time
            self._join(self.routes)

    def _summarize(self) -> None:
        summarize(
            self.summary,
            self.status,
            self.backend,
            self.ownership.rebalances,
            self.stop_event.is_set(),
            self._begun,
            self.metrics,
        )

    def _round_policy(self, exc: BaseException | None) -> RetryPolicy:
        return policy_for(self.cfg, getattr(exc, "side", "target"))


def _is_retriable_round(exc: BaseException) -> bool:
    return isinstance(exc, RetriableRoundError) or is_retriable(exc)

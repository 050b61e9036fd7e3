"""One round: a Spark job whose tasks relay their partitions until the driver stops them.

A round ends when its tasks are done (every partition reached its --stop-at-end offset), or when
the driver asks them to stop: a stop signal, a failover, a task error, a membership change, or a
re-plan of the tasks that pays off. Asking is cooperative (relay.engine.channel): tasks flush,
commit and return within about a second. Cancelling the Spark job is the last resort, for tasks
that do not answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from relay.engine.channel import Report
from relay.engine.driver.retry import RetriableRoundError
from relay.engine.driver.rows import PartitionRow
from relay.engine.driver.seams import Channel, Job
from relay.engine.driver.status import Status
from relay.engine.driver.task_plan import TaskPlan, load_of, worth_replanning
from relay.engine.metrics import Metrics
from relay.errors import RelayError
from relay.spec import SourcePartition, TaskResult

log = logging.getLogger(__name__)

TICK = 0.2  # seconds between the driver's checks while a round runs
CANCEL_AFTER = 15.0  # seconds after a stop request before a silent task's job is cancelled
DRAIN_LIMIT = 40.0  # ... and before one still reporting while it waits for its acks is
SILENT_AFTER = 8.0  # a running task silent this long is lost (its executor died)
START_GRACE = 30.0  # a task not started after this long has no slot (the cluster shrank)
# seconds a failed round's tasks get to end before the partitions are read again (Spark kills a
# cancelled task's worker after spark.python.task.killTimeout, 2 s, checked every 2 s)
QUIET_WAIT = 30.0
# A task's pace (records it relayed over its seconds) is read from at least this long: over less,
# one big first batch reads as a pace no task keeps.
PACE_MIN_SECONDS = 0.5


@dataclass
class Round:
    round_id: int
    tasks: TaskPlan
    job: Job
    held: bool = False  # planned before the group's first assignment (relay.engine.driver.held)
    started: float = field(default_factory=time.monotonic)
    last_replan_check: float = field(default_factory=time.monotonic)
    replan_checked_finished: int = 0  # finished tasks already considered for a re-plan
    stop_reason: str | None = None
    stop_asked_at: float | None = None
    cancelled: bool = False  # the Spark job was cancelled: once is enough
    said_stalled: bool = False  # the line saying why it stalled was logged (once a round)
    # Final reports by task id, as they arrive over the channel (before the job ends).
    finished: dict[int, TaskResult] = field(default_factory=dict)
    heard: dict[int, float] = field(default_factory=dict)  # task id -> its last report
    latest: dict[int, TaskResult] = field(default_factory=dict)  # task id -> its last totals
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_report(self, report: Report) -> None:
        if report.round_id != self.round_id:
            return
        with self._lock:
            self.heard[report.task_id] = time.monotonic()
            self.latest[report.task_id] = report.result
            if report.final:
                self.finished[report.task_id] = report.result

    def stalled(self) -> bool:
        """A task went silent (Spark re-runs it, but its slot may never free up while the
        others run: they run until stopped), or never started (fewer slots than planned)."""
        now = time.monotonic()
        with self._lock:
            silent = [
                t
                for t, at in self.heard.items()
                if t not in self.finished and now - at > SILENT_AFTER
            ]
            waiting = len(self.tasks) - len(self.heard)
        stalled = bool(silent) or (waiting > 0 and now - self.started > START_GRACE)
        if stalled and not self.said_stalled:
            self.said_stalled = True
            if silent:
                log.warning("round %d: task(s) %s went silent; re-planning", self.round_id, silent)
            else:
                log.warning(
                    "round %d: %d task(s) found no slot; re-planning", self.round_id, waiting
                )
        return stalled

    def finished_results(self) -> list[TaskResult]:
        with self._lock:
            return list(self.finished.values())

    def failed(self) -> bool:
        return any(result.error is not None for result in self.finished_results())

    def replan_due(self, interval: float) -> bool:
        """Whether to weigh a re-plan now: a task is done (its slot idles) or `interval` went
        by since the last look. Asked every tick, so it reads nothing per partition: the rows
        a re-plan is weighed on cost a pass over every partition (at 10,000 partitions that
        pass, every tick, was most of an idle driver's CPU)."""
        now, finished = time.monotonic(), len(self.finished_results())
        due = now - self.last_replan_check >= interval
        if not (due or finished > self.replan_checked_finished):
            return False
        self.last_replan_check, self.replan_checked_finished = now, finished
        return True

    def replan_pays(
        self, rows: Mapping[SourcePartition, PartitionRow], pending: set[SourcePartition]
    ) -> bool:
        """Whether a fresh plan finishes the work clearly sooner (asked once `replan_due`).

        The work left is turned into seconds at the faster of the partitions' measured rate
        and the tasks' own pace this round. Early in a round no rate is measured yet (it takes
        RATE_WINDOW), and a task that is done leaves the others' rows up to a report behind:
        at an assumed rate that stale remainder of a bounded copy looked seconds long, and a
        300k-record copy stopped its round at 283k to re-plan the last 17k."""
        live = [tuple(k for k in task if k in pending) for task in self.tasks]
        loads = {k: load_of(rows[k]) for k in pending}
        measured = sum(row.rate for row in rows.values()) / max(len(live), 1)
        return worth_replanning(live, loads, len(self.tasks), max(measured, self.pace(), 1.0))

    def pace(self) -> float:
        """Source records per second of this round's fastest task, from its last report."""
        with self._lock:
            results = list(self.latest.values())
        return max(
            (
                sum(p.consumed for p in r.partitions) / max(r.elapsed, PACE_MIN_SECONDS)
                for r in results
            ),
            default=0.0,
        )

    def ask_to_stop(self, reason: str, channel: Channel) -> None:
        if self.stop_reason is None:
            self.stop_reason, self.stop_asked_at = reason, time.monotonic()
            log.debug("round %d: asking tasks to stop (%s)", self.round_id, reason)
            channel.stop_round(self.round_id)

    def overdue(self) -> bool:
        """Asked to stop CANCEL_AFTER ago and still running, with a task not answering: one
        silent for SILENT_AFTER (or never started), or one still draining after DRAIN_LIMIT.
        A task that reports while it waits for its last acks is draining a slow destination,
        not stuck; cancelled, it would leave what it sent to land after the next round read
        the destination (seen at 10,000 partitions: final flushes of 14-16 s, whole partitions
        then written twice)."""
        asked = self.stop_asked_at
        if self.cancelled or asked is None:
            return False
        now = time.monotonic()
        if now - asked <= CANCEL_AFTER:
            return False
        if now - asked > DRAIN_LIMIT:
            return True
        with self._lock:
            running = [t for t in range(len(self.tasks)) if t not in self.finished]
            return any(now - self.heard.get(t, asked) > SILENT_AFTER for t in running)

    def cancel(self) -> None:
        waited = time.monotonic() - (self.stop_asked_at or self.started)
        log.warning(
            "round %d: tasks did not stop within %.0fs; cancelling the Spark job",
            self.round_id,
            waited,
        )
        self.cancelled = True
        self.job.cancel()


def await_quiet(current: Round, channel: Channel | None) -> None:
    """A failed or cancelled job's tasks may still run: Spark kills a cancelled task's Python
    worker only seconds later (spark.python.task.killTimeout), and meanwhile its producer sends
    what it holds. The resync that follows must read the destination after their last write.
    Each task's channel connection ends with the task or its process: wait for none to be
    left, at most QUIET_WAIT."""
    deadline = time.monotonic() + QUIET_WAIT
    while channel is not None and channel.connected(current.round_id):
        if time.monotonic() >= deadline:
            log.warning(
                "round %d: %d task(s) still running %.0fs after the job ended",
                current.round_id,
                channel.connected(current.round_id),
                QUIET_WAIT,
            )
            return
        time.sleep(TICK)


@dataclass(frozen=True)
class Outcome:
    failures: list[TaskResult]  # tasks that failed (a lost lease is not a failure)
    lost_lease: bool  # tasks stopped without a lease: where their partitions stand is unknown
    source_trouble: bool  # a task failed reading its source (failover may help)


def settle(current: Round, results: list[TaskResult], status: Status) -> Outcome:
    """A round's end: its tasks' last progress into the status, one line for the log, and
    what the runner must do next."""
    wall = time.monotonic() - current.started
    for result in results:
        attempt = (result.round_id, result.task_id, result.attempt)
        status.apply(attempt, result.partitions, trouble=result.trouble, throttled=result.throttled)
    status.record_round(wall, current.stop_reason or "end")
    failures = [r for r in results if r.error is not None]
    source_trouble = any(r.error and r.error.kind == "source" for r in failures)
    # A task that lost its lease stopped because this driver could not vouch for it (it was
    # frozen, or lost its group membership): not a failure, but its last records may have
    # landed unacknowledged, so the next round first re-reads where things stand.
    lost = [r for r in failures if r.error is not None and r.error.kind == "channel"]
    if lost:
        log.info("round %d: %d task(s) stopped without a lease", current.round_id, len(lost))
    log.info(
        "round %d ended (%s) after %.1fs: %d tasks, %d records so far",
        current.round_id,
        current.stop_reason or "done",
        wall,
        len(current.tasks),
        status.snapshot().relayed,
    )
    return Outcome([r for r in failures if r not in lost], bool(lost), source_trouble)


def raise_for(failures: list[TaskResult], metrics: Metrics) -> None:
    """Count the tasks' errors and raise the one that decides: a fatal error stops the run
    (RelayError), otherwise a retriable one picks the retry policy of its side."""
    errors = [r.error for r in failures if r.error is not None]
    for error in errors:
        metrics.errors.labels(error.kind).inc()
        log.warning("task failed kind=%s partition=%s: %s", error.kind, error.key, error.message)
    fatal = [e for e in errors if not e.retriable]
    first = (fatal or errors)[0]
    where = f" on {first.key[0]}[{first.key[1]}]" if first.key else ""
    if fatal:
        raise RelayError(f"{first.kind} error{where}: {first.message}")
    side = "source" if first.kind == "source" else "target"
    raise RetriableRoundError(f"{first.kind} error{where}: {first.message}", side)

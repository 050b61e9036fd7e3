"""The driver's decisions without Spark or Kafka: rounds, retries, resyncs, ownership.

The fakes stand behind the driver's own seams (the Spark backend, the pipeline, the group
membership); the engine answers each round with the results a test scripts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, Unpack, cast

import pytest

from relay.clients.members import Assignment
from relay.config import (
    AppConfig,
    ClusterConfig,
    Config,
    SourcePoolConfig,
    SparkConfig,
    TargetConfig,
    TopicRoute,
)
from relay.engine.channel import Report
from relay.engine.driver import rounds
from relay.engine.driver.rows import PartitionRow
from relay.engine.driver.runner import Runner
from relay.engine.driver.seams import WarmSpec
from relay.engine.metrics import Metrics
from relay.engine.pipeline import CommonFields, Halt, Partitions, Pipeline, Plan, Progress
from relay.errors import RelayError, StoppedWhileWaiting
from relay.spec import (
    ChannelAddress,
    PartitionProgress,
    PartitionRoute,
    TaskError,
    TaskResult,
    TaskSpec,
)

T = TypeVar("T")
R = TypeVar("R")
ROUTES = [PartitionRoute("t", p, "t2", p) for p in range(4)]
KEYS = [r.key for r in ROUTES]


def config() -> Config:
    cluster = ClusterConfig("c", ("h:1",))
    return Config(
        path="x.toml",
        app=AppConfig(metrics_addr=None, session_timeout=2.0),
        spark=SparkConfig(),
        topics=(TopicRoute("t", "t2"),),
        sources=(cluster,),
        source_pool=SourcePoolConfig(max_retries=2, backoff_min=0.0, backoff_max=0.0),
        target=TargetConfig(cluster, max_retries=2, backoff_min=0.0, backoff_max=0.0),
        filters=(),
    )


class FakeJob:
    def __init__(self, results: list[TaskResult]):
        self._results = results

    def wait(self, timeout: float) -> bool:
        return True

    def results(self) -> list[TaskResult]:
        return self._results

    def cancel(self) -> None:
        pass


class FakeEngine:
    """Answers every round through `respond(tasks)`."""

    slots = 2

    def __init__(
        self, respond: Callable[[list[TaskSpec]], list[TaskResult]], job: type[FakeJob] = FakeJob
    ):
        self.respond, self.job = respond, job
        self.rounds: list[list[TaskSpec]] = []

    def submit(self, round_id: int, tasks: Sequence[TaskSpec], sides: object) -> FakeJob:
        self.rounds.append(list(tasks))
        return self.job(self.respond(list(tasks)))

    def refresh_slots(self) -> None:
        pass

    def run_batch(self, tasks: Sequence[T], run: Callable[[T], R]) -> list[R]:
        raise AssertionError("no sidecar in these tests")


class FakeChannel:
    address = ChannelAddress("127.0.0.1", 1, "token")

    def connected(self, round_id: int) -> int:
        return 0

    def stop_round(self, round_id: int) -> None:
        pass

    def renew(self, round_id: int) -> None:
        pass


class FakeBackend:
    start_seconds, used = 0.0, False
    log_path: str | None = None
    channel: FakeChannel | None = FakeChannel()

    def __init__(self, engine: FakeEngine):
        self.engine = engine
        self.warmed: list[TaskSpec] = []

    def launch(self) -> None:
        pass

    def begin(self, partitions: int, warm: WarmSpec | None = None) -> None:
        if warm is not None:  # Spark is "up" at once
            self.warmed.append(warm(FakeChannel.address, self.engine.slots)[0])

    def ready(self, partitions: int) -> tuple[FakeEngine, FakeChannel]:
        return self.engine, FakeChannel()

    def engine_slots(self) -> int:
        return self.engine.slots

    def stop(self) -> None:
        pass


@dataclass
class FakePipeline(Pipeline):
    """A pipeline without Kafka: the capabilities it does not fake are Pipeline's defaults."""

    stops: dict[tuple[str, int], int] | None
    at_destination: dict[tuple[str, int], int] = field(default_factory=dict)
    kind: str = "relay"
    coordinator: Any = None
    group_topics: tuple[str, ...] = ("t2",)
    sides: Any = None  # the fake engine runs no executor side
    where_calls: list[list[tuple[str, int]]] = field(default_factory=list)
    found: Plan | None = None  # partitions "found while running", handed over once

    def has_changes(self) -> bool:
        return self.found is not None

    def changes(self) -> Plan | None:
        found, self.found = self.found, None
        return found

    def partitions(self) -> Partitions:
        return Partitions(list(ROUTES))

    def resume(self, routes: list[PartitionRoute], stop_at_end: bool) -> Plan:
        return Plan(routes, dict.fromkeys(KEYS, 0), dict.fromkeys(KEYS, 100), self.stops)

    def where(self, routes: Sequence[PartitionRoute]) -> dict[tuple[str, int], int]:
        self.where_calls.append([r.key for r in routes])
        return {r.key: self.at_destination[r.key] for r in routes if r.key in self.at_destination}

    def spec(self, **common: Unpack[CommonFields]) -> TaskSpec:
        return TaskSpec(**common)

    def active_source(self) -> str:
        return "c"


class FakeMembership:
    lease, rebalances = 1.0, 0

    def __init__(self, keys: list[tuple[str, int]], generation: int = 1):
        self._assignment = Assignment(generation, frozenset(keys), 2)

    def current(self) -> Assignment:
        return self._assignment

    assignment = current

    def wait_assigned(self, stop: threading.Event) -> Assignment:
        return self._assignment

    def await_assignment(self, seconds: float) -> None:
        pass

    pending = first_join_of_empty_group = False

    def plan(self, topics: Sequence[str], keys: list[tuple[str, int]]) -> None:
        pass

    def rejoin(self, topics: Sequence[str], keys: list[tuple[str, int]]) -> None:
        self.rejoined = list(keys)
        self._assignment = Assignment(self._assignment.generation + 1, frozenset(keys), 2)

    def may_write(self) -> bool:
        return True

    def leave(self) -> None:
        pass

    def close(self) -> None:
        pass


def done(spec: TaskSpec, *, error: TaskError | None = None, upto: int | None = None) -> TaskResult:
    """A task's result: every partition acknowledged up to `upto` (default: its stop)."""
    parts = []
    for w in spec.partitions:
        reached = w.stop if upto is None else upto
        assert reached is not None
        parts.append(
            PartitionProgress(
                w.route.key,
                next_offset=reached,
                produced=reached - w.start,
                reached_stop=upto is None,
            )
        )
    return TaskResult(spec.round_id, spec.task_id, 0, tuple(parts), error)


def holds(spec: TaskSpec, key: tuple[str, int]) -> bool:
    return any(w.route.key == key for w in spec.partitions)


def runner(
    respond: Callable[[list[TaskSpec]], list[TaskResult]],
    pipeline: FakePipeline,
    owned: list[tuple[str, int]] = KEYS,
    job: type[FakeJob] = FakeJob,
) -> tuple[Runner, FakeEngine]:
    engine = FakeEngine(respond, job)
    run = Runner(config(), pipeline, stop_at_end=pipeline.stops is not None,
                 stop_event=threading.Event(), metrics=Metrics(),
                 backend=FakeBackend(engine))  # fmt: skip
    run.ownership.membership = FakeMembership(owned)
    return run, engine


STOPS = dict.fromkeys(KEYS, 100)


def test_a_stop_at_end_run_plans_groups_on_the_slots_and_ends_when_all_reached_their_stop():
    run, engine = runner(lambda tasks: [done(t) for t in tasks], FakePipeline(STOPS))
    run.prepare(start_spark=True)
    summary = run.run()
    assert len(engine.rounds) == 1 and len(engine.rounds[0]) == 2  # 4 partitions, 2 slots
    assert sorted(w.route.key for t in engine.rounds[0] for w in t.partitions) == KEYS
    assert summary.relayed == 400 and summary.next_offsets == STOPS
    # as soon as Spark was up the workers opened their clients, once, for the one topic
    warmed = run.backend.warmed
    assert [[w.route.topic for w in spec.partitions] for spec in warmed] == [["t"]]


def test_a_retriable_target_error_is_retried_from_where_the_destination_stands():
    pipeline = FakePipeline(STOPS, at_destination={("t", 0): 60})
    failure = TaskError("target", "KafkaTimeoutError: no ack", retriable=True, key=("t", 0))

    def respond(tasks: list[TaskSpec]) -> list[TaskResult]:
        first = tasks[0].round_id == 1
        return [done(t, error=failure, upto=50) if first and holds(t, ("t", 0)) else done(t)
                for t in tasks]  # fmt: skip

    run, engine = runner(respond, pipeline)
    run.prepare()
    run.run()
    assert len(engine.rounds) == 2
    retried = {w.route.key: w.start for t in engine.rounds[1] for w in t.partitions}
    assert retried[("t", 0)] == 60  # records landed without their ack: not written again
    assert run.metrics.registry.get_sample_value("ktm_errors_total", {"kind": "target"}) == 1


def test_after_a_failed_job_the_destination_is_read_again_only_once_its_tasks_are_gone(
    monkeypatch: pytest.MonkeyPatch,
):
    """Spark kills a cancelled task's worker seconds after the job ended, its producer still
    sending meanwhile: the resync must not read the destination before they are gone."""
    monkeypatch.setattr("relay.engine.driver.rounds.TICK", 0.001)

    class Lingering(FakeChannel):
        left = 3  # the cancelled round's tasks stay connected this many looks

        def connected(self, round_id: int) -> int:
            if round_id != 1 or self.left <= 0:
                return 0
            self.left -= 1
            return 2

    class CancelledFirst(FakeJob):
        def results(self) -> list[TaskResult]:
            if self._results[0].round_id == 1:
                raise RelayError("Spark job failed: [SPARK_JOB_CANCELLED]")
            return self._results

    pipeline = FakePipeline(STOPS, at_destination={("t", 0): 60})
    run, engine = runner(lambda tasks: [done(t) for t in tasks], pipeline, job=CancelledFirst)
    channel = Lingering()
    cast(FakeBackend, run.backend).channel = channel
    seen: list[int] = []
    where = pipeline.where

    def where_once_gone(routes: Sequence[PartitionRoute]) -> dict[tuple[str, int], int]:
        seen.append(channel.left)
        return where(routes)

    pipeline.where = where_once_gone  # type: ignore[method-assign]
    run.prepare()
    run.run()
    assert len(engine.rounds) == 2 and seen == [3, 0]  # at start-up, then once they were gone
    retried = {w.route.key: w.start for t in engine.rounds[1] for w in t.partitions}
    assert retried[("t", 0)] == 60


def test_a_cluster_that_never_answers_ends_the_run_with_what_it_said_not_an_internal_error():
    class Silent(FakePipeline):
        """Answers at start-up, then never again."""

        def where(self, routes: Sequence[PartitionRoute]) -> dict[tuple[str, int], int]:
            if self.where_calls:
                raise TimeoutError("reading t2[0] 0..10 timed out")
            return super().where(routes)

    failure = TaskError("target", "KafkaTimeoutError: no ack", retriable=True, key=("t", 0))
    run, _ = runner(lambda tasks: [done(t, error=failure, upto=50) for t in tasks], Silent(STOPS))
    run.prepare()
    with pytest.raises(RelayError, match=r"gave up retrying: TimeoutError: reading t2\[0\]"):
        run.run()


def test_a_filter_error_stops_the_run_with_its_message():
    failure = TaskError(
        "filter", "filter 'x' failed: boom (offset=7)", retriable=False, key=("t", 1)
    )
    run, _ = runner(lambda tasks: [done(tasks[0], error=failure, upto=7)], FakePipeline(STOPS))
    run.prepare()
    with pytest.raises(RelayError, match=r"filter error on t\[1\]: filter 'x' failed: boom"):
        run.run()


def test_tasks_that_lost_their_lease_are_no_failure_but_the_next_round_re_reads_first():
    pipeline = FakePipeline(STOPS, at_destination={("t", 2): 90})
    lost = TaskError("channel", "the driver's lease ran out", retriable=True)

    def respond(tasks: list[TaskSpec]) -> list[TaskResult]:
        if tasks[0].round_id == 1:
            return [done(t, error=lost, upto=30) for t in tasks]
        return [done(t) for t in tasks]

    run, engine = runner(respond, pipeline)
    run.prepare()
    run.run()
    assert len(engine.rounds) == 2
    assert run.metrics.registry.get_sample_value("ktm_errors_total", {"kind": "channel"}) is None
    assert pipeline.where_calls[-1] == sorted(KEYS)  # re-read before round 2
    starts = {w.route.key: w.start for t in engine.rounds[1] for w in t.partitions}
    assert starts[("t", 2)] == 90 and starts[("t", 0)] == 30


class Running(FakeJob):
    """A round whose tasks run for a few of the driver's looks."""

    looks = 6

    def wait(self, timeout: float) -> bool:
        self.looks -= 1
        return self.looks < 0


class StopsSeen(FakeChannel):
    def __init__(self) -> None:
        self.stopped: list[int] = []

    def stop_round(self, round_id: int) -> None:
        self.stopped.append(round_id)


def test_a_new_generation_ends_the_round():
    class Rebalanced(FakeMembership):
        looks = 0

        def assignment(self) -> Assignment:
            self.looks += 1
            if self.looks == 2:  # the group moved on while the round ran
                self._assignment = Assignment(self._assignment.generation + 1, frozenset(KEYS), 2)
            return self._assignment

    run, engine = runner(lambda tasks: [done(t) for t in tasks], FakePipeline(STOPS), job=Running)
    run.ownership.membership = Rebalanced(KEYS)
    channel = StopsSeen()
    cast(FakeBackend, run.backend).channel = channel
    run.prepare()
    run.run()
    assert channel.stopped == [1]


def test_a_task_draining_a_slow_destination_is_waited_for_a_silent_one_is_cancelled(
    monkeypatch: pytest.MonkeyPatch,
):
    now = [100.0]
    monkeypatch.setattr(rounds.time, "monotonic", lambda: now[0])
    current = rounds.Round(1, [(("t", 0),), (("t", 1),)], FakeJob([]), started=100.0)
    current.ask_to_stop("stop", FakeChannel())

    def heard(task_id: int, at: float) -> None:
        now[0] = at
        current.on_report(Report(1, task_id, 0, TaskResult(1, task_id, 0, ()), final=False))

    heard(0, 110.0)
    heard(1, 114.0)
    now[0] = 116.0  # past CANCEL_AFTER, both still reporting while their last acks come
    assert not current.overdue()
    heard(1, 120.0)
    now[0] = 122.0  # task 0 silent for 12 s
    assert current.overdue()
    heard(0, 122.0)
    now[0] = 141.0  # both answer, but past DRAIN_LIMIT
    heard(0, 141.0)
    heard(1, 141.0)
    assert current.overdue()


def test_only_the_partitions_this_process_owns_are_planned():
    owned = [("t", 1), ("t", 3)]
    run, engine = runner(lambda tasks: [done(t) for t in tasks], FakePipeline(STOPS), owned)
    run.prepare()
    run.run()
    planned = sorted(w.route.key for t in engine.rounds[0] for w in t.partitions)
    assert planned == owned
    assert run.status.snapshot().members == 2 and len(run.status.snapshot().owned) == 2


def test_partitions_found_while_running_join_the_next_round_and_the_group():
    new = PartitionRoute("u", 0, "u2", 0)
    pipeline = FakePipeline(None)

    def respond(tasks: list[TaskSpec]) -> list[TaskResult]:
        if tasks[0].round_id == 1:
            pipeline.found = Plan([new], {new.key: 5}, {new.key: 10}, None)
        else:
            run.stop_event.set()
        return [done(t, upto=10) for t in tasks]

    run, engine = runner(respond, pipeline)
    run.prepare()
    run.run()
    assert len(engine.rounds) == 2
    starts = {w.route.key: w.start for t in engine.rounds[1] for w in t.partitions}
    assert starts[new.key] == 5 and len(starts) == 5
    assert sorted(run.ownership.membership.rejoined) == sorted([*KEYS, new.key])


@dataclass
class WaitingPipeline(FakePipeline):
    """Start-up waits for topic t's first segment for `waits` asks (restore --follow)."""

    waits: int = 2
    asked: int = 0
    seen: list[dict[str, str]] = field(default_factory=list)  # the status, as each ask found it
    status: Any = None

    def partitions(self) -> Partitions:
        self.asked += 1
        if self.status is not None:
            self.seen.append(dict(self.status.waiting_topics))
        if self.asked <= self.waits:
            return Partitions(None, {"t": "its first segment"}, 0.0)
        return super().partitions()


def test_start_up_asks_again_while_the_pipeline_waits_and_shows_what_for():
    pipeline = WaitingPipeline(STOPS)
    run, _ = runner(lambda tasks: [done(t) for t in tasks], pipeline)
    pipeline.status = run.status
    run.prepare()
    assert pipeline.asked == 3
    assert pipeline.seen == [{}, {"t": "its first segment"}, {"t": "its first segment"}]
    assert run.status.waiting_topics == {} and run.run().relayed == 400


def test_a_stop_while_start_up_waits_names_what_it_waited_for():
    run, _ = runner(lambda tasks: [done(t) for t in tasks], WaitingPipeline(STOPS, waits=5))
    run.stop_event.set()
    with pytest.raises(StoppedWhileWaiting, match="stopped while waiting .t: its first segment"):
        run.prepare()


@dataclass
class HaltingPipeline(FakePipeline):
    """Finds, while running, a partition that must halt (the relay: one its destination
    lacks), and gives it at a tick."""

    lacking: PartitionRoute = PartitionRoute("u", 0, "u2", 0)
    ticks: int = 0

    def tick(self, progress: Progress) -> Sequence[Halt]:
        self.ticks += 1
        return [Halt(self.lacking, 3, "destination u2 lacks it")] if self.ticks == 1 else []


def test_partitions_a_pipeline_halts_at_a_tick_halt_in_the_runner():
    pipeline = HaltingPipeline(STOPS)
    run, _ = runner(lambda tasks: [done(t) for t in tasks], pipeline, job=OnceSlowJob)
    run.prepare()
    run.run()
    assert pipeline.ticks >= 1
    (halt,) = run.status.halts.all()
    assert (halt.route, halt.offset) == (pipeline.lacking, 3)
    labels = {"source_topic": "u", "source_partition": "0"}
    assert run.metrics.registry.get_sample_value("ktm_partitions_halted", labels) == 1


def test_a_refused_record_halts_its_partition_and_the_others_reach_their_end():
    """The destination refuses t[1]'s record at offset 40 for good: the next round relays t[1]
    up to 40 (the records before the refused one) and the run ends with it halted there."""
    refused = TaskError("target", "destination t2[1] refuses record t[1] offset 40: ...",
                        retriable=False, key=("t", 1), halt_at=40)  # fmt: skip

    def respond(tasks: list[TaskSpec]) -> list[TaskResult]:
        if tasks[0].round_id == 1:  # t[1]'s batch of 30-49 was refused: 30 acknowledged
            return [done(t, error=refused, upto=30) if holds(t, ("t", 1)) else done(t)
                    for t in tasks]  # fmt: skip
        return [done(t) for t in tasks]

    run, engine = runner(respond, FakePipeline(STOPS))
    run.prepare()
    summary = run.run()  # no error: the halt is reported, not raised
    assert len(engine.rounds) == 2
    (again,) = [w for t in engine.rounds[1] for w in t.partitions if w.route.key == ("t", 1)]
    assert (again.route.key, again.start, again.stop) == (("t", 1), 30, 40)
    assert summary.next_offsets[("t", 1)] == 40
    assert [(h["source_partition"], h["offset"]) for h in summary.halted] == [(1, 40)]
    registry = run.metrics.registry
    labels = {"source_topic": "t", "source_partition": "1"}
    assert registry.get_sample_value("ktm_partitions_halted", labels) == 1
    assert registry.get_sample_value("ktm_errors_total", {"kind": "refused"}) == 1
    assert registry.get_sample_value("ktm_errors_total", {"kind": "target"}) is None


def test_without_stop_at_end_a_halted_partition_is_never_planned_again():
    refused = TaskError("target", "refused", retriable=False, key=("t", 0), halt_at=10)
    stop = threading.Event()

    def respond(tasks: list[TaskSpec]) -> list[TaskResult]:
        if tasks[0].round_id == 1:
            return [done(t, error=refused, upto=10) if holds(t, ("t", 0)) else done(t, upto=50)
                    for t in tasks]  # fmt: skip
        stop.set()  # the second round is the last one this test needs
        return [done(t, upto=60) for t in tasks]

    run, engine = runner(respond, FakePipeline(None))
    run.stop_event = stop
    run.prepare()
    run.run()
    planned = [sorted(w.route.key for t in r for w in t.partitions) for r in engine.rounds]
    assert planned == [KEYS, [("t", 1), ("t", 2), ("t", 3)]]  # t[0] reached its halt at 10
    healthy, detail = run.status.health()
    assert not healthy and "partition(s) halted: t[0] at offset 10 (-> t2[0])" in detail["reason"]


LOST = "ktm_source_records_lost_total"
TRUNCATED_AT_50 = TaskError(
    "source", "source log truncated below what was copied: ...", retriable=False,
    key=("t", 0), halt_at=50, lost=(0, 50, "truncated"),
)  # fmt: skip


class OnceSlowJob(FakeJob):
    """A job still running at the first look: the runner watches it for one tick."""

    def __init__(self, results: list[TaskResult]):
        super().__init__(results)
        self.looked = False

    def wait(self, timeout: float) -> bool:
        looked, self.looked = self.looked, True
        return looked


@dataclass
class FollowingPipeline(FakePipeline):
    """`on_recreate = "follow"`: topic t is found recreated once `recreation` is set."""

    follows_recreated: bool = True
    recreation: bool = False
    followed: list[tuple[list[PartitionRoute], frozenset[tuple[str, int]]]] = field(
        default_factory=list
    )

    looks: int = 0  # looks at the topics' IDs answered
    asked: int = 0  # looks asked for at once
    found_when_asked: bool = False  # the look a truncation asks for finds the recreation

    def look_again(self) -> int:
        self.asked += 1
        self.recreation = self.recreation or self.found_when_asked
        return self.looks + 1

    def looked(self) -> int:
        return self.looks

    def recreated(self) -> list[tuple[str, str]]:
        found, self.recreation = self.recreation, False
        self.looks += 1
        return [("t", "source topic t on c was deleted and created again")] if found else []

    def follow(self, routes: list[PartitionRoute], owned: frozenset[tuple[str, int]]) -> Plan:
        self.followed.append((list(routes), owned))
        new = [replace(r, incarnation=r.incarnation + 1) for r in routes if r.partition < 3]
        return Plan(new, {r.key: 0 for r in new}, {r.key: 7 for r in new}, None)


@pytest.mark.parametrize("found_first", [True, False], ids=["id-look-first", "fetch-first"])
def test_a_recreated_topic_followed_starts_over_at_its_log_start_as_its_next_incarnation(
    found_first: bool,
) -> None:
    """on_recreate = "follow": t is found recreated while round 1 runs, and t[0]'s fetch finds
    the new, shorter log truncated below the copy (before the look at the topic IDs, or after).
    The round ends; round 2 relays t[0..2] from the new topic's log start under incarnation 1,
    t[0]'s halt lifted and no loss counted; t[3], which the new topic lacks, halts where it was
    copied up to."""
    pipeline = FollowingPipeline(None, found_when_asked=not found_first)
    stop = threading.Event()

    def respond(tasks: list[TaskSpec]) -> list[TaskResult]:
        if tasks[0].round_id == 1:
            pipeline.recreation = found_first
            return [done(t, error=TRUNCATED_AT_50, upto=50) if holds(t, ("t", 0))
                    else done(t, upto=50) for t in tasks]  # fmt: skip
        if any(w.route.incarnation for t in tasks for w in t.partitions):
            stop.set()  # the round after following: the last one this test needs
        return [done(t, upto=5 if stop.is_set() else 50) for t in tasks]

    run, engine = runner(respond, pipeline, job=OnceSlowJob)
    run.stop_event = stop
    run.prepare()
    summary = run.run()
    ((routes, owned),) = pipeline.followed
    assert sorted(r.key for r in routes) == KEYS and owned == frozenset(KEYS)
    works = {w.route.key: w for t in engine.rounds[-1] for w in t.partitions}
    assert sorted(works) == KEYS[:3]
    assert {(w.start, w.route.incarnation, w.route.origin[0]) for w in works.values()} == {
        (0, 1, "t~1")
    }
    assert [(h["source_partition"], h["offset"]) for h in summary.halted] == [(3, 50)]
    labels = {"source_topic": "t", "source_partition": "0"}
    assert run.metrics.registry.get_sample_value("ktm_partitions_halted", labels) == 0
    lost = {**labels, "cause": "truncated"}  # the recreation explains the truncation
    assert run.metrics.registry.get_sample_value(LOST, lost) is None
    assert {r.key: r.incarnation for r in run.routes} == {**dict.fromkeys(KEYS[:3], 1), KEYS[3]: 0}


def test_following_a_truncation_no_recreation_explains_is_counted_lost_after_the_next_look():
    """Following recreated topics, t[0]'s log is found truncated below the copy (an unclean
    leader election, say): it halts, and the next look at the topics' IDs, which finds no
    recreation, has the truncated offsets counted."""
    pipeline = FollowingPipeline(None)
    stop = threading.Event()

    def respond(tasks: list[TaskSpec]) -> list[TaskResult]:
        if tasks[0].round_id == 1:
            return [done(t, error=TRUNCATED_AT_50, upto=50) if holds(t, ("t", 0))
                    else done(t, upto=50) for t in tasks]  # fmt: skip
        stop.set()
        return [done(t, upto=60) for t in tasks]

    run, engine = runner(respond, pipeline, job=OnceSlowJob)
    run.stop_event = stop
    run.prepare()
    summary = run.run()
    assert pipeline.followed == [] and pipeline.asked == 1
    labels = {"source_topic": "t", "source_partition": "0", "cause": "truncated"}
    assert run.metrics.registry.get_sample_value(LOST, labels) == 50
    assert [(h["source_partition"], h["offset"]) for h in summary.halted] == [(0, 50)]


def test_a_replan_is_weighed_only_when_due(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner asks every tick; the rows a re-plan is weighed on (a pass over every
    partition) are read only when `replan_due`: a task done, or the interval gone by."""
    now = [100.0]
    monkeypatch.setattr(rounds.time, "monotonic", lambda: now[0])
    current = rounds.Round(1, [(("t", 0),), (("t", 1),)], FakeJob([]), last_replan_check=100.0)
    now[0] = 129.0
    assert not current.replan_due(30.0)
    now[0] = 130.0
    assert current.replan_due(30.0) and not current.replan_due(30.0)  # once per interval
    current.finished[0] = TaskResult(1, 0, 0, ())
    assert current.replan_due(30.0) and not current.replan_due(30.0)  # once per task done


def test_a_bounded_copy_near_its_end_is_not_replanned_on_a_stale_remainder() -> None:
    """Task 0 is done; task 1's rows are a report behind (75k left on each of its partitions)
    and no rate is measured yet. At the tasks' own pace this round (a task got through 140k
    records in 0.7 s) that remainder is under a second of work: not worth a re-plan. Without
    reports it is weighed at an assumed rate, where it looks long enough to re-plan."""
    plan: list[tuple[tuple[str, int], ...]] = [(KEYS[0], KEYS[1]), (KEYS[2], KEYS[3])]
    rows = {
        r.key: PartitionRow(r, 150_000 if r.partition < 2 else 75_000, 150_000, 150_000)
        for r in ROUTES
    }
    pending = {KEYS[2], KEYS[3]}
    silent = rounds.Round(1, plan, FakeJob([]))
    assert silent.replan_pays(rows, pending)

    current = rounds.Round(1, plan, FakeJob([]))
    done = tuple(PartitionProgress(k, 150_000, consumed=70_000) for k in plan[0])
    current.on_report(Report(1, 0, 0, TaskResult(1, 0, 0, done, elapsed=0.7), final=True))
    assert current.pace() == pytest.approx(200_000)
    assert not current.replan_pays(rows, pending)


class FirstJoin(FakeMembership):
    """A new group's first join, held by the broker: no assignment until the runner waits for
    one (by then the held round is submitted), then `keys`."""

    def __init__(self, keys: list[tuple[str, int]]):
        super().__init__(keys, generation=0)
        self._coming = self._assignment
        self._assignment_now: Assignment | None = None
        self.held_at_assignment: list[int] = []

    def current(self) -> Assignment | None:  # type: ignore[override]
        return self._assignment_now

    assignment = current  # type: ignore[assignment]

    @property
    def first_join_of_empty_group(self) -> bool:  # type: ignore[override]
        return self._assignment_now is None

    def await_assignment(self, seconds: float) -> None:
        self._assignment_now = self._coming

    def wait_assigned(self, stop: threading.Event) -> Assignment:
        self._assignment_now = self._coming
        return self._coming


class Pushes(FakeChannel):
    def __init__(self) -> None:
        self.renewed: list[int] = []
        self.stopped: list[int] = []

    def renew(self, round_id: int) -> None:
        self.renewed.append(round_id)

    def stop_round(self, round_id: int) -> None:
        self.stopped.append(round_id)


def held_runner(
    owned: list[tuple[str, int]], respond: Callable[[list[TaskSpec]], list[TaskResult]]
) -> tuple[Runner, FakeEngine, Pushes, list[tuple[float | None, float | None]]]:
    """A runner joining an empty group; records each round's lease and hold as submitted."""
    grants: list[tuple[float | None, float | None]] = []

    def answer(tasks: list[TaskSpec]) -> list[TaskResult]:
        round_id = tasks[0].round_id
        grants.append((run.ownership.lease_for(round_id), run.ownership.hold_for(round_id)))
        return respond(tasks)

    run, engine = runner(answer, FakePipeline(STOPS))
    run.ownership.membership = FirstJoin(owned)
    channel = Pushes()
    run.backend.ready = lambda partitions: (engine, channel)  # type: ignore[method-assign]
    return run, engine, channel, grants


def test_a_new_groups_first_round_is_planned_held_and_confirmed_by_its_assignment():
    """Alone in a new group: the first round is submitted before the assignment, its tasks
    held (a hold, no lease); the assignment gives it every partition, none moved at the
    destination, so it is confirmed and its leases pushed at once. One round, no re-plan."""
    run, engine, channel, grants = held_runner(KEYS, lambda tasks: [done(t) for t in tasks])
    run.prepare(start_spark=True)
    summary = run.run()
    assert grants == [(None, 1.0)]  # submitted held: reads ahead, may not write
    assert channel.renewed == [1] and channel.stopped == []
    assert run.ownership.lease_for(1) == 1.0 and run.ownership.hold_for(1) is None
    assert len(engine.rounds) == 1 and summary.relayed == 400


def test_a_held_round_is_stopped_when_the_assignment_gives_this_process_less():
    """Another process joined at the same moment: the assignment gives this one half. The
    held round, which wrote nothing, is stopped, not confirmed; the next round is planned
    with this process's partitions alone, under a lease."""
    mine = KEYS[:2]

    def respond(tasks: list[TaskSpec]) -> list[TaskResult]:
        if tasks[0].round_id == 1:  # held, then stopped: nothing written
            return [done(t, upto=0) for t in tasks]
        return [done(t) for t in tasks]

    run, engine, channel, grants = held_runner(mine, respond)
    run.prepare(start_spark=True)
    summary = run.run()
    assert channel.stopped == [1] and channel.renewed == []
    assert grants == [(None, 1.0), (1.0, None)]
    assert (
        sorted(w.route.key for w in engine.rounds[0][0].partitions + engine.rounds[0][1].partitions)
        == KEYS
    )
    assert sorted(w.route.key for t in engine.rounds[1] for w in t.partitions) == mine
    assert summary.relayed == 200

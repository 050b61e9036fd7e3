"""The executor's task loop without Spark or Kafka: fakes behind its seams (the channel, the
reader, the producer); segments go to a real directory store."""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from relay.batches import Origin, split_batches
from relay.config import ClusterConfig, StoreConfig, TargetConfig
from relay.engine.executor.task import QUIET_REPORTS, TaskRun
from relay.filters import FilterSpec
from relay.losses import Loss, out_of_range
from relay.pipelines.backup.executor import SegmentWriter
from relay.pipelines.kafka_target import KafkaWriter
from relay.pipelines.relay.spec import RelayTask
from relay.spec import ChannelAddress, FetchTrouble, PartitionRoute, PartitionWork
from relay.store import ChainLink, open_store, plan_chain
from tests.support.batches import control_batch, make_batch, recs


@dataclass
class Rec:
    offset: int
    timestamp: int = 1_000
    key: bytes | None = b"k"
    value: bytes | None = b"v"
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp_type: int = 0


class FakeChannel:
    """Stops the loop after `reports` progress reports, or loses the driver then."""

    def __init__(self, reports: int = 1_000, lose: bool = False):
        self.left, self.lose = reports, lose
        self.lost, self.reason = False, ""
        self.finals: list[Any] = []

    @property
    def should_stop(self) -> bool:
        if self.left <= 0 and self.lose:
            self.lost, self.reason = True, "the driver's lease ran out"
        return self.left <= 0

    def wait_writable(self, timeout: float) -> bool:
        return not self.should_stop

    def report(self, result: Any, final: bool = False) -> None:
        self.left -= 1
        if final:
            self.finals.append(result)


class FakeReader:
    def __init__(self, records: dict[tuple[str, int], list[Rec]]):
        self.queues = {key: deque(rs) for key, rs in records.items()}
        self.position: dict[tuple[str, int], int] = {}
        self.committed: dict[tuple[str, int], int] = {}

    def assign(self, starts: Mapping[tuple[str, int], int]) -> None:
        self.position = dict(starts)

    def poll(self, timeout: float) -> dict[tuple[str, int], list[Rec]]:
        batch = {}
        for key, queue in self.queues.items():
            taken = [queue.popleft() for _ in range(min(3, len(queue)))]
            if taken:
                batch[key] = taken
                self.position[key] = taken[-1].offset + 1
        return batch

    def positions(self, keys: Any) -> dict[tuple[str, int], int]:
        return {key: self.position[key] for key in keys}

    def highwater(self, key: tuple[str, int]) -> int:
        return 100

    def pause(self, key: tuple[str, int]) -> None:
        pass

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        self.committed.update(offsets)

    def commit_async(self, offsets: Mapping[tuple[str, int], int], done: Any) -> None:
        self.committed.update(offsets)
        done()

    def take_losses(self) -> list[Loss]:
        return []

    def take_trouble(self) -> list[FetchTrouble]:
        return []

    def waiting(self, key: tuple[str, int]) -> tuple[str, float] | None:
        return None

    def close(self) -> None:
        pass


class FakeDelivery:
    """relay.clients.producer.Delivery, already ended."""

    def __init__(self, fail: bool):
        self.done = True
        self._error = TimeoutError("no ack") if fail else None

    def error(self) -> BaseException | None:
        return self._error

    def acked(self) -> bool:
        return self._error is None

    def refused(self, count: int) -> None:
        return None  # the broker named no record

    def on_ack(self, callback: Any) -> None:
        if self._error is None:
            callback()


class FakeProducer:
    def __init__(self, fail_from: int | None = None):
        self.fail_from = fail_from
        self.takes_built = False  # the record path: kafka-python frames the records
        self.sent: list[Any] = []

    def send_batch(self, topic: str, partition: int, items: list[Any]) -> list[Any]:
        self.sent.extend(items)
        offsets = [int(h[-1][1].rsplit(b"/", 1)[1]) for _, _, _, h in items]
        fail = self.fail_from is not None and offsets[-1] >= self.fail_from
        return [(len(items), FakeDelivery(fail))]


class Sides:
    def __init__(self, task: RelayTask, reader: FakeReader, make_writer: Any):
        self.task, self._reader, self.make_writer = task, reader, make_writer
        self.flushes, self.abandoned = 0, False

    def works(self, attempt: int) -> tuple[PartitionWork, ...]:
        return self.task.partitions

    def reader(self) -> FakeReader:
        return self._reader

    def writer(self, work: PartitionWork, latencies: list[float]) -> Any:
        return self.make_writer(work, latencies)

    flush_limit = 1.0

    def flush(self, timeout: float | None) -> bool:
        self.flushes += 1
        return True

    def writing(self) -> AbstractContextManager[None]:
        return nullcontext()

    answers_late = 0  # how often abandon() waits for the destination's answers

    def abandon(self, waiting: Callable[[], object] | None = None) -> None:
        self.abandoned = True
        for _ in range(self.answers_late):
            assert waiting is not None
            waiting()

    def buffer_limit(self) -> int | None:
        return None

    def evict(self, kind: str, waiting: Callable[[], object] | None = None) -> None:
        pass

    def warm(self) -> None:
        pass


ROUTES = [PartitionRoute("t", 0, "t2", 0), PartitionRoute("t", 1, "t2", 1)]
CLUSTER = ClusterConfig("src", ("h:1",))


def task(stops: tuple[int | None, int | None], filters: tuple[FilterSpec, ...] = ()) -> RelayTask:
    works = tuple(PartitionWork(r, 0, stop) for r, stop in zip(ROUTES, stops, strict=True))
    return RelayTask(round_id=1, task_id=0, source=CLUSTER, target=TargetConfig(CLUSTER),
                     partitions=works, group_id="g", channel=ChannelAddress("h", 1, "t"),
                     report_interval=0.0, filters=filters)  # fmt: skip


def kafka_run(spec: RelayTask, reader: FakeReader, producer: FakeProducer, channel: Any) -> Any:
    def writer(work: PartitionWork, latencies: list[float]) -> KafkaWriter:
        origin = Origin("src", "t", work.route.partition)
        return KafkaWriter(producer, work.route, origin, latencies)  # type: ignore[arg-type]

    sides = Sides(spec, reader, writer)
    run = TaskRun(spec, 0, channel, sides)
    error = run.execute()
    return run, error, sides


def records(count: int) -> dict[tuple[str, int], list[Rec]]:
    return {r.key: [Rec(offset=o) for o in range(count)] for r in ROUTES}


def test_every_partition_runs_to_its_stop_and_commits_what_was_acknowledged() -> None:
    reader = FakeReader(records(10))
    run, error, _ = kafka_run(task((10, 7)), reader, FakeProducer(), FakeChannel())
    assert error is None
    result = run.result(None, 0.0)
    assert {p.key: (p.next_offset, p.produced, p.reached_stop) for p in result.partitions} == {
        ("t", 0): (10, 10, True),
        ("t", 1): (7, 7, True),
    }
    assert reader.committed == {("t", 0): 10, ("t", 1): 7}


def test_dropped_records_count_as_done(tmp_path: Path) -> None:
    code = (
        'class F:\n    id = "odd"\n    def is_allowed(self, r):\n        return r.offset % 2 == 0\n'
    )
    (tmp_path / "odd.py").write_text(code + "def new(config):\n    return F()\n")
    spec = FilterSpec.from_file("odd", tmp_path / "odd.py")
    producer = FakeProducer()
    run, error, _ = kafka_run(
        task((6, 6), (spec,)), FakeReader(records(6)), producer, FakeChannel()
    )
    assert error is None
    parts = {p.key: p for p in run.result(None, 0.0).partitions}
    assert parts[("t", 0)].next_offset == 6 and parts[("t", 0)].filtered == (("odd", 3),)
    assert len(producer.sent) == 6  # 3 of each partition


def test_the_first_record_not_acknowledged_bounds_what_is_done() -> None:
    reader = FakeReader(records(9))
    run, error, _ = kafka_run(task((9, 9)), reader, FakeProducer(fail_from=5), FakeChannel())
    assert error is not None and error.kind == "target" and error.retriable
    nexts = {p.key: p.next_offset for p in run.result(None, 0.0).partitions}
    assert nexts == {("t", 0): 3, ("t", 1): 3}  # batches 0-2 acked, 3-5 failed
    assert reader.committed == nexts


def test_a_lost_lease_drops_what_is_unsent_and_is_reported_as_such() -> None:
    channel = FakeChannel(reports=2, lose=True)
    run, error, sides = kafka_run(task((None, None)), FakeReader(records(50)), FakeProducer(),
                                  channel)  # fmt: skip
    assert error is not None and error.kind == "channel" and "lease" in error.message
    assert sides.abandoned and sides.flushes == 0  # nothing flushed after the lease ran out


def test_a_task_waiting_for_the_answers_to_what_it_sent_keeps_reporting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Silent while a busy destination answers (seconds), it would be taken for lost and
    cancelled, and what it sent could land after the next round read the destination."""
    monkeypatch.setattr(Sides, "answers_late", 3)
    channel = FakeChannel(reports=2, lose=True)
    kafka_run(task((None, None)), FakeReader(records(50)), FakeProducer(), channel)
    assert channel.left == -3  # two reports while it ran, three while it waited


def test_backup_segments_close_at_their_limit_and_chain_past_dropped_records(
    tmp_path: Path,
) -> None:
    store_cfg = StoreConfig(url=str(tmp_path), cluster="src", max_segment_records=4)
    store = open_store(str(tmp_path))
    route = ROUTES[0]
    # Offsets 0-2 were dropped by a filter in an earlier run: the chain starts at 0 anyway.
    writer = SegmentWriter(store, store_cfg, route, chain_start=0)
    # 3-6 and 7-10 close at 4 records (a segment ends mid-batch); 11, then a transaction
    # marker at 12
    data = make_batch(recs(1, 5)) + make_batch(recs(6, 6)) + control_batch(12)
    batches, _ = split_batches(data)
    assert writer.write_batches(batches, 3, None, frozenset()) == (9, 13)
    writer.settle(processed_to=13)
    refs = store.list_segments("src", "t", 0)
    links = [ChainLink.of(ref, store.read_meta(ref)) for ref in refs]
    assert [(link.start, link.first, link.last, link.next_offset) for link in links] == [
        (0, 3, 6, 7),
        (7, 7, 10, 11),
        (11, 11, 11, 13),
    ]
    assert not plan_chain(links).problems
    assert writer.done_up_to(13) == 13 and writer.segments == 3 and writer.acked == 9


class RunsProducer(FakeProducer):
    """Each send's delivery fails or not as told, in order."""

    def __init__(self, failing: list[bool]):
        super().__init__()
        self.failing = deque(failing)

    def send_batch(self, topic: str, partition: int, items: list[Any]) -> list[Any]:
        self.sent.extend(items)
        return [(len(items), FakeDelivery(self.failing.popleft()))]


def test_a_failed_run_followed_by_an_acknowledged_one_is_a_hole_the_task_reports() -> None:
    from relay.engine.executor.partition import PartitionState

    route = PartitionRoute("t", 0, "t-copy", 0)
    writer = KafkaWriter(RunsProducer([False, True, False]), route, Origin("c", "t", 0), [])  # type: ignore[arg-type]
    part = PartitionState(PartitionWork(route, 0), writer, [], set())
    for first in (0, 3, 6):  # written before the failure was seen (acks come later)
        part.handle([Rec(offset=o) for o in range(first, first + 3)])
    try:
        part.collect_acks(0.0)
    except Exception as exc:  # noqa: BLE001 - the failure the task reports
        failure = exc
    assert "offsets 3-5" in str(failure) and getattr(failure, "hole", False)
    progress = part.progress(None)
    assert progress.next_offset == 3 and progress.hole  # the driver resumes exactly here
    # retried whatever the cause: only this process knows to resume at 3, not after the tail
    from relay.engine.executor.task import _error

    class Refused(Exception):
        retriable = False

    failure.__cause__ = Refused("for good")
    assert _error(failure).retriable


def test_backup_decodes_batches_into_segments_as_stored(tmp_path: Path) -> None:
    """What a segment holds is what the source's batches hold: keys, values, headers (a None
    value kept), create times, or the batch's append time with its type; a filter's rejected
    offsets and everything from the stop offset on are left out; a compressed batch reads the
    same."""
    store_cfg = StoreConfig(url=str(tmp_path), cluster="src")
    store = open_store(str(tmp_path))
    writer = SegmentWriter(store, store_cfg, ROUTES[0], chain_start=0)
    created, appended = recs(0, 4), recs(4, 4)
    data = make_batch(created, "zstd") + make_batch(appended, attributes=0x08)  # LogAppendTime
    batches, _ = split_batches(data)
    assert writer.write_batches(batches, 0, 7, frozenset({1})) == (6, 7)
    writer.settle(processed_to=7)
    (ref,) = store.list_segments("src", "t", 0)
    stored = list(store.read_records(ref))
    append_time = appended[-1].timestamp  # the batch's max timestamp
    expected = [
        (r.offset, r.timestamp, 0, r.key, r.value, r.headers) for r in created if r.offset != 1
    ]
    expected += [(r.offset, append_time, 1, r.key, r.value, r.headers) for r in appended[:3]]
    got = [
        (s.offset, s.timestamp, s.timestamp_type, s.key, s.value, list(s.headers)) for s in stored
    ]
    assert got == expected
    assert store.read_meta(ref).next_offset == 7


class PendingDelivery(FakeDelivery):
    """A delivery the destination has not answered yet."""

    def __init__(self) -> None:
        super().__init__(fail=False)
        self.done = False

    def acked(self) -> bool:
        return False


class HoldingProducer(FakeProducer):
    """A destination that answers nothing: everything written stays unacknowledged."""

    ack_deadline = 60.0  # seconds before an unanswered run counts as failed: not reached here

    def send_batch(self, topic: str, partition: int, items: list[Any]) -> list[Any]:
        self.sent.extend(items)
        return [(len(items), PendingDelivery())]


class CountingReader(FakeReader):
    def __init__(self, records: dict[tuple[str, int], list[Rec]]):
        super().__init__(records)
        self.polls = 0

    def poll(self, timeout: float) -> dict[tuple[str, int], list[Rec]]:
        self.polls += 1
        return super().poll(timeout)


def test_a_task_whose_writes_are_not_acknowledged_stops_reading_at_its_buffer_limit() -> None:
    """A far or slow target must hold the reading back: queued records would only expire."""
    reader = CountingReader(records(100))

    def writer(work: PartitionWork, latencies: list[float]) -> KafkaWriter:
        origin = Origin("src", "t", work.route.partition)
        return KafkaWriter(HoldingProducer(), work.route, origin, latencies)  # type: ignore[arg-type]

    sides = Sides(task((None, None)), reader, writer)
    sides.buffer_limit = lambda: 1  # type: ignore[method-assign]  # one byte: any write fills it
    channel: Any = FakeChannel(reports=20)
    run = TaskRun(task((None, None)), 0, channel, sides)
    error = run.execute()
    assert error is not None and "no acknowledgement" in error.message  # still none at the end
    assert reader.polls == 1  # the first poll's records are unacknowledged: no second one
    assert all(p.writer.unacked_bytes > 0 for p in run.parts.values())


class SlowFlush(Sides):
    """A producer still sending after `slow` flush slices (None: never done)."""

    def __init__(self, slow: int | None, limit: float):
        super().__init__(task((1, 1)), FakeReader({}), None)
        self.slow, self.flush_limit = slow, limit

    def flush(self, timeout: float | None) -> bool:
        self.flushes += 1
        return self.slow is not None and self.flushes > self.slow


def test_a_long_final_flush_reports_between_its_slices() -> None:
    channel, sides = FakeChannel(), SlowFlush(slow=5, limit=30.0)
    TaskRun(sides.task, 0, channel, sides)._final_flush()  # type: ignore[arg-type]
    assert sides.flushes == 6
    assert channel.left == 1_000 - 5  # a report after each slice that left writes out


def test_a_final_flush_ends_at_the_sides_limit_when_writes_stay_out() -> None:
    channel, sides = FakeChannel(), SlowFlush(slow=None, limit=0.05)
    began = time.monotonic()
    TaskRun(sides.task, 0, channel, sides)._final_flush()  # type: ignore[arg-type]
    assert time.monotonic() - began < 1.0 and sides.flushes >= 1


class RecordingChannel(FakeChannel):
    def __init__(self, reports: int):
        super().__init__(reports)
        self.live: list[Any] = []

    def report(self, result: Any, final: bool = False) -> None:
        if not final:
            self.live.append(result)
        super().report(result, final)


def test_live_reports_carry_the_partitions_that_moved_and_the_final_one_all() -> None:
    reader = FakeReader({ROUTES[0].key: [Rec(offset=o) for o in range(9)], ROUTES[1].key: []})
    channel = RecordingChannel(reports=6)
    run, _, _ = kafka_run(task((None, None)), reader, FakeProducer(), channel)

    keys = [[p.key for p in result.partitions] for result in channel.live]
    assert keys[0] == [ROUTES[0].key, ROUTES[1].key]  # the first one: everything is new
    assert sum(ROUTES[1].key in k for k in keys) == 1  # partition 1 never moved after it
    moved = [p for result in channel.live for p in result.partitions if p.key == ROUTES[0].key]
    assert [p.next_offset for p in moved] == sorted({p.next_offset for p in moved})
    assert moved[-1].next_offset == 9  # each report of it says something new, up to the end
    final = run.result(None, 0.0)  # what run_task sends last
    assert [(p.key, p.next_offset) for p in final.partitions] == [
        (ROUTES[0].key, 9),
        (ROUTES[1].key, 0),
    ]


class RisingReader(FakeReader):
    """Partition 1 gets no record; its high watermark rises at the 4th poll (records another
    reader of the source cannot see yet, say)."""

    polls = 0

    def poll(self, timeout: float) -> dict[tuple[str, int], list[Rec]]:
        self.polls += 1
        return super().poll(timeout)

    def highwater(self, key: tuple[str, int]) -> int:
        return 150 if key == ROUTES[1].key and self.polls >= 4 else 100


def test_a_quiet_partition_is_reported_again_when_only_its_end_moves() -> None:
    """A live report names the partitions whose report changed (`PartitionState.mark`), a
    change in what the reader says as much as in what the task did."""
    reader = RisingReader({ROUTES[0].key: [Rec(offset=o) for o in range(9)], ROUTES[1].key: []})
    channel = RecordingChannel(reports=8)
    kafka_run(task((None, None)), reader, FakeProducer(), channel)

    quiet = [p for result in channel.live for p in result.partitions if p.key == ROUTES[1].key]
    assert [p.highwater for p in quiet] == [100, 150]  # the first report, then the rise once
    assert all(p.next_offset == 0 and p.produced == 0 for p in quiet)


class TimedChannel(RecordingChannel):
    """Stops the loop after `seconds`."""

    def __init__(self, seconds: float):
        super().__init__(reports=1_000_000)
        self.until = time.monotonic() + seconds

    @property
    def should_stop(self) -> bool:
        return time.monotonic() >= self.until


def test_an_idle_task_reports_every_few_intervals_not_at_each() -> None:
    """Nothing new to say: a live report waits QUIET_REPORTS intervals (the driver still hears
    from the task well within the 8 s after which it takes it for lost)."""
    spec = dataclasses.replace(task((None, None)), report_interval=0.05)
    channel = TimedChannel(seconds=1.0)
    _, error, _ = kafka_run(spec, FakeReader({}), FakeProducer(), channel)
    assert error is None
    # the first report says everything; then one per QUIET_REPORTS (4) intervals of 0.05 s:
    # about 6 in the second, where a report at each interval would make about 20
    assert QUIET_REPORTS == 4 and 2 <= len(channel.live) <= 8
    assert [len(r.partitions) for r in channel.live[1:]] == [0] * (len(channel.live) - 1)


class LosingReader(FakeReader):
    """Partition 0's records 5-9 were deleted at the source before they were read: once the
    reader is at offset 5 it finds the log starting at 10 (as BatchReader and SourceReader do)."""

    def __init__(self, records: dict[tuple[str, int], list[Rec]]):
        super().__init__(records)
        self.queues[("t", 0)] = deque(r for r in self.queues[("t", 0)] if not 5 <= r.offset < 10)
        self.losses: list[Loss] = []
        self.found = False

    def poll(self, timeout: float) -> dict[tuple[str, int], list[Rec]]:
        key, queue = ("t", 0), self.queues[("t", 0)]
        if self.position.get(key) == 5 and not self.found:
            self.losses.append(out_of_range(key, 5, 10, 20) or Loss(key, 0, 0, "", 0))
            self.position[key], self.found = 10, True
            return {}
        if self.position.get(key, 0) < 5:  # a fetch ends where the log has a gap now
            taken = [queue.popleft() for _ in range(min(3, len(queue))) if queue[0].offset < 5]
            self.position[key] = taken[-1].offset + 1 if taken else self.position[key]
            return {key: taken} if taken else {}
        return super().poll(timeout)

    def take_losses(self) -> list[Loss]:
        found, self.losses = self.losses, []
        return found


def test_deleted_source_records_are_reported_and_the_partition_goes_on_past_them() -> None:
    producer = FakeProducer()
    run, error, _ = kafka_run(task((20, 20)), LosingReader(records(20)), producer, FakeChannel())
    assert error is None
    parts = {p.key: p for p in run.result(None, 0.0).partitions}
    assert parts[("t", 0)].lost == ((5, 10, "deleted"),)
    assert parts[("t", 1)].lost == ()
    assert (parts[("t", 0)].next_offset, parts[("t", 0)].produced) == (20, 15)


def test_on_loss_stop_halts_the_partition_before_anything_past_the_loss_is_written() -> None:
    spec = dataclasses.replace(task((20, 20)), on_loss="stop")
    producer = FakeProducer()
    run, error, _ = kafka_run(spec, LosingReader(records(20)), producer, FakeChannel())
    assert error is not None and (error.key, error.halt_at) == (("t", 0), 5)
    assert error.lost == (5, 10, "deleted") and not error.retriable
    assert "topic=t partition=0 offsets=5-9" in error.message
    assert '[source_pool].on_loss = "stop"' in error.message
    origins = [h[-1][1].decode().split("/") for _, _, _, h in producer.sent]
    written = [int(offset) for _, _, partition, offset in origins if partition == "0"]
    assert written == [0, 1, 2, 3, 4]
    parts = {p.key: p for p in run.result(None, 0.0).partitions}
    assert parts[("t", 0)].next_offset == 5


class PausingReader(FakeReader):
    """Counts the polls made once every partition was paused at its stop (each would wait
    out its timeout on a real reader)."""

    def __init__(self, records: dict[tuple[str, int], list[Rec]]):
        super().__init__(records)
        self.paused: set[tuple[str, int]] = set()
        self.idle_polls = 0

    def pause(self, key: tuple[str, int]) -> None:
        self.paused.add(key)

    def poll(self, timeout: float) -> dict[tuple[str, int], list[Rec]]:
        if self.paused == set(self.queues):
            self.idle_polls += 1
        return super().poll(timeout)


def test_a_task_whose_partitions_all_reached_their_stops_polls_no_more() -> None:
    reader = PausingReader(records(10))
    _, error, _ = kafka_run(task((10, 7)), reader, FakeProducer(), FakeChannel())
    assert error is None
    assert reader.paused == {("t", 0), ("t", 1)}
    assert reader.idle_polls == 0  # before: polls until the next sweep, 0.25 s later
    assert reader.committed == {("t", 0): 10, ("t", 1): 7}


class SlowProducer(FakeProducer):
    """Each partition's write takes `seconds`: a fetch of many partitions is a long step."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def send_batch(self, topic: str, partition: int, items: list[Any]) -> list[Any]:
        time.sleep(self.seconds)
        return super().send_batch(topic, partition, items)


class WatchedSides(Sides):
    """Counts the write blocks (each wakes the producer's I/O thread as it ends)."""

    blocks = 0

    def writing(self) -> AbstractContextManager[None]:
        self.blocks += 1
        return nullcontext()


def test_a_long_step_wakes_the_producer_in_slices_and_reports_amid_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One poll of 40 partitions written in 0.8 s: the producer is woken every WRITE_SLICE,
    and the driver hears from the task after LONG_STEP, before the poll's last partition is
    written (at 10,000 partitions one poll's writing outlasted the driver's 8 s)."""
    monkeypatch.setattr("relay.engine.executor.task.LONG_STEP", 0.2)
    routes = [PartitionRoute("t", p, "t2", p) for p in range(40)]
    spec = dataclasses.replace(
        task((None, None)), partitions=tuple(PartitionWork(r, 0, 3) for r in routes)
    )
    reader = FakeReader({r.key: [Rec(offset=o) for o in range(3)] for r in routes})
    producer = SlowProducer(0.02)
    channel = RecordingChannel(reports=1_000)
    sent_at_reports: list[int] = []
    channel_report = channel.report

    def report(result: Any, final: bool = False) -> None:
        sent_at_reports.append(len(producer.sent))
        channel_report(result, final)

    channel.report = report  # type: ignore[method-assign]

    def writer(work: PartitionWork, latencies: list[float]) -> KafkaWriter:
        origin = Origin("src", "t", work.route.partition)
        return KafkaWriter(producer, work.route, origin, latencies)  # type: ignore[arg-type]

    sides = WatchedSides(spec, reader, writer)
    error = TaskRun(spec, 0, channel, sides).execute()  # type: ignore[arg-type]

    assert error is None and len(producer.sent) == 40 * 3  # all of it, once
    assert sides.blocks >= 8  # 0.8 s of writing in slices of 0.05 s, not one block
    amid = [sent for sent in sent_at_reports if 0 < sent < 40 * 3]
    assert amid, sent_at_reports  # a report while the poll's records were being written

"""Source records lost before they were copied (relay.losses): what an out-of-range position
means, and how the driver counts, shows and says it (relay.engine.driver.status)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from kafka import TopicPartition
from kafka import errors as kafka_errors
from kafka.structs import OffsetAndMetadata

from relay.clients.consumer import SourceReader
from relay.engine.driver.progress import plain_line
from relay.engine.driver.status import Status
from relay.engine.driver.summary import RunSummary
from relay.engine.metrics import Metrics
from relay.losses import DELETED, TRUNCATED, Loss, LossCounter, diverged, out_of_range
from relay.spec import PartitionProgress, PartitionRoute

KEY = ("orders", 0)
ROUTES = [PartitionRoute("orders", 0, "copy", 0), PartitionRoute("orders", 1, "copy", 1)]


def test_a_position_below_the_log_start_lost_the_records_up_to_it() -> None:
    loss = out_of_range(KEY, 100, 150, 400)
    assert loss == Loss(KEY, 100, 150, DELETED, 100)
    assert (loss.count, loss.resume, loss.halts("warn"), loss.halts("stop")) == (
        50,
        150,
        False,
        True,
    )
    assert "topic=orders partition=0 offsets=100-149 (50 records" in loss.describe()


def test_a_position_above_the_log_end_is_a_truncation_which_always_halts() -> None:
    loss = out_of_range(KEY, 300, 0, 280)
    assert loss == Loss(KEY, 280, 300, TRUNCATED, 300)
    assert (loss.count, loss.resume, loss.halts("warn")) == (20, 300, True)
    assert "source log truncated below what was copied" in loss.describe()


def test_a_leader_diverging_below_the_position_is_a_truncation_from_there() -> None:
    """An unclean leader whose log has grown past the position since: the fetch is in range,
    but the leader says its log parts from the one read at 100."""
    assert diverged(KEY, 150, 100) == Loss(KEY, 100, 150, TRUNCATED, 150)
    assert diverged(KEY, 150, 150) is None and diverged(KEY, 150, -1) is None


def test_the_record_path_takes_a_truncation_kafka_python_found_for_a_loss() -> None:
    """kafka-python's consumer validates a position after a leader change (KIP-320) and, with
    no reset policy (ktm's), raises LogTruncationError naming where the new log parts."""
    tp = TopicPartition(*KEY)

    def truncated(found: OffsetAndMetadata | None) -> SourceReader:
        def poll(timeout_ms: int) -> None:
            raise kafka_errors.LogTruncationError({tp: found})

        reader = SourceReader.__new__(SourceReader)
        at_150 = SimpleNamespace(position=SimpleNamespace(offset=150))
        reader._consumer = SimpleNamespace(poll=poll, _subscription=SimpleNamespace(
            assignment={tp: at_150}))  # fmt: skip
        reader._tps, reader.losses = {KEY: tp}, []
        return reader

    reader = truncated(OffsetAndMetadata(100, "", 1))
    assert reader.poll(0.1) == {} and reader.take_losses() == [Loss(KEY, 100, 150, TRUNCATED, 150)]
    with pytest.raises(kafka_errors.LogTruncationError):  # no place known: the poll fails
        truncated(None).poll(0.1)


@pytest.mark.parametrize("position", [150, 200, 400])
def test_a_position_inside_the_log_is_no_loss(position: int) -> None:
    assert out_of_range(KEY, position, 150, 400) is None


def test_each_lost_offset_counts_once() -> None:
    counter = LossCounter()
    assert counter.new(KEY, 100, 150, DELETED) == 50
    assert counter.new(KEY, 100, 150, DELETED) == 0  # the same range, reported again
    assert counter.new(KEY, 120, 170, DELETED) == 20  # a retried round from 120: 150-169 new
    assert counter.new(("orders", 1), 0, 5, DELETED) == 5
    assert counter.new(KEY, 280, 300, TRUNCATED) == 20
    assert counter.new(KEY, 280, 300, TRUNCATED) == 0


def make_status() -> tuple[Status, Metrics]:
    metrics = Metrics()
    status = Status(metrics, stuck_after=60)
    status.start(ROUTES, {r.key: 0 for r in ROUTES}, {r.key: 500 for r in ROUTES}, None)
    return status, metrics


def lost_total(metrics: Metrics, partition: str, cause: str = DELETED) -> float | None:
    labels = {"source_topic": "orders", "source_partition": partition, "cause": cause}
    return metrics.registry.get_sample_value("ktm_source_records_lost_total", labels)


def test_lost_records_are_counted_said_once_and_shown(caplog: pytest.LogCaptureFixture) -> None:
    status, metrics = make_status()
    first = PartitionProgress(KEY, 100, lost=((40, 90, DELETED),))
    with caplog.at_level(logging.WARNING):
        status.apply((1, 0, 0), [first])
        status.apply((1, 0, 0), [first])  # live, then final: the same totals
        status.apply((2, 0, 0), [PartitionProgress(KEY, 100, lost=((40, 90, DELETED),))])
    assert lost_total(metrics, "0") == 50
    assert lost_total(metrics, "1") is None
    lines = [r.getMessage() for r in caplog.records if "deleted before" in r.getMessage()]
    assert lines == [
        "source records deleted before they were copied: topic=orders partition=0 "
        "offsets=40-89 (50 records, the log now starts at 90); going on at offset 90 "
        '([source_pool].on_loss = "warn")'
    ]
    snap = status.snapshot()
    assert snap.lost == 50 and "lost=50" in plain_line(snap)
    healthy, detail = status.health()
    assert healthy and detail["source_records_lost"] == {"orders[0]": 50}


def test_a_halted_partitions_loss_is_counted_without_a_second_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    status, metrics = make_status()
    with caplog.at_level(logging.WARNING):
        status.count_loss(("orders", 1), (280, 300, TRUNCATED))
    assert lost_total(metrics, "1", TRUNCATED) == 20
    assert not caplog.records
    assert status.snapshot().lost == 20


def test_the_summary_names_the_lost_records_per_partition() -> None:
    from relay.engine.driver.summary import summarize

    status, metrics = make_status()
    status.apply((1, 0, 0), [PartitionProgress(KEY, 100, lost=((40, 90, DELETED),))])

    class Backend:
        start_seconds = 0.0

        def engine_slots(self) -> int:
            return 1

    summary = RunSummary()
    summarize(summary, status, Backend(), 0, False, 0.0, metrics)  # type: ignore[arg-type]
    assert (summary.records_lost, summary.lost) == (50, {"orders/0": 50})

"""Records a destination refuses for good: the topic's rules (relay.refusals), the writer naming
the first refused record of a refused batch (relay.pipelines.kafka_target), and how a halt
shows (relay.engine.driver.halts, the progress line). Behind fakes of ktm's own seams; the same
on Apache Kafka is in tests/integration/test_refusals.py."""

from __future__ import annotations

import logging
from collections import namedtuple
from typing import Any

import pytest
from kafka.errors import InvalidRecordError, InvalidTimestampError

from relay.batches import Origin, codecs
from relay.engine.driver.progress import plain_line
from relay.engine.driver.status import Status
from relay.engine.executor.failures import Refused
from relay.engine.metrics import Metrics
from relay.pipelines.kafka_target import KafkaWriter
from relay.refusals import NO_LIMIT, TopicRules, first_refused, rules_of
from relay.spec import PartitionRoute

NOW = 1_800_000_000_000
HOUR = 3_600_000
Rec = namedtuple("Rec", "offset timestamp key value headers")
ROUTE = PartitionRoute("orders", 3, "copy", 3)


def test_the_rules_are_read_from_the_described_configs():
    described = {
        "message.timestamp.before.max.ms": str(NO_LIMIT),  # "no limit", as Kafka describes it
        "message.timestamp.after.max.ms": "3600000",
        "cleanup.policy": "compact,delete",
        "message.timestamp.type": "CreateTime",
    }
    assert rules_of("copy", described) == TopicRules("copy", None, HOUR, None, True, False)
    appended = rules_of("copy", {"message.timestamp.type": "LogAppendTime",
                                 "message.timestamp.after.max.ms": "1"})  # fmt: skip
    assert appended.refuses(NOW + HOUR, b"k", NOW) is None  # the broker stamps its own time


@pytest.mark.parametrize(
    ("rules", "timestamp", "key", "says"),
    [
        (TopicRules("copy", after_max_ms=HOUR), NOW + 2 * HOUR, b"k",
         "message.timestamp.after.max.ms = 3600000 on destination topic copy (record timestamp "
         "1800007200000 = 2027-01-15T10:00:00Z, 2.0h ahead of now)"),
        (TopicRules("copy", after_max_ms=HOUR), NOW + HOUR, b"k", None),  # at the limit: taken
        (TopicRules("copy", before_max_ms=HOUR), NOW - 2 * HOUR, b"k",
         "message.timestamp.before.max.ms = 3600000 on destination topic copy (record timestamp "
         "1799992800000 = 2027-01-15T06:00:00Z, 2.0h before now)"),
        (TopicRules("copy", difference_max_ms=HOUR), NOW - 2 * HOUR, b"k",
         "message.timestamp.difference.max.ms = 3600000 on destination topic copy"),
        (TopicRules("copy", difference_max_ms=HOUR), NOW + 2 * HOUR, b"k",
         "message.timestamp.difference.max.ms = 3600000"),
        (TopicRules("copy", compacted=True), NOW, None,
         "cleanup.policy=compact on destination topic copy (the record has a null key)"),
        (TopicRules("copy", compacted=True), NOW, b"", None),  # an empty key is a key
        (TopicRules("copy", after_max_ms=HOUR), -1, b"k", None),  # no timestamp: not checked
    ],
)  # fmt: skip
def test_a_rule_names_its_key_its_value_and_the_records_side_of_it(rules, timestamp, key, says):
    found = rules.refuses(timestamp, key, NOW)
    assert (found is None) == (says is None)
    if says is not None:
        assert says in found


def test_the_record_the_broker_named_wins_over_the_rules():
    records = [Rec(10 + i, NOW, b"k", b"v", []) for i in range(4)]
    rules = TopicRules("copy", compacted=True)
    assert first_refused(records, rules, NOW, named=2).offset == 12
    assert first_refused(records, rules, NOW) is None  # every record has a key
    late = [*records[:3], Rec(13, NOW + 5 * HOUR, b"k", b"v", [])]
    found = first_refused(late, TopicRules("copy", after_max_ms=HOUR), NOW)
    assert found is not None and found.offset == 13
    assert first_refused(late, None, NOW) is None  # neither says: the caller decides


class RefusedDelivery:
    """relay.clients.delivery.Delivery of a batch the broker refused, naming `named` (an index
    in the batch) or no record."""

    done = True

    def __init__(self, error: BaseException, named: int | None):
        self._error, self._named = error, named

    def error(self) -> BaseException:
        return self._error

    def acked(self) -> bool:
        return False

    def refused(self, count: int) -> tuple[int, BaseException] | None:
        return None if self._named is None else (self._named, self._error)

    def on_ack(self, callback: Any) -> None:
        pass


class BuiltProducer:
    takes_built, ack_deadline = True, 60.0

    def __init__(self, deliveries: list[RefusedDelivery]):
        self.deliveries = deliveries

    def send_built(self, topic: str, partition: int, batches: list[Any]) -> list[Any]:
        return self.deliveries[: len(batches)]


def refused_writer(error: BaseException, named: int | None, rules: TopicRules | None,
                   records: list[Rec]) -> KafkaWriter:  # fmt: skip
    producer = BuiltProducer([RefusedDelivery(error, named)])
    writer = KafkaWriter(producer, ROUTE, Origin("src", "orders", 3), [],  # type: ignore[arg-type]
                         (codecs.NONE, 1 << 20), rules=rules)  # fmt: skip
    writer.write(records)  # restore's path: framed into one destination batch here
    return writer


# offsets 100-105 with a compaction gap after 101: the i-th record is the i-th offset listed
OFFSETS = [100, 101, 104, 105, 106, 107]


def test_the_writer_names_the_record_the_broker_named_by_its_source_offset():
    records = [Rec(o, NOW, b"k", b"v", []) for o in OFFSETS]
    records[3] = Rec(105, NOW + 3 * HOUR, b"k", b"v", [])
    rules = TopicRules("copy", after_max_ms=HOUR)
    error = InvalidTimestampError("Timestamp of message with offset 3 is out of range")
    failure = refused_writer(error, 3, rules, records).failure()
    assert isinstance(failure, Refused) and failure.halt_at == 105
    assert failure.key == ("orders", 3)
    assert str(failure).startswith(
        "destination copy[3] refuses record orders[3] offset 105: "
        "message.timestamp.after.max.ms = 3600000 on destination topic copy"
    )
    assert "InvalidTimestampError" in str(failure)


def test_without_a_named_record_the_rules_find_it():
    records = [Rec(o, NOW, b"k%d" % o, b"v", []) for o in OFFSETS]
    records[2] = Rec(104, NOW, None, b"v", [])
    failure = refused_writer(InvalidRecordError("Compacted topic cannot accept message without "
                                                "key"), None, TopicRules("copy", compacted=True),
                             records).failure()  # fmt: skip
    assert isinstance(failure, Refused) and failure.halt_at == 104
    assert "cleanup.policy=compact on destination topic copy (the record has a null key)" in str(
        failure
    )


def test_when_nothing_says_which_record_the_partition_halts_at_the_batchs_first():
    records = [Rec(o, NOW, b"k", b"v", []) for o in OFFSETS]
    failure = refused_writer(InvalidTimestampError("out of range"), None, None, records).failure()
    assert isinstance(failure, Refused) and failure.halt_at == 100
    assert "the broker named no record of offsets 100-107 (its limits: not described)" in str(
        failure
    )


def test_a_halt_is_one_error_line_a_gauge_the_progress_line_and_health(caplog):
    metrics = Metrics()
    status = Status(metrics, stuck_after=60.0)
    status.start([ROUTE], {ROUTE.key: 100}, {ROUTE.key: 200}, None)
    with caplog.at_level(logging.ERROR, logger="relay.engine.driver.halts"):
        assert status.halts.add(ROUTE, 105, "destination copy[3] refuses record ...")
        assert not status.halts.add(ROUTE, 106, "a later record")  # the first one stays
        assert status.halts.add(ROUTE, 104, "an earlier record")  # an earlier one moves it
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[0].startswith(
        "halted source partition orders[3] at offset 105"
    )
    labels = {"source_topic": "orders", "source_partition": "3"}
    assert metrics.registry.get_sample_value("ktm_partitions_halted", labels) == 1
    snap = status.snapshot()
    assert plain_line(snap).endswith(" halted=1; halted: orders[3] at offset 104 (-> copy[3])")
    healthy, detail = status.health()
    assert not healthy and detail["halted"][0]["offset"] == 104
    assert detail["reason"] == "partition(s) halted: orders[3] at offset 104 (-> copy[3])"

"""A compacted destination on Apache Kafka, its log cleaner eager (the topic's settings: segments
roll every 100 ms, any dirt is cleanable, tombstones go after 100 ms; the broker looks for work
every 15 s, its stock `log.cleaner.backoff.ms`).

The cleaner removes records a later one with the same key supersedes, and tombstones, from
closed segments; ktm's provenance header rides on the last record of each destination batch.
Kafka keeps a batch's last offset when it cleans records out of it (and drops a batch it
empties, unless it is its producer's last). What is checked, with the source records numbered
in an "n" header (the checks read those, never ktm's code):
- kill -9 mid-stream of a fan-in (two source partitions, one destination partition), a
  cleaning pass, a restart: no record that survived is there twice, and the latest record of
  each key of each source partition is there (nothing skipped);
- a source partition whose last batch lost its header (its last record, a tombstone, cleaned),
  its committed offset behind that batch or gone: it resumes after the batch (its survivors
  are its records: relay.provenance.attribution), on start-up as on a takeover (`where`);
- group sync into a compacted destination: the committed source offset becomes the offset of
  the first surviving copy of it or later, exactly.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import ConfigResource
from kafka.structs import OffsetAndMetadata

from relay.config import ClusterConfig, load_config
from relay.engine.metrics import Metrics
from relay.pipelines.relay.driver import RelayPipeline
from relay.provenance.resume import at_destination
from relay.provenance.translation import first_copy_at_or_after
from relay.spec import PartitionRoute
from testbed.ktm_process import ktm
from testbed.records import Record, produce, read_all
from testbed.topics import create_topic, unique_topic, wait_until
from tests.support.inprocess import Background, relay_once
from tests.support.relay import committed_offsets, listed_end_offsets, write_config

pytestmark = [pytest.mark.brokers("kafka"), pytest.mark.timeout(300)]

EAGER = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "100",
    "min.compaction.lag.ms": "0",
}
PROVENANCE = "ktm.src"
SEGMENT = 0.1  # seconds: EAGER's segment.ms


class Numbered:
    """Records numbered in an "n" header, written to a source topic: where each number went."""

    def __init__(self, bootstrap: str, topic: str):
        self.bootstrap, self.topic = bootstrap, topic
        self.sent = 0

    def send(self, partition: int, keys: list[bytes], tombstones: tuple[bytes, ...] = ()) -> None:
        records = []
        for key in keys:
            value = None if key in tombstones else b"%d." % self.sent + b"v" * 40
            records.append(Record(key=key, value=value, headers=[("n", b"%d" % self.sent)],
                                  partition=partition))  # fmt: skip
            self.sent += 1
        produce(self.bootstrap, self.topic, records)

    def source(self) -> dict[int, tuple[int, int, bytes]]:
        """n -> (partition, offset, key), as the source holds them."""
        found = read_all(self.bootstrap, self.topic)
        return {_n(r): (p, r.offset, r.key) for p, rs in found.items() for r in rs}


def _n(record: Any) -> int:
    return int(dict(record.headers)["n"])


def copies(bootstrap: str, topic: str) -> list[Any]:
    return [r for rs in read_all(bootstrap, topic, timeout=20).values() for r in rs]


def wait_for_cleaning(
    bootstrap: str,
    topic: str,
    done: Callable[[list[Any]], bool],
    feed: Callable[[], None],
    timeout: float = 120,
) -> None:
    """Until `done(records)` holds of the destination, feeding it (`feed()`) meanwhile: the
    cleaner works on closed segments, and a segment closes when a record comes after it."""
    deadline = time.monotonic() + timeout
    while not done(copies(bootstrap, topic)):
        assert time.monotonic() < deadline, f"no cleaning pass on {topic} within {timeout}s"
        feed()
        time.sleep(1)


def stop_cleaning(bootstrap: str, topic: str) -> None:
    """The destination as it is now, for the checks: no more compaction (AlterConfigs)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.alter_configs([ConfigResource("TOPIC", topic, configs={"cleanup.policy": "delete"})])
    finally:
        admin.close()


def test_kill_9_of_a_fan_in_to_a_compacted_destination_duplicates_and_skips_nothing(
    source_broker, target_broker, tmp_path
):
    source, target = source_broker.bootstrap, target_broker.bootstrap
    topic, dest = unique_topic("cmp-src"), unique_topic("cmp-dst")
    create_topic(source, topic, 2)
    create_topic(target, dest, 1, configs=EAGER)
    numbered, rng = Numbered(source, topic), random.Random(7)
    group = f"ktm-{dest}"
    config = write_config(tmp_path / "ktm.toml", source=source, target=target,
                          topics={topic: f"{dest}:0"},
                          app=f'metrics_addr = ""\ngroup_id = "{group}"')  # fmt: skip

    stop = threading.Event()

    def feed() -> None:  # keys shared by both partitions: one supersedes the other's
        while not stop.wait(0.05):
            numbered.send(rng.randint(0, 1), [b"k%d" % rng.randint(0, 11) for _ in range(4)])

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        with ktm(tmp_path, "--config", str(config), "--no-progress") as relay:
            # the destination shrinks as it grows: the relay's commits say how far it got
            wait_until(lambda: sum(o or 0 for o in committed_offsets(
                source, group, topic, 2).values()) >= 300, 120, "300 records relayed",
                every=1)  # fmt: skip
            relay.kill()  # mid-stream: nothing flushed, nothing committed at the end
    finally:
        stop.set()
        feeder.join(30)
    relayed = numbered.sent
    wait_for_cleaning(target, dest, lambda found: len(found) < relayed // 2, lambda: None)
    with ktm(tmp_path, "--config", str(config), "--no-progress", "--stop-at-end") as relay:
        run = relay.wait(timeout=180)
    assert run.returncode == 0, run.stderr
    stop_cleaning(target, dest)
    where = numbered.source()
    held = Counter(_n(r) for r in copies(target, dest))
    assert [n for n, times in held.items() if times > 1] == []  # no survivor twice
    latest: dict[tuple[int, bytes], int] = {}
    for n, (partition, _, key) in sorted(where.items(), key=lambda item: item[1][1]):
        latest[(partition, key)] = n
    keys_held = {(where[n][0], where[n][2]) for n in held}
    # nothing skipped: the last record of each key of each partition is there, or one of the
    # other partition with its key (which may have superseded it)
    skipped = [n for (p, key), n in latest.items()
               if n not in held and (1 - p, key) not in keys_held]  # fmt: skip
    assert skipped == []


def test_a_source_partition_whose_last_batch_lost_its_header_resumes_after_it(
    source_broker, target_broker, tmp_path, spark, caplog
):
    """Fan-in: source partition 0 writes two batches, the second ending on a tombstone;
    partition 1 goes on. The cleaner removes the tombstone, which carried the header of
    partition 0's last batch: the destination names partition 0's first batch only, and its
    committed offset is set back there (what a kill -9 within a second of the acknowledgement
    leaves), then deleted (what offsets.retention.minutes does to a group stopped for long).
    The survivors of the batch are partition 0's records 2 and 3: it resumes after the batch,
    at start-up as on a takeover (`where`), and copies nothing again."""
    source, target = source_broker.bootstrap, target_broker.bootstrap
    topic, dest = unique_topic("cmp-src"), unique_topic("cmp-dst")
    create_topic(source, topic, 2)
    create_topic(target, dest, 1, configs=EAGER)
    numbered = Numbered(source, topic)
    group = f"ktm-{dest}"
    config = write_config(tmp_path / "ktm.toml", source=source, target=target,
                          topics={topic: f"{dest}:0"},
                          app=f'metrics_addr = ""\ngroup_id = "{group}"')  # fmt: skip
    numbered.send(0, [b"a0", b"a1"])  # n 0, 1
    numbered.send(1, [b"b0", b"b1"])
    relay_once(config)
    numbered.send(0, [b"a2", b"a3", b"a9"], tombstones=(b"a9",))  # n 4, 5, 6: a batch
    relay_once(config)
    tombstone = 6

    def feed() -> None:
        numbered.send(1, [b"b0", b"b1"])
        relay_once(config)

    wait_for_cleaning(target, dest, lambda found: tombstone not in {_n(r) for r in found}, feed)
    stop_cleaning(target, dest)
    routes = [PartitionRoute(topic, p, dest, 0) for p in (0, 1)]
    tail = at_destination(ClusterConfig("target", (target,)), routes, 10.0)
    assert tail.delivered[(topic, 0)].next_offset == 2 and tail.unsettled == {(topic, 0)}
    _commit(source, group, topic, 2)  # behind the last batch, as after a kill -9
    pipeline = RelayPipeline(load_config(config), stop_event=threading.Event(), metrics=Metrics(),
                             failover=False, dry_run=True, filters=())  # fmt: skip
    try:  # a takeover
        assert pipeline.where(routes)[(topic, 0)] == 5
    finally:
        pipeline.close()
    before = Counter(_n(r) for r in copies(target, dest))
    assert before[4] == before[5] == 1  # the survivors
    for _ in range(2):  # a start-up with the committed offset behind, then with none
        relay_once(config)
        assert Counter(_n(r) for r in copies(target, dest)) == before  # nothing copied again
        admin = KafkaAdminClient(bootstrap_servers=source)
        try:
            admin.delete_groups([group])
        finally:
            admin.close()
    assert not [m for m in caplog.messages if "cannot settle" in m]


def test_group_sync_into_a_compacted_destination_translates_exactly(
    source_broker, target_broker, tmp_path, spark
):
    """One source partition, keys repeated: batches of the destination lose records, some
    their header. A consumer group committed at a source offset lands, after the sync, on the
    first surviving copy of that offset or a later one; every offset translates so."""
    source, target = source_broker.bootstrap, target_broker.bootstrap
    topic, dest = unique_topic("cmp-src"), unique_topic("cmp-dst")
    create_topic(source, topic, 1)
    create_topic(target, dest, 1, configs=EAGER)
    numbered, rng = Numbered(source, topic), random.Random(11)
    config = write_config(tmp_path / "ktm.toml", source=source, target=target,
                          topics={topic: dest})  # fmt: skip

    def feed() -> None:  # a batch, copied before the next: a destination batch each
        numbered.send(0, [b"k%d" % rng.randint(0, 7) for _ in range(rng.randint(1, 6))])
        wait_until(lambda: listed_end_offsets(target, dest, 1)[0] == numbered.sent, 30,
                   "the batch copied", every=0.05)  # fmt: skip
        time.sleep(SEGMENT)  # the next one in a segment of its own

    relay = Background(config, failover=False)
    try:
        for _ in range(12):
            feed()
        wait_for_cleaning(target, dest, lambda found: len(found) < numbered.sent // 3, feed)
    finally:
        relay.finish()
    assert relay.error is None, relay.error
    stop_cleaning(target, dest)
    where = numbered.source()
    survivors = sorted((r.offset, where[_n(r)][1], _has_header(r)) for r in copies(target, dest))
    end = survivors[-1][0] + 1

    def truth(committed: int) -> int:
        return next((d for d, s, _ in survivors if s >= committed), end)

    named = [s for _, s, header in survivors if header]
    cluster = ClusterConfig("target", (target,))
    for committed in range(numbered.sent + 1):
        got = first_copy_at_or_after(cluster, (dest, 0), (topic, 0), committed, 10.0, sole=True)
        if named and committed > named[0]:  # a named copy before it: exact
            assert got == truth(committed), committed
        else:
            assert got <= truth(committed), committed  # never skips a survivor
    # and group sync: groups committed at source offsets of survivors with no header
    bare = [s for _, s, header in survivors if not header and named and s > named[0]][:4]
    assert bare, "no survivor without its header after a named copy: nothing to translate"
    groups = {unique_topic("readers"): offset for offset in bare}
    for group, offset in groups.items():
        _commit(source, group, topic, offset)
    sync = config.read_text() + '\n[groups]\ninclude = ["readers-.*"]\ninterval = "1s"\n'
    Path(config).write_text(sync)
    relay = Background(config, failover=False)  # a new run: the groups are found at its start
    try:
        wait_until(lambda: all(_committed(target, g, dest) is not None for g in groups), 60,
                   "the groups synced", every=0.5)  # fmt: skip
    finally:
        relay.finish()
    assert relay.error is None, relay.error
    assert {g: _committed(target, g, dest) for g in groups} == {
        g: truth(o) for g, o in groups.items()
    }


def _has_header(record: Any) -> bool:
    return any(name == PROVENANCE for name, _ in record.headers)


def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    """The group's offset of `topic`[0] (the group must have no member)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        answers = admin.alter_group_offsets(
            group, {TopicPartition(topic, 0): OffsetAndMetadata(offset, "", -1)}
        )
    finally:
        admin.close()
    assert all(error.errno == 0 for error in answers.values()), answers


def _committed(bootstrap: str, group: str, topic: str) -> int | None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        found = admin.list_group_offsets({group: None}).get(group, {})
    finally:
        admin.close()
    meta = found.get(TopicPartition(topic, 0))
    return None if meta is None else meta.offset

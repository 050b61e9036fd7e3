"""Issue 20, consumer groups: a consumer that stops on the source, waits for the next sync and
starts on the target with the same group reads exactly what it had not committed, none twice.

Each test: a feeder writes while the relay runs with `[groups]`; a consumer reads on the source
and commits every 150 records; it stops at a random moment (with records read but not
committed); once the relay's next sync has read the source's offsets after that moment, the same
group reads the destination. What it reads (the feeder's record numbers, kept in a header) must be
exactly the source's records from each committed offset on, minus those a filter drops.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import CoordinatorNotAvailableError, NoError
from kafka.structs import OffsetAndMetadata

from testbed.group_member import GroupMember
from testbed.provenance import attributed
from testbed.records import Record, produce, read_all, record_count
from testbed.topics import create_topic, unique_topic, wait_until
from tests.support.feeder import Feeder
from tests.support.inprocess import Background
from tests.support.relay import write_config

# Long: proved on Apache Kafka alone, the broker users run.
pytestmark = pytest.mark.brokers("kafka")

FILTERS = Path(__file__).parent / "filter_files"
GROUP_SESSION = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
Key = int  # the feeder's record number (its "n" header, which the copies keep)


def group_config(path: Path, source: str, target: str, topics: dict[str, str], group: str,
                 drop: bool = False) -> Path:  # fmt: skip
    extra = f'\n[groups]\ninclude = ["{group}"]\ninterval = "1s"\n'
    if drop:
        extra += f'\n[filters.drop_marked]\npath = "{FILTERS / "drop_marked.py"}"\n'
    return write_config(path, source=source, target=target, topics=topics, extra=extra)


def read_on_source_then_stop(bootstrap: str, topic: str, group: str, stop_after: int) -> None:
    """Read, committing every 150 records; stop after `stop_after` records without a last
    commit (the records since the last commit must be read again on the target)."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             max_poll_records=40, **GROUP_SESSION)  # fmt: skip
    read = since_commit = 0
    deadline = time.monotonic() + 60
    try:
        while read < stop_after:
            assert time.monotonic() < deadline, f"read only {read} of {stop_after} on the source"
            got = sum(len(records) for records in consumer.poll(timeout_ms=300).values())
            read, since_commit = read + got, since_commit + got
            if since_commit >= 150:
                consumer.commit()
                since_commit = 0
    finally:
        consumer.close(autocommit=False)


def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        found = admin.list_group_offsets({group: None}).get(group, {})
    finally:
        admin.close()
    return {(tp.topic, tp.partition): meta.offset for tp, meta in found.items()}


def wait_for_sync(relay: Background, group: str, after: float, timeout: float = 60) -> None:
    """Until the relay's sync of `group` read the source's offsets after `after` (unix time)."""
    deadline = time.monotonic() + timeout
    labels = {"group": group}
    while (relay.metrics.registry.get_sample_value("ktm_group_sync_timestamp_seconds", labels)
           or 0) <= after:  # fmt: skip
        assert relay.error is None, relay.error
        assert time.monotonic() < deadline, f"no sync of {group} within {timeout}s"
        time.sleep(0.2)


def read_on_target(bootstrap: str, topic: str, group: str, want: int) -> Counter[Key]:
    """The source records the group reads on the target: `want` of them, then 1.5 s more."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             **GROUP_SESSION)  # fmt: skip
    seen: Counter[Key] = Counter()
    deadline, quiet_until = time.monotonic() + 60, None
    try:
        while quiet_until is None or time.monotonic() < quiet_until:
            assert time.monotonic() < deadline, f"read {sum(seen.values())} of {want} on target"
            for records in consumer.poll(timeout_ms=300).values():
                seen.update(number(record) for record in records)
            if quiet_until is None and sum(seen.values()) >= want:
                quiet_until = time.monotonic() + 1.5
    finally:
        consumer.close(autocommit=False)
    return seen


def number(record: object) -> int:
    """The feeder's number of a record (the group reads from the middle of destination batches,
    so not every batch-form provenance header it sees lists only records it read)."""
    return int(dict(record.headers)["n"])  # type: ignore[attr-defined]


def unread(bootstrap: str, topic: str, commits: dict[tuple[str, int], int],
           drop: bool) -> Counter[Key]:  # fmt: skip
    """The source's records at or after the group's committed offsets (minus dropped ones)."""
    return Counter({
        number(r): 1
        for p, records in read_all(bootstrap, topic).items()
        for r in records
        if r.offset >= commits.get((topic, p), 0) and not (drop and r.value.startswith(b"drop"))
    })  # fmt: skip


def switch(source, target, tmp_path: Path, *, partitions: int, dest: str, restart: bool = False,
           drop: bool = False) -> tuple[Counter[Key], Counter[Key]]:  # fmt: skip
    """Run the switch; (what the group read on the target, what it should have read)."""
    topic, group = unique_topic("gs"), unique_topic("consumers")
    name = unique_topic("gs-copy")
    create_topic(source.bootstrap, topic, partitions)
    create_topic(target.bootstrap, name, 2)
    config = group_config(tmp_path / "ktm.toml", source.bootstrap, target.bootstrap,
                          {topic: dest.replace("DEST", name)}, group, drop)  # fmt: skip
    feeder = Feeder(source.bootstrap, topic, partitions, per_batch=30, pause=0.05,
                    drop_every=5 if drop else 0)  # fmt: skip
    relay = Background(config, failover=False)
    try:
        read_on_source_then_stop(source.bootstrap, topic, group, random.randint(400, 900))
        if restart:
            relay.finish()
            relay = Background(config, failover=False)
        stopped_at = time.time()
        wait_for_sync(relay, group, stopped_at)
        feeder.stop()
        commits = committed(source.bootstrap, group)
        want = unread(source.bootstrap, topic, commits, drop)
        seen = read_on_target(target.bootstrap, name, group, sum(want.values()))
    finally:
        feeder.stop()
        relay.finish()
    assert relay.error is None, relay.error
    return seen, want


def test_the_switch_is_exact_and_passes_over_records_a_filter_drops(
    source_broker, target_broker, spark, tmp_path
):
    seen, want = switch(source_broker, target_broker, tmp_path, partitions=2, dest="DEST",
                        drop=True)  # fmt: skip
    assert seen == want


def test_the_switch_is_exact_to_a_fixed_destination_partition_after_a_relay_restart(
    source_broker, target_broker, spark, tmp_path
):
    seen, want = switch(source_broker, target_broker, tmp_path, partitions=1, dest="DEST:1",
                        restart=True)  # fmt: skip
    assert seen == want


def test_fan_in_never_skips_and_re_reads_only_what_was_committed(
    source_broker, target_broker, spark, tmp_path
):
    """Two source partitions in one destination partition: Kafka keeps one offset per
    destination partition, so the group gets the smaller translation. It skips nothing; what
    it reads twice is records of the other partition it had already read on the source."""
    seen, want = switch(source_broker, target_broker, tmp_path, partitions=2, dest="DEST:0")
    assert set(seen) >= set(want) and all(n == 1 for n in seen.values())
    extra = set(seen) - set(want)
    assert len({n % 2 for n in extra}) <= 1  # the extra records are of one source partition


# ---- groups active on the target, of either protocol (Apache Kafka 4: KIP-848) -------------

PER_PARTITION, READ, OTHERS = 600, 400, 50  # records per source partition read by the group
# there, and not read; records at the head of each destination partition, deleted


def numbered(start: int, count: int, partitions: int) -> list[Record]:
    return [Record(key=f"k{n}", value=f"{n}".ljust(60, "v"), headers=[("n", str(n).encode())],
                   partition=n % partitions) for n in range(start, start + count)]  # fmt: skip


def wait_until_committed(bootstrap: str, group: str, want: dict[tuple[str, int], int]) -> None:
    deadline = time.monotonic() + 60
    while committed(bootstrap, group) != want:
        assert time.monotonic() < deadline, f"{group} committed {committed(bootstrap, group)}"
        time.sleep(0.3)


def copy_offsets(bootstrap: str, topic: str, source: str,
                 offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:  # fmt: skip
    """The destination offset of the copy of each source (topic, partition)'s offset, read
    from the provenance headers (testbed.provenance: none of ktm's code)."""
    copies = [r for rs in read_all(bootstrap, topic).values() for r in rs]
    return {
        (r.record.topic, r.record.partition): r.record.offset
        for r in attributed(copies)
        if r.topic == source and offsets.get((source, r.partition)) == r.offset
    }


@pytest.mark.brokers("kafka")
@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_a_group_active_on_the_target_is_left_alone_until_its_member_leaves(
    source_broker, target_broker, spark, tmp_path, caplog, protocol
):
    """A KIP-848 group on the source (read by Kafka's own Java consumer with
    group.protocol=consumer, which kafka-python cannot join) and a group of the same name
    with a live member on the target, of either protocol. Kafka's DescribeGroups describes a
    KIP-848 group as dead with no members; ktm must still see it is active: it says so in one
    line, commits nothing (the broker would refuse: UNKNOWN_MEMBER_ID) and leaves the offsets
    the target's consumers committed. Once the member left, the next sync commits the
    translated offsets: the copies of the source's committed offsets."""
    source, target = source_broker.bootstrap, target_broker.bootstrap
    topic, name, group = unique_topic("gk"), unique_topic("gk-copy"), unique_topic("kip848")
    create_topic(source, topic, 2)
    create_topic(target, name, 2)
    produce(source, topic, numbered(0, 2 * PER_PARTITION, 2))
    produce(target, name, [Record(value=b"other", partition=p) for p in (0, 1)] * OTHERS)
    before = {(name, p): 1 for p in (0, 1)}  # what the target's consumers committed
    admin = KafkaAdminClient(bootstrap_servers=target)
    try:  # destination offsets are not the source's: its log starts at OTHERS
        admin.delete_records({TopicPartition(name, p): OTHERS for p in (0, 1)})
        commits = {TopicPartition(*tp): OffsetAndMetadata(o, "", -1) for tp, o in before.items()}
        wait_until(lambda: _committed_now(admin, group, commits), 30,
                   "the target's coordinator to take a commit", every=0.5)  # fmt: skip
    finally:
        admin.close()
    on_target = GroupMember(target, group, name, protocol=protocol).start()
    config = group_config(tmp_path / "ktm.toml", source, target, {topic: name}, group)
    on_source = GroupMember(source, group, topic, commit=True)  # a KIP-848 group, reading
    relay = None
    try:
        on_source.start()  # first: a fresh node's group coordinator is up once it is assigned
        relay = Background(config, failover=False)
        wait_until_committed(source, group, {(topic, p): PER_PARTITION for p in (0, 1)})
        on_source.stop()
        produce(source, topic, numbered(2 * PER_PARTITION, 2 * READ, 2))  # not read yet
        wait_until(lambda: record_count(target, name) == 2 * (PER_PARTITION + READ), 60,
                   "every record relayed", every=0.5)  # fmt: skip
        labels = {"group": group}
        active = "ktm_group_active_on_target"
        wait_until(lambda: relay.metrics.registry.get_sample_value(active, labels) == 1, 30,
                   "the sync to see the target's member")  # fmt: skip
        time.sleep(4)  # four more syncs
        assert committed(target, group) == before
        on_target.stop()
        left_at = time.time()
        wait_for_sync(relay, group, left_at)
    finally:
        on_source.stop()
        on_target.stop()
        if relay is not None:
            relay.finish()
    assert relay.error is None, relay.error
    source_commits = committed(source, group)
    assert committed(target, group) == copy_offsets(target, name, topic, source_commits)
    assert relay.metrics.registry.get_sample_value(active, labels) == 0
    said = [r.getMessage() for r in caplog.records if f"group {group} " in r.getMessage()]
    active_lines = [line for line in said if "is active on the target" in line]
    assert len(active_lines) == 1 and f"{protocol} protocol" in active_lines[0], said
    assert not [line for line in caplog.messages if "group sync failed" in line]


def _committed_now(admin: KafkaAdminClient, group: str, commits: dict) -> bool:
    """One commit; False while the broker's coordinator is not there yet (a fresh node)."""
    try:
        return all(e is NoError for e in admin.alter_group_offsets(group, commits).values())
    except CoordinatorNotAvailableError:
        return False

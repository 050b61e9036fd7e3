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
from kafka import KafkaAdminClient, KafkaConsumer

from testbed.records import read_all
from testbed.topics import create_topic, unique_topic
from tests.support.feeder import Feeder
from tests.support.inprocess import Background
from tests.support.relay import write_config

pytestmark = pytest.mark.brokers("tansu", "kafka")

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

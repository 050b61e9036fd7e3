"""Issue 36: a source topic that gains partitions while ktm relays. Its destination grows too
where `[target].create_topics` allows it, and the new partitions are relayed from their start,
exactly once, within a discovery interval or so; where the destination cannot grow, the new
partitions halt (one ERROR line naming the topic, both counts and the key), never remapped.

Apache Kafka only: Tansu has no CreatePartitions. One pair of module-scoped single-node clusters
serves every test (their topics are unique); `[discover].interval` is 1 s.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewPartitions

from testbed.provenance import attributed
from testbed.records import Record, produce, read_all
from testbed.topics import create_topic, describe_topic, unique_topic, wait_until
from tests.support.inprocess import Background, assert_verified, verify_once
from tests.support.relay import write_config

pytestmark = [pytest.mark.brokers("kafka"), pytest.mark.timeout(120)]

DISCOVERY = '[discover]\ninterval = "1s"\n'


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    wait_until(condition, timeout, what, every=0.3)


def grow(bootstrap: str, counts: dict[str, int]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_partitions({t: NewPartitions(total_count=n) for t, n in counts.items()})
    finally:
        admin.close()


def partitions(bootstrap: str, topic: str) -> int:
    described = describe_topic(bootstrap, topic)
    return len(described["partitions"]) if described else 0


def numbered(start: int, count: int, parts: int, tag: str) -> list[Record]:
    """Deterministic records, round-robin over `parts` partitions (two failover nodes fed the
    same range hold the same data)."""
    return [
        Record(key=f"{tag}{n}", value=f"{tag}-{n}", partition=n % parts,
               timestamp_ms=1_700_000_000_000 + n)
        for n in range(start, start + count)
    ]  # fmt: skip


def copies(bootstrap: str, topic: str) -> Counter[tuple[str, int, int]]:
    """How often each source record (topic, partition, offset) has a copy in `topic`."""
    records = [r for rs in read_all(bootstrap, topic).values() for r in rs]
    return Counter((c.topic, c.partition, c.offset) for c in attributed(records))


def once_each(topic: str, per_partition: Sequence[int]) -> Counter[tuple[str, int, int]]:
    return Counter({(topic, p, o): 1 for p, n in enumerate(per_partition) for o in range(n)})


def config(path: Path, sources: Sequence[Any], target: str, topics: dict[str, str],
           extra: str = "") -> Path:  # fmt: skip
    text = write_config(path, source=sources[0].bootstrap, target=target, topics=topics,
                        app=f'metrics_addr = ""\ngroup_id = "{unique_topic("grow")}"',
                        extra=extra).read_text()  # fmt: skip
    for n, node in enumerate(sources[1:], start=2):
        text = text.replace(
            "[source_pool]",
            f'[[sources]]\nname = "node{n}"\nservers = ["{node.bootstrap}"]\n\n[source_pool]',
        )
    path.write_text(text)
    return path


def test_named_and_discovered_topics_that_grow_are_relayed_from_their_start(
    source_broker, target_broker, spark, tmp_path
):
    """Single mode: a `[topics]` route and a `[discover]` one, both 2 -> 4 partitions."""
    src, dst = source_broker.bootstrap, target_broker.bootstrap
    named, found = unique_topic("grow-named"), unique_topic("grow-found")
    dest = create_topic(dst, unique_topic("grow-named-copy"), 2)
    for topic in (named, found):
        create_topic(src, topic, 2)
        produce(src, topic, numbered(0, 20, 2, "a"))
    path = config(tmp_path / "c.toml", [source_broker], dst, {named: dest},
                  f'create_topics = true\n\n{DISCOVERY}include = ["{found}"]\n'
                  'rename = "copy.{topic}"\n')  # fmt: skip
    relay = Background(path, failover=False)
    try:
        wait_for(lambda: copies(dst, dest) == once_each(named, [10, 10]), 60, "relayed")
        wait_for(lambda: copies(dst, f"copy.{found}") == once_each(found, [10, 10]), 30, "found")
        grown_at = time.monotonic()
        grow(src, {named: 4, found: 4})
        for topic in (named, found):
            produce(src, topic, numbered(20, 40, 4, "b"))
        want = [20, 20, 10, 10]
        wait_for(lambda: copies(dst, dest) == once_each(named, want), 30, "new partitions")
        wait_for(lambda: copies(dst, f"copy.{found}") == once_each(found, want), 30, "found")
        took = time.monotonic() - grown_at
    finally:
        relay.finish()
    assert relay.error is None, relay.error
    assert partitions(dst, dest) == 4 and partitions(dst, f"copy.{found}") == 4
    assert_verified(verify_once(path, spark), 120)
    print(f"\npartitions grown -> every new record relayed: {took:.1f}s (interval 1s)")

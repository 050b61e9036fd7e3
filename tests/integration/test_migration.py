"""Issue 20, topics: patterns found at start and while running, destinations created, and an
active/active pair that never loops. Real brokers of their own (patterns see every topic)."""

from __future__ import annotations

import logging
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource

from testbed.ktm_process import Ktm
from testbed.provenance import attributed
from testbed.records import Record, produce, read_all
from testbed.tansu import brokers_are_external
from testbed.topics import create_topic, describe_topic, topic_names, unique_topic, wait_until
from tests.support.feeder import Feeder
from tests.support.inprocess import Background
from tests.support.relay import write_config

pytestmark = pytest.mark.brokers("tansu", "kafka")

FAST_DISCOVERY = 'interval = "1s"'


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    wait_until(condition, timeout, what, every=0.3)


def copies(bootstrap: str, topic: str) -> Counter[tuple[str, int, int]]:
    """How often each source record (topic, partition, offset) has a copy in `topic`."""
    if describe_topic(bootstrap, topic) is None:
        return Counter()
    records = [r for rs in read_all(bootstrap, topic).values() for r in rs]
    return Counter((c.topic, c.partition, c.offset) for c in attributed(records))


def expected(topic: str, per_partition: dict[int, int]) -> Counter[tuple[str, int, int]]:
    return Counter({(topic, p, o): 1 for p, n in per_partition.items() for o in range(n)})


def numbered(count: int, partitions: int, tag: str) -> list[Record]:
    return [Record(key=f"{tag}{n}", value=f"{tag}-{n}", partition=n % partitions)
            for n in range(count)]  # fmt: skip


def discover_config(path: Path, source: str, target: str, discover: str, name: str = "src") -> Path:
    """A relay of the topics `discover` matches; its own group id, so two relays on one
    cluster (KTM_TEST_KAFKA) do not share their partitions."""
    return write_config(
        path,
        source=source,
        target=target,
        topics={},
        source_name=name,
        app=f'metrics_addr = ""\ngroup_id = "ktm-{name}-{path.parent.name}"',
        extra=f"create_topics = true\n\n[discover]\n{FAST_DISCOVERY}\n{discover}\n",
    )


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
def test_a_pattern_relays_topics_created_while_running_and_leaves_the_others_alone(
    broker_factory, spark, tmp_path
):
    """The relay starts while the pattern matches nothing (it waits, in its group); topics
    created later are relayed without a restart, their destinations created with their
    partition counts. Names are unique and copies are renamed, so this also runs on one shared
    Apache Kafka."""
    source, target = broker_factory("pattern-src"), broker_factory("pattern-dst")
    p = unique_topic("pat")
    orders, payments, shipments = (f"{p}-{n}" for n in ("or", "pa", "sh"))
    left = (f"{p}-skip-audit", f"__{p}-hidden", f"{p}-jobs.internal")
    for name in left:
        create_topic(source.bootstrap, name, 2)
        produce(source.bootstrap, name, numbered(40, 2, name))
    config = discover_config(tmp_path / "ktm.toml", source.bootstrap, target.bootstrap,
                             f'include = [".*{p}.*"]\nexclude = ["{p}-skip-.*"]\n'
                             'rename = "copy.{topic}"')  # fmt: skip
    relay = Background(config, failover=False)
    try:
        time.sleep(1.5)
        assert relay.error is None, relay.error
        for name in (orders, payments):
            create_topic(source.bootstrap, name, 2)
            produce(source.bootstrap, name, numbered(40, 2, name))
        for name in (orders, payments):
            want = expected(name, {0: 20, 1: 20})
            wait_for(lambda n=name, w=want: copies(target.bootstrap, f"copy.{n}") == w,
                     60, f"{name} relayed")  # fmt: skip
        create_topic(source.bootstrap, shipments, 3)  # found by the next look
        produce(source.bootstrap, shipments, numbered(30, 3, "s"))
        produce(source.bootstrap, orders, numbered(10, 2, "late"))
        want = expected(shipments, {0: 10, 1: 10, 2: 10})
        wait_for(lambda: copies(target.bootstrap, f"copy.{shipments}") == want, 60,
                 "the new topic relayed")  # fmt: skip
        want = expected(orders, {0: 25, 1: 25})
        wait_for(lambda: copies(target.bootstrap, f"copy.{orders}") == want, 30,
                 "later records relayed")  # fmt: skip
    finally:
        relay.finish()
    assert relay.error is None, relay.error
    assert not {f"copy.{name}" for name in left} & topic_names(target.bootstrap)
    assert len(describe_topic(target.bootstrap, f"copy.{shipments}")["partitions"]) == 3
    assert relay.metrics.registry.get_sample_value("ktm_partitions_discovered_total") == 7
    assert relay.metrics.registry.get_sample_value("ktm_group_members") == 1


def test_an_active_active_pair_copies_every_record_once_each_way_and_never_back(
    broker_factory, spark, tmp_path
):
    east, west = broker_factory("east"), broker_factory("west")
    p = unique_topic("aa")
    for cluster in (east, west):
        create_topic(cluster.bootstrap, p, 2)
    # Both relays match everything named after the test; each must skip its own copies and
    # the other relay's.
    pattern = f'include = [".*{p}.*"]\n'
    to_west = discover_config(tmp_path / "east-west.toml", east.bootstrap, west.bootstrap,
                              pattern + 'rename = "east.{topic}"\nfrom_target_prefix = "west."',
                              name="east")  # fmt: skip
    to_east = discover_config(tmp_path / "west-east.toml", west.bootstrap, east.bootstrap,
                              pattern + 'rename = "west.{topic}"\nfrom_target_prefix = "east."',
                              name="west")  # fmt: skip
    for path in (to_west, to_east):
        path.write_text(path.read_text().replace("[spark]\n", "[spark]\nslots = 1\n", 1))
    feeders = [Feeder(c.bootstrap, p, 2, per_batch=20, pause=0.1) for c in (east, west)]
    relays = [Background(to_west, failover=False), Background(to_east, failover=False)]
    try:
        time.sleep(3)
        sent = [feeder.stop() for feeder in feeders]
        per_partition = [{0: n // 2, 1: n // 2} for n in sent]
        if east.bootstrap == west.bootstrap:  # one external cluster: both feeders wrote to p
            per_partition = [{0: sum(sent) // 2, 1: sum(sent) // 2}] * 2
        wait_for(lambda: copies(west.bootstrap, f"east.{p}") == expected(p, per_partition[0]),
                 60, "east's records on west")  # fmt: skip
        wait_for(lambda: copies(east.bootstrap, f"west.{p}") == expected(p, per_partition[1]),
                 60, "west's records on east")  # fmt: skip
        time.sleep(2)  # two more discovery intervals: nothing may be relayed back
    finally:
        for relay in relays:
            relay.finish()
    for relay in relays:
        assert relay.error is None, relay.error
    assert {t for t in topic_names(east.bootstrap) if p in t} == {p, f"west.{p}"} | (
        {f"east.{p}"} if east.bootstrap == west.bootstrap else set()
    )
    assert {t for t in topic_names(west.bootstrap) if p in t} >= {p, f"east.{p}"}
    assert not any(
        t.count(".") > 1 or t.startswith(("east.west.", "west.east."))
        for t in topic_names(east.bootstrap) | topic_names(west.bootstrap)
        if p in t
    )


def test_configs_are_copied_and_a_source_that_grows_grows_its_destination(
    broker_kind, broker_factory, spark, tmp_path, caplog
):
    # the relay's own timeline in the report of a failure (once: a new partition not relayed
    # within 60 s under CI's load, with only the warnings to say why)
    caplog.set_level(logging.INFO, logger="relay")
    if broker_kind == "tansu" and not brokers_are_external():
        pytest.skip("Tansu describes no topic configs and lacks CreatePartitions "
                    "(docs/development.md): runs on Apache Kafka")  # fmt: skip
    cluster = broker_factory("kafka")
    topic = unique_topic("grow")
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        admin.create_topics({topic: {"num_partitions": 2, "replication_factor": -1,
                                     "configs": {"retention.ms": "7654321"}}})  # fmt: skip
        produce(cluster.bootstrap, topic, numbered(20, 2, "a"))
        config = discover_config(tmp_path / "ktm.toml", cluster.bootstrap, cluster.bootstrap,
                                 f'include = ["{topic}"]\nrename = "copy.{{topic}}"')  # fmt: skip
        relay = Background(config, failover=False)
        try:
            want = expected(topic, {0: 10, 1: 10})
            wait_for(lambda: copies(cluster.bootstrap, f"copy.{topic}") == want, 60, "relayed")
            described = admin.describe_configs([ConfigResource("TOPIC", f"copy.{topic}")])
            assert described["topic"][f"copy.{topic}"]["retention.ms"]["value"] == "7654321"
            admin.create_partitions({topic: 3})
            produce(cluster.bootstrap, topic, numbered(30, 3, "b"))
            want = expected(topic, {0: 20, 1: 20, 2: 10})
            wait_for(lambda: copies(cluster.bootstrap, f"copy.{topic}") == want, 60,
                     "the new partition relayed")  # fmt: skip
        finally:
            relay.finish()
        assert relay.error is None, relay.error
        assert len(describe_topic(cluster.bootstrap, f"copy.{topic}")["partitions"]) == 3
    finally:
        admin.close()


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
@pytest.mark.skipif(brokers_are_external(), reason="each run needs clusters of its own")
def test_two_processes_on_one_pattern_config_take_a_new_topic_once(broker_factory, tmp_path):
    """Two `ktm relay` processes: each finds the new topic and rejoins the group with it (until
    both have, the leader's plan holds). Every record arrives once."""
    source, target = broker_factory("two-src"), broker_factory("two-dst")
    p = unique_topic("two")
    first, later = f"{p}-a", f"{p}-b"
    create_topic(source.bootstrap, first, 2)
    feeder = Feeder(source.bootstrap, first, 2, per_batch=20, pause=0.1)
    processes = []
    for name in ("one", "two"):
        config = discover_config(tmp_path / f"{name}.toml", source.bootstrap, target.bootstrap,
                                 f'include = ["{p}-.*"]\nrename = "copy.{{topic}}"')  # fmt: skip
        processes.append(Ktm(tmp_path, "--config", str(config), "--no-progress"))
    try:
        wait_for(lambda: sum(copies(target.bootstrap, f"copy.{first}").values()) > 0, 120,
                 "the first records relayed")  # fmt: skip
        create_topic(source.bootstrap, later, 2)
        produce(source.bootstrap, later, numbered(40, 2, "b"))
        time.sleep(3)
        sent = feeder.stop()
        want_first = expected(first, {0: sent // 2, 1: sent // 2})
        wait_for(lambda: copies(target.bootstrap, f"copy.{first}") == want_first, 90,
                 "every record of the first topic once")  # fmt: skip
        want_later = expected(later, {0: 20, 1: 20})
        wait_for(lambda: copies(target.bootstrap, f"copy.{later}") == want_later, 90,
                 "every record of the new topic once")  # fmt: skip
        for process in processes:
            process.proc.send_signal(signal.SIGTERM)
        for process in processes:
            run = process.wait(timeout=30)
            assert run.returncode == 0, run.stderr
            assert "found 2 new partition(s) to relay" in run.stderr
    finally:
        feeder.stop()
        for process in processes:
            process.kill()

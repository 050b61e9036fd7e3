"""A stock three-broker Apache Kafka cluster (replication factor 3): ktm's defaults start on it,
and a group session it refuses is named. Then the faults only a real cluster has: a source
broker killed with -9 and restarted while its partitions are relayed from the new leaders, and a
broker of each side frozen past the request timeouts. Each copy ends proven exact by
`ktm verify`, with no partition stuck; the rounds each fault cost are printed (`-s`).

The source and destination topics live on one cluster, each led by a node of its own (the
destination's by another node than the source's), so a fault of a node hits one side. The
relay is held to a records/s cap so that the fault lands mid-stream."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testbed.kafka import KafkaCluster
from testbed.ktm_process import assert_one_error_line, run_ktm
from testbed.records import Record, produce, read_all
from testbed.topics import unique_topic
from tests.support.inprocess import Background, assert_verified, verify_once
from tests.support.relay import assert_exact_copy

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 6
RECORDS = 60_000
CAP = 6_000  # records/s: ten seconds of relaying, the fault in the middle
SOURCE_LEADER, TARGET_LEADER = 1, 2
FREEZE = 12.0  # seconds: past every request timeout below, and the broker's 9 s session


def config(path: Path, trio: KafkaCluster, src: str, dst: str) -> Path:
    servers = ", ".join(f'"{node.bootstrap}"' for node in trio.nodes)
    path.write_text(
        f'[app]\nmetrics_addr = ""\nsession_timeout = "6s"\n\n[topics]\n"{src}" = "{dst}"\n\n'
        f'[[sources]]\nname = "trio"\nservers = [{servers}]\n\n'
        '[source_pool]\nrequest_timeout = "2s"\nfetch_timeout = "5s"\n'
        'backoff_min = "200ms"\nbackoff_max = "1s"\n\n'
        f'[target]\nservers = [{servers}]\nrequest_timeout = "5s"\n'
        'backoff_min = "200ms"\nbackoff_max = "1s"\n\n'
        f"[limits]\nrecords_per_second = {CAP}\n"
    )
    return path


def test_the_defaults_start_on_a_stock_broker_and_a_refused_session_is_named(kafka_trio, tmp_path):
    src = kafka_trio.create_topic(unique_topic("stock-src"), 3)
    dst = kafka_trio.create_topic(unique_topic("stock-dst"), 3)
    produce(
        kafka_trio.bootstrap, src, [Record(value=b"%d" % i, partition=i % 3) for i in range(300)]
    )
    servers = ", ".join(f'"{node.bootstrap}"' for node in kafka_trio.nodes)
    conf = tmp_path / "c.toml"
    base = (f'[topics]\n"{src}" = "{dst}"\n\n[[sources]]\nname = "trio"\nservers = [{servers}]\n\n'
            f"[target]\nservers = [{servers}]\n")  # fmt: skip
    conf.write_text(f'[app]\nmetrics_addr = ""\n\n{base}')  # every other key: its default

    done = run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", timeout=120)

    assert done.returncode == 0, done.stderr
    copied = [r for rs in read_all(kafka_trio.bootstrap, dst).values() for r in rs]
    assert_exact_copy(read_all(kafka_trio.bootstrap, src), copied, src)

    conf.write_text(f'[app]\nmetrics_addr = ""\nsession_timeout = "2s"\n\n{base}')
    refused = run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", timeout=120)
    line = assert_one_error_line(refused, 2, "[app].session_timeout = 2s")
    assert "group.min.session.timeout.ms = 6000" in line


def copy_through(trio: KafkaCluster, tmp_path: Path, spark: Any, fault: Callable[[], None]) -> None:
    src = trio.create_topic(unique_topic("cf-src"), PARTITIONS, led_by=SOURCE_LEADER)
    dst = trio.create_topic(unique_topic("cf-dst"), PARTITIONS, led_by=TARGET_LEADER)
    records = [
        Record(key=b"k%d" % i, value=b"%08d" % i + b"." * 92, partition=i % PARTITIONS)
        for i in range(RECORDS)
    ]
    produce(trio.bootstrap, src, records)
    conf = config(tmp_path / "c.toml", trio, src, dst)
    relay = Background(conf, stop_at_end=True, failover=False)
    try:
        deadline = time.monotonic() + 60
        while relay.produced() < RECORDS / 4:
            assert time.monotonic() < deadline and relay.error is None, relay.error
            time.sleep(0.2)
        fault()
        relay.thread.join(180)  # --stop-at-end: done once every partition reached its end
        assert not relay.thread.is_alive(), "a partition is stuck: the relay did not finish"
    finally:
        relay.finish()
    assert relay.error is None, relay.error
    print(f"\nrounds by reason: {relay.rounds()}")
    copied = [r for rs in read_all(trio.bootstrap, dst, timeout=30).values() for r in rs]
    assert_exact_copy(read_all(trio.bootstrap, src, timeout=30), copied, src)
    assert_verified(verify_once(conf, spark), RECORDS)


def test_a_source_leader_killed_and_restarted_mid_stream(kafka_trio, tmp_path, spark):
    def kill_and_restart() -> None:
        node = kafka_trio.node(SOURCE_LEADER)
        node.kill()
        time.sleep(3)  # relayed from the new leaders meanwhile (once the node is fenced)
        node.launch()
        kafka_trio.wait_ready()

    copy_through(kafka_trio, tmp_path, spark, kill_and_restart)
    kafka_trio.wait_in_sync()


@pytest.mark.parametrize("side", [SOURCE_LEADER, TARGET_LEADER], ids=["source", "target"])
def test_a_broker_frozen_past_the_request_timeouts(kafka_trio, tmp_path, spark, side):
    def freeze() -> None:
        node = kafka_trio.node(side)
        node.freeze()
        try:
            time.sleep(FREEZE)
        finally:
            node.thaw()

    copy_through(kafka_trio, tmp_path, spark, freeze)
    kafka_trio.wait_in_sync()

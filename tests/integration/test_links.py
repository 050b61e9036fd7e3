"""The relay across real links: a source or a target 240 ms away (a US-Asia round trip), a
broker frozen longer than the fetch timeout, a stop while a fetch is out. Real brokers behind a
delaying proxy (testbed/link.py), real ktm processes, every record checked."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from testbed.ktm_process import Ktm, metric_total, run_ktm, wait_for
from testbed.records import Record, produce, read_all, record_count
from testbed.topics import create_topic, unique_topic
from tests.support.feeder import Feeder
from tests.support.relay import assert_exact_copy, write_config

pytestmark = [pytest.mark.timeout(420)]

ONE_WAY = 0.12  # seconds: a 240 ms round trip
PARTITIONS = 4


def records(count: int, first: int = 0) -> list[Record]:
    return [
        Record(
            key=b"k%d" % i,
            value=b"%08d" % i + b"." * 92,
            headers=[("n", b"%d" % i)],
            partition=i % PARTITIONS,
            timestamp_ms=1_700_000_000_000 + i,
        )  # fmt: skip
        for i in range(first, first + count)
    ]


def relay_setup(source: Any, target: Any, name: str, tmp_path: Path) -> tuple[str, str, int, Path]:
    """A source topic, its destination, a metrics port and a config relaying one to the other."""
    src = create_topic(source.bootstrap, unique_topic(name), PARTITIONS)
    dst = create_topic(target.bootstrap, unique_topic(f"{name}-copy"), PARTITIONS)
    port = _port()
    conf = write_config(
        tmp_path / "c.toml", source=source.bootstrap, target=target.bootstrap,
        topics={src: dst}, app=f'metrics_addr = "127.0.0.1:{port}"',
    )  # fmt: skip
    return src, dst, port, conf


def flat(by_partition: dict[int, list[Any]]) -> list[Any]:
    return [record for rs in by_partition.values() for record in rs]


@pytest.mark.parametrize("far", ["source", "target"])
def test_a_cluster_240ms_away_gets_every_record_exactly_once(
    far, far_brokers, source_broker, target_broker, tmp_path
):
    source = far_brokers("far-src", delay=0) if far == "source" else source_broker
    target = far_brokers("far-dst", delay=0) if far == "target" else target_broker
    src = create_topic(source.bootstrap, unique_topic("link"), PARTITIONS)
    dst = create_topic(target.bootstrap, unique_topic("link-copy"), PARTITIONS)
    produce(source.bootstrap, src, records(40_000))
    conf = write_config(tmp_path / "c.toml", source=source.bootstrap, target=target.bootstrap,
                        topics={src: dst})  # fmt: skip
    (source if far == "source" else target).link.set_delay(ONE_WAY)

    run = run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", "--no-progress", timeout=300)

    assert run.returncode == 0, run.stderr[-3000:]
    (source if far == "source" else target).link.set_delay(0)
    assert_exact_copy(read_all(source.bootstrap, src), flat(read_all(target.bootstrap, dst)), src)


def test_a_source_frozen_longer_than_the_fetch_timeout_is_reported_then_resumed_exactly(
    far_brokers, target_broker, tmp_path
):
    """The fetch out to the frozen broker times out (fetch_timeout 3 s), is counted and logged
    naming the broker; once it thaws the relay goes on, and nothing is lost or doubled."""
    source = far_brokers("frozen-src", delay=0.02)
    src, dst, port, conf = relay_setup(source, target_broker, "frz", tmp_path)
    conf.write_text(
        conf.read_text().replace("[source_pool]\n", '[source_pool]\nfetch_timeout = "3s"\n')
    )
    feeder = Feeder(source.bootstrap, src, PARTITIONS, per_batch=40, pause=0.05)
    try:
        with Ktm(tmp_path, "--config", str(conf), "--no-progress") as relay:
            wait_for(lambda: (metric_total(port, "ktm_messages_produced_total") or 0) > 200, 120,
                     "the relay running", relay)  # fmt: skip
            source.link.freeze()
            wait_for(lambda: (metric_total(port, "ktm_fetch_failures_total") or 0) >= 1, 60,
                     "a fetch counted as failed", relay)  # fmt: skip
            source.link.thaw()
            sent = feeder.stop()
            wait_for(lambda: (metric_total(port, "ktm_messages_produced_total") or 0) >= sent,
                     120, "every record relayed after the thaw", relay)  # fmt: skip
            relay.proc.send_signal(signal.SIGTERM)
            ended = relay.wait(60)
    finally:
        feeder.stop()
    assert ended.returncode == 0, ended.stderr[-3000:]
    assert f"fetches from source broker {source.bootstrap} keep failing" in ended.stderr
    assert_exact_copy(
        read_all(source.bootstrap, src), flat(read_all(target_broker.bootstrap, dst)), src
    )


def test_sigterm_while_a_fetch_is_out_to_a_frozen_broker_exits_0_within_5_seconds(
    far_brokers, target_broker, tmp_path
):
    source = far_brokers("stuck-src", delay=ONE_WAY)
    src, dst, port, conf = relay_setup(source, target_broker, "stop", tmp_path)
    produce(source.bootstrap, src, records(2_000))
    with Ktm(tmp_path, "--config", str(conf), "--no-progress") as relay:
        wait_for(lambda: (metric_total(port, "ktm_messages_produced_total") or 0) >= 2_000, 120,
                 "the backlog relayed", relay)  # fmt: skip
        source.link.freeze()  # the next fetch goes out and is never answered
        wait_for(lambda: (metric_total(port, "ktm_fetch_waiting_seconds") or 0) >= 1, 30,
                 "a fetch out for a second", relay)  # fmt: skip
        asked = time.monotonic()
        relay.proc.send_signal(signal.SIGTERM)
        ended = relay.wait(60)
        took = time.monotonic() - asked
    source.link.thaw()
    assert ended.returncode == 0, ended.stderr[-3000:]
    assert took < 5, f"the stop took {took:.1f}s"
    assert_exact_copy(
        read_all(source.bootstrap, src), flat(read_all(target_broker.bootstrap, dst)), src
    )


def _port() -> int:
    from testbed.ports import free_port

    return free_port()


def test_kill_9_and_restart_with_both_clusters_240ms_away_gives_every_record_once(
    far_brokers, tmp_path
):
    source, target = far_brokers("kill-src", delay=0), far_brokers("kill-dst", delay=0)
    src = create_topic(source.bootstrap, unique_topic("kill"), PARTITIONS)
    dst = create_topic(target.bootstrap, unique_topic("kill-copy"), PARTITIONS)
    produce(source.bootstrap, src, records(4_000))
    conf = write_config(tmp_path / "c.toml", source=source.bootstrap, target=target.bootstrap,
                        topics={src: dst})  # fmt: skip
    port = _port()
    first = conf.with_name("first.toml")
    first.write_text(
        conf.read_text().replace('metrics_addr = ""', f'metrics_addr = "127.0.0.1:{port}"')
    )
    for far in (source, target):
        far.link.set_delay(ONE_WAY)
    feeder = Feeder(source.bootstrap, src, PARTITIONS, per_batch=200, pause=0.1)
    try:
        with Ktm(tmp_path, "--config", str(first), "--no-progress") as relay:
            wait_for(lambda: (metric_total(port, "ktm_messages_produced_total") or 0) >= 6_000,
                     180, "records flowing", relay)  # fmt: skip
            relay.kill()  # ktm, its JVM, its workers: mid-stream, with requests on both links
        feeder.stop()
        last = run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", "--no-progress",
                       timeout=300)  # fmt: skip
    finally:
        feeder.stop()
    assert last.returncode == 0, last.stderr[-3000:]
    for far in (source, target):
        far.link.set_delay(0)
    assert_exact_copy(read_all(source.bootstrap, src), flat(read_all(target.bootstrap, dst)), src)


def test_failover_to_a_standby_node_240ms_away_loses_and_repeats_nothing(
    broker_factory, far_brokers, tmp_path
):
    """The standby is far: its health checks must pass across the link (kept clients, a
    timeout that holds four round trips) for the relay to fail over to it at all."""
    near, far = broker_factory("near"), far_brokers("standby", delay=0)
    target = broker_factory("fo-dst")
    topic, dest = unique_topic("fofar"), unique_topic("fofar-copy")
    for node in (near, far):
        create_topic(node.bootstrap, topic, PARTITIONS)
        produce(node.bootstrap, topic, records(2_000))
    create_topic(target.bootstrap, dest, PARTITIONS)
    far.link.set_delay(ONE_WAY)
    nodes = "".join(f'[[sources]]\nname = "{n.name}"\nservers = ["{n.bootstrap}"]\n\n'
                    for n in (near, far))  # fmt: skip
    conf = tmp_path / "failover.toml"
    conf.write_text(
        f'[app]\nmetrics_addr = ""\nsession_timeout = "2s"\n\n[topics]\n"{topic}" = "{dest}"\n\n'
        f'{nodes}[source_pool]\nhealthcheck_interval = "500ms"\nmax_retries = 30\n'
        f'backoff_min = "200ms"\nbackoff_max = "500ms"\n\n'
        f'[target]\nservers = ["{target.bootstrap}"]\n'
    )
    with Ktm(tmp_path, "--config", str(conf), "--mode", "failover", "--no-progress") as relay:
        wait_for(
            lambda: record_count(target.bootstrap, dest) >= 2_000, 120, "the first records", relay
        )
        near.kill()
        far.link.set_delay(0)
        produce(far.bootstrap, topic, records(1_000, first=2_000))  # only the far node has them
        far.link.set_delay(ONE_WAY)
        wait_for(
            lambda: record_count(target.bootstrap, dest) >= 3_000,
            180,
            "records from the far node",
            relay,
        )
        relay.proc.send_signal(signal.SIGTERM)
        ended = relay.wait(60)
    assert ended.returncode == 0, ended.stderr[-3000:]
    assert "source node near is down" in ended.stderr
    far.link.set_delay(0)
    assert_exact_copy(read_all(far.bootstrap, topic), flat(read_all(target.bootstrap, dest)), topic)


def test_one_task_serving_a_thousand_partitions_copies_every_record_once(
    source_broker, target_broker, tmp_path
):
    """One slot: one task fetches 1,000 partitions (a fetch of them takes Tansu about a second,
    far past the task loop's tick) and writes them all."""
    count = 1_000
    src = create_topic(source_broker.bootstrap, unique_topic("wide"), count, timeout=60)
    dst = create_topic(target_broker.bootstrap, unique_topic("wide-copy"), count, timeout=60)
    batch = [
        Record(
            key=b"k%d" % i,
            value=b"v%d" % i,
            partition=i % count,
            timestamp_ms=1_700_000_000_000 + i,
        )
        for i in range(5 * count)
    ]
    produce(source_broker.bootstrap, src, batch)
    conf = write_config(tmp_path / "c.toml", source=source_broker.bootstrap,
                        target=target_broker.bootstrap, topics={src: dst},
                        spark="slots = 1")  # fmt: skip
    run = run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", "--no-progress", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "slots 1" in run.stderr
    copied = flat(read_all(target_broker.bootstrap, dst, timeout=60))
    assert_exact_copy(read_all(source_broker.bootstrap, src, timeout=60), copied, src)

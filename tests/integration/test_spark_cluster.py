"""The same relay on a standalone Spark cluster: a master and two workers, separate processes
from the driver, started from the pyspark pip package by testbed/cluster.py (what
scripts/spark_cluster.py runs)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from testbed.cluster import start_standalone
from testbed.ktm_process import Ktm, wait_for
from testbed.records import Record, produce, read_all, record_count
from testbed.tansu import NO_KILL_REASON, brokers_are_external
from testbed.topics import create_topic, unique_topic
from tests.support.relay import assert_exact_copy, write_config

pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory):
    cluster = start_standalone(tmp_path_factory.mktemp("spark-cluster"), workers=2)
    yield cluster
    cluster.stop()


def _records(count: int, partitions: int, first: int = 0) -> list[Record]:
    return [
        Record(
            key=b"k%d" % i,
            value=(b"v%08d" % i).ljust(100, b"."),
            headers=[("n", b"%d" % i)],
            partition=i % partitions,
            timestamp_ms=1_700_000_000_000 + i,
        )
        for i in range(first, first + count)
    ]


def _relay(config: Path, master: str, stop_at_end: bool = True) -> Ktm:
    """`ktm relay` on the cluster, from the config's directory (the test's)."""
    flags = ["--stop-at-end"] if stop_at_end else []
    return Ktm(config.parent, "--config", str(config), "--master", master, *flags,
               env={"SPARK_LOCAL_IP": "127.0.0.1"})  # fmt: skip


def _setup(source_broker, target_broker, tmp_path, count: int, partitions: int = 4, spark=""):
    topic = create_topic(source_broker.bootstrap, unique_topic("cl"), partitions)
    dest = create_topic(target_broker.bootstrap, unique_topic("cl-copy"), partitions)
    produce(source_broker.bootstrap, topic, _records(count, partitions))
    config = write_config(
        tmp_path / "config.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={topic: dest},
        spark=spark,
    )
    return topic, dest, config


def _executors_launched(cluster) -> int:
    logs = [Path(cluster.log_dir) / f"worker-{i}.log" for i in range(len(cluster.worker_pids))]
    return sum(log.read_text(errors="replace").count("Asked to launch executor") for log in logs)


@pytest.mark.skipif(brokers_are_external(), reason=NO_KILL_REASON)
def test_losing_a_worker_mid_run_still_gives_exactly_once(
    standalone, source_broker, target_broker, tmp_path
):
    # A continuous relay: its tasks run until told to stop, so once the first records are
    # delivered, killing a worker makes Spark re-run the tasks it was running.
    topic, dest, config = _setup(source_broker, target_broker, tmp_path, 20_000)
    with _relay(config, standalone.master_url, stop_at_end=False) as relay:
        wait_for(
            lambda: record_count(target_broker.bootstrap, dest) >= 20_000,
            180,
            "first records",
            relay,
        )
        standalone.kill_worker(0)  # the worker, its executor and their Python workers
        produce(source_broker.bootstrap, topic, _records(20_000, 4, first=20_000))
        wait_for(lambda: record_count(target_broker.bootstrap, dest) >= 40_000, 180, "all records",
                 relay)  # fmt: skip
        relay.proc.send_signal(signal.SIGTERM)
        run = relay.wait(timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    copy = [r for rs in read_all(target_broker.bootstrap, dest, timeout=30).values() for r in rs]
    assert_exact_copy(read_all(source_broker.bootstrap, topic, timeout=30), copy, topic)
    # Spark re-ran the lost tasks on the other worker, and they resumed after what the dead
    # attempts had already delivered (the executor's stderr, in the surviving worker's dir).
    survivor = Path(standalone.log_dir) / "work-1"
    logs = "".join(p.read_text(errors="replace") for p in survivor.rglob("stderr"))
    assert "retried task resumes" in logs


@pytest.mark.skipif(brokers_are_external(), reason=NO_KILL_REASON)
def test_more_partitions_than_slots_kill_9_and_restart_give_exactly_once(
    standalone, source_broker, target_broker, tmp_path
):
    # 24 partitions on 2 task slots: each task serves a group of 12 partitions.
    two_slots = '[spark.conf]\n"spark.cores.max" = "2"'
    topic, dest, config = _setup(
        source_broker, target_broker, tmp_path, 48_000, partitions=24, spark=two_slots
    )
    with _relay(config, standalone.master_url, stop_at_end=False) as relay:
        wait_for(lambda: record_count(target_broker.bootstrap, dest) >= 5_000, 180, "first records",
                 relay)  # fmt: skip
    # Leaving the block killed the driver (kill -9, its JVM too); the executors follow it.
    before = record_count(target_broker.bootstrap, dest)
    produce(source_broker.bootstrap, topic, _records(24_000, 24, first=48_000))

    launched = _executors_launched(standalone)
    with _relay(config, standalone.master_url) as again:
        run = again.wait(timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert _executors_launched(standalone) > launched  # the tasks ran on the workers' executors
    assert "slots=2" in run.stderr
    copy = [r for rs in read_all(target_broker.bootstrap, dest, timeout=30).values() for r in rs]
    assert_exact_copy(read_all(source_broker.bootstrap, topic, timeout=30), copy, topic)
    assert before < 72_000 <= len(copy)

"""The same relay on a standalone Spark cluster: a master and two workers, separate processes
from the driver, started from the pyspark pip package by scripts/spark_cluster.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cluster import start_standalone
from tests.support.kafka import (
    NO_KILL_REASON,
    Record,
    brokers_are_external,
    create_topic,
    produce,
    read_all,
    unique_topic,
)
from tests.support.relay import assert_exact_copy, write_config

pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster]

KTM = [sys.executable, "-c", "from relay.cli import main; main()"]


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


def _relay(config: Path, master: str, stop_at_end: bool = True) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    flags = ["--stop-at-end"] if stop_at_end else []
    return subprocess.Popen(
        [*KTM, "relay", "--config", str(config), "--master", master, *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )


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


def test_stop_at_end_on_a_standalone_cluster_delivers_everything_once(
    standalone, source_broker, target_broker, tmp_path
):
    topic, dest, config = _setup(source_broker, target_broker, tmp_path, 20_000)
    launched = _executors_launched(standalone)
    proc = _relay(config, standalone.master_url)
    try:
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 0, stderr.decode()[-3000:]
    assert _executors_launched(standalone) > launched  # the tasks ran on the workers' executors
    copy = [r for rs in read_all(target_broker.bootstrap, dest).values() for r in rs]
    assert_exact_copy(read_all(source_broker.bootstrap, topic), copy, topic)


@pytest.mark.skipif(brokers_are_external(), reason=NO_KILL_REASON)
def test_losing_a_worker_mid_run_still_gives_exactly_once(
    standalone, source_broker, target_broker, tmp_path
):
    # A continuous relay: its tasks run until told to stop, so once the first records are
    # delivered, killing a worker makes Spark re-run the tasks it was running.
    topic, dest, config = _setup(source_broker, target_broker, tmp_path, 20_000)
    proc = _relay(config, standalone.master_url, stop_at_end=False)
    try:
        _wait(lambda: _count(target_broker.bootstrap, dest) >= 20_000, 180, proc, "first records")
        standalone.kill_worker(0)  # the worker, its executor and their Python workers
        produce(source_broker.bootstrap, topic, _records(20_000, 4, first=20_000))
        _wait(lambda: _count(target_broker.bootstrap, dest) >= 40_000, 180, proc, "all records")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 0, stderr.decode()[-3000:]
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
    proc = _relay(config, standalone.master_url, stop_at_end=False)
    try:
        _wait(lambda: _count(target_broker.bootstrap, dest) >= 5_000, 180, proc, "first records")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver; its JVM and executors follow it
        proc.wait()
    before = _count(target_broker.bootstrap, dest)
    produce(source_broker.bootstrap, topic, _records(24_000, 24, first=48_000))

    again = _relay(config, standalone.master_url)
    try:
        _, stderr = again.communicate(timeout=240)
    finally:
        if again.poll() is None:
            os.killpg(again.pid, 9)
    assert again.returncode == 0, stderr.decode()[-3000:]
    assert "slots=2" in stderr.decode()
    copy = [r for rs in read_all(target_broker.bootstrap, dest, timeout=30).values() for r in rs]
    assert_exact_copy(read_all(source_broker.bootstrap, topic, timeout=30), copy, topic)
    assert before < 72_000 <= len(copy)


def _wait(condition, timeout: float, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, (
            f"ktm exited before {what}: {proc.communicate()[1].decode()[-3000:]}"
        )
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def _count(bootstrap: str, topic: str) -> int:
    return sum(len(rs) for rs in read_all(bootstrap, topic, timeout=20).values())

"""A ktm process joining a group whose running member keeps relaying and committing (a rolling
deploy): its start-up must never mistake offsets committed meanwhile for a recreated source
topic (issue 18.1). Real brokers, a real running relay, a feeder writing all along."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from relay.config import load_config
from relay.engine.metrics import Metrics
from relay.pipelines.calls import Calls
from relay.pipelines.source_plan import SourcePlan
from relay.pipelines.source_pool import SourcePool
from testbed.ktm_process import Ktm, metric_total, wait_for
from testbed.ports import free_port
from testbed.records import read_all, record_count
from testbed.tansu import NO_KILL_REASON, brokers_are_external
from testbed.topics import create_topic, unique_topic
from tests.support.feeder import Feeder
from tests.support.relay import assert_exact_copy, write_config

pytestmark = [
    pytest.mark.brokers("tansu", "kafka"),
    pytest.mark.timeout(420),
    pytest.mark.skipif(brokers_are_external(), reason=NO_KILL_REASON),
]

PARTITIONS = 4
# Start-ups planned against the moving group, one after another: a count, not a time window
# (a slower machine plans fewer per second, and must still plan them all, each one right).
JOIN_ATTEMPTS = 10
JOIN_TIMEOUT = 240.0  # seconds: generous, only there to end a hang


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
def test_start_up_while_a_member_relays_and_commits_never_sees_a_recreated_topic(
    source_broker, target_broker, tmp_path
):
    src = create_topic(source_broker.bootstrap, unique_topic("join-src"), PARTITIONS)
    dst = create_topic(target_broker.bootstrap, unique_topic("join-dst"), PARTITIONS)
    group = unique_topic("join-group")

    def conf(port: int):
        app = f'metrics_addr = "127.0.0.1:{port}"\ngroup_id = "{group}"'
        return write_config(tmp_path / f"c-{port}.toml", source=source_broker.bootstrap,
                            target=target_broker.bootstrap, topics={src: dst}, app=app)  # fmt: skip

    first_port, second_port = free_port(), free_port()
    feeder = Feeder(source_broker.bootstrap, src, PARTITIONS, per_batch=20, pause=0.01)
    with Ktm(tmp_path, "--config", str(conf(first_port)), "--no-progress") as first:
        try:
            wait_for(lambda: (metric_total(first_port, "ktm_messages_produced_total") or 0) > 500,
                     120, "the first member relaying", first)  # fmt: skip
            plan_repeatedly(conf(second_port), JOIN_ATTEMPTS, JOIN_TIMEOUT)
            with Ktm(tmp_path, "--config", str(conf(second_port)), "--no-progress") as second:
                wait_for(lambda: metric_total(second_port, "ktm_group_members") == 2, 120,
                         "the second member joined", second)  # fmt: skip
                sent = feeder.stop()
                wait_for(lambda: record_count(target_broker.bootstrap, dst) >= sent, 120,
                         "every record relayed", second)  # fmt: skip
                for process in (second, first):
                    process.proc.send_signal(signal.SIGTERM)
                    run = process.wait(timeout=60)
                    assert run.returncode == 0, run.stderr
        finally:
            feeder.stop()
    source = read_all(source_broker.bootstrap, src, timeout=30)
    copied = [r for rs in read_all(target_broker.bootstrap, dst, timeout=30).values() for r in rs]
    assert_exact_copy(source, copied, src)


def plan_repeatedly(config_path, count: int, timeout: float) -> None:
    """Plan a start-up (what a joining process does before it relays) `count` times while the
    group moves; every one must succeed."""
    cfg = load_config(config_path)
    planned, deadline = 0, time.monotonic() + timeout
    done = threading.Event()
    # A real joining process plans while its own threads (Spark starting, the group join, the
    # progress view) hold the GIL: that stretches the time between two reads. A busy thread
    # here does the same, so the planning sees the group move between its reads as it would.
    busy = threading.Thread(target=_spin, args=(done,), daemon=True)
    busy.start()
    try:
        while planned < count:
            assert time.monotonic() < deadline, f"only {planned} start-ups planned in {timeout}s"
            metrics = Metrics()
            pool = SourcePool(cfg.sources, cfg.source_pool, metrics, failover=False)
            try:
                calls = Calls(cfg, threading.Event(), metrics, pool.describe_all)
                SourcePlan(cfg, pool, calls).plan(stop_at_end=False)
            finally:
                pool.close()
            planned += 1
    finally:
        done.set()


def _spin(done: threading.Event) -> None:
    while not done.is_set():
        sum(range(10_000))

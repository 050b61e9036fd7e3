"""Several `ktm relay` processes on one config, while a feeder keeps writing: they share the
partitions through a consumer group on the target cluster, and every record arrives once.

Each test runs real processes (each with its own Spark), kills or freezes some of them, and then
checks every destination partition record by record against its source partition.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.ktm_process import Ktm, metric_total, wait_for
from testbed.ports import free_port
from testbed.records import Record, produce, read_all
from testbed.tansu import NO_KILL_REASON, brokers_are_external
from testbed.topics import create_topic, unique_topic
from tests.support.feeder import Feeder
from tests.support.relay import assert_exact_copy, write_config

pytestmark = [
    pytest.mark.brokers("tansu", "kafka"),
    pytest.mark.timeout(300),
    pytest.mark.skipif(brokers_are_external(), reason=NO_KILL_REASON),
]

PARTITIONS = 6
SESSION = "2s"  # the group's session timeout in these tests (production default: 6s)


class Setup:
    def __init__(self, source, target, tmp_path: Path):
        self.source, self.target, self.tmp_path = source, target, tmp_path
        self.topic = create_topic(source.bootstrap, unique_topic("many-src"), PARTITIONS)
        self.dest = create_topic(target.bootstrap, unique_topic("many-dst"), PARTITIONS)
        self.group = unique_topic("many-group")
        self.processes: list[tuple[Ktm, int]] = []

    def start(self, *flags: str) -> tuple[Ktm, int]:
        """One more `ktm relay` on the shared config (its own metrics port)."""
        port = free_port()
        config = write_config(
            self.tmp_path / f"c-{port}.toml",
            source=self.source.bootstrap,
            target=self.target.bootstrap,
            topics={self.topic: self.dest},
            app=f'metrics_addr = "127.0.0.1:{port}"\ngroup_id = "{self.group}"',
        )
        text = config.read_text().replace(
            'session_timeout = "2s"', f'session_timeout = "{SESSION}"'
        )
        config.write_text(text)
        process = Ktm(self.tmp_path, "--config", str(config), "--no-progress", *flags)
        self.processes.append((process, port))
        return process, port

    def arrived(self) -> int:
        return sum(
            len(rs) for rs in read_all(self.target.bootstrap, self.dest, timeout=30).values()
        )

    def check_exactly_once(self) -> None:
        source = read_all(self.source.bootstrap, self.topic, timeout=30)
        copied = [
            r for rs in read_all(self.target.bootstrap, self.dest, timeout=30).values() for r in rs
        ]
        assert_exact_copy(source, copied, self.topic)

    def stop_all(self) -> None:
        """SIGTERM to every process still running; each exits 0."""
        running = [process for process, _ in self.processes if process.proc.poll() is None]
        for process in running:
            process.proc.send_signal(signal.SIGTERM)
        for process in running:
            run = process.wait(timeout=30)
            assert run.returncode == 0, run.stderr

    def kill_all(self) -> None:
        for process, _ in self.processes:
            process.kill()


@pytest.fixture
def setup(source_broker, target_broker, tmp_path):
    s = Setup(source_broker, target_broker, tmp_path)
    yield s
    s.kill_all()


def assigned(port: int) -> float | None:
    return metric_total(port, "ktm_assigned_partitions")


def members(port: int) -> float | None:
    return metric_total(port, "ktm_group_members")


def settle(setup: Setup, feeder: Feeder, first: Ktm) -> None:
    sent = feeder.stop()
    wait_for(lambda: setup.arrived() >= sent, 120, f"all {sent} records", first)
    time.sleep(1.0)  # anything duplicated late would show now


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
def test_two_processes_share_the_partitions_and_a_third_joining_changes_nothing(setup, tmp_path):
    feeder = Feeder(setup.source.bootstrap, setup.topic, PARTITIONS)
    (a, port_a), (_, port_b) = setup.start(), setup.start()
    try:
        wait_for(lambda: setup.arrived() >= 2000, 180, "records flowing", a)
        wait_for(lambda: members(port_a) == 2 and members(port_b) == 2, 60, "two members", a)
        wait_for(lambda: (assigned(port_a), assigned(port_b)) == (3, 3), 60, "a 3/3 share", a)
        config = str(tmp_path / f"c-{port_a}.toml")
        check = subprocess.run(
            [sys.executable, "-m", "relay.cli", "check", "--config", config],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert check.returncode == 0, check.stderr
        assert "2 ktm process(es) run on this config now" in check.stdout

        c, port_c = setup.start()  # a third one joins mid-stream
        wait_for(lambda: all(assigned(p) == 2 for p in (port_a, port_b, port_c)), 90, "2/2/2", c)
        before = setup.arrived()
        wait_for(lambda: setup.arrived() >= before + 1000, 60, "records still flowing", c)
        settle(setup, feeder, a)
        setup.stop_all()
    finally:
        feeder.stop()
    setup.check_exactly_once()


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
def test_kill_9_of_one_process_hands_its_partitions_to_the_other(setup, tmp_path):
    feeder = Feeder(setup.source.bootstrap, setup.topic, PARTITIONS)
    (a, port_a), (b, port_b) = setup.start(), setup.start()
    try:
        wait_for(lambda: (assigned(port_a), assigned(port_b)) == (3, 3), 180, "a 3/3 share", a)
        wait_for(lambda: setup.arrived() >= 1000, 60, "records flowing", a)
        killed_at = time.monotonic()
        a.kill()  # ktm, its JVM and its Python workers: nothing gets to flush or commit
        wait_for(lambda: assigned(port_b) == 6, 60, "the survivor owning every partition", b)
        handover = time.monotonic() - killed_at
        before = setup.arrived()
        wait_for(lambda: setup.arrived() >= before + 1000, 60, "records flowing again", b)
        print(f"\nhandover after kill -9: {handover:.1f}s (session timeout {SESSION})")
        settle(setup, feeder, b)
        setup.stop_all()
    finally:
        feeder.stop()
    setup.check_exactly_once()


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
def test_stop_at_end_started_while_a_killed_process_lingers_relays_everything(setup):
    """A process killed with -9 stays a member until its session expires. A `--stop-at-end`
    process started meanwhile must not settle for a share: it owns every partition once the
    dead member is gone, and exits 0 only with every record (old and new) delivered once."""

    def records(tag: bytes) -> list[Record]:
        return [Record(key=b"k%d" % n, value=tag + b"%d" % n, partition=n % PARTITIONS)
                for n in range(6000)]  # fmt: skip

    produce(setup.source.bootstrap, setup.topic, records(b"a"))
    a, _ = setup.start()
    wait_for(lambda: setup.arrived() >= 6000, 180, "the first records", a)
    a.kill()  # its membership lingers until the session times out
    produce(setup.source.bootstrap, setup.topic, records(b"b"))
    b, _ = setup.start("--stop-at-end")
    run = b.wait(timeout=180)
    assert run.returncode == 0, run.stderr
    assert setup.arrived() == 12_000  # read right after the exit: nothing was left to others
    setup.check_exactly_once()


def test_two_processes_started_at_once_on_a_new_group_relay_every_record_once(setup):
    """Both launched together on a new group, `--stop-at-end`. A process that found the group
    empty may plan a held round of all six partitions before the first assignment
    (relay.engine.driver.held); given a share, that round is stopped having written nothing.
    Whether one does depends on timing (its Spark may be up only after the join ended), so
    the test holds what must hold either way: both exit 0, their counts add up to the
    backlog, a dropped held round relayed nothing, and every record arrives once."""
    produce(
        setup.source.bootstrap,
        setup.topic,
        [Record(key=b"k%d" % n, value=b"v%d" % n, partition=n % PARTITIONS) for n in range(6000)],
    )
    (a, _), (b, _) = setup.start("--stop-at-end"), setup.start("--stop-at-end")
    runs = [a.wait(timeout=180), b.wait(timeout=180)]
    assert [run.returncode for run in runs] == [0, 0], runs[0].stderr + runs[1].stderr
    relayed = [re.search(r"done: (\d+) records relayed", run.stderr) for run in runs]
    assert sum(int(m.group(1)) for m in relayed if m) == 6000, runs[0].stderr + runs[1].stderr
    for run in runs:
        if "planned before the group's first assignment" in run.stderr:
            assert "round 1 ended (membership)" in run.stderr, run.stderr
            assert "0 records so far" in run.stderr.split("round 1 ended")[1].splitlines()[0]
    assert setup.arrived() == 6000
    setup.check_exactly_once()


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
def test_a_frozen_process_stops_writing_before_its_partitions_move(setup, tmp_path):
    """SIGSTOP freezes one ktm (its driver: heartbeats and lease renewals stop; its Spark
    tasks run on until their lease runs out). The other takes everything over, then the frozen
    one continues and rejoins: nothing is lost or written twice."""
    feeder = Feeder(setup.source.bootstrap, setup.topic, PARTITIONS)
    (a, port_a), (b, port_b) = setup.start(), setup.start()
    try:
        wait_for(lambda: (assigned(port_a), assigned(port_b)) == (3, 3), 180, "a 3/3 share", a)
        wait_for(lambda: setup.arrived() >= 1000, 60, "records flowing", a)
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: assigned(port_b) == 6, 60, "the other owning everything", b)
            before = setup.arrived()
            wait_for(lambda: setup.arrived() >= before + 1000, 60, "records flowing again", b)
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        wait_for(lambda: (assigned(port_a), assigned(port_b)) == (3, 3), 90, "a 3/3 share again", a)
        before = setup.arrived()
        wait_for(lambda: setup.arrived() >= before + 1000, 60, "records flowing after", a)
        settle(setup, feeder, a)
        setup.stop_all()
    finally:
        feeder.stop()
    setup.check_exactly_once()

"""The real `ktm relay` command as a subprocess: restarts, failures, signals, metrics, output.

Every process runs in its own session, gets a time limit, and is killed at the end of the test
whatever happened, together with everything else in its session: its JVM and the Python workers
(PySpark's worker daemon has a process group of its own, so killing ktm's group is not enough).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from testbed.ktm_process import (
    SPARK_NOISE,
    assert_one_error_line,
    assert_only_log_lines,
    ktm,
    live_session_members,
    metric_total,
    run_ktm,
    scrape,
    spark_sessions,
    wait_for,
)
from testbed.ports import free_port
from testbed.records import Record, produce, read_all, record_count
from testbed.topics import create_topic, topic_names, unique_topic
from tests.support.feeder import Feeder
from tests.support.relay import (
    assert_exact_copy,
    committed_offsets,
    listed_end_offsets,
    relayed_offsets,
    topic_pair,
    write_config,
)

pytestmark = [pytest.mark.timeout(170), pytest.mark.brokers("tansu", "kafka")]


def assert_copied_without_duplicates(
    source_bootstrap: str, src: str, target_bootstrap: str, dst: str
) -> dict[int, list[Any]]:
    """Each destination partition is an exact, in-order prefix of its source partition."""
    source = read_all(source_bootstrap, src)
    copied = read_all(target_bootstrap, dst, timeout=30)
    for p, records in copied.items():
        assert_exact_copy({p: source[p][: len(records)]}, records, src)
    return copied


# --- restart after SIGKILL ----------------------------------------------------------------------

RESTART_RECORDS = 48_000  # ~100 bytes each, over RESTART_PARTITIONS partitions
RESTART_PARTITIONS = 12  # more partitions than the 2 task slots it runs on


def restart_record(i: int) -> Record:
    return Record(key=b"k%06d" % i, value=b"%06d" % i + b"v" * 94, partition=i % RESTART_PARTITIONS)


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
@pytest.mark.timeout(420)  # two Spark start-ups and 48k records, on a busy 2-core box
def test_restart_after_sigkill_relays_every_record_exactly_once(
    source_broker, target_broker, tmp_path
):
    parts = RESTART_PARTITIONS
    src = create_topic(source_broker.bootstrap, unique_topic("restart-src"), partitions=parts)
    dst = create_topic(target_broker.bootstrap, unique_topic("restart-dst"), partitions=parts)
    routes = {"source": source_broker.bootstrap, "target": target_broker.bootstrap}
    two_slots = 'master = "local[2]"'
    first_config = write_config(
        tmp_path / "first.toml", topics={src: dst}, spark=two_slots, **routes
    )
    last_config = write_config(tmp_path / "last.toml", topics={src: dst}, spark=two_slots, **routes)

    def arrived() -> int:  # a lower bound: Tansu's ListOffsets under-reports the end
        return sum(listed_end_offsets(target_broker.bootstrap, dst, parts).values())

    def feed(first: int, last: int, pause: float) -> None:
        for start in range(first, last, 1_000):
            produce(source_broker.bootstrap, src, map(restart_record, range(start, start + 1_000)))
            time.sleep(pause)

    # The rest is fed at a pace once the relay runs, so records still flow when it is killed
    # (the batch path copies a whole backlog within a second of starting)
    feeding = threading.Thread(target=feed, args=(1_000, RESTART_RECORDS, 0.1))
    with ktm(tmp_path, "--config", str(first_config), "--mode", "single") as first:
        feed(0, 1_000, 0)
        copied = lambda: sum(map(len, read_all(target_broker.bootstrap, dst).values()))  # noqa: E731
        wait_for(lambda: copied() >= 1_000, 180, "the relay running", first)
        feeding.start()
        wait_for(lambda: arrived() >= RESTART_RECORDS // 10, 180, "10% arrived", first)
        first.kill()  # the JVM and the Python workers too: nothing gets to flush or commit
    feeding.join(120)
    before = sum(len(rs) for rs in read_all(target_broker.bootstrap, dst, timeout=30).values())
    print(f"killed with {before} of {RESTART_RECORDS} records in the destination")
    assert RESTART_RECORDS // 10 <= before < RESTART_RECORDS, "the kill must come mid-way"

    last = run_ktm(tmp_path, "--config", str(last_config), "--stop-at-end", timeout=200)

    assert last.returncode == 0, last.stderr
    assert_only_log_lines(last.stderr)  # a successful run shows no Spark/Java output
    copied = read_all(target_broker.bootstrap, dst, timeout=30)
    for p, records in copied.items():
        # Source offset n of partition p holds record parts*n + p: exactly once, in order.
        assert relayed_offsets(records) == {(src, p): list(range(RESTART_RECORDS // parts))}
        expected = [restart_record(parts * n + p) for n in range(RESTART_RECORDS // parts)]
        assert [(r.key, r.value) for r in records] == [(e.key, e.value) for e in expected]
    verified = run_ktm(tmp_path, "--config", str(last_config), command="verify", timeout=120)
    assert verified.returncode == 0, verified.stderr  # ktm verify proves the same
    assert f"{parts} exact, 0 differ" in verified.stdout


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
@pytest.mark.timeout(240)
def test_records_held_unsent_when_the_driver_dies_are_relayed_by_the_next_run(
    source_broker, target_broker, tmp_path
):
    """The driver dies while its tasks hold records their producer has not sent yet (a long
    linger): the tasks lose the driver, drop those records and commit only what the destination
    acknowledged, which is nothing, so the next run relays every record."""
    source, target = source_broker.bootstrap, target_broker.bootstrap
    src, dst = topic_pair(source, target, "unsent", 4, records=400)
    port = free_port()
    config = write_config(
        tmp_path / "c.toml",
        source=source,
        target=target,
        topics={src: dst},
        app=f'metrics_addr = "127.0.0.1:{port}"',
    )
    config.write_text(config.read_text() + 'linger = "60s"\n')  # [target] is the last section
    with ktm(tmp_path, "--config", str(config), "--no-progress") as first:
        consumed = lambda: metric_total(port, "ktm_messages_consumed_total") or 0  # noqa: E731
        wait_for(lambda: consumed() >= 400, 120, "every record read", first)
        os.kill(first.proc.pid, signal.SIGKILL)  # the driver only: its tasks lose it
        time.sleep(3)  # they drop what they hold and commit
    assert sum(len(rs) for rs in read_all(target, dst).values()) == 0
    assert set(committed_offsets(source, "ktm", src, 4).values()) <= {None, 0}

    last = run_ktm(tmp_path, "--config", str(config), "--stop-at-end", "--no-progress", timeout=120)
    assert last.returncode == 0, last.stderr
    copy = [r for rs in read_all(target, dst).values() for r in rs]
    assert_exact_copy(read_all(source, src), copy, src)


# --- failures: one line, the right exit code, nothing created ---------------------------------


def test_missing_destination_topic_fails_without_creating_it(
    source_broker, target_broker, tmp_path
):
    src = create_topic(source_broker.bootstrap, unique_topic("nodst-src"), partitions=2)
    produce(source_broker.bootstrap, src, [Record(value=b"x", partition=0)])
    dst = unique_topic("nodst-missing")
    config = write_config(
        tmp_path / "config.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={src: dst},
    )

    run = run_ktm(tmp_path, "--config", str(config), "--stop-at-end", timeout=60)

    assert_one_error_line(run, 1, dst)
    assert len(run.stderr.splitlines()) == 1, run.stderr
    assert dst not in topic_names(target_broker.bootstrap)


def test_missing_source_topic_fails_without_creating_it(source_broker, target_broker, tmp_path):
    src = unique_topic("nosrc-missing")
    dst = create_topic(target_broker.bootstrap, unique_topic("nosrc-dst"), partitions=2)
    config = write_config(
        tmp_path / "config.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={src: dst},
    )

    run = run_ktm(tmp_path, "--config", str(config), "--stop-at-end", timeout=60)

    assert_one_error_line(run, 1, src, source_broker.bootstrap)
    assert len(run.stderr.splitlines()) == 1, run.stderr
    assert src not in topic_names(source_broker.bootstrap)
    assert src not in topic_names(target_broker.bootstrap)


def test_a_process_that_fails_right_after_joining_early_leaves_its_group_usable(
    source_broker, target_broker, tmp_path
):
    """A process joins its (empty) group while it counts the partitions; one that then fails
    on a config error must not leave the group waiting for it: on Tansu a LeaveGroup while the
    broker held the join left the group stuck, and the next process never got an assignment."""
    src, dst = topic_pair(source_broker.bootstrap, target_broker.bootstrap, "early", 2, records=20)
    group = f'metrics_addr = ""\ngroup_id = "{unique_topic("early")}"'
    brokers = {"source": source_broker.bootstrap, "target": target_broker.bootstrap}
    broken = write_config(tmp_path / "broken.toml", topics={unique_topic("none"): dst}, app=group,
                          **brokers)  # fmt: skip
    config = write_config(tmp_path / "config.toml", topics={src: dst}, app=group, **brokers)

    failed = run_ktm(tmp_path, "--config", str(broken), "--stop-at-end", timeout=60)
    assert failed.returncode == 1, failed.stderr
    run = run_ktm(tmp_path, "--config", str(config), "--stop-at-end", timeout=90)

    assert run.returncode == 0, run.stderr
    assert record_count(target_broker.bootstrap, dst) == 20


@pytest.mark.brokers("tansu")  # ktm's own behaviour, the same on any broker: a closed port
def test_unreachable_bootstrap_fails_within_30s_naming_the_address(
    source_broker, target_broker, tmp_path
):
    """Source and target each on a closed port; both runs at once, to keep the test short."""
    src, dst = topic_pair(source_broker.bootstrap, target_broker.bootstrap, "closed", 1)
    closed = f"127.0.0.1:{free_port()}"
    configs = {
        "source": write_config(
            tmp_path / "source.toml",
            source=closed,
            target=target_broker.bootstrap,
            topics={src: dst},
        ),
        "target": write_config(
            tmp_path / "target.toml",
            source=source_broker.bootstrap,
            target=closed,
            topics={src: dst},
        ),
    }
    with ktm(tmp_path, "--config", str(configs["source"]), "--stop-at-end") as source_down:
        with ktm(tmp_path, "--config", str(configs["target"]), "--stop-at-end") as target_down:
            runs = {"source": source_down.wait(45), "target": target_down.wait(45)}

    for side, run in runs.items():
        line = assert_one_error_line(run, 1, closed)
        assert side in line
        assert run.elapsed < 30, f"{side}: exit after {run.elapsed:.1f}s"


def test_unknown_config_key_exits_2_naming_the_key(source_broker, target_broker, tmp_path):
    config = write_config(
        tmp_path / "config.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={"a": "b"},
    )
    config.write_text(config.read_text() + "max_retrys = 3\n")  # in [target], the last table

    run = run_ktm(tmp_path, "--config", str(config), "--stop-at-end", timeout=60)

    assert_one_error_line(run, 2, "[target].max_retrys", "max_retries")
    assert len(run.stderr.splitlines()) == 1, run.stderr


# --- signals and metrics ----------------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "stop_signal",
    [
        pytest.param("SIGTERM", id="sigterm-to-ktm"),  # kill PID, docker stop
        pytest.param("SIGINT", id="sigint-to-group"),  # Ctrl+C: the whole foreground group
        pytest.param("SIGTERM-group", id="sigterm-to-group"),  # systemd: every process, JVM too
    ],
)
@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
def test_signal_stops_cleanly_and_metrics_count_what_was_relayed(
    source_broker, target_broker, tmp_path, stop_signal
):
    src, dst = topic_pair(
        source_broker.bootstrap, target_broker.bootstrap, "sig", 4, records=2000, value=b"r"
    )
    port = free_port()
    group = unique_topic("sig-group")
    config = write_config(
        tmp_path / "config.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={src: dst},
        app=f'metrics_addr = "127.0.0.1:{port}"\ngroup_id = "{group}"',
    )

    with ktm(tmp_path, "--config", str(config)) as relay:
        wait_for(lambda: sum(scrape(port).values()) > 0, 180, "records were produced", relay)
        wait_for(lambda: sum(scrape(port).values()) == 2000, 60, "all 2000 relayed", relay)
        samples = scrape(port)
        # Labels sorted by name: source_partition, source_topic, target_partition, target_topic.
        assert samples == {(str(p), src, str(p), dst): 500.0 for p in range(4)}
        assert sum(len(rs) for rs in read_all(target_broker.bootstrap, dst).values()) == 2000
        spark = spark_sessions(tmp_path)
        assert spark, "the Spark JVM of this run was not found"

        more = Feeder(source_broker.bootstrap, src, 4, per_batch=40, pause=0)
        try:  # the signal arrives while records are flowing
            wait_for(lambda: sum(scrape(port).values()) > 2200, 60, "new records relayed", relay)
            signalled = time.monotonic()
            if stop_signal == "SIGTERM":
                relay.proc.send_signal(signal.SIGTERM)
            elif stop_signal == "SIGINT":
                relay.signal_group(signal.SIGINT)
            else:
                relay.signal_group(signal.SIGTERM)
            run = relay.wait(timeout=15)
            took = time.monotonic() - signalled
        finally:
            more.stop()

    assert run.returncode == 0, run.stderr
    assert took <= 5.0, f"took {took:.1f}s to stop"
    # A normal stop is silent: no warning, no error, nothing but ktm's own info lines.
    assert_only_log_lines(run.stderr)
    assert not re.search(r" (WARNING|ERROR|CRITICAL) ", run.stderr), run.stderr
    # The driver, not the signal, stopped Spark: its whole tree is gone.
    assert not [pid for sid in spark for pid in live_session_members(sid)]
    copied = assert_copied_without_duplicates(
        source_broker.bootstrap, src, target_broker.bootstrap, dst
    )
    held = {p: len(rs) for p, rs in copied.items()}
    assert sum(held.values()) > 2200
    # Every acknowledged offset was committed, whoever got the signal.
    assert committed_offsets(source_broker.bootstrap, group, src, 4) == held
    assert all(relayed_offsets(rs) == {(src, p): list(range(held[p]))} for p, rs in copied.items())


@pytest.mark.brokers("tansu")  # ktm's own behaviour, the same on any broker: its metrics
def test_metrics_follow_the_destination_within_two_seconds(source_broker, target_broker, tmp_path):
    """Tasks report while they run: /metrics does not wait for a round (or a job) to end."""
    src, dst = topic_pair(source_broker.bootstrap, target_broker.bootstrap, "live", 4)
    port = free_port()
    config = write_config(
        tmp_path / "config.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={src: dst},
        app=f'metrics_addr = "127.0.0.1:{port}"',
    )
    with ktm(tmp_path, "--config", str(config)) as relay:
        for burst in range(3):
            batch = [Record(value=b"b%d-%d" % (burst, i), partition=i % 4) for i in range(500)]
            produce(source_broker.bootstrap, src, batch)
            sent = 500 * (burst + 1)
            wait_for(lambda n=sent: record_count(target_broker.bootstrap, dst) >= n, 180,
                     f"burst {burst} at the destination", relay)  # fmt: skip
            arrived = time.monotonic()
            wait_for(lambda n=sent: sum(scrape(port).values()) >= n, 30, "the metrics", relay)
            behind = time.monotonic() - arrived
            assert behind <= 2.0, f"burst {burst}: metrics {behind:.1f}s behind the destination"
        relay.proc.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=15).returncode == 0


@pytest.mark.brokers("tansu")  # ktm's own behaviour, the same on any broker: its logs
def test_debug_names_the_spark_log_which_holds_what_the_terminal_does_not(
    source_broker, target_broker, tmp_path
):
    src, dst = topic_pair(
        source_broker.bootstrap, target_broker.bootstrap, "debug", 2, records=100, value=b"d"
    )
    config = write_config(
        tmp_path / "config.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={src: dst},
    )

    run = run_ktm(tmp_path, "--config", str(config), "--stop-at-end", "--debug", timeout=120)

    assert run.returncode == 0, run.stderr
    paths = re.findall(r"spark log: (\S+)", run.stderr)
    assert paths, run.stderr
    spark_log = Path(paths[-1])
    assert spark_log.is_file()
    assert spark_log.is_relative_to(tmp_path / "ktm-logs")  # KTM_LOG_DIR is honoured
    assert spark_log.stat().st_size > 0  # the JVM's chatter went here...
    for noise in SPARK_NOISE:  # ...and not to the terminal
        assert noise not in run.stderr
    assert "Traceback" not in run.stderr
    copied = read_all(target_broker.bootstrap, dst)
    assert sum(len(rs) for rs in copied.values()) == 100


@pytest.mark.brokers("tansu")  # ktm's own behaviour, the same on any broker: Spark's class archive
@pytest.mark.timeout(300)
def test_the_first_run_writes_the_class_archive_and_the_next_one_maps_it(
    source_broker, target_broker, tmp_path, monkeypatch
):
    src, dst = topic_pair(
        source_broker.bootstrap, target_broker.bootstrap, "cds", 2, records=100, value=b"c"
    )
    cache = tmp_path / "class-cache"
    config = write_config(
        tmp_path / "config.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={src: dst},
        spark=f'class_cache = "{cache}"',
    )

    first = run_ktm(tmp_path, "--config", str(config), "--stop-at-end", "--debug", timeout=150)

    assert first.returncode == 0, first.stderr
    assert "spark class archive: -XX:ArchiveClassesAtExit=" in first.stderr
    assert "spark python daemon: relay.engine.local_daemon" in first.stderr  # PySpark compiled
    (archive,) = cache.glob("spark-driver-*.jsa")
    assert archive.stat().st_size > 1_000_000 and not list(cache.glob("*.tmp"))

    produce(source_broker.bootstrap, src, [Record(value=b"more", partition=0)] * 10)
    # -Xshare:on: a JVM that cannot map the archive refuses to start, so this run fails
    monkeypatch.setenv("JDK_JAVA_OPTIONS", "-Xshare:on")
    second = run_ktm(tmp_path, "--config", str(config), "--stop-at-end", "--debug", timeout=120)

    assert second.returncode == 0, second.stderr
    assert f"spark class archive: -XX:SharedArchiveFile={archive}" in second.stderr
    assert "writing the Spark JVM's class archive" not in second.stderr
    copied = read_all(target_broker.bootstrap, dst)
    assert sum(len(rs) for rs in copied.values()) == 110

"""Issue 36: source records deleted before ktm copied them are never lost silently.

Retention is simulated with DeleteRecords (kafka-python's admin `delete_records`): it moves the
log start exactly as a retention check does, as a reader sees it (its fetch below the log start
is answered OFFSET_OUT_OF_RANGE), but at the moment and offset the test picks. Real retention
would need a cluster of its own with `log.retention.check.interval.ms` of a second (the pool's
nodes keep the 5-minute default): seconds to start, and a test that can only wait for the next
check and then read back what it deleted. With DeleteRecords the test knows the deleted range
and the count must equal it exactly. test_retention_race lets the broker's own retention race
a throttled relay.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from relay.clients.batch_reader import BatchReader
from relay.clients.consumer import SourceReader
from relay.config import ClusterConfig, load_config
from relay.engine.metrics import Metrics
from relay.losses import DELETED, Loss
from relay.pipelines.jobs import backup_job
from testbed.ktm_process import run_ktm
from testbed.provenance import attributed
from testbed.records import Record, produce, read_all
from testbed.topics import create_topic, unique_topic, wait_until
from tests.support.inprocess import Background, relay_once, verify_once
from tests.support.relay import committed_offsets, write_config

pytestmark = pytest.mark.brokers("kafka")

GROUP = "ktm"  # [app].group_id's default: where the relay commits on the source
HOUR_MS = 3_600_000
STOP_ON_LOSS = '[source_pool]\non_loss = "stop"\n'


@pytest.fixture(scope="module", autouse=True)
def coordinator_ready(source_broker: Any) -> None:
    """A fresh node's group coordinator loads for a moment; the configs' retries are short."""
    topic = create_topic(source_broker.bootstrap, unique_topic("loss-warm"), partitions=1)
    assert committed_offsets(source_broker.bootstrap, GROUP, topic, 1) == {0: None}


def delete_below(bootstrap: str, topic: str, starts: dict[int, int]) -> None:
    """Move each partition's log start to its offset, as retention would."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, p): o for p, o in starts.items()})
    finally:
        admin.close()


def fill(
    bootstrap: str, topic: str, partitions: int, per_partition: int, first: int = 0, pad: int = 0
) -> None:
    produce(bootstrap, topic, [
        Record(key=b"k%d" % i, value=b"v%d" % i + b"." * pad, partition=p)
        for i in range(first, first + per_partition) for p in range(partitions)
    ])  # fmt: skip


def copied_offsets(bootstrap: str, topic: str) -> dict[int, list[int]]:
    """The source offsets the destination holds, per source partition, in order."""
    found: dict[int, list[int]] = {}
    for partition, records in read_all(bootstrap, topic).items():
        for record in attributed(records):
            found.setdefault(record.partition, []).append(record.offset)
        found.setdefault(partition, [])
    return found


def lost_metric(metrics: Metrics, topic: str, partition: int) -> float | None:
    labels = {"source_topic": topic, "source_partition": str(partition), "cause": DELETED}
    return metrics.registry.get_sample_value("ktm_source_records_lost_total", labels)


@pytest.mark.parametrize("batches", [True, False], ids=["batch-path", "record-path"])
def test_a_reader_below_the_log_start_reports_the_deleted_offsets_and_goes_on(
    source_broker: Any, batches: bool
) -> None:
    topic = create_topic(source_broker.bootstrap, unique_topic("loss-read"), partitions=1)
    fill(source_broker.bootstrap, topic, 1, 20)
    delete_below(source_broker.bootstrap, topic, {0: 12})
    cluster = ClusterConfig("src", (source_broker.bootstrap,))
    reader = BatchReader(cluster, "ktm-loss-test") if batches else SourceReader(cluster, "g-loss")
    try:
        reader.assign({(topic, 0): 5})
        got: list[Any] = []
        losses: list[Loss] = []
        deadline = time.monotonic() + 15
        while not got and time.monotonic() < deadline:
            got = reader.poll(0.5).get((topic, 0), [])
            losses += reader.take_losses()
    finally:
        reader.close()
    assert losses == [Loss((topic, 0), 5, 12, DELETED, 5)]
    if batches:  # the whole batch holding offset 12 (one produce call: it may begin before)
        assert got[0].base_offset <= 12 < got[0].next_offset
    else:
        assert got[0].offset == 12


def commit_at(bootstrap: str, topic: str, offsets: dict[int, int], group: str = GROUP) -> None:
    """What a relay that copied up to these offsets and then stopped leaves on the source: the
    group's committed offsets (the resume point when the destination names none)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False)  # fmt: skip
    try:
        consumer.commit({TopicPartition(topic, p): OffsetAndMetadata(o, "", -1)
                         for p, o in offsets.items()})  # fmt: skip
    finally:
        consumer.close(autocommit=False)


def after_loss(source: str, target: str, tmp_path: Path, on_loss: str) -> tuple[str, str, Path]:
    """Two partitions copied up to offset 30 (as the group's offsets say), 60 records each;
    then partition 0's log start moves to 45 (15 not yet copied) and partition 1's to 20 (all
    copied). A config with `on_loss`."""
    src = create_topic(source, unique_topic("loss-src"), partitions=2)
    dst = create_topic(target, unique_topic("loss-dst"), partitions=2)
    conf = write_config(tmp_path / "c.toml", source=source, target=target, topics={src: dst})
    with_loss = f'[source_pool]\non_loss = "{on_loss}"\n'
    conf.write_text(conf.read_text().replace("[source_pool]\n", with_loss))
    fill(source, src, 2, 60)
    commit_at(source, src, {0: 30, 1: 30})
    delete_below(source, src, {0: 45, 1: 20})
    return src, dst, conf


def test_a_relay_counts_what_was_deleted_before_it_was_copied_and_nothing_else(
    source_broker: Any, target_broker: Any, tmp_path: Path
) -> None:
    """`ktm relay --stop-at-end` loses exactly the 15 records deleted unread, says so in one
    line, copies every record the source still has past what was copied, and exits 1 naming
    the loss (the copy is not the source's whole log); --summary-json counts it."""
    src, dst, conf = after_loss(source_broker.bootstrap, target_broker.bootstrap, tmp_path, "warn")
    summary_path = tmp_path / "summary.json"

    run = run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", "--summary-json",
                  str(summary_path), timeout=200)  # fmt: skip

    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    (error,) = run.error_lines()
    assert f"15 source records were lost before they were copied ({src}/0: 15)" in error
    said = [line for line in run.stderr.splitlines() if "deleted before they were copied" in line]
    assert len(said) == 1 and f"topic={src} partition=0 offsets=30-44 (15 records" in said[0]
    summary = json.loads(summary_path.read_text())
    assert (summary["records_lost"], summary["lost"]) == (15, {f"{src}/0": 15})
    assert summary["relayed"] == 15 + 30 and summary["halted"] == []
    copied = copied_offsets(target_broker.bootstrap, dst)
    assert copied == {0: list(range(45, 60)), 1: list(range(30, 60))}


def test_on_loss_stop_halts_the_partition_at_the_first_deleted_offset(
    source_broker: Any, target_broker: Any, tmp_path: Path
) -> None:
    src, dst, conf = after_loss(source_broker.bootstrap, target_broker.bootstrap, tmp_path, "stop")
    summary, metrics = relay_once(conf)
    (halt,) = summary.halted
    assert (halt["source_topic"], halt["source_partition"], halt["offset"]) == (src, 0, 30)
    assert f"topic={src} partition=0 offsets=30-44" in str(halt["reason"])
    assert '[source_pool].on_loss = "stop"' in str(halt["reason"])
    assert (summary.records_lost, lost_metric(metrics, src, 0)) == (15, 15)
    copied = copied_offsets(target_broker.bootstrap, dst)
    assert copied == {0: [], 1: list(range(30, 60))}  # partition 1 went on


def test_check_says_a_relay_would_resume_below_the_log_start_and_still_passes(
    source_broker: Any, target_broker: Any, tmp_path: Path
) -> None:
    src = create_topic(source_broker.bootstrap, unique_topic("loss-chk"), partitions=1)
    dst = create_topic(target_broker.bootstrap, unique_topic("loss-chk-dst"), partitions=1)
    conf = write_config(tmp_path / "c.toml", source=source_broker.bootstrap,
                        target=target_broker.bootstrap, topics={src: dst})  # fmt: skip
    fill(source_broker.bootstrap, src, 1, 20)
    commit_at(source_broker.bootstrap, src, {0: 5})
    delete_below(source_broker.bootstrap, src, {0: 12})

    run = run_ktm(tmp_path, "--config", str(conf), command="check", timeout=120)

    assert run.returncode == 0, run.stderr
    assert f"{src}[0] -> {dst}[0]: from offset 5, end 20, lag 15" in run.stdout
    assert f"{src}[0] resumes outside the source's log (from offset 5): records deleted" in (
        run.stdout
    )


def test_retention_racing_a_throttled_relay_loses_exactly_the_offsets_it_deleted_unread(
    source_broker: Any, target_broker: Any, tmp_path: Path, spark: Any
) -> None:
    """A relay held to 100 records/s; while it is partway, the log start moves to 300: what it
    had not read by then is lost and counted, what it had copied stays, and every offset from
    300 on is copied. The count equals the offsets below 300 the copy lacks, whatever moment
    the deletion hit."""
    src = create_topic(source_broker.bootstrap, unique_topic("race-src"), partitions=1)
    dst = create_topic(target_broker.bootstrap, unique_topic("race-dst"), partitions=1)
    conf = write_config(tmp_path / "c.toml", source=source_broker.bootstrap,
                        target=target_broker.bootstrap, topics={src: dst},
                        extra="\n[limits]\nrecords_per_second = 100\n")  # fmt: skip
    # batches of 10 records of 1 kB: a throttled fetch (16 kB at least) takes one or two
    for first in range(0, 400, 10):
        fill(source_broker.bootstrap, src, 1, 10, first=first, pad=1000)
    relay = Background(conf, stop_at_end=True)
    try:
        wait_until(lambda: relay.produced() >= 50, 60, "50 records are copied")
        delete_below(source_broker.bootstrap, src, {0: 300})
        relay.thread.join(60)
        assert not relay.thread.is_alive() and relay.error is None, relay.error
    finally:
        relay.finish()
    assert relay.summary is not None
    copied = copied_offsets(target_broker.bootstrap, dst)[0]
    below = [o for o in copied if o < 300]
    assert below == list(range(len(below))) and 50 <= len(below) < 300
    assert copied[len(below) :] == list(range(300, 400))
    assert relay.summary.records_lost == 300 - len(below)
    assert lost_metric(relay.metrics, src, 0) == 300 - len(below)
    (report,) = verify_once(conf, spark)  # ktm verify: exact, and says what was deleted
    assert report.exact and (report.compared, report.deleted) == (100, 300 - len(below))


def test_a_backup_counts_what_was_deleted_before_it_was_backed_up(
    source_broker: Any, tmp_path: Path, spark: Any
) -> None:
    """The store is the destination: offsets 20-31 deleted before the second backup are counted
    (12) and the rest backed up; with on_loss = "stop", 40-44 deleted halt the partition at 40."""
    src = create_topic(source_broker.bootstrap, unique_topic("loss-bk"), partitions=1)
    store = tmp_path / "store"
    conf = write_config(tmp_path / "c.toml", source=source_broker.bootstrap,
                        target=source_broker.bootstrap, topics={src: src},
                        extra=f'\n[store]\nurl = "{store}"\n')  # fmt: skip
    fill(source_broker.bootstrap, src, 1, 20)

    def backup() -> tuple[Any, Metrics]:
        metrics = Metrics()
        runner = backup_job(load_config(conf), stop_at_end=True, stop_event=threading.Event(),
                            metrics=metrics)  # fmt: skip
        with runner:
            runner.prepare()
            return runner.run(), metrics

    assert backup()[0].records_lost == 0
    fill(source_broker.bootstrap, src, 1, 20, first=20)
    delete_below(source_broker.bootstrap, src, {0: 32})
    summary, metrics = backup()
    assert (summary.relayed, summary.records_lost, lost_metric(metrics, src, 0)) == (8, 12, 12)
    # ktm verify --store reads the store from the source's log start on: exact, and it does
    # not count what was deleted before (docs/verify.md)
    (report,) = verify_once(conf, spark, "backup")
    assert report.exact and report.compared == 8

    # on_loss = "stop": the partition halts at the first deleted offset, as a relay's does
    fill(source_broker.bootstrap, src, 1, 10, first=40)
    delete_below(source_broker.bootstrap, src, {0: 45})
    conf.write_text(conf.read_text().replace("[source_pool]\n", STOP_ON_LOSS))
    summary, metrics = backup()
    (halt,) = summary.halted
    assert (halt["source_partition"], halt["offset"], summary.records_lost) == (0, 40, 5)
    assert summary.relayed == 0


def test_a_source_topic_recreated_under_a_relay_halts_its_partition(
    source_broker: Any, target_broker: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A relay copied offsets 0-49; the topic is deleted and created again under its name, and
    gets 10 records. Within one health check an ERROR line names the topic's old and new IDs,
    and the partition halts at 50. Whichever sees it first: the ID check, or a fetch finding the
    log ended below what was copied (as after an unclean leader election), which also names the
    offsets the copy holds and the source lost (10-49, or 0-49 if it came before the 10),
    counted as truncated. Nothing of the new topic is copied under offsets the copy holds."""
    bootstrap = source_broker.bootstrap
    src = create_topic(bootstrap, unique_topic("recreate-src"), partitions=1)
    dst = create_topic(target_broker.bootstrap, unique_topic("recreate-dst"), partitions=1)
    conf = recreating(tmp_path / "c.toml", bootstrap, target_broker.bootstrap, src, dst)
    fill(bootstrap, src, 1, 50)
    relay = Background(conf, failover=False)
    try:
        recreate(bootstrap, src, 1, lambda: relay.produced() >= 50)
        fill(bootstrap, src, 1, 10)
        halts = relay.relay.status.halts
        wait_until(lambda: bool(halts.all()) and bool(id_lines(caplog, src)), 30,
                   "the partition halts and the ID line is said")  # fmt: skip
    finally:
        relay.finish()
    (halt,) = halts.all()
    assert (halt.route.key, halt.offset) == ((src, 0), 50)
    (line,) = id_lines(caplog, src)
    assert re.search(r"its topic ID was [0-9a-f-]{36}, now [0-9a-f-]{36}", line), line
    labels = {"source_topic": src, "source_partition": "0", "cause": "truncated"}
    lost = relay.metrics.registry.get_sample_value("ktm_source_records_lost_total", labels)
    # the log ended at 10, or at 0 when a fetch came between the creation and the records
    found = re.search(rf"topic={src} partition=0 offsets=(\d+)-49 \((\d+) records the copy holds",
                      halt.reason)  # fmt: skip
    if found is not None:  # the fetch saw it first
        assert found[1] in ("0", "10") and int(found[2]) == 50 - int(found[1]) == lost
    else:
        assert halt.reason == f"source topic {src} was recreated" and lost in (None, 40.0, 50.0)
    assert copied_offsets(target_broker.bootstrap, dst) == {0: list(range(50))}


def test_a_recreated_topic_followed_is_copied_again_from_its_start_into_the_same_destination(
    source_broker: Any, target_broker: Any, spark: Any, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """`on_recreate = "follow"`: a relay copied offsets 0-49 of each of 2 partitions; the topic
    is deleted and created again, empty, then gets 20 records a partition (fewer: the lag must
    follow the new, lower ends). Within a health check
    the relay follows it (a fetch may first find the new log ended below the copy and halt the
    partition: following lifts that): the destination holds the 50 old copies, then the 20 new
    ones named `topic~1`. A consumer group at offset 10 of the new topic is carried over to the
    destination at 60 (after the old copies). A restart copies nothing again; `ktm verify`
    compares the new incarnation exact and counts the old copies apart."""
    bootstrap = source_broker.bootstrap
    src = create_topic(bootstrap, unique_topic("follow-src"), partitions=2)
    dst = create_topic(target_broker.bootstrap, unique_topic("follow-dst"), partitions=2)
    app = unique_topic("follow-app")
    groups = f'\n[groups]\ninclude = ["{app}"]\ninterval = "1s"\n'
    conf = recreating(tmp_path / "c.toml", bootstrap, target_broker.bootstrap, src, dst,
                      'on_recreate = "follow"', groups, interval="1s")  # fmt: skip
    fill(bootstrap, src, 2, 50)
    relay = Background(conf, failover=False)
    try:
        recreate(bootstrap, src, 2, lambda: relay.produced() >= 100)
        wait_until(lambda: all(r.incarnation == 1 for r in relay.relay.routes), 30,
                   "the relay follows the new topic")  # fmt: skip
        time.sleep(4)  # health checks of the new, empty topic (a stale one raised its lag)
        fill(bootstrap, src, 2, 20, first=100)
        wait_until(lambda: relay.produced() >= 140, 60, "the new topic is copied")
        status = relay.relay.status
        wait_until(lambda: status.snapshot().lag == 0, 10, "no lag left: the new topic's ends")
        commit_at(bootstrap, src, {0: 10, 1: 10}, group=app)
        target = target_broker.bootstrap
        wait_until(lambda: committed_offsets(target, app, dst, 2) == {0: 60, 1: 60}, 30,
                   "the group is carried over into the new incarnation's copies")  # fmt: skip
    finally:
        relay.finish()
    assert relay.error is None and relay.relay.status.halts.all() == ()
    labels = {"source_topic": src, "source_partition": "0", "cause": "truncated"}
    # a fetch finding the new log shorter than the copy is no loss once the IDs explain it
    assert relay.metrics.registry.get_sample_value("ktm_source_records_lost_total", labels) is None
    assert any("following it" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    held = read_all(target_broker.bootstrap, dst)
    copies = attributed([record for p in sorted(held) for record in held[p]])
    for partition in (0, 1):
        mine = [(c.topic, c.offset) for c in copies if c.partition == partition]
        assert mine == [(src, o) for o in range(50)] + [(f"{src}~1", o) for o in range(20)]
    summary, _ = relay_once(conf)  # a restart: the incarnation is read back, nothing copied
    assert summary.relayed == 0 and not summary.halted
    reports = verify_once(conf, spark)
    assert [(r.exact, r.compared, r.earlier) for r in reports] == [(True, 20, 50)] * 2


def recreating(
    path: Path, source: str, target: str, src: str, dst: str, pool: str = "", extra: str = "",
    interval: str = "500ms",
) -> Path:  # fmt: skip
    """A config relaying `src` while it is deleted and created again: the topic is missing for
    a moment, and the source side retries until it is back."""
    conf = write_config(path, source=source, target=target, topics={src: dst}, extra=extra)
    pool = f'[source_pool]\nhealthcheck_interval = "{interval}"\nmax_retries = -1\n{pool}'
    conf.write_text(conf.read_text().replace("[source_pool]\nmax_retries = 1", pool.rstrip()))
    return conf


def recreate(bootstrap: str, topic: str, partitions: int, copied: Callable[[], bool]) -> None:
    """Once the relay `copied` what it should, delete the topic and create it again, empty."""
    wait_until(copied, 60, "the first records are copied")
    time.sleep(1.5)  # a health check has seen the first topic ID
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic])
        wait_until(lambda: topic not in admin.list_topics(), 30, "the topic is gone")
    finally:
        admin.close()
    create_topic(bootstrap, topic, partitions=partitions)


def id_lines(caplog: pytest.LogCaptureFixture, topic: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "ERROR" and f"source topic {topic} on src was deleted" in r.getMessage()
    ]


def test_check_names_a_destination_whose_retention_would_delete_the_copies(
    source_broker: Any, target_broker: Any, tmp_path: Path
) -> None:
    """30 source records two hours old and 10 new, copied into a topic keeping one hour: `ktm
    check` (the relay's own start-up plan, which a relay's start logs the same) names the topic
    and the 30 records its retention would delete; a topic keeping them all is not named."""
    now = int(time.time() * 1000)
    src = create_topic(source_broker.bootstrap, unique_topic("old-src"), partitions=2)
    dst = create_topic(target_broker.bootstrap, unique_topic("short-dst"), partitions=2,
                       configs={"retention.ms": str(HOUR_MS)})  # fmt: skip
    keep = create_topic(target_broker.bootstrap, unique_topic("long-dst"), partitions=2)
    old = [Record(value=b"old", partition=i % 2, timestamp_ms=now - 2 * HOUR_MS + i)
           for i in range(30)]  # fmt: skip
    new = [Record(value=b"new", partition=i % 2, timestamp_ms=now) for i in range(10)]
    produce(source_broker.bootstrap, src, old + new)
    other = create_topic(source_broker.bootstrap, unique_topic("old-src2"), partitions=2)
    produce(source_broker.bootstrap, other, old)
    conf = write_config(tmp_path / "c.toml", source=source_broker.bootstrap,
                        target=target_broker.bootstrap, topics={src: dst, other: keep})  # fmt: skip

    run = run_ktm(tmp_path, "--config", str(conf), command="check", timeout=120)

    assert run.returncode == 0, run.stderr
    said = (
        f"destination topic {dst} deletes records older than retention.ms = {HOUR_MS} (1h): "
        "30 of the records to copy into it (2 partition(s)) are older than that"
    )
    assert f"retention: {said}" in run.stdout
    assert [line for line in run.stderr.splitlines() if said in line and "WARNING" in line]
    assert keep not in run.stdout.split("records to relay")[1]  # 7 days: keeps them

"""ktm backup, restore and compact against real brokers, a real local Spark, a directory store
and a real S3 server (SeaweedFS). Most runs are in-process on the shared SparkSession; the
crash tests run `ktm` as a subprocess and kill it."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from relay.config import load_config
from relay.engine.batch import run_on
from relay.engine.metrics import Metrics
from relay.pipelines.compact.driver import CompactOptions, CompactPipeline
from relay.pipelines.jobs import backup_job, relay_job, restore_job
from relay.pipelines.restore.driver import RestoreOptions
from relay.pipelines.restore.translate import carry_groups
from relay.pipelines.verify.spec import Scope
from relay.store import ChainLink, plan_chain
from relay.store.configured import store_of
from relay.store.layout import temp_name
from testbed.records import Record, produce, read_all, record_count
from testbed.topics import create_topic, unique_topic
from tests.support.inprocess import assert_verified, backup, restore, verify_once
from tests.support.relay import (
    committed_offsets,
    produce_null_record,
    without_provenance,
    write_config,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.brokers("tansu", "kafka")]
# The store's own behaviour (formats, S3, compaction, follow) is the broker's business nowhere:
# Kafka 3.9 runs the copy both ways, the translated group offsets and the relay after a restore.
ON_3_9 = pytest.mark.brokers("tansu", "kafka", "kafka39")

T0 = 1_700_000_000_000


def records(count: int, partitions: int, first: int = 0) -> list[Record]:
    return [
        Record(
            key=b"k%d" % i,
            value=b"%08d" % i + b"." * 60,
            headers=[("n", b"%d" % i), ("n", b"again"), ("dotted.name with space", b"")],
            partition=i % partitions,
            timestamp_ms=T0 + i * 1000,
        )
        for i in range(first, first + count)
    ]


def config(
    path: Path,
    *,
    source: str,
    target: str,
    topics: dict[str, str],
    store: str,
    store_keys: str = "",
    app: str = 'metrics_addr = ""',
) -> Path:
    return write_config(
        path, source=source, target=target, topics=topics, source_name="prod", app=app,
        extra=f'\n[store]\nurl = "{store}"\n{store_keys}\n',
    )  # fmt: skip


def view(record: Any) -> tuple[Any, ...]:
    return (record.key, record.value, without_provenance(record.headers), record.timestamp)


def assert_same(source: dict[int, list[Any]], copied: dict[int, list[Any]]) -> None:
    """Every source record once, in its partition, in order, unchanged."""
    assert set(copied) >= set(source)
    for partition, expected in source.items():
        got = [view(r) for r in copied[partition]]
        assert got == [view(r) for r in expected], f"partition {partition} differs"


def chain_of(conf: Path, topic: str, partition: int) -> Any:
    cfg = load_config(conf, needs=frozenset({"store"}))
    store = store_of(cfg.need_store())
    refs = store.list_segments(cfg.need_store().cluster, topic, partition)
    return plan_chain([ChainLink.of(ref, store.read_meta(ref)) for ref in refs])


@pytest.fixture
def topics(source_broker, target_broker):
    src = create_topic(source_broker.bootstrap, unique_topic("bk"), 3)
    return src, unique_topic("rs")


@pytest.fixture
def conf(source_broker, target_broker, topics, tmp_path):
    src, dst = topics
    return config(tmp_path / "c.toml", source=source_broker.bootstrap,
                  target=target_broker.bootstrap, topics={src: dst}, store=str(tmp_path / "store"),
                  store_keys="max_segment_records = 70")  # fmt: skip


# --- round trips --------------------------------------------------------------------------------


@ON_3_9
def test_backup_then_restore_is_an_exact_copy(source_broker, target_broker, topics, conf, spark):
    src, dst = topics
    produce(source_broker.bootstrap, src, records(600, 3))
    produce_null_record(source_broker.bootstrap, src, 1, T0)  # null key, null value

    first = backup(conf)
    assert first.relayed == 601
    for partition in range(3):
        plan = chain_of(conf, src, partition)
        assert not plan.problems and len(plan.links) >= 2  # 70-record segments chain
    assert_verified(verify_once(conf, spark, "backup"), 601)  # ktm verify --store

    summary, _ = restore(conf, create_topics=True)
    assert summary.relayed == 601
    assert_same(read_all(source_broker.bootstrap, src), read_all(target_broker.bootstrap, dst))
    assert_verified(verify_once(conf, spark, "restore"), 601)  # ktm verify --from-store

    again, _ = restore(conf)  # a second run writes nothing
    assert again.relayed == 0
    assert sum(len(rs) for rs in read_all(target_broker.bootstrap, dst).values()) == 601


def test_backup_resumes_from_the_store_and_restore_into_an_empty_topic_writes_all(
    source_broker, target_broker, topics, conf, spark
):
    src, dst = topics
    produce(source_broker.bootstrap, src, records(300, 3))
    backup(conf)
    # What a crash mid-write leaves in a directory store: a temporary file, never a segment.
    segment = next((conf.parent / "store").rglob("*.parquet"))
    leftover = segment.with_name(temp_name(segment.name))
    leftover.write_bytes(b"half a segment")
    produce(source_broker.bootstrap, src, records(200, 3, first=300))
    second = backup(conf)
    assert second.relayed == 200  # only the new records: the store is the truth
    assert not leftover.exists()  # cleaned once the partition was this process's
    for partition in range(3):
        assert not chain_of(conf, src, partition).problems

    create_topic(target_broker.bootstrap, dst, 3)
    summary, _ = restore(conf)
    assert summary.relayed == 500
    assert_same(read_all(source_broker.bootstrap, src), read_all(target_broker.bootstrap, dst))


def test_jsonl_segments_and_a_time_window(source_broker, target_broker, topics, tmp_path, spark):
    src, dst = topics
    conf = config(tmp_path / "j.toml", source=source_broker.bootstrap,
                  target=target_broker.bootstrap, topics={src: dst}, store=str(tmp_path / "js"),
                  store_keys='format = "jsonl"\nmax_segment_records = 50')  # fmt: skip
    produce(source_broker.bootstrap, src, records(300, 3))
    backup(conf)
    assert list((tmp_path / "js").rglob("*.jsonl"))
    window = (T0 + 100_000, T0 + 200_000)  # records 100..199

    summary, _ = restore(conf, create_topics=True, from_time=window[0], until_time=window[1])

    assert summary.relayed == 100
    source = read_all(source_broker.bootstrap, src)
    inside = {
        p: [r for r in rs if window[0] <= r.timestamp < window[1]] for p, rs in source.items()
    }
    assert_same(inside, read_all(target_broker.bootstrap, dst))
    # ktm verify --from-store --from-time --until-time: the point-in-time copy is exact, and
    # the same copy checked whole lacks exactly the records outside the window.
    in_window = Scope(from_time=window[0], until_time=window[1])
    assert_verified(verify_once(conf, spark, "restore", scope=in_window), 100)
    whole = verify_once(conf, spark, "restore")
    assert sum(dict(r.counts).get("missing", 0) for r in whole) == 200


def test_s3_store_backup_compaction_and_restore(
    source_broker, target_broker, topics, tmp_path, spark, s3
):
    src, dst = topics
    s3_keys = (f'max_segment_records = 100\ns3_endpoint = "{s3.endpoint}"\n'
               f's3_access_key = "{s3.access_key}"\ns3_secret_key = "{s3.secret_key}"')  # fmt: skip
    url = f"s3://{s3.bucket}/t-{uuid.uuid4().hex[:6]}"
    conf = config(tmp_path / "s3.toml", source=source_broker.bootstrap,
                  target=target_broker.bootstrap, topics={src: dst}, store=url,
                  store_keys=s3_keys)  # fmt: skip
    produce(source_broker.bootstrap, src, records(450, 3))

    assert backup(conf).relayed == 450
    cfg = load_config(conf, needs=frozenset({"store"}))
    merged = run_on(CompactPipeline(cfg, CompactOptions(level=0, min_age=0.0, delete=True)), spark)
    summary, _ = restore(conf, create_topics=True)

    assert (merged.merged, merged.inputs, merged.deleted) == (3, 6, 6)  # 2 segments each -> 1
    assert summary.relayed == 450
    assert_same(read_all(source_broker.bootstrap, src), read_all(target_broker.bootstrap, dst))
    assert_verified(verify_once(conf, spark, "backup"), 450)  # the compacted store, on S3
    assert_verified(verify_once(conf, spark, "restore"), 450)


# --- continuity with the relay, consumer groups -------------------------------------------------


@ON_3_9
def test_relay_after_restore_continues_without_gap_or_duplicate(
    source_broker, target_broker, topics, conf, spark
):
    src, dst = topics
    produce(source_broker.bootstrap, src, records(300, 3))
    backup(conf)
    restore(conf, create_topics=True)
    produce(source_broker.bootstrap, src, records(150, 3, first=300))

    relay = relay_job(load_config(conf), stop_at_end=True, stop_event=threading.Event(),
                  metrics=Metrics())  # fmt: skip
    relay.prepare()
    summary = relay.run()

    assert summary.relayed == 150  # resumed after the last restored offset
    assert_same(read_all(source_broker.bootstrap, src), read_all(target_broker.bootstrap, dst))
    assert_verified(verify_once(conf, spark), 450)  # restored and relayed: one exact copy


@ON_3_9
def test_consumer_group_offsets_are_translated_to_the_restored_records(
    source_broker, target_broker, topics, tmp_path, spark
):
    src, dst = topics
    group = unique_topic("app-group")
    conf = config(tmp_path / "g.toml", source=source_broker.bootstrap,
                  target=target_broker.bootstrap, topics={src: dst}, store=str(tmp_path / "gs"),
                  store_keys=f'groups = ["{group}"]')  # fmt: skip
    produce(source_broker.bootstrap, src, records(300, 3))
    consumed = {0: 40, 1: 77, 2: 100}  # the application's group read this far on the source
    commit(source_broker.bootstrap, group, src, consumed)
    backup(conf)
    # The destination already holds other records: its offsets differ from the source's.
    create_topic(target_broker.bootstrap, dst, 3)
    produce(target_broker.bootstrap, dst, [Record(value=b"old", partition=p) for p in (0, 1, 1)])
    restore_summary, runner = restore(conf)
    assert restore_summary.relayed == 300

    lines = carry_groups(load_config(conf), runner.routes, 20.0)

    assert lines == [f"group {group}: 3 partition offset(s) committed on the target"]
    translated = committed_offsets(target_broker.bootstrap, group, dst, 3)
    copied = read_all(target_broker.bootstrap, dst)
    source = read_all(source_broker.bootstrap, src)
    for partition in (0, 1):
        # The record the group reads next is the one it would have read next on the source.
        next_up = copied[partition][translated[partition]]
        assert view(next_up) == view(source[partition][consumed[partition]])
    assert translated[2] == len(copied[2])  # it had read everything: it resumes at the end


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        consumer.commit({TopicPartition(topic, p): OffsetAndMetadata(o, "", -1)
                         for p, o in offsets.items()})  # fmt: skip
    finally:
        consumer.close(autocommit=False)


# --- segments: age, compaction, follow ----------------------------------------------------------


def test_an_idle_partitions_segment_closes_on_its_age(
    source_broker, target_broker, topics, tmp_path, spark
):
    src, dst = topics
    conf = config(tmp_path / "a.toml", source=source_broker.bootstrap,
                  target=target_broker.bootstrap, topics={src: dst}, store=str(tmp_path / "as"),
                  store_keys='max_segment_age = "1s"')  # fmt: skip
    produce(source_broker.bootstrap, src, records(30, 3))
    stop = threading.Event()
    runner = backup_job(load_config(conf), stop_at_end=False, stop_event=stop, metrics=Metrics())
    segments: list[Path] = []

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(segments) < 3:
            segments[:] = list((tmp_path / "as").rglob("*.parquet"))
            time.sleep(0.2)
        stop.set()  # no record came after the first 30: the age alone closed the segments

    threading.Thread(target=watch, daemon=True).start()
    with runner:
        runner.prepare()
        runner.run()
    assert len(segments) == 3
    assert runner.summary.relayed == 30


def test_compaction_merges_verifies_and_survives_a_crash_between_write_and_delete(
    source_broker, target_broker, topics, conf, spark, tmp_path
):
    src, dst = topics
    produce(source_broker.bootstrap, src, records(900, 3))
    backup(conf)  # 70-record segments: 5 per partition
    cfg = load_config(conf, needs=frozenset({"store"}))
    small = len(list((tmp_path / "store").rglob("*.parquet")))

    # Without --delete: merged segments and their inputs side by side, as after a crash
    # between writing the merged segment and deleting the inputs.
    kept = run_on(CompactPipeline(cfg, CompactOptions(level=0, min_age=0.0, delete=False)), spark)
    assert kept.merged == 3 and kept.inputs == small and kept.deleted == 0
    summary, _ = restore(conf, create_topics=True)
    assert summary.relayed == 900  # nothing replayed twice
    assert_same(read_all(source_broker.bootstrap, src), read_all(target_broker.bootstrap, dst))

    cleaned = run_on(CompactPipeline(cfg, CompactOptions(level=0, min_age=0.0, delete=True)), spark)
    assert cleaned.deleted == small  # the leftovers, checked against their merged segment
    assert len(list((tmp_path / "store").rglob("*.parquet"))) == 3
    assert {p.parent.name for p in (tmp_path / "store").rglob("*.parquet")} == {"1"}


def test_follow_mode_waits_for_a_late_segment(
    source_broker, target_broker, topics, conf, spark, tmp_path
):
    src, dst = topics
    produce(source_broker.bootstrap, src, records(630, 3))
    backup(conf)  # 3 segments per partition; the followed store gets the 2nd ones late
    followed = tmp_path / "followed"
    segments = sorted((tmp_path / "store").rglob("*.parquet"))
    late = [s for s in segments if s.name.startswith("0" * 18 + "70-")]  # each 2nd segment
    assert len(late) == 3
    for segment in segments:
        if segment not in late:
            place(segment, tmp_path / "store", followed)
    follow_conf = conf.with_name("f.toml")
    text = conf.read_text().replace(str(tmp_path / "store"), str(followed))
    follow_conf.write_text(text + 'follow_interval = "300ms"\nlate_segment_timeout = "1m"\n')
    stop = threading.Event()
    options = RestoreOptions(follow=True, create_topics=True)
    runner = restore_job(
        load_config(follow_conf), stop_at_end=False, stop_event=stop, metrics=Metrics(),
        options=options,
    )  # fmt: skip

    def land_late_then_stop() -> None:
        wait(lambda: record_count(target_broker.bootstrap, dst) == 3 * 70, 60)
        time.sleep(2)  # the hole is there: restore waits, writes nothing more
        assert record_count(target_broker.bootstrap, dst) == 3 * 70
        for segment in late:
            place(segment, tmp_path / "store", followed)
        wait(lambda: record_count(target_broker.bootstrap, dst) == 630, 60)
        stop.set()

    thread = threading.Thread(target=land_late_then_stop, daemon=True)
    thread.start()
    with runner:
        runner.prepare()
        runner.run()
    thread.join(5)
    assert_same(read_all(source_broker.bootstrap, src), read_all(target_broker.bootstrap, dst))


def place(segment: Path, root: Path, into: Path) -> None:
    """Copy a segment into another store the way a writer would: complete, then renamed."""
    final = into / segment.relative_to(root)
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = final.with_name(".incoming-" + final.name)
    shutil.copy(segment, temp)
    temp.rename(final)


def wait(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)

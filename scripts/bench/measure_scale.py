"""Thousands of partitions in one process: N topics of 5 partitions each (400 topics: 2,000
partitions), every contender copying all of them, whole process, every record checked.

ktm gets the topics as `[topics]` entries; the loops get the same pairs (scripts/bench/loops.py
--pairs). The source topics are made once per case and shared by the contenders; each contender
copies into destination topics of its own, deleted afterwards (Tansu keeps all in memory). A
last ktm row gets the topics from a `[discover]` pattern instead and creates their copies."""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from relay import internals
from scripts.bench import report
from scripts.bench.brokers import Cluster, KafkaPair
from scripts.bench.contenders import LABELS, Bench, Ktm, Loop, runnable, unique
from scripts.bench.data import fingerprint, record_fields
from scripts.bench.machine import load_average
from scripts.bench.options import Options
from scripts.bench.processes import Finished
from scripts.bench.report import Table
from testbed.topics import create_topics

PARTITIONS = 5  # per topic
STALL_S = 60

Digest = dict[tuple[str, int], tuple[int, str]]


@dataclass
class Topics:
    names: list[str]
    records: int
    expected: Digest


@contextmanager
def many_topics(bootstrap: str, prefix: str, count: int) -> Iterator[list[str]]:
    tag = uuid.uuid4().hex[:6]  # one per call: a pattern names these topics and no others
    names = [f"{prefix}-{tag}-{i:05d}" for i in range(count)]
    create_topics(bootstrap, names, PARTITIONS)
    with deleted_after(bootstrap, names):
        yield names


@contextmanager
def deleted_after(bootstrap: str, names: list[str]) -> Iterator[list[str]]:
    """`names` (made by the caller, or by ktm as it copies), deleted when the block ends."""
    try:
        yield names
    finally:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=60_000)
        try:
            admin.delete_topics(names)
        except Exception as exc:  # noqa: BLE001 - only broker memory is at stake
            print(f"  (could not delete {len(names)} topics: {type(exc).__name__})")
        finally:
            admin.close()


def produce_spread(bootstrap: str, topics: list[str], records: int, size: int) -> None:
    """`records` records spread round-robin over every partition of every topic (record `seq`
    to partition `seq % partitions`, numbered across the topics), fed a slice of topics at a
    time: one kafka-python producer writing to 10,000 partitions walks all of them on every
    loop of its I/O thread, and on Apache Kafka let its batches expire (1M records)."""
    base_ms = int(time.time() * 1000) - records
    total = len(topics) * PARTITIONS
    for first in range(0, len(topics), FEED_TOPICS):
        names = topics[first : first + FEED_TOPICS]
        slots = range(first * PARTITIONS, (first + len(names)) * PARTITIONS)
        sends = (
            (names[slot // PARTITIONS - first], slot % PARTITIONS, turn + slot)
            for turn in range(0, records, total)
            for slot in slots
            if turn + slot < records
        )
        _feed(bootstrap, names, sends, base_ms, size)


FEED_TOPICS = 200  # topics one feeding producer writes to


def _feed(
    bootstrap: str,
    topics: list[str],
    sends: Iterator[tuple[str, int, int]],
    base_ms: int,
    size: int,
) -> None:
    """Record `seq` to each (topic, partition, seq) of `sends`, all in `topics`."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    # every topic's metadata in one request: kafka-python alone waits for each new topic in
    # turn (2,000 topics on Apache Kafka: 8 minutes)
    internals.know_topics(producer, topics)
    errors: list[BaseException] = []
    try:
        for topic, partition, seq in sends:
            fields = record_fields(seq, size, PARTITIONS)
            fields["partition"] = partition
            producer.send(topic, timestamp_ms=base_ms + seq, **fields).add_errback(errors.append)
        producer.flush()
    finally:
        producer.close()
    if errors:
        raise RuntimeError(f"{len(errors)} records not acknowledged: {errors[0]!r}")


def digest_topics(bootstrap: str, topics: list[str]) -> Digest:
    """Every record of every partition of `topics`, hashed in order, read to the real end, a
    slice of topics at a time: one kafka-python consumer assigned 10,000 partitions was seen
    to get nothing in 60 s from Tansu."""
    digest: Digest = {}
    for first in range(0, len(topics), DIGEST_TOPICS):
        digest.update(_digest_slice(bootstrap, topics[first : first + DIGEST_TOPICS]))
    return digest


DIGEST_TOPICS = 200  # topics one reading consumer is assigned at a time


def _digest_slice(bootstrap: str, topics: list[str]) -> Digest:
    tps = [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)]
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             max_poll_records=50_000, fetch_max_wait_ms=100)  # fmt: skip
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    hashes = {(tp.topic, tp.partition): hashlib.blake2b(digest_size=16) for tp in tps}
    counts = dict.fromkeys(hashes, 0)
    try:
        stalled_at = time.monotonic() + STALL_S
        while not all(
            consumer.highwater(tp) is not None and consumer.position(tp) >= consumer.highwater(tp)
            for tp in tps
        ):
            if time.monotonic() > stalled_at:
                raise TimeoutError(f"reading {len(topics)} topics stalled for {STALL_S} s")
            for tp, batch in consumer.poll(timeout_ms=200).items():
                for record in batch:
                    hashes[(tp.topic, tp.partition)].update(fingerprint(record))
                    counts[(tp.topic, tp.partition)] += 1
                stalled_at = time.monotonic() + STALL_S
    finally:
        consumer.close()
    return {key: (counts[key], hashes[key].hexdigest()) for key in hashes}


def verdict(expected: Digest, got: Digest, mapping: dict[str, str]) -> str:
    renamed = {(mapping[t], p): value for (t, p), value in expected.items()}
    if got == renamed:
        return "ok"
    extra = sum(c for c, _ in got.values()) - sum(c for c, _ in renamed.values())
    bad = sum(1 for key in renamed if got.get(key) != renamed[key])
    return f"WRONG: {bad} partitions differ, {extra:+d} records"


def fresh_target(bench: Bench) -> None:
    """An empty destination broker on the same port (the loopback pairs only)."""
    if isinstance(bench.cluster, Cluster | KafkaPair):
        bench.cluster.fresh_target()


def fresh_source(bench: Bench) -> None:
    """An empty source broker for each case and repeat (the loopback pairs only): every one
    starts from the same broker state, and Apache Kafka's open files stay within the limit."""
    if isinstance(bench.cluster, Cluster | KafkaPair):
        bench.cluster.fresh_source()


def copy_many(
    bench: Bench, kind: str, source: Topics, opts: Options, discover: bool = False
) -> tuple[Finished | None, dict[str, Any], str]:
    """One contender copies every source topic into destination topics of its own, on an
    empty destination broker: Tansu (memory storage) slowed from copy to copy even with each
    copy's topics deleted (its CPU for the same 1.2M-record copy grew from 2.3 to 8.5 s over
    three copies), which made the order of the contenders part of the result. `discover`
    (ktm): the topics are named by a `[discover]` pattern, and ktm creates their copies."""
    fresh_target(bench)
    if discover:
        made = deleted_after(bench.cluster.dst, source.names)
    else:
        made = many_topics(bench.cluster.dst, f"scale-{kind}", len(source.names))
    with made as targets:
        mapping = dict(zip(source.names, targets, strict=True))
        partitions = len(targets) * PARTITIONS
        print(f"  {label(kind, discover)}: copying {source.records:,} records of {partitions:,} "
              f"partitions (load average {load_average()}) ...", flush=True)  # fmt: skip
        if kind == "ktm":
            # names are PREFIX-TAG-NNNNN (many_topics): the pattern matches these and no others
            pattern = re.escape(source.names[0].rsplit("-", 1)[0]) + "-.*" if discover else None
            proc: Ktm | Loop = Ktm(bench, "", "", stop_at_end=True, routes=mapping,
                                   discover=pattern)  # fmt: skip
        else:
            pairs = bench.workdir / f"{unique('pairs')}.json"
            pairs.write_text(json.dumps([[s, t, PARTITIONS] for s, t in mapping.items()]))
            proc = Loop(kind, bench, ("", ""), 0, follow=False, pairs=pairs)
        with proc:
            finished = proc.wait(900)
        summary = (proc.summary() or {}) if isinstance(proc, Ktm) else {}
        if finished.returncode != 0:
            return finished, summary, f"FAILED: exit {finished.returncode}"
        return (
            finished,
            summary,
            verdict(source.expected, digest_topics(bench.cluster.dst, targets), mapping),
        )


def label(kind: str, discover: bool) -> str:
    return "ktm, topics by [discover] pattern" if discover else LABELS[kind]


HEADERS = ["topics", "partitions", "records", "contender", "seconds", "records/s",
           "loop s / this s", "first record s", "peak RSS MB", "CPU s", "CPU µs/record",
           "copy check"]  # fmt: skip


def scale(bench: Bench, opts: Options) -> Table:
    table = Table(f"SCALE: topics of {PARTITIONS} partitions, {opts.size} B values", list(HEADERS))
    table.notes.append(
        "seconds = whole process, launch to exit; first record = ktm's --summary-json (from "
        "launch to the first record the destination acknowledged); RSS summed over the process "
        "tree. Every partition of every destination topic is read back and compared in order."
    )
    for topics, records in opts.scale_cases:
        print(f"\n[scale] {topics} topics x {PARTITIONS} partitions, {records:,} records")
        fresh_source(bench)
        with many_topics(bench.cluster.src, "scale-src", topics) as names:
            began = time.monotonic()
            produce_spread(bench.cluster.src, names, records, opts.size)
            source = Topics(names, records, digest_topics(bench.cluster.src, names))
            print(f"  source ready in {time.monotonic() - began:.1f} s (not timed)", flush=True)
            loop_wall = None
            kinds = [(k, False) for k in runnable(opts.contenders) if k != "naive"][::-1]
            kinds += [("ktm", True)] if "ktm" in opts.contenders else []
            for kind, discover in kinds:
                finished, summary, check = copy_many(bench, kind, source, opts, discover)
                wall = finished.wall if finished and check == "ok" else None
                loop_wall = wall if kind != "ktm" else loop_wall
                versus = report.ratio(loop_wall, wall) if kind == "ktm" else report.NA
                table.add(
                    topics, topics * PARTITIONS, f"{records:,}", label(kind, discover),
                    report.seconds(wall),
                    report.rate(records, wall), versus,
                    report.seconds(summary.get("first_record")),
                    report.megabytes(finished.peak_rss if finished else None),
                    report.seconds(finished.cpu_seconds if finished else None),
                    report.per_record_us(finished.cpu_seconds if finished else None, records),
                    check,
                )  # fmt: skip
    return table

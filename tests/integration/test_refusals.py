"""What an Apache Kafka destination refuses for good, as `ktm relay` meets it: a record whose
timestamp is out of the destination topic's limits (message.timestamp.after/before.max.ms,
INVALID_TIMESTAMP) and a record without a key for a compacted destination (INVALID_RECORD).
Tansu checks neither, so these run on Apache Kafka only.

The refused record's partition halts there: one ERROR line naming it and the broker's rule,
everything before it relayed and committed, the other partitions relayed in full.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from testbed.ktm_process import ktm, metric_total, run_ktm, wait_for
from testbed.ports import free_port
from testbed.records import Record, produce, read_all
from testbed.topics import create_topic, unique_topic
from tests.support.relay import assert_exact_copy, committed_offsets, write_config

pytestmark = [pytest.mark.timeout(240), pytest.mark.brokers("kafka")]

HOUR_MS = 3_600_000
ANY_TIME = {"message.timestamp.after.max.ms": str((1 << 63) - 1)}
GROUP = "ktm"  # [app].group_id's default: where the relay commits on the source


def create_with_configs(bootstrap: str, name: str, partitions: int, configs: dict) -> str:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs)])
    finally:
        admin.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the metadata shows it a moment later
        if read_all(bootstrap, name, timeout=2) == {p: [] for p in range(partitions)}:
            return name
        time.sleep(0.1)
    return name


def halted_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " ERROR " in line and "halted source" in line]


def test_a_refused_record_halts_its_partition_and_the_others_are_relayed(
    source_broker: Any, target_broker: Any, tmp_path: Path
) -> None:
    """(A) a timestamp 3 h ahead into a topic allowing 1 h ahead, and (B) a null key into a
    compacted topic, in one --stop-at-end run: exit 1 naming both, each halted partition copied
    up to its refused record, every other partition exact."""
    now = int(time.time() * 1000)
    # the source takes any timestamp (Kafka 4's default allows one hour ahead)
    src = create_with_configs(source_broker.bootstrap, unique_topic("ahead-src"), 2, ANY_TIME)
    bsrc = create_topic(source_broker.bootstrap, unique_topic("nokey-src"), partitions=2)
    dst = create_with_configs(
        target_broker.bootstrap, unique_topic("ahead-dst"), 2,
        {"message.timestamp.after.max.ms": str(HOUR_MS)},
    )  # fmt: skip
    bdst = create_with_configs(
        target_broker.bootstrap, unique_topic("nokey-dst"), 2, {"cleanup.policy": "compact"}
    )
    good = [Record(key=f"k{i}", value=f"v{i}", partition=i % 2, timestamp_ms=now - 60_000 + i)
            for i in range(40)]  # fmt: skip
    # partition 0: offsets 0-9 good, 10 three hours ahead, 11-19 good; partition 1: 20 good
    ahead = Record(key="late", value="ahead", partition=0, timestamp_ms=now + 3 * HOUR_MS)
    produce(source_broker.bootstrap, src, good[:20] + [ahead] + good[20:], linger_ms=50)
    # partition 1: offsets 0-6 keyed, 7 without a key, 8-19 keyed; partition 0: 20 keyed
    nokey = Record(key=None, value="no key", partition=1, timestamp_ms=now)
    produce(source_broker.bootstrap, bsrc, good[:15] + [nokey] + good[15:], linger_ms=50)

    conf = write_config(
        tmp_path / "config.toml", source=source_broker.bootstrap,
        target=target_broker.bootstrap, topics={src: dst, bsrc: bdst},
    )  # fmt: skip
    summary_path = tmp_path / "summary.json"
    # a fresh node's group coordinator loads for a moment; the config's retries are short
    assert committed_offsets(source_broker.bootstrap, GROUP, src, 2) == {0: None, 1: None}
    run = run_ktm(
        tmp_path, "--config", str(conf), "--stop-at-end", "--summary-json", str(summary_path),
        timeout=200,
    )  # fmt: skip

    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    (error,) = run.error_lines()
    assert "2 partition(s) halted" in error
    assert f"{src}[0] at offset 10 (-> {dst}[0])" in error
    assert f"{bsrc}[1] at offset 7 (-> {bdst}[1])" in error
    lines = halted_lines(run.stderr)
    assert len(lines) == 2, run.stderr  # one ERROR line each, once
    (timestamp_line,) = [line for line in lines if src + "[0]" in line]
    assert " ERROR " in timestamp_line
    assert f"halted source partition {src}[0] at offset 10" in timestamp_line
    assert f"message.timestamp.after.max.ms = {HOUR_MS} on destination topic {dst}" in (
        timestamp_line
    )
    assert f"record timestamp {now + 3 * HOUR_MS}" in timestamp_line
    assert "InvalidTimestampError" in timestamp_line
    (key_line,) = [line for line in lines if bsrc + "[1]" in line]
    assert f"halted source partition {bsrc}[1] at offset 7" in key_line
    assert f"cleanup.policy=compact on destination topic {bdst} (the record has a null key)" in (
        key_line
    )

    source, copied = read_all(source_broker.bootstrap, src), read_all(target_broker.bootstrap, dst)
    assert_exact_copy({0: source[0][:10], 1: source[1]}, copied[0] + copied[1], src)
    bsource = read_all(source_broker.bootstrap, bsrc)
    bcopied = read_all(target_broker.bootstrap, bdst)
    assert_exact_copy({0: bsource[0], 1: bsource[1][:7]}, bcopied[0] + bcopied[1], bsrc)
    # the halted partitions are committed up to the refused record; the others' commits are
    # best effort (a commit after the last round may not have happened: the destination's
    # provenance, checked above, is the truth), never past their end
    assert committed_offsets(source_broker.bootstrap, GROUP, src, 2)[0] == 10
    assert committed_offsets(source_broker.bootstrap, GROUP, bsrc, 2)[1] == 7
    assert committed_offsets(source_broker.bootstrap, GROUP, src, 2)[1] in (None, 20)

    summary = json.loads(summary_path.read_text())
    halted = {(h["source_topic"], h["source_partition"]): h for h in summary["halted"]}
    assert set(halted) == {(src, 0), (bsrc, 1)}
    assert halted[(src, 0)]["offset"] == 10 and halted[(src, 0)]["target_topic"] == dst
    assert "message.timestamp.after.max.ms" in halted[(src, 0)]["reason"]
    assert halted[(bsrc, 1)]["offset"] == 7
    assert summary["next_offsets"][f"{src}/0"] == 10
    assert summary["next_offsets"][f"{src}/1"] == 20


def health(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())
    except OSError:
        return 0, {}


def test_without_stop_at_end_a_halted_partition_shows_and_the_others_go_on(
    source_broker: Any, target_broker: Any, tmp_path: Path
) -> None:
    """A record older than the destination's message.timestamp.before.max.ms: the partition
    halts (metric, /healthz), is not retried, and the other partition keeps being relayed."""
    now = int(time.time() * 1000)
    src = create_topic(source_broker.bootstrap, unique_topic("old-src"), partitions=2)
    dst = create_with_configs(
        target_broker.bootstrap, unique_topic("old-dst"), 2,
        {"message.timestamp.before.max.ms": str(24 * HOUR_MS)},
    )  # fmt: skip
    records = [Record(value=f"v{i}", partition=0, timestamp_ms=now - 1000 + i) for i in range(5)]
    records.append(Record(value="two days old", partition=0, timestamp_ms=now - 48 * HOUR_MS))
    records += [
        Record(value=f"w{i}", partition=p, timestamp_ms=now) for i in range(8) for p in (0, 1)
    ]
    produce(source_broker.bootstrap, src, records)

    port = free_port()
    conf = write_config(
        tmp_path / "config.toml", source=source_broker.bootstrap,
        target=target_broker.bootstrap, topics={src: dst}, app=f'metrics_addr = "127.0.0.1:{port}"',
    )  # fmt: skip
    with ktm(tmp_path, "--config", str(conf)) as process:
        wait_for(lambda: (metric_total(port, "ktm_partitions_halted") or 0) >= 1, 150,
                 "the partition halted", process)  # fmt: skip
        code, detail = health(port)
        assert code == 503 and "partition(s) halted" in detail["reason"], detail
        assert detail["halted"][0]["offset"] == 5 and detail["halted"][0]["source_partition"] == 0
        # the other partition goes on: records produced now are relayed
        produce(
            source_broker.bootstrap, src, [Record(value="later", partition=1, timestamp_ms=now)]
        )

        def caught_up() -> bool:
            return len(read_all(target_broker.bootstrap, dst, timeout=2).get(1, [])) == 9

        wait_for(caught_up, 60, "partition 1 relayed in full", process)
        rounds = metric_total(port, "ktm_rounds_total")
        time.sleep(3)  # a halted partition is not retried: no round ends meanwhile
        assert metric_total(port, "ktm_rounds_total") == rounds
        process.signal_group(2)  # SIGINT: a clean stop
        finished = process.wait(60)
    assert finished.returncode == 0, finished.stderr
    lines = halted_lines(finished.stderr)
    assert len(lines) == 1, finished.stderr
    assert f"{src}[0] at offset 5" in lines[0]
    assert (
        f"message.timestamp.before.max.ms = {24 * HOUR_MS} on destination topic {dst}" in (lines[0])
    )
    source, copied = read_all(source_broker.bootstrap, src), read_all(target_broker.bootstrap, dst)
    assert_exact_copy({0: source[0][:5], 1: source[1]}, copied[0] + copied[1], src)


def test_a_restore_halts_the_same_way(
    source_broker: Any, target_broker: Any, spark: Any, tmp_path: Path
) -> None:
    """Restore writes to Kafka too: a stored record without a key, restored into a compacted
    destination, halts its partition there; the rest is restored."""
    from tests.support.inprocess import backup, restore

    now = int(time.time() * 1000)
    src = create_topic(source_broker.bootstrap, unique_topic("rs-src"), partitions=2)
    dst = create_with_configs(
        target_broker.bootstrap, unique_topic("rs-dst"), 2, {"cleanup.policy": "compact"}
    )
    keyed = [
        Record(key=f"k{i}", value=f"v{i}", partition=i % 2, timestamp_ms=now) for i in range(16)
    ]
    nokey = Record(key=None, value="no key", partition=1, timestamp_ms=now)
    produce(source_broker.bootstrap, src, keyed[:8] + [nokey] + keyed[8:])  # partition 1: offset 4
    conf = write_config(
        tmp_path / "config.toml", source=source_broker.bootstrap,
        target=target_broker.bootstrap, topics={src: dst},
        extra=f'\n[store]\nurl = "{tmp_path / "store"}"\n',
    )  # fmt: skip
    backup(conf)
    summary, _ = restore(conf)

    assert [(h["source_partition"], h["offset"]) for h in summary.halted] == [(1, 4)]
    assert "cleanup.policy=compact" in str(summary.halted[0]["reason"])
    source, copied = read_all(source_broker.bootstrap, src), read_all(target_broker.bootstrap, dst)
    assert [r.value for r in copied[0]] == [r.value for r in source[0]]
    assert [r.value for r in copied[1]] == [r.value for r in source[1][:4]]

"""`ktm check`: validates, connects, checks topics, prints the plan, relays nothing."""

from __future__ import annotations

import pytest

from testbed.ktm_process import Finished, assert_one_error_line
from testbed.records import Record, produce, read_all
from testbed.topics import create_topic, unique_topic
from tests.support.relay import topic_pair, write_config

pytestmark = [pytest.mark.timeout(120), pytest.mark.brokers("tansu", "kafka")]


def check(tmp_path, config) -> Finished:
    import subprocess
    import sys
    import time

    began = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from relay.cli import main; main()",
            "check",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
    )
    return Finished(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - began)


def test_check_prints_the_plan_and_relays_nothing(source_broker, target_broker, tmp_path):
    src, dst = topic_pair(source_broker.bootstrap, target_broker.bootstrap, "chk", 2)
    produce(source_broker.bootstrap, src, [Record(value=b"x", partition=i % 2) for i in range(30)])
    config = write_config(
        tmp_path / "c.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={src: dst},
        source_name="dc1",
    )
    run = check(tmp_path, config)
    assert run.returncode == 0, run.stderr
    assert "ok; source node: dc1 (read_committed)" in run.stdout
    assert f"{src}[0] -> {dst}[0]: from offset 0, end 15, lag 15" in run.stdout
    assert f"{src}[1] -> {dst}[1]: from offset 0, end 15, lag 15" in run.stdout
    assert "2 partitions, 30 records to relay; nothing was relayed" in run.stdout
    assert f"fetch from source dc1 ({source_broker.bootstrap}): 2 partitions answered in" in (
        run.stdout
    )
    assert "group ktm.relay: no ktm process runs on this config now" in run.stdout
    assert all(not records for records in read_all(target_broker.bootstrap, dst).values())


def test_check_exit_codes(source_broker, target_broker, tmp_path):
    src = create_topic(source_broker.bootstrap, unique_topic("chk-src"), partitions=1)
    missing = write_config(
        tmp_path / "m.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={src: unique_topic("nope")},
    )
    assert_one_error_line(check(tmp_path, missing), 1, "does not exist")
    bad = tmp_path / "bad.toml"
    bad.write_text(missing.read_text() + "\n[app2]\n")
    assert_one_error_line(check(tmp_path, bad), 2, "app2: unknown key")


def test_check_shows_what_patterns_match_what_would_be_created_and_the_groups_carried(
    source_broker, target_broker, spark, tmp_path
):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    from testbed.topics import describe_topic
    from tests.support.inprocess import relay_once

    src, dst = topic_pair(source_broker.bootstrap, target_broker.bootstrap, "chk-g", 2)
    produce(source_broker.bootstrap, src, [Record(value=b"x", partition=i % 2) for i in range(30)])
    found = create_topic(source_broker.bootstrap, unique_topic("chk-found"), partitions=3)
    group = unique_topic("chk-consumers")
    config = write_config(
        tmp_path / "c.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={src: dst},
        extra=(
            f'create_topics = true\n\n[discover]\ninclude = ["{found}"]\n\n'
            f'[groups]\ninclude = ["{group}"]\n'
        ),
    )
    relay_once(write_config(tmp_path / "only.toml", source=source_broker.bootstrap,
                            target=target_broker.bootstrap, topics={src: dst}))  # fmt: skip
    consumer = KafkaConsumer(bootstrap_servers=source_broker.bootstrap, group_id=group)
    consumer.commit({TopicPartition(src, 0): OffsetAndMetadata(5, "", -1),
                     TopicPartition(src, 1): OffsetAndMetadata(15, "", -1)})  # fmt: skip
    consumer.close(autocommit=False)
    run = check(tmp_path, config)
    assert run.returncode == 0, run.stderr
    assert f"[discover] matches 1 topic(s) today: {found} -> {found}" in run.stdout
    assert f"would create {found}: 3 partitions, replication factor -1" in run.stdout
    assert "[groups] carries 1 group(s) today" in run.stdout
    assert f"{src}[0]@5 -> {dst}[0]@5 (the target has no offset yet; end 15)" in run.stdout
    assert f"{src}[1]@15 -> {dst}[1]@15 (the target has no offset yet; end 15)" in run.stdout
    assert describe_topic(target_broker.bootstrap, found) is None  # a check creates nothing

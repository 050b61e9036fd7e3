"""Destination topics `ktm relay` creates (`[target].create_topics = true`) take their source
topic's configs as MirrorMaker 2 copies them, on brokers that describe configs (Apache Kafka;
Tansu describes none): only those set on the source topic, less `config_exclude` and what the
target does not know; a config the target refuses is one line (exit 2), never a traceback.
Kafka 4.0 removed some topic configs and raised segment.bytes' minimum to 1 MiB: a 3.9 source
copied into a 4.x target meets both.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, NewTopic

from relay.clients import admin
from relay.config import ClusterConfig
from testbed.ktm_process import assert_one_error_line, run_ktm
from testbed.records import Record, produce, read_all
from testbed.topics import describe_topic, unique_topic
from tests.support.relay import assert_exact_copy, write_config

pytestmark = [pytest.mark.timeout(200), pytest.mark.brokers("kafka")]

CREATE = "create_topics = true"


def create_with_configs(bootstrap: str, name: str, configs: dict[str, str]) -> str:
    client = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        client.create_topics([NewTopic(name, 2, 1, topic_configs=configs)])
    finally:
        client.close()
    deadline = time.monotonic() + 10
    while describe_topic(bootstrap, name) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return name


def set_on_topic(bootstrap: str, topic: str) -> dict[str, str]:
    """The configs set on `topic` itself (DescribeConfigs, source DYNAMIC_TOPIC_CONFIG), read
    with kafka-python, not with the code under test."""
    client = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = client.describe_configs([ConfigResource("TOPIC", topic)], config_filter="all")
    finally:
        client.close()
    configs = described["topic"][topic]
    return {
        name: str(data["value"])
        for name, data in configs.items()
        if data.get("config_source") == "DYNAMIC_TOPIC_CONFIG"
    }


def relay_creating(tmp_path: Path, source: Any, target: Any, src: str, dst: str,
                   extra: str = "") -> Any:  # fmt: skip
    conf = write_config(
        tmp_path / f"{dst}.toml", source=source.bootstrap, target=target.bootstrap,
        topics={src: dst}, extra=f"{CREATE}\n{extra}",
    )  # fmt: skip
    return run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", timeout=150)


def test_a_created_topic_takes_the_configs_set_on_its_source_less_the_excluded(
    source_broker: Any, target_broker: Any, tmp_path: Path
) -> None:
    copied = {
        "retention.ms": "86400000000",
        "cleanup.policy": "compact,delete",
        "max.message.bytes": "2000000",
        "segment.bytes": "2097152",
    }
    excluded = {
        "min.insync.replicas": "1",  # MirrorMaker 2's list: the target's own decisions
        "unclean.leader.election.enable": "true",
        "message.timestamp.type": "CreateTime",
        "local.retention.ms": "3600000",  # tiered storage: the target's
    }
    src = create_with_configs(source_broker.bootstrap, unique_topic("cfg-src"),
                              {**copied, **excluded})  # fmt: skip
    produce(source_broker.bootstrap, src, [Record(key=f"k{i}", value="v", partition=i % 2)
                                            for i in range(10)])  # fmt: skip
    # ktm reads what is set on the source topic as the broker does: nothing else
    cluster = ClusterConfig("src", (source_broker.bootstrap,))
    assert admin.topic_configs(cluster, [src], 10.0, set_only=True) == {src: {**copied, **excluded}}

    dst = unique_topic("cfg-dst")
    run = relay_creating(tmp_path, source_broker, target_broker, src, dst)
    assert run.returncode == 0, run.stderr

    assert set_on_topic(target_broker.bootstrap, dst) == copied
    source = read_all(source_broker.bootstrap, src)
    copy = read_all(target_broker.bootstrap, dst)
    assert_exact_copy(source, copy[0] + copy[1], src)


def test_a_3_9_topic_copied_into_4_x_leaves_out_what_4_x_removed_and_names_what_it_refuses(
    request: pytest.FixtureRequest, target_broker: Any, tmp_path: Path
) -> None:
    pool = request.getfixturevalue("kafka_pool")
    source = pool.lease("kafka39", "source39")
    try:
        src = create_with_configs(source.bootstrap, unique_topic("cfg39-src"), {
            "retention.ms": "86400000000",
            "message.format.version": "3.0",  # removed in Kafka 4.0
            "message.downconversion.enable": "false",  # removed in Kafka 4.0
            "message.timestamp.difference.max.ms": "86400000",  # removed in Kafka 4.0
            "segment.bytes": "524288",  # 3.9 takes it; 4.x's minimum is 1 MiB
        })  # fmt: skip

        refused_dst = unique_topic("cfg39-refused")
        run = relay_creating(tmp_path, source, target_broker, src, refused_dst)
        line = assert_one_error_line(
            run, 2, f"destination topic '{refused_dst}' refuses config segment.bytes = 524288",
            '[target].config_exclude (add "segment.bytes")',
        )  # fmt: skip
        assert "InvalidConfigurationError" in line
        assert describe_topic(target_broker.bootstrap, refused_dst) is None

        # Without the default exclusions the keys 4.x removed are left out all the same: the
        # target does not know them (one debug line each).
        dst = unique_topic("cfg39-dst")
        run = relay_creating(tmp_path, source, target_broker, src, dst,
                             'config_exclude = ["segment.bytes"]')  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert set_on_topic(target_broker.bootstrap, dst) == {"retention.ms": "86400000000"}
    finally:
        pool.give_back(source)

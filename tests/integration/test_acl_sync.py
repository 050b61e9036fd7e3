"""Topic ACLs copied (`[acls]`) and topic configs kept in step (`[target].config_sync`) while
relaying, on Apache Kafka 4.x with the standard authorizer on: a source and a target cluster
for the module, where ktm (PLAINTEXT: User:ANONYMOUS) is a super user and ACLs for other
principals are created and read with kafka-python, never with the code under test.

The rules (relay.pipelines.relay.acl_sync): READ and DESCRIBE copied, ALL as READ, WRITE not;
DENY copied (ALL as READ and DESCRIBE); literal names follow `[topics]`, prefixes follow
`[discover].rename`; principals chosen by `[acls].principals`/`exclude`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    AlterConfigOp,
    ConfigResource,
    NewTopic,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from testbed.kafka import KafkaCluster, KafkaUnavailable
from testbed.records import Record, produce
from testbed.topics import wait_until
from tests.support.inprocess import Background
from tests.support.kafka_pool import POOL_SETTINGS, KafkaLease
from tests.support.relay import committed_offsets, write_config

pytestmark = [pytest.mark.timeout(120), pytest.mark.brokers("kafka")]

AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",
    **POOL_SETTINGS,  # the relay's 2 s group session
}
Acl = tuple[str, str, str, str, str]  # (pattern, name, principal, operation, permission)


@dataclass(frozen=True)
class World:
    source: KafkaCluster
    target: KafkaCluster
    config: Path
    orders: str  # a [topics] route, renamed to orders + "-copy"
    prefix: str  # [discover] takes the topics beginning with it, renamed "east.{topic}"


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KafkaCluster, ...]]:
    started: list[KafkaCluster] = []
    try:
        for name in ("acl-source", "acl-target"):
            cluster = KafkaCluster(name, settings=AUTHORIZER,
                                   log_dir=tmp_path_factory.mktemp(name))  # fmt: skip
            started.append(cluster)
            cluster.start()
    except KafkaUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Apache Kafka is needed under CI: {exc}")
        pytest.skip(f"Apache Kafka cannot be had here: {exc}")
    try:
        yield tuple(started)
    finally:
        for cluster in started:
            cluster.remove()


def acl(pattern: str, name: str, principal: str, operation: str, permission: str = "ALLOW") -> ACL:
    resource = ResourcePattern(ResourceType.TOPIC, name, ACLResourcePatternType[pattern])
    return ACL(principal, "*", ACLOperation[operation], ACLPermissionType[permission], resource)


def add_acls(bootstrap: str, acls: list[ACL]) -> None:
    client = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        answer = client.create_acls(acls)
    finally:
        client.close()
    assert not answer["failed"], answer


def topic_acls(bootstrap: str) -> set[Acl]:
    wanted = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                       ResourcePatternFilter(ResourceType.TOPIC, None,
                                             ACLResourcePatternType.ANY))  # fmt: skip
    client = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        found, _ = client.describe_acls(wanted)
    finally:
        client.close()
    return {
        (a.resource_pattern.pattern_type.name, a.resource_pattern.resource_name, a.principal,
         a.operation.name, a.permission_type.name)
        for a in found
    }  # fmt: skip


def set_on_topic(bootstrap: str, topic: str) -> dict[str, str]:
    client = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = client.describe_configs([ConfigResource("TOPIC", topic)], config_filter="all")
    finally:
        client.close()
    return {
        name: str(data["value"])
        for name, data in described["topic"][topic].items()
        if data.get("config_source") == "DYNAMIC_TOPIC_CONFIG"
    }


@pytest.fixture(scope="module")
def world(clusters: tuple[KafkaCluster, ...], tmp_path_factory: pytest.TempPathFactory) -> World:
    source, target = clusters
    uid = uuid.uuid4().hex[:6]
    orders, prefix = f"acl-{uid}-orders", f"pfx{uid}."
    client = KafkaAdminClient(bootstrap_servers=source.bootstrap)
    try:
        client.create_topics([
            NewTopic(orders, 1, 1, topic_configs={"retention.ms": "86400000",
                                                  "max.message.bytes": "2000000"}),
            NewTopic(prefix + "eu", 1, 1),
            NewTopic(f"acl-{uid}-unrelated", 1, 1),
        ])  # fmt: skip
        # a SCRAM user on the source that the target lacks (its ACLs are copied all the same)
        client.alter_user_scram_credentials(
            [UserScramCredentialUpsertion("reader", ScramMechanism.SCRAM_SHA_256, "secret")]
        )
    finally:
        client.close()
    for topic in (orders, prefix + "eu"):
        produce(source.bootstrap, topic, [Record(value=b"v") for _ in range(3)])
    # the group coordinators of fresh clusters take a moment to load (seconds on a busy
    # machine): ktm check and the relay ask them at once, with short retries
    committed_offsets(source.bootstrap, "ktm", orders, 1)
    committed_offsets(target.bootstrap, "ktm.relay", orders, 1)
    add_acls(source.bootstrap, [
        acl("LITERAL", orders, "User:reader", "READ"),
        acl("LITERAL", orders, "User:describer", "DESCRIBE"),
        acl("LITERAL", orders, "User:writer", "WRITE"),  # never copied
        acl("LITERAL", orders, "User:admin", "ALL"),  # copied as READ
        acl("LITERAL", orders, "User:bob", "ALL", "DENY"),  # DENY READ and DENY DESCRIBE
        acl("LITERAL", orders, "User:ops-1", "READ"),  # [acls].exclude leaves it out
        acl("PREFIXED", prefix, "User:reader", "READ"),  # renamed: east.<prefix>
        acl("LITERAL", f"acl-{uid}-unrelated", "User:reader", "READ"),  # not relayed
    ])  # fmt: skip
    directory = tmp_path_factory.mktemp("acl-sync")
    config = write_config(
        directory / "relay.toml", source=source.bootstrap, target=target.bootstrap,
        topics={orders: f"{orders}-copy"},
        extra='create_topics = true\nconfig_sync = true\nconfig_sync_interval = "1s"\n\n'
        f'[discover]\ninclude = ["{prefix}.*"]\nrename = "east.{{topic}}"\ninterval = "1s"\n\n'
        '[acls]\nsync = true\ninterval = "1s"\nexclude = ["User:ops-.*"]\n',
    )  # fmt: skip
    return World(source, target, config, orders, prefix)


def expected(w: World) -> set[Acl]:
    copy = f"{w.orders}-copy"
    return {
        ("LITERAL", copy, "User:reader", "READ", "ALLOW"),
        ("LITERAL", copy, "User:describer", "DESCRIBE", "ALLOW"),
        ("LITERAL", copy, "User:admin", "READ", "ALLOW"),
        ("LITERAL", copy, "User:bob", "READ", "DENY"),
        ("LITERAL", copy, "User:bob", "DESCRIBE", "DENY"),
        ("PREFIXED", f"east.{w.prefix}", "User:reader", "READ", "ALLOW"),
    }


def check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from relay.cli import main; main()", "check", "--config",
         str(config)],
        capture_output=True, text=True, timeout=90, cwd=config.parent,
    )  # fmt: skip


def test_check_lists_the_acls_it_would_create_and_the_missing_scram_user(world: World) -> None:
    run = check(world.config)
    assert run.returncode == 0, run.stderr
    copy = f"{world.orders}-copy"
    assert "[acls] would create 6 ACL(s) on the target (0 copied already)" in run.stdout
    for line in (
        f"would create ALLOW READ on topic {copy} for User:admin (source: ALLOW ALL on topic "
        f"{world.orders} for User:admin)",
        f"would create DENY DESCRIBE on topic {copy} for User:bob (source: DENY ALL",
        f"would create ALLOW READ on prefix east.{world.prefix} for User:reader (source: ALLOW "
        f"READ on prefix {world.prefix} for User:reader)",
        "User:reader is a SCRAM user on the source, not on the target",
    ):
        assert line in run.stdout, run.stdout
    assert "User:writer" not in run.stdout and "User:ops-1" not in run.stdout
    # the destinations do not exist yet: created with their configs, nothing to keep in step
    assert "[target].config_sync would change 0 destination topic(s)" in run.stdout
    assert topic_acls(world.target.bootstrap) == set()  # nothing was created


@pytest.fixture(scope="module")
def relay(world: World) -> Iterator[Background]:
    running = Background(world.config)
    try:
        yield running
    finally:
        running.finish()
    assert running.error is None, running.error


def test_the_relay_copies_exactly_the_expected_acls_and_names_the_missing_user_once(
    world: World, relay: Background, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="relay.pipelines.relay.acl_sync")
    want = expected(world)
    wait_until(lambda: topic_acls(world.target.bootstrap) == want, 60,
               "the copied ACLs on the target")  # fmt: skip
    # the ACLs are visible to DescribeAcls a moment before the relay's CreateAcls returns and
    # counts them
    created = relay.metrics.registry
    wait_until(lambda: created.get_sample_value("ktm_acls_created_total") == len(want), 10,
               "the copied ACLs counted")  # fmt: skip
    line = "ACLs copied for User:reader, a SCRAM user on the source"
    wait_until(lambda: line in caplog.text, 10, "the missing SCRAM user named")
    time.sleep(2.5)  # two more syncs ([acls].interval 1s): the line is not written again
    assert caplog.text.count(line) == 1


def test_an_acl_added_on_the_source_while_relaying_reaches_the_target(
    world: World, relay: Background
) -> None:
    wait_until(lambda: topic_acls(world.target.bootstrap) == expected(world), 60, "first sync")
    add_acls(world.source.bootstrap, [acl("LITERAL", world.orders, "User:late", "READ")])
    late = ("LITERAL", f"{world.orders}-copy", "User:late", "READ", "ALLOW")
    wait_until(lambda: late in topic_acls(world.target.bootstrap), 10, "the late ACL copied")
    assert topic_acls(world.target.bootstrap) == expected(world) | {late}


def test_a_config_changed_on_the_source_while_relaying_reaches_the_target_excluded_ones_not(
    world: World, relay: Background
) -> None:
    copy = f"{world.orders}-copy"
    wait_until(
        lambda: (
            set_on_topic(world.target.bootstrap, copy)
            == {"retention.ms": "86400000", "max.message.bytes": "2000000"}
        ),
        60,
        "copied at creation",
    )
    client = KafkaAdminClient(bootstrap_servers=world.source.bootstrap)
    try:
        changes = {
            "retention.ms": (AlterConfigOp.SET, "123456789"),  # changed
            "max.message.bytes": (AlterConfigOp.DELETE, None),  # back to the default
            "segment.ms": (AlterConfigOp.SET, "7200000"),  # set
            "message.timestamp.type": (AlterConfigOp.SET, "LogAppendTime"),  # excluded
        }
        client.alter_configs([ConfigResource("TOPIC", world.orders, configs=changes)],
                             raise_on_unknown=False)  # fmt: skip
    finally:
        client.close()
    want = {"retention.ms": "123456789", "segment.ms": "7200000"}
    # one pass reads all four changes at once: once the others are there, the excluded one
    # would be too
    wait_until(lambda: set_on_topic(world.target.bootstrap, copy) == want, 10,
               "the changed configs on the target")  # fmt: skip
    altered = relay.metrics.registry.get_sample_value("ktm_topic_configs_altered_total")
    assert altered == 3


def test_check_on_clusters_without_an_authorizer_says_no_acl_is_copied(
    source_broker: KafkaLease, target_broker: KafkaLease, tmp_path: Path
) -> None:
    src = f"acl-plain-{uuid.uuid4().hex[:6]}"
    source_broker.cluster.create_topic(src, 1)
    # the group coordinator of a fresh node takes a moment to load (see world)
    committed_offsets(source_broker.bootstrap, "ktm", src, 1)
    config = write_config(tmp_path / "plain.toml", source=source_broker.bootstrap,
                          target=target_broker.bootstrap, topics={src: src},
                          extra="create_topics = true\n[acls]\nsync = true\n")  # fmt: skip
    run = check(config)
    assert run.returncode == 0, run.stderr
    assert "[acls] copies no ACL: source src has no authorizer" in run.stdout, run.stdout

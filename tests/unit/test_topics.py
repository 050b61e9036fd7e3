"""Destination topics (relay.pipelines.relay.topics) behind the admin seam: created with the
source's partitions and copied configs, grown, and what happens where a broker lacks the call
(Tansu has no CreatePartitions and describes no configs: the real brokers cannot show it)."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from kafka.errors import InvalidPartitionsError

from relay.clients.admin import Unsupported, in_requests
from relay.clients.topic_create import ConfigRefused
from relay.config import (
    AppConfig,
    ClusterConfig,
    Config,
    DiscoverConfig,
    SourcePoolConfig,
    SparkConfig,
    TargetConfig,
    TopicRoute,
)
from relay.config.choices import (
    CONFIG_EXCLUDE,
)
from relay.engine.metrics import Metrics
from relay.errors import ConfigError, KafkaSetupError
from relay.pipelines.relay import topic_configs as topic_configs_module
from relay.pipelines.relay import topics as topics_module
from relay.pipelines.relay.topics import Topics

SOURCE = ClusterConfig("src", ("s:1",))


class FakeAdmin:
    """The admin seam and relay.clients.topic_create: the target knows the config names in
    `known` (empty: it does not say) and refuses the (name, value) pairs in `refuses`."""

    Unsupported = Unsupported
    ConfigRefused = ConfigRefused

    def __init__(self, source: dict[str, int], target: dict[str, int], configs: dict | None = None,
                 can_grow: bool = True, known: frozenset[str] = frozenset(),
                 refuses: dict[str, str] | None = None):  # fmt: skip
        self.source, self.target, self.configs, self.can_grow = source, target, configs, can_grow
        self.known, self.refuses = known, refuses or {}
        self.created: list[tuple[dict, int, dict]] = []
        self.grown: list[dict] = []
        self.validated: list[dict] = []

    def known_topic_configs(self, cluster: Any, probe: str, timeout: float) -> frozenset[str]:
        assert probe.startswith("ktm-config-probe-")
        return self.known

    def refused_config(self, cluster: Any, topic: str, partitions: int, rf: int, configs: dict,
                       timeout: float) -> str | None:  # fmt: skip
        self.validated.append(configs)
        bad = [n for n, v in configs.items() if self.refuses.get(n) == v]
        return "InvalidConfigurationError: out of range" if bad else None

    def all_partition_counts(self, cluster: Any, timeout: float) -> dict[str, int]:
        return dict(self.source if cluster is SOURCE else self.target)

    def partition_counts(self, cluster: Any, topics: Any, timeout: float) -> dict[str, int]:
        return {t: n for t, n in self.all_partition_counts(cluster, timeout).items() if t in topics}

    def topic_configs(self, cluster: Any, topics: Any, timeout: float, set_only: bool) -> dict:
        assert set_only
        if self.configs is None:
            raise Unsupported("the broker does not implement DescribeConfigs")
        return {t: self.configs.get(t, {}) for t in topics}

    def create_topics(self, cluster: Any, topics: dict, timeout: float, rf: int, configs: dict):
        for topic, copied in configs.items():
            if any(self.refuses.get(n) == v for n, v in copied.items()):
                raise ConfigRefused(topic, "InvalidConfigurationError: Configuration is invalid.")
        self.created.append((topics, rf, configs))
        self.target.update(topics)

    def grow_partitions(self, cluster: Any, counts: dict, timeout: float) -> None:
        if not self.can_grow:
            raise Unsupported("the broker does not implement CreatePartitions")
        self.grown.append(counts)
        self.target.update(counts)


def manager(monkeypatch: pytest.MonkeyPatch, fake: FakeAdmin, named: tuple = (),
            create: bool = True, **discover: Any) -> Topics:  # fmt: skip
    monkeypatch.setattr(topics_module, "admin", fake)
    monkeypatch.setattr(topics_module, "topic_create", fake)
    monkeypatch.setattr(topic_configs_module, "topic_create", fake)
    cluster = ClusterConfig("target", ("t:1",))
    exclude = discover.pop("exclude", ("min.insync.replicas",))
    target = TargetConfig(cluster, create_topics=create, replication_factor=3,
                          config_exclude=exclude)  # fmt: skip
    cfg = Config(
        path="x.toml", app=AppConfig(metrics_addr=None), spark=SparkConfig(), topics=named,
        sources=(SOURCE,), source_pool=SourcePoolConfig(), target=target, filters=(),
        discover=DiscoverConfig(**discover),
    )  # fmt: skip
    return Topics(cfg, lambda: SOURCE, lambda side, fn: fn(), Metrics(), 1.0)


def test_a_missing_destination_is_created_like_its_source(monkeypatch):
    configs = {"orders": {"retention.ms": "60000", "min.insync.replicas": "2"}}
    fake = FakeAdmin({"orders": 6}, {}, configs)
    plan = manager(monkeypatch, fake, include=("orders",), rename="east.{topic}").resolve()
    assert fake.created == [({"east.orders": 6}, 3, {"east.orders": {"retention.ms": "60000"}})]
    assert [r.target for r in plan.routes] == ["east.orders"]


def test_a_dry_run_creates_nothing_and_says_what_it_would(monkeypatch):
    fake = FakeAdmin({"orders": 6, "payments": 2}, {"payments": 2}, {})
    plan = manager(monkeypatch, fake, include=(".*",)).resolve(dry_run=True)
    assert fake.created == [] and [c.topic for c in plan.created] == ["orders"]
    assert [r.source for r in plan.routes] == ["payments"]
    assert [r.source for r in plan.held] == ["orders"]


def test_without_create_topics_nothing_is_created(monkeypatch):
    fake = FakeAdmin({"orders": 6}, {}, {})
    named = (TopicRoute("orders", "copy"),)
    plan = manager(monkeypatch, fake, named=named, create=False).resolve()
    assert fake.created == [] and plan.routes == (TopicRoute("orders", "copy"),)


def test_a_fixed_partition_route_needs_only_that_partition(monkeypatch):
    fake = FakeAdmin({"orders": 6}, {}, {})
    manager(monkeypatch, fake, named=(TopicRoute("orders", "copy", 2),)).resolve()
    assert fake.created[0][0] == {"copy": 3}


def test_a_smaller_destination_is_grown(monkeypatch):
    fake = FakeAdmin({"orders": 6}, {"orders": 4}, {})
    plan = manager(monkeypatch, fake, include=("orders",)).resolve()
    assert fake.grown == [{"orders": 6}] and plan.grown == (("orders", 4, 6),)


def test_partitions_of_a_destination_just_grown_are_relayed_though_its_metadata_lags(monkeypatch):
    """Apache Kafka acknowledges CreatePartitions before its metadata shows the partitions:
    the grow is followed until it does, so the new source partitions are relayed, not halted
    as lacking a destination (seen under load: 2 of 4 read right after the grow)."""
    fake = FakeAdmin({"orders": 4}, {"orders": 2}, {})
    shown = {"orders": 2}
    fake.grow_partitions = lambda cluster, counts, timeout: fake.grown.append(counts)
    real = fake.all_partition_counts

    def lagging(cluster: Any, timeout: float) -> dict[str, int]:
        counts = real(cluster, timeout)
        if cluster is not SOURCE and fake.grown:
            counts.update(shown)
            shown["orders"] = 4  # the next look shows the grow
        return counts

    fake.all_partition_counts = lagging
    topics = manager(monkeypatch, fake, include=("orders",))
    found = topics.new_partitions({("orders", 0), ("orders", 1)})
    assert [r.key for r in found.routes] == [("orders", 2), ("orders", 3)] and found.short == []


def test_a_grow_refused_as_already_made_is_followed_until_the_metadata_shows_it(monkeypatch):
    """An earlier try timed out after the broker had grown the topic (or another ktm process
    grew it): the broker refuses the count it has (INVALID_PARTITIONS) while its metadata still
    said 2 of 4. The count is followed until it shows: relayed, not halted."""
    fake = FakeAdmin({"orders": 4}, {"orders": 2}, {})
    looks = []

    def refused(cluster: Any, counts: dict, timeout: float) -> None:
        raise InvalidPartitionsError("Topic already has 4 partitions.")

    def lagging(cluster: Any, topics: Any, timeout: float) -> dict[str, int]:
        looks.append(1)
        return {"orders": 2 if len(looks) < 3 else 4}

    fake.grow_partitions, fake.partition_counts = refused, lagging
    topics = manager(monkeypatch, fake, include=("orders",))
    monkeypatch.setattr(topics_module, "GROWN_POLL", 0.0)
    found = topics.new_partitions({("orders", 0), ("orders", 1)})
    assert [r.key for r in found.routes] == [("orders", 2), ("orders", 3)] and found.short == []
    assert len(looks) >= 3  # one look, then followed: 2, 2, 4


def test_a_broker_without_create_partitions_or_configs_gets_one_log_line_each(monkeypatch, caplog):
    fake = FakeAdmin({"orders": 6, "new": 1}, {"orders": 4}, None, can_grow=False)
    topics = manager(monkeypatch, fake, include=(".*",))
    with caplog.at_level(logging.WARNING):
        topics.resolve()
        topics.resolve()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("CreatePartitions" in line for line in lines) == 1
    assert sum("DescribeConfigs" in line for line in lines) == 1
    assert fake.created[0][2] == {"new": {}}  # created without configs


def test_partitions_found_while_running(monkeypatch, caplog):
    fake = FakeAdmin({"orders": 2, "payments": 1}, {"orders": 3}, {})
    topics = manager(monkeypatch, fake, include=("orders", "payments"), create=False)
    known = {("orders", 0), ("orders", 1)}
    with caplog.at_level(logging.WARNING):
        assert topics.new_partitions(known).routes == []  # payments has no destination: waits
        fake.source["orders"] = 3  # grown on the source
        found = topics.new_partitions(known)
        topics.new_partitions(known)
    assert [r.key for r in found.routes] == [("orders", 2)] and found.short == []
    waiting = [r.getMessage() for r in caplog.records if "payments" in r.getMessage()]
    assert len(waiting) == 1 and "create_topics" in waiting[0]


def test_a_create_error_names_the_key_and_topic(monkeypatch):
    fake = FakeAdmin({"orders": 2}, {}, {})

    def refuse(*args: Any) -> None:
        raise KafkaSetupError("InvalidReplicationFactorError: 3 > 1 broker")

    fake.create_topics = refuse
    with pytest.raises(KafkaSetupError, match=r"\[target\].create_topics: creating 'orders'"):
        manager(monkeypatch, fake, include=("orders",)).resolve()


def test_many_missing_destinations_are_created_in_one_request_and_logged_in_one_line(
    monkeypatch, caplog
):
    source = {f"t{i:02d}": 5 for i in range(30)}
    configs = {"t07": {"retention.ms": "60000"}}
    fake = FakeAdmin(source, {}, configs)
    with caplog.at_level(logging.INFO, logger="relay.pipelines.relay.topics"):
        manager(monkeypatch, fake, include=("t.*",)).resolve()
    ((topics, rf, copied),) = fake.created  # one request, configs described in one too
    assert topics == source and rf == 3
    assert copied["t07"] == {"retention.ms": "60000"} and copied["t08"] == {}
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert lines == ["created 30 destination topics (each: --debug)"]


def test_topics_another_process_created_first_are_taken_one_by_one(monkeypatch):
    fake = FakeAdmin({"a": 2, "b": 2, "c": 2}, {}, {})
    create = fake.create_topics

    def first_was_faster(cluster: Any, topics: dict, *args: Any) -> None:
        if "b" in topics:  # as Kafka does: the others in the request are created all the same
            if len(topics) > 1:
                create(cluster, {t: n for t, n in topics.items() if t != "b"}, *args)
            fake.target["b"] = 2
            raise KafkaSetupError("TopicAlreadyExistsError: b")
        create(cluster, topics, *args)

    fake.create_topics = first_was_faster
    plan = manager(monkeypatch, fake, include=(".*",)).resolve()
    assert [set(topics) for topics, _, _ in fake.created] == [{"a", "c"}, {"a"}, {"c"}]
    assert sorted(r.target for r in plan.routes) == ["a", "b", "c"]


def test_the_default_exclusions_leave_out_what_a_target_refuses_or_decides(monkeypatch):
    copied = {
        "retention.ms": "60000",  # data: copied
        "cleanup.policy": "compact,delete",
        "min.insync.replicas": "2",  # MirrorMaker 2's list
        "message.timestamp.type": "LogAppendTime",
        "remote.storage.enable": "true",  # tiered storage: the target decides
        "remote.log.copy.disable": "false",
        "local.retention.ms": "1000",
        "confluent.placement.constraints": "{}",  # a vendor's
        "message.format.version": "2.8",  # removed in Kafka 4.0
        "message.downconversion.enable": "false",
    }
    fake = FakeAdmin({"orders": 1}, {}, {"orders": copied})
    manager(monkeypatch, fake, include=("orders",), exclude=CONFIG_EXCLUDE).resolve()
    assert fake.created[0][2] == {
        "orders": {"retention.ms": "60000", "cleanup.policy": "compact,delete"}
    }


def test_a_key_the_target_does_not_know_is_left_out_with_a_debug_line(monkeypatch, caplog):
    copied = {"retention.ms": "60000", "message.format.version": "2.8", "x.vendor": "1"}
    known = frozenset({"retention.ms", "cleanup.policy", "segment.bytes"})
    fake = FakeAdmin({"orders": 1}, {}, {"orders": copied}, known=known)
    with caplog.at_level(logging.DEBUG, logger="relay.pipelines.relay.topic_configs"):
        manager(monkeypatch, fake, include=("orders",), exclude=()).resolve()
    assert fake.created[0][2] == {"orders": {"retention.ms": "60000"}}
    lines = [r.getMessage() for r in caplog.records]
    assert any("message.format.version=2.8 of source topic orders" in line for line in lines)
    assert any("x.vendor=1" in line and "does not know" in line for line in lines)


def test_a_config_the_target_refuses_names_the_topic_key_value_and_the_way_out(monkeypatch):
    copied = {"retention.ms": "60000", "segment.bytes": "524288"}
    fake = FakeAdmin({"orders": 2}, {}, {"orders": copied}, refuses={"segment.bytes": "524288"})
    with pytest.raises(ConfigError) as caught:
        manager(monkeypatch, fake, include=("orders",)).resolve()
    line = str(caught.value)
    assert "destination topic 'orders' refuses config segment.bytes = 524288" in line
    assert '[target].config_exclude (add "segment.bytes")' in line
    assert caught.value.exit_code == 2
    assert fake.created == []
    # the broker's answer did not name the key: each config was validated alone, in order
    assert fake.validated == [{"retention.ms": "60000"}, {"segment.bytes": "524288"}]


def test_a_refusal_naming_the_key_needs_no_validation(monkeypatch):
    copied = {"retention.ms": "60000", "segment.bytes": "524288"}
    fake = FakeAdmin({"orders": 2}, {}, {"orders": copied})

    def refuse(cluster: Any, topics: dict, *args: Any) -> None:
        why = "Invalid value 524288 for configuration segment.bytes: Value must be at least 1048576"
        raise ConfigRefused("orders", f"InvalidConfigurationError: {why}")

    fake.create_topics = refuse
    with pytest.raises(ConfigError, match="refuses config segment.bytes = 524288"):
        manager(monkeypatch, fake, include=("orders",)).resolve()
    assert fake.validated == []


def test_a_name_ending_in_a_star_stands_for_every_name_it_begins():
    pattern = topic_configs_module.config_pattern
    assert re.fullmatch(pattern("confluent.*"), "confluent.tier.enable")
    assert not re.fullmatch(pattern("confluent.*"), "confluentx")
    assert not re.fullmatch(pattern("retention.ms"), "retentionxms")  # a name, not a regex


def test_a_relayed_topic_grown_past_its_destination_is_short_never_remapped(monkeypatch):
    """The destination has 3 partitions and may not grow: of the source's 5, the new partition
    2 is relayed to 2, and 3 and 4 are short, the reason naming the topic, both counts and the
    key (the driver halts them)."""
    fake = FakeAdmin({"orders": 5}, {"copy": 3}, {})
    named = (TopicRoute("orders", "copy"),)
    topics = manager(monkeypatch, fake, named=named, create=False)
    found = topics.new_partitions({("orders", 0), ("orders", 1)})
    assert [(r.key, r.target_partition) for r in found.routes] == [(("orders", 2), 2)]
    assert [(s.route.key, s.route.target_partition) for s in found.short] == [
        (("orders", 3), 3), (("orders", 4), 4)
    ]  # fmt: skip
    reason = found.short[0].reason
    assert "'copy' has 3 partitions, fewer than the source's 5" in reason
    assert "[topics].orders" in reason and "[target].create_topics = true" in reason
    assert fake.grown == []


def test_a_destination_the_target_refuses_to_grow_is_logged_once_and_short(monkeypatch, caplog):
    fake = FakeAdmin({"orders": 4}, {"copy": 2}, {})

    def refuse(cluster: Any, counts: dict, timeout: float) -> None:
        raise PolicyRefused("PolicyViolationError: no more partitions")

    fake.grow_partitions = refuse
    topics = manager(monkeypatch, fake, named=(TopicRoute("orders", "copy"),))
    with caplog.at_level(logging.WARNING):
        first = topics.new_partitions({("orders", 0), ("orders", 1)})
        topics.new_partitions({("orders", 0), ("orders", 1)})
    assert [s.route.key for s in first.short] == [("orders", 2), ("orders", 3)]
    lines = [r.getMessage() for r in caplog.records if "PolicyViolation" in r.getMessage()]
    assert lines == ["destination copy keeps 2 partitions, fewer than the 4 its source has: "
                     "PolicyViolationError: no more partitions"]  # fmt: skip


class PolicyRefused(Exception):
    retriable = False


def test_a_destination_another_process_grew_first_is_no_refusal(monkeypatch, caplog):
    fake = FakeAdmin({"orders": 4}, {"copy": 2}, {})

    def another_was_first(cluster: Any, counts: dict, timeout: float) -> None:
        fake.target.update(counts)  # as Kafka answers the second CreatePartitions
        raise PolicyRefused("InvalidPartitionsError: Topic already has 4 partitions.")

    fake.grow_partitions = another_was_first
    topics = manager(monkeypatch, fake, named=(TopicRoute("orders", "copy"),))
    with caplog.at_level(logging.WARNING):
        found = topics.new_partitions({("orders", 0), ("orders", 1)})
    assert [r.key for r in found.routes] == [("orders", 2), ("orders", 3)] and found.short == []
    assert not [r for r in caplog.records if "keeps" in r.getMessage()]


def test_topics_are_created_in_requests_a_kraft_controller_takes():
    """A KRaft controller refuses a request of more than 10,000 metadata records (a topic and
    each of its partitions is one), PolicyViolationError for every topic in it."""
    requests = in_requests({f"t{i}": 5 for i in range(2000)})
    assert [len(r) for r in requests] == [833, 833, 334]
    assert all(sum(1 + n for n in r.values()) <= 5000 for r in requests)
    assert in_requests({"big": 6000, "a": 1, "b": 2}) == [{"big": 6000}, {"a": 1, "b": 2}]

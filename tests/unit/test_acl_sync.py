"""Which topic ACLs [acls] copies (relay.pipelines.relay.acl_sync), which config changes
[target].config_sync makes (relay.pipelines.relay.config_sync), and how both are configured.
No broker: the clients are faked behind ktm's own functions (tests/integration/test_acl_sync.py
runs the same on Apache Kafka)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from relay.clients import acls
from relay.clients.acls import TopicAcl
from relay.config import AclsConfig, ClusterConfig, TargetConfig, load_config
from relay.engine.metrics import Metrics
from relay.pipelines.relay import config_sync
from relay.pipelines.relay.acl_sync import AclSync, copied_acls
from relay.pipelines.relay.config_sync import config_changes
from relay.pipelines.relay.relayed import Relayed
from relay.pipelines.relay.topic_configs import ConfigCopy
from relay.spec import PartitionRoute


def acl(name: str, operation: str = "READ", principal: str = "User:alice", *,
        pattern: str = "LITERAL", permission: str = "ALLOW") -> TopicAcl:  # fmt: skip
    return TopicAcl(pattern, name, principal, "*", operation, permission)


def copied(found: list[TopicAcl], routes: list[tuple[str, str]], rename: str = "{topic}",
           **filters: tuple[str, ...]) -> set[TopicAcl]:  # fmt: skip
    return set(copied_acls(found, routes, rename, **filters))


def test_read_and_describe_are_copied_all_becomes_read_write_and_the_rest_are_not() -> None:
    found = [acl("orders", op) for op in ("READ", "DESCRIBE", "ALL", "WRITE", "ALTER", "DELETE")]
    assert copied(found, [("orders", "orders")]) == {
        acl("orders", "READ"),
        acl("orders", "DESCRIBE"),
    }


def test_deny_is_copied_and_deny_all_denies_read_and_describe() -> None:
    found = [acl("orders", "ALL", "User:bob", permission="DENY"),
             acl("orders", "WRITE", "User:eve", permission="DENY")]  # fmt: skip
    assert copied(found, [("orders", "orders")]) == {
        acl("orders", "READ", "User:bob", permission="DENY"),
        acl("orders", "DESCRIBE", "User:bob", permission="DENY"),
    }


def test_a_literal_acl_follows_the_topic_to_its_destination_and_others_are_not_copied() -> None:
    found = [acl("orders"), acl("payments"), acl("*")]
    assert copied(found, [("orders", "orders-copy")]) == {acl("orders-copy")}


def test_a_prefixed_acl_is_renamed_when_the_rename_keeps_prefixes() -> None:
    found = [acl("orders.", pattern="PREFIXED")]
    routes = [("orders.eu", "east.orders.eu"), ("orders.us", "east.orders.us")]
    assert copied(found, routes, "east.{topic}") == {acl("east.orders.", pattern="PREFIXED")}


def test_a_prefixed_acl_becomes_literal_acls_where_the_rename_does_not_keep_prefixes() -> None:
    found = [acl("orders.", pattern="PREFIXED")]
    routes = [("orders.eu", "orders.eu.copy"), ("orders.us", "orders.us.copy")]
    assert copied(found, routes, "{topic}.copy") == {acl("orders.eu.copy"), acl("orders.us.copy")}


def test_a_prefixed_acl_gives_topics_renamed_in_topics_a_literal_acl_of_their_own() -> None:
    found = [acl("orders.", pattern="PREFIXED")]
    routes = [("orders.eu", "orders.eu"), ("orders.us", "us-orders")]  # [topics] renames one
    assert copied(found, routes) == {acl("orders.", pattern="PREFIXED"), acl("us-orders")}


def test_a_prefixed_acl_no_relayed_topic_begins_with_is_not_copied() -> None:
    assert copied([acl("billing.", pattern="PREFIXED")], [("orders", "orders")]) == set()


def test_principals_and_exclude_choose_whose_acls_are_copied() -> None:
    found = [acl("orders", principal=p) for p in ("User:alice", "User:bob", "User:app-1")]
    routes = [("orders", "orders")]
    assert copied(found, routes, principals=("User:app-.*", "User:bob")) == {
        acl("orders", principal="User:app-1"),
        acl("orders", principal="User:bob"),
    }
    assert copied(found, routes, exclude=("User:bob",)) == {
        acl("orders", principal="User:alice"),
        acl("orders", principal="User:app-1"),
    }


def test_each_copy_names_the_source_acl_it_comes_from() -> None:
    source = acl("orders", "ALL")
    assert copied_acls([source], [("orders", "o2")], "{topic}") == {acl("o2", "READ"): source}


# Topic configs kept in step


def config_copy(**keys: tuple[str, ...]) -> ConfigCopy:
    target = TargetConfig(ClusterConfig("target", ("127.0.0.1:1",)), **keys)  # type: ignore[arg-type]
    copy = ConfigCopy(target, 1.0)
    copy._known = frozenset()  # the target does not say which names it knows: all copied
    return copy


def test_config_changes_set_what_differs_and_delete_what_the_source_no_longer_sets() -> None:
    changes = config_changes(
        config_copy(),
        {"orders-copy": "orders", "same": "same-src", "gone": "missing-src"},
        {
            "orders": {"retention.ms": "1000", "cleanup.policy": "compact"},
            "same-src": {"retention.ms": "5"},
        },
        {
            "orders-copy": {"retention.ms": "99", "max.message.bytes": "2000"},
            "same": {"retention.ms": "5"},
            "gone": {"retention.ms": "1"},
        },
    )
    assert changes == {
        "orders-copy": {
            "retention.ms": "1000",
            "cleanup.policy": "compact",
            "max.message.bytes": None,
        }
    }


def test_config_changes_leave_excluded_configs_alone_on_both_sides() -> None:
    copy = config_copy(config_exclude=("min.insync.replicas", "retention.*"))
    changes = config_changes(
        copy,
        {"dst": "src"},
        {"src": {"min.insync.replicas": "2", "retention.ms": "5", "segment.ms": "10"}},
        {"dst": {"min.insync.replicas": "1", "retention.bytes": "7"}},
    )
    assert changes == {"dst": {"segment.ms": "10"}}


# Configuration


def test_acls_and_config_sync_are_off_by_default_and_read_when_given(tmp_path: Path) -> None:
    base = (
        '[topics]\n"a" = "b"\n[[sources]]\nname = "s"\nservers = ["127.0.0.1:1"]\n'
        '[target]\nservers = ["127.0.0.1:2"]\n'
    )
    path = tmp_path / "default.toml"
    path.write_text(base)
    config = load_config(path)
    assert config.acls == AclsConfig(sync=False, interval=60.0, principals=(), exclude=())
    target = config.need_target()
    assert (target.config_sync, target.config_sync_interval) == (False, 60.0)

    path = tmp_path / "given.toml"
    path.write_text(
        base + 'config_sync = true\nconfig_sync_interval = "5s"\n'
        '[acls]\nsync = true\ninterval = "2s"\nprincipals = ["User:app-.*"]\n'
        'exclude = ["User:app-admin"]\n'
    )
    config = load_config(path)
    assert config.acls == AclsConfig(True, 2.0, ("User:app-.*",), ("User:app-admin",))
    target = config.need_target()
    assert (target.config_sync, target.config_sync_interval) == (True, 5.0)


@pytest.mark.parametrize("rename", ["{topic}", "east.{topic}"])
def test_a_prefixed_acl_on_a_topic_named_exactly_as_the_prefix_is_copied(rename: str) -> None:
    prefix = rename.partition("{topic}")[0]
    found = [acl("orders", pattern="PREFIXED")]
    assert copied(found, [("orders", prefix + "orders")], rename) == {
        acl(prefix + "orders", pattern="PREFIXED")
    }


def test_a_config_the_target_refuses_is_named_once_and_the_others_are_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[topics]\n"orders" = "orders-copy"\n[[sources]]\nname = "src"\n'
        'servers = ["127.0.0.1:1"]\n[target]\nservers = ["127.0.0.1:2"]\nconfig_sync = true\n'
    )
    cfg = load_config(path)
    set_on = {"src": {"orders": {"retention.ms": "5", "segment.bytes": "10"}},
              "target": {"orders-copy": {"retention.ms": "1"}}}  # fmt: skip
    asked: list[dict[str, dict[str, str | None]]] = []

    def alter(cluster: ClusterConfig, changes: dict, timeout: float) -> dict[str, str]:
        asked.append(changes)
        for topic, change in changes.items():
            if change.get("segment.bytes") == "10":  # applied whole or not at all, as Kafka
                return {topic: "InvalidConfigurationError: segment.bytes must be >= 1048576"}
            set_on["target"][topic].update(change)
        return {}

    monkeypatch.setattr(config_sync, "alter_topic_configs", alter)
    monkeypatch.setattr(config_sync, "_described",
                        lambda cluster, topics, timeout: set_on[cluster.name])  # fmt: skip
    metrics = Metrics()
    copied = [PartitionRoute("orders", 0, "orders-copy", 0)]
    sync = config_sync.ConfigSync(cfg, Relayed.fixed(cfg.sources[0], copied), metrics)
    sync.copy._known = frozenset()
    with caplog.at_level(logging.WARNING):
        sync.sync_once()
        sync.sync_once()

    assert set_on["target"]["orders-copy"] == {"retention.ms": "5"}
    refusals = [r.getMessage() for r in caplog.records]
    assert len(refusals) == 1
    assert refusals[0].startswith(
        "destination topic orders-copy refuses config segment.bytes = 10 (copied from its source "
        "topic): InvalidConfigurationError: segment.bytes must be >= 1048576; left as it is"
    )
    assert metrics.registry.get_sample_value("ktm_topic_config_failures_total") == 1
    assert metrics.registry.get_sample_value("ktm_topic_configs_altered_total") == 1
    assert len([a for a in asked if a]) == 3  # both, then each alone; then nothing
    set_on["src"]["orders"]["segment.bytes"] = "2097152"  # changed on the source: asked again
    sync.sync_once()
    assert set_on["target"]["orders-copy"] == {"retention.ms": "5", "segment.bytes": "2097152"}


def test_an_acl_the_target_refuses_is_named_once_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[topics]\n"orders" = "orders"\n[[sources]]\nname = "src"\nservers = ["127.0.0.1:1"]\n'
        '[target]\nservers = ["127.0.0.1:2"]\n[acls]\nsync = true\n'
    )
    cfg = load_config(path)
    on = {"src": [acl("orders"), acl("orders", principal="User:bad")], "target": []}
    refusal = {acl("orders", principal="User:bad"): "InvalidRequestError"}

    def create(cluster: ClusterConfig, wanted: list[TopicAcl], timeout: float) -> dict:
        on["target"] += [a for a in wanted if a not in refusal]
        return {a: why for a, why in refusal.items() if a in wanted}

    monkeypatch.setattr(acls, "topic_acls", lambda cluster, timeout: list(on[cluster.name]))
    monkeypatch.setattr(acls, "create_acls", create)
    monkeypatch.setattr(acls, "scram_users", lambda cluster, timeout: frozenset())
    metrics = Metrics()
    copied = [PartitionRoute("orders", 0, "orders", 0)]
    sync = AclSync(cfg, Relayed.fixed(cfg.sources[0], copied), metrics)
    with caplog.at_level(logging.WARNING):
        sync.sync_once()
        sync.sync_once()

    assert on["target"] == [acl("orders")]
    assert [r.getMessage() for r in caplog.records] == [
        "the target refused ACL ALLOW READ on topic orders for User:bad: InvalidRequestError "
        "(not asked again until a restart)"
    ]
    assert metrics.registry.get_sample_value("ktm_acls_created_total") == 1
    assert metrics.registry.get_sample_value("ktm_acl_failures_total") == 1

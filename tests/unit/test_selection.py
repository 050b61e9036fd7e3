"""Which topics and groups a relay takes (relay.selection): patterns, exclusions, and the names
that are never matched."""

from __future__ import annotations

from relay.config import DiscoverConfig, TopicRoute
from relay.selection import carried_groups, discovered, select_routes

SOURCE = ["orders", "orders.eu", "payments", "tmp-orders", "__consumer_offsets",
          "__transaction_state", "mm2-offsets.internal", "jobs-internal", "x.replica"]  # fmt: skip


def test_patterns_take_whole_names_minus_exclusions_and_never_internal_topics():
    discover = DiscoverConfig(include=(".*",), exclude=("tmp-.*",))
    routes = select_routes((), discover, SOURCE)
    assert [r.source for r in routes] == ["orders", "orders.eu", "payments"]
    assert all(r.discovered and r.target == r.source for r in routes)


def test_a_pattern_matches_the_whole_name():
    discover = DiscoverConfig(include=("orders",))
    assert [r.source for r in select_routes((), discover, SOURCE)] == ["orders"]


def test_named_topics_keep_their_route_and_come_first():
    named = (TopicRoute("payments", "pay-copy", 2),)
    routes = select_routes(named, DiscoverConfig(include=("pay.*", "orders")), SOURCE)
    assert routes == (named[0], TopicRoute("orders", "orders", discovered=True))


def test_rename_prefixes_and_never_takes_a_name_it_would_produce():
    discover = DiscoverConfig(include=(".*",), rename="east.{topic}")
    routes = select_routes((), discover, ["orders", "east.orders", "eastern"])
    assert [(r.source, r.target) for r in routes] == [
        ("eastern", "east.eastern"),
        ("orders", "east.orders"),
    ]


def test_an_active_active_relay_never_takes_back_the_targets_own_topics():
    discover = DiscoverConfig(include=(".*",), rename="east.{topic}", from_target_prefix="west.")
    assert discovered(discover, "orders")
    assert not discovered(discover, "west.orders")  # came from the target
    assert not discovered(discover, "east.orders")  # a copy this relay made (same cluster)


def test_no_pattern_takes_nothing():
    assert select_routes((), DiscoverConfig(), SOURCE) == ()


def test_groups_by_pattern_never_ktms_own():
    groups = ["billing", "billing-eu", "analytics", "ktm", "ktm.relay", "ktm.backup", "ktmx"]
    found = carried_groups(("billing.*", "ktm.*", "analytics"), ("billing-eu",), "ktm", groups)
    assert found == ["analytics", "billing", "ktmx"]

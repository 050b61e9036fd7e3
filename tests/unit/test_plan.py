"""Planning: partition routes, provenance headers, resume points (the next-offset rule)."""

from __future__ import annotations

from collections import namedtuple

import pytest

from relay.config import TopicRoute
from relay.driver.plan import plan_routes
from relay.errors import KafkaSetupError
from relay.resume import choose_start, delivered_in
from relay.spec import PROVENANCE_HEADER, PartitionRoute, parse_provenance, provenance_prefix

Rec = namedtuple("Rec", "headers")


def _prov(topic: str, partition: int, offset: int, cluster: str = "src") -> Rec:
    value = provenance_prefix(cluster, topic, partition) + str(offset).encode()
    return Rec([("app", b"x"), (PROVENANCE_HEADER, value)])


def test_provenance_round_trip_even_with_slashes_in_cluster_name() -> None:
    value = provenance_prefix("dc/one", "orders.v1", 7) + b"123456"
    assert parse_provenance(value) == ("dc/one", "orders.v1", 7, 123456)


@pytest.mark.parametrize("value", [b"", b"garbage", b"a/b/c/notanint", b"\xff\xfe/t/1/2"])
def test_foreign_header_values_are_ignored(value: bytes) -> None:
    assert parse_provenance(value) is None


def test_plan_routes_preserves_partitions_and_fixed_partition_fans_in() -> None:
    routes = [TopicRoute("a", "x", None), TopicRoute("b", "y", 1)]
    planned = plan_routes(routes, {"a": 2, "b": 3}, {"x": 2, "y": 2}, "src")
    assert planned == [
        PartitionRoute("a", 0, "x", 0),
        PartitionRoute("a", 1, "x", 1),
        PartitionRoute("b", 0, "y", 1),
        PartitionRoute("b", 1, "y", 1),
        PartitionRoute("b", 2, "y", 1),
    ]


@pytest.mark.parametrize(
    ("route", "source", "target", "message"),
    [
        (TopicRoute("a", "x", None), {}, {"x": 1}, "source topic 'a' does not exist"),
        (TopicRoute("a", "x", None), {"a": 1}, {}, "destination topic 'x' does not exist"),
        (
            TopicRoute("a", "x", None),
            {"a": 4},
            {"x": 2},
            "has 2 partitions, fewer than the source's 4",
        ),
        (TopicRoute("a", "x", 5), {"a": 1}, {"x": 2}, 'partition 5 of "x" does not exist'),
    ],
)
def test_plan_routes_refuses_what_would_lose_records(route, source, target, message) -> None:
    with pytest.raises(KafkaSetupError, match="topics") as err:
        plan_routes([route], source, target, "src")
    assert message in str(err.value)


def _nexts(records, wanted) -> dict:
    return {key: d.next_offset for key, d in delivered_in(records, wanted).items()}


def test_delivered_takes_the_highest_offset_per_wanted_partition() -> None:
    records = [_prov("a", 0, 5), _prov("a", 1, 9), _prov("a", 0, 6), _prov("b", 0, 99), Rec([])]
    assert _nexts(records, {("a", 0), ("a", 1)}) == {("a", 0): 7, ("a", 1): 10}
    last = delivered_in(records, {("a", 0)})[("a", 0)]
    assert (last.offset, last.record) == (6, records[2])


def test_delivered_matches_any_node_name() -> None:
    # Failover nodes carry different names but the same offsets: the node is not part of the key.
    records = [_prov("a", 0, 5, cluster="node1"), _prov("a", 0, 8, cluster="node2")]
    assert _nexts(records, {("a", 0)}) == {("a", 0): 9}


def test_choose_start_prefers_the_latest_safe_point() -> None:
    assert choose_start(("a", 0), None, None, 3, 10).next_offset == 3
    assert choose_start(("a", 0), 5, None, 0, 10).next_offset == 5
    # filtered tail: the committed offset is past the last delivered record
    point = choose_start(("a", 0), 5, 8, 0, 10)
    assert (point.next_offset, point.reason) == (8, "committed")
    # retention removed the old records: start at the log start
    assert choose_start(("a", 0), 5, None, 7, 10).next_offset == 7


def test_choose_start_refuses_a_destination_ahead_of_the_source() -> None:
    with pytest.raises(KafkaSetupError, match="recreated"):
        choose_start(("a", 0), 51, None, 0, 10)

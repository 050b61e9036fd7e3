"""Partitions found while running (relay.pipelines.relay.driver) behind the seams: where each
starts, and what `start = "end"` remembers on the source."""

from __future__ import annotations

import threading
from typing import Any

import pytest

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
from relay.engine.metrics import Metrics
from relay.engine.pipeline import Progress
from relay.pipelines.relay import driver
from relay.pipelines.relay.driver import RelayPipeline
from relay.pipelines.relay.topics import Found, Short
from relay.provenance.resume import ResumePoint, SourceOffsets
from relay.spec import PartitionRoute

SOURCE = ClusterConfig("src", ("s:1",))
KNOWN = PartitionRoute("orders", 0, "orders", 0)
GROWN = PartitionRoute("orders", 1, "orders", 1)  # a partition added to a relayed topic
FRESH = PartitionRoute("shipments", 0, "shipments", 0)  # a new topic
COPIED = PartitionRoute("refunds", 0, "refunds", 0)  # a new topic the destination has copies of


def pipeline(monkeypatch: pytest.MonkeyPatch, start: str) -> tuple[RelayPipeline, list[Any]]:
    cfg = Config(
        path="x.toml", app=AppConfig(metrics_addr=None), spark=SparkConfig(),
        topics=(TopicRoute("orders", "orders"),), sources=(SOURCE,),
        source_pool=SourcePoolConfig(), target=TargetConfig(ClusterConfig("target", ("t:1",))),
        filters=(), discover=DiscoverConfig(include=(".*",), start=start),
    )  # fmt: skip
    relay = RelayPipeline(cfg, stop_event=threading.Event(), metrics=Metrics(), filters=(),
                          failover=False)  # fmt: skip
    relay.relayed.routes = [KNOWN]
    commits: list[Any] = []
    found = [GROWN, FRESH, COPIED]
    monkeypatch.setattr(relay.topics, "new_partitions", lambda known: Found(list(found), []))
    monkeypatch.setattr(driver, "destination_next_offsets", lambda *a: {COPIED.key: 7})
    points = {
        GROWN.key: ResumePoint(0, "beginning"),
        FRESH.key: ResumePoint(0, "beginning"),
        COPIED.key: ResumePoint(7, "destination"),
    }
    ends = {GROWN.key: 5, FRESH.key: 40, COPIED.key: 9}
    monkeypatch.setattr(
        relay.planner,
        "resume",
        lambda routes, at: (points, SourceOffsets(dict.fromkeys(ends, 0), ends)),
    )
    monkeypatch.setattr(driver.consumer_groups, "commit_group", lambda *a: commits.append(a[1:3]))
    return relay, commits


def test_found_partitions_start_at_their_beginning_or_after_their_copies(monkeypatch):
    relay, commits = pipeline(monkeypatch, "beginning")
    relay._look_for_partitions()
    assert relay.has_changes()
    plan = relay.changes()
    assert plan is not None and plan.routes == [GROWN, FRESH, COPIED]
    assert plan.next_offsets == {GROWN.key: 0, FRESH.key: 0, COPIED.key: 7}
    assert relay.routes == [KNOWN, GROWN, FRESH, COPIED] and relay.changes() is None
    assert commits == []


def test_start_at_the_end_applies_to_new_topics_only_and_is_remembered(monkeypatch):
    relay, commits = pipeline(monkeypatch, "end")
    relay._look_for_partitions()
    plan = relay.changes()
    assert plan is not None
    # The grown partition's records are all new: from its beginning. The new topic: from its
    # end when found. The one with copies: after them.
    assert plan.next_offsets == {GROWN.key: 0, FRESH.key: 40, COPIED.key: 7}
    assert commits == [("ktm", {FRESH.key: 40, COPIED.key: 7})]


def test_partitions_the_destination_lacks_halt_at_their_start_once(monkeypatch):
    """A relayed topic grown past a destination that cannot grow: the partitions it lacks halt
    (never remapped), are not looked for again, and the others are relayed."""
    relay, _ = pipeline(monkeypatch, "beginning")
    lacking = PartitionRoute("orders", 2, "orders", 2)
    why = "[topics].orders: destination 'orders' has 2 partitions, fewer than the source's 3"
    asked: list[set[tuple[str, int]]] = []

    def new_partitions(known: set[tuple[str, int]]) -> Found:
        asked.append(set(known))
        return Found([GROWN], [Short(lacking, why)] if lacking.key not in known else [])

    monkeypatch.setattr(relay.topics, "new_partitions", new_partitions)
    monkeypatch.setattr(driver.admin, "offset_bounds", lambda *a: ({lacking.key: 3}, {}))
    relay._look_for_partitions()
    (halt,) = relay.tick(Progress({}, None))  # handed to the runner at its next tick, once
    assert (halt.route, halt.offset, halt.reason) == (lacking, 3, why)
    relay._look_for_partitions()
    assert relay.tick(Progress({}, None)) == []
    assert lacking.key in asked[1]  # not halted twice
    plan = relay.changes()
    assert plan is not None and lacking not in plan.routes and GROWN in plan.routes

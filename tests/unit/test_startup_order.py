"""Start-up compares offsets read at different moments; the order of the reads must make a
false "source topic recreated" impossible while other members relay and commit (issue 18.1).

The clusters are fakes behind relay.clients.admin and the pool: a log that grows by 100
records at every request, and a member that commits everything that was produced before the
request, so any offset read later is further on than one read earlier."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from relay.batches.records import Decoded
from relay.config import (
    AppConfig,
    ClusterConfig,
    Config,
    SourcePoolConfig,
    SparkConfig,
    TargetConfig,
    TopicRoute,
)
from relay.engine.metrics import Metrics
from relay.engine.pipeline import NodeView
from relay.pipelines import source_plan as startup_module
from relay.pipelines import target_fit
from relay.pipelines.calls import Calls
from relay.pipelines.source_plan import SourcePlan
from relay.pipelines.source_pool import SourcePool
from relay.provenance.resume import AtDestination, Delivered, SourceOffsets

KEY = ("t", 0)


class GrowingCluster:
    """Every request sees the log 100 records longer than the one before."""

    def __init__(self) -> None:
        self.clock = 1000

    def tick(self) -> int:
        self.clock += 100
        return self.clock

    def committed_offsets(self, *_: Any, **__: Any) -> dict[tuple[str, int], int | None]:
        return {KEY: self.tick()}  # the running member committed all it had read

    def source_offsets(self, *_: Any, **__: Any) -> SourceOffsets:
        return SourceOffsets({KEY: 0}, {KEY: self.tick()})


class FakePool:
    active = ClusterConfig(name="src", servers=("127.0.0.1:1",))
    failover = False

    def partition_counts(self, topics: list[str], timeout: float) -> dict[str, int]:
        return {"t": 1}

    def start(self, keys: Any, nexts: Any) -> None:
        pass

    def boot_ends(self) -> None:
        return None

    def describe_all(self) -> str:
        return "src (127.0.0.1:1)"


def config() -> Config:
    target = TargetConfig(cluster=ClusterConfig(name="target", servers=("127.0.0.1:2",)))
    return Config(
        path="c.toml",
        app=AppConfig(),
        spark=SparkConfig(),
        topics=(TopicRoute("t", "t-copy"),),
        sources=(FakePool.active,),
        source_pool=SourcePoolConfig(),
        target=target,
        filters=(),
    )


def planner() -> SourcePlan:
    pool = FakePool()
    calls = Calls(config(), threading.Event(), Metrics(), pool.describe_all)
    return SourcePlan(config(), pool, calls)  # type: ignore[arg-type]


def test_committed_offsets_read_before_the_end_never_pass_it(monkeypatch) -> None:
    cluster = GrowingCluster()
    monkeypatch.setattr(startup_module.admin, "partition_counts", lambda *a, **k: {"t-copy": 1})
    monkeypatch.setattr(
        startup_module.consumer_groups, "committed_offsets", cluster.committed_offsets
    )
    monkeypatch.setattr(startup_module, "source_offsets", cluster.source_offsets)
    copy = Decoded(899, 0, None, b"v", [])  # the destination's copy of offset 899
    tail = AtDestination({KEY: Delivered(900, copy)}, frozenset(), {}, {})
    monkeypatch.setattr(startup_module, "at_destination", lambda *a, **k: tail)
    plan = planner().plan(stop_at_end=False)

    # The member had committed 1100; the end read after that is 1200: resume at the commit.
    assert plan.next_offsets[KEY] == 1100
    assert plan.ends[KEY] == 1200


class StaleMonitor:
    """Health checks: the cached views predate what was relayed since; a fresh check agrees."""

    def __init__(self) -> None:
        self.fresh_checks = 0

    def views(self) -> list[NodeView]:
        return [NodeView("a", False, {}, "down"), NodeView("b", True, {KEY: 500})]

    def check_now(self) -> list[NodeView]:
        self.fresh_checks += 1
        return [NodeView("a", False, {}, "down"), NodeView("b", True, {KEY: 800})]


def test_a_node_is_not_judged_behind_on_a_view_older_than_what_was_relayed() -> None:
    nodes = [ClusterConfig(name="a", servers=("127.0.0.1:1",)),
             ClusterConfig(name="b", servers=("127.0.0.1:2",))]  # fmt: skip
    pool = SourcePool(nodes, SourcePoolConfig(randomize_initial=False), Metrics(), True)
    monitor = StaleMonitor()
    pool.monitor = monitor  # type: ignore[assignment]

    decision = pool.next_switch({KEY: 700}, urgent=False)  # relayed up to 700 meanwhile

    assert decision is not None and decision.node == "b"
    assert monitor.fresh_checks == 1


def test_a_node_really_behind_is_still_refused() -> None:
    nodes = [ClusterConfig(name="a", servers=("127.0.0.1:1",)),
             ClusterConfig(name="b", servers=("127.0.0.1:2",))]  # fmt: skip
    pool = SourcePool(nodes, SourcePoolConfig(randomize_initial=False), Metrics(), True)
    monitor = StaleMonitor()
    monitor.check_now = lambda: [  # type: ignore[method-assign]
        NodeView("a", False, {}, "down"),
        NodeView("b", True, {KEY: 600}),
    ]
    pool.monitor = monitor  # type: ignore[assignment]
    with pytest.raises(ConnectionError, match="no source node can serve"):
        pool.next_switch({KEY: 700}, urgent=False)


@pytest.mark.parametrize(
    ("described", "expected"),
    [
        ({"a": {"max.message.bytes": "100000"}, "b": {"max.message.bytes": "50000"}}, 50_000),
        ({"a": {"max.message.bytes": "9000000"}}, 262_144),  # room enough: as configured
        ({"a": {}}, 262_144),  # Tansu describes nothing: not checked
    ],
)
def test_batch_size_is_fitted_to_what_the_destination_topics_allow(
    monkeypatch, caplog, described: dict, expected: int
) -> None:
    monkeypatch.setattr(target_fit.admin, "topic_configs", lambda *a, **k: described)
    target = target_fit.fit(config(), ["a", "b"], 1.0).target
    assert target.batch_size == expected
    assert target.cluster == config().need_target().cluster
    lowered = "[target].batch_size 262144 exceeds max.message.bytes 50000 of destination topic b"
    assert (lowered in caplog.text) == (expected == 50_000)

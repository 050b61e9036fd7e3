"""Node choice in failover mode: per partition, dead nodes demoted at once, no skipping."""

from __future__ import annotations

import pytest

from relay.clients import admin
from relay.config import ClusterConfig, SourcePoolConfig
from relay.engine.metrics import Metrics
from relay.errors import ConfigError
from relay.pipelines.source_pool import (
    Decision,
    NodeMonitor,
    NodeView,
    SourcePool,
    best_ends,
    can_serve,
    choose,
    fewest_partitions,
    max_lag,
)

P0, P1 = ("t", 0), ("t", 1)


def up(name: str, p0: int, p1: int) -> NodeView:
    return NodeView(name, True, {P0: p0, P1: p1})


def down(name: str) -> NodeView:
    return NodeView(name, False, error="KafkaTimeoutError")


def test_initial_choice_is_the_first_node_within_the_threshold() -> None:
    views = [up("a", 100, 100), up("b", 100, 100)]
    assert choose(views, None, {}, threshold=10) == Decision("a", "initial")
    views = [up("a", 10, 100), up("b", 100, 100)]
    assert choose(views, None, {}, threshold=10) == Decision("b", "initial")


def test_down_active_moves_round_robin_to_the_next_fresh_node() -> None:
    views = [up("a", 100, 100), down("b"), up("c", 100, 100)]
    assert choose(views, "b", {P0: 50}, threshold=10) == Decision("c", "down")
    views = [up("a", 100, 100), up("b", 100, 100), down("c")]
    assert choose(views, "c", {}, threshold=10) == Decision("a", "down")


def test_lag_is_compared_per_partition_not_summed() -> None:
    # Sums are equal (200 each) but "a" is 100 behind on partition 1.
    views = [up("a", 150, 50), up("b", 50, 150)]
    best = best_ends(views)
    assert max_lag(views[0], best) == 100
    assert choose(views, "a", {}, threshold=10) is None  # "b" is just as far behind elsewhere
    views = [up("a", 100, 50), up("b", 100, 150)]
    assert choose(views, "a", {}, threshold=10) == Decision("b", "lag")
    assert choose(views, "a", {}, threshold=200) is None


def test_a_node_behind_what_was_relayed_cannot_serve() -> None:
    restarted = up("a", 0, 0)  # a memory broker that came back empty
    assert not can_serve(restarted, {P0: 10})
    views = [restarted, up("b", 100, 100)]
    assert choose(views, "b", {P0: 10, P1: 10}, threshold=10) is None  # stay on b
    views = [restarted, down("b")]
    assert choose(views, "b", {P0: 10, P1: 10}, threshold=10) is None  # wait, never replay


def test_down_nodes_are_never_chosen() -> None:
    assert choose([down("a"), down("b")], "a", {}, threshold=10) is None


def test_a_node_is_asked_afresh_after_a_failed_check_and_its_gauges_follow(monkeypatch) -> None:
    answers: list[dict | BaseException] = [{P0: 5, P1: 7}, ConnectionError("gone"), {P0: 5, P1: 9}]
    memos: list[dict] = []

    def health_end_offsets(node, keys, timeout, memo):  # admin's, without a broker
        memos.append(dict(memo))
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        memo.update({key: (0, end, end) for key, end in answer.items()})
        return answer

    monkeypatch.setattr(admin, "health_end_offsets", health_end_offsets)
    metrics = Metrics()
    monitor = NodeMonitor([ClusterConfig("a", ("h:1",))], SourcePoolConfig(), metrics, [P0, P1])
    views = [monitor.check_now()[0].up for _ in range(3)]

    assert views == [True, False, True]
    assert memos[1] == {P0: (0, 5, 5), P1: (0, 7, 7)}  # what the first check learned
    assert memos[2] == {}  # forgotten: the node may have come back empty
    end = metrics.registry.get_sample_value
    labels = {"node": "a", "topic": "t", "partition": "1"}
    assert end("ktm_source_node_end_offset", labels) == 9
    assert end("ktm_source_node_end_offset", {**labels, "partition": "0"}) == 5


def test_checks_that_only_observe_are_spaced_beyond_a_few_thousand_partitions() -> None:
    """Single mode's checks (`spread`) list every partition's offsets only to observe: at
    10,000 partitions every 5 intervals. Failover's keep the interval: they decide switches."""
    keys = [("t", p) for p in range(10_000)]
    pool, node = SourcePoolConfig(healthcheck_interval=3.0), [ClusterConfig("a", ("h:1",))]
    assert NodeMonitor(node, pool, Metrics(), keys, spread=True).interval() == 15.0
    assert NodeMonitor(node, pool, Metrics(), keys[:2_000], spread=True).interval() == 3.0
    assert NodeMonitor(node, pool, Metrics(), keys).interval() == 3.0
    assert SourcePool(node, pool, Metrics(), failover=False).monitor.spread
    assert not SourcePool(node * 2, pool, Metrics(), failover=True).monitor.spread


def test_a_topic_counts_the_partitions_every_answering_node_has(monkeypatch) -> None:
    """A partition added to one node waits for the others; a node that came back empty (no
    topic) or does not answer does not count."""
    names = ("a", "b", "empty", "dead", "refused")
    nodes = [ClusterConfig(name, (f"{name}:1",)) for name in names]
    held = {"a": {"t": 4, "u": 1}, "b": {"t": 2, "u": 1}, "empty": {}}

    def counts(node: ClusterConfig, timeout: float) -> dict[str, int]:
        if node.name == "dead":
            raise TimeoutError("no answer")
        if node.name == "refused":
            raise ConfigError("[[sources]][5].password: the broker refused the login")
        return held[node.name]

    monkeypatch.setattr(admin, "all_partition_counts", counts)
    assert fewest_partitions(nodes, 1.0) == {"t": 2, "u": 1}
    held["b"]["t"] = 4
    assert fewest_partitions(nodes, 1.0) == {"t": 4, "u": 1}


def test_no_node_answering_raises_a_refused_login_first(monkeypatch) -> None:
    nodes = [ClusterConfig(name, (f"{name}:1",)) for name in ("dead", "refused")]

    def counts(node: ClusterConfig, timeout: float) -> dict[str, int]:
        if node.name == "dead":
            raise TimeoutError("no answer")
        raise ConfigError("[[sources]][2].password: the broker refused the login")

    monkeypatch.setattr(admin, "all_partition_counts", counts)
    with pytest.raises(ConfigError, match="password"):
        fewest_partitions(nodes, 1.0)
    monkeypatch.setattr(admin, "all_partition_counts", lambda node, t: counts(nodes[0], t))
    with pytest.raises(ConnectionError, match="no source node answered: dead"):
        fewest_partitions(nodes, 1.0)

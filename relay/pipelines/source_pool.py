"""Failover: background health checks of N identical source nodes, and the choice of node.

Nodes are compared per partition, never by a summed weight (kaf-relay's weak point: a sum hides
one partition falling behind). A node that does not answer a health check within
`request_timeout` is down at once. A node can serve only if it holds every offset already
relayed (its end is at or past each partition's next offset); otherwise resuming on it would
wait for, or worse skip, records.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from relay.clients import admin
from relay.clients.kept import ClientCache
from relay.clients.settings import describe, is_retriable
from relay.config import ClusterConfig, SourcePoolConfig
from relay.engine.metrics import Metrics, per_topic
from relay.engine.pipeline import NodeView
from relay.errors import ConfigError
from relay.pipelines.spacing import spaced
from relay.spec import SourcePartition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    node: str
    reason: str  # "initial", "down", "lag"


def max_lag(view: NodeView, best: dict[SourcePartition, int]) -> int:
    """How far `view` is behind the most advanced node, on its worst partition."""
    return max((best[key] - view.ends.get(key, 0) for key in best), default=0)


def best_ends(views: Sequence[NodeView]) -> dict[SourcePartition, int]:
    best: dict[SourcePartition, int] = {}
    for view in views:
        if view.up:
            for key, end in view.ends.items():
                best[key] = max(best.get(key, 0), end)
    return best


def can_serve(view: NodeView, nexts: dict[SourcePartition, int]) -> bool:
    """Up, and holding every offset already relayed: its end is at or past each partition's
    next offset (so resuming on it skips nothing)."""
    return view.up and all(view.ends.get(key, -1) >= nxt for key, nxt in nexts.items())


def choose(
    views: Sequence[NodeView],
    active: str | None,
    nexts: dict[SourcePartition, int],
    threshold: int,
) -> Decision | None:
    """The node to switch to, or None to stay (or to wait, when no node can serve).

    Down active node: the next node in round-robin order among those within the lag threshold
    of the most advanced one. Active node behind another by more than the threshold on any
    partition: the most advanced node. Views are in configuration order.
    """
    best = best_ends(views)
    candidates = [v for v in views if can_serve(v, nexts)]
    by_name = {v.name: v for v in views}
    current = by_name.get(active) if active is not None else None
    if current is not None and current.up:
        if max_lag(current, best) <= threshold or not candidates:
            return None
        leader = min(candidates, key=lambda v: max_lag(v, best))
        if leader.name == active or max_lag(leader, best) >= max_lag(current, best):
            return None
        return Decision(leader.name, "lag")
    fresh = [v for v in candidates if max_lag(v, best) <= threshold] or candidates
    if not fresh:
        return None
    names = [v.name for v in views]
    start = names.index(active) + 1 if active in names else 0
    order = names[start:] + names[:start]
    pick = next(name for name in order if any(v.name == name for v in fresh))
    return Decision(pick, "initial" if active is None else "down")


class NodeMonitor:
    """Checks every node's end offsets every `healthcheck_interval`, on a driver thread; with
    `spread` (checks that only observe) further apart beyond a few thousand partitions
    (relay.pipelines.spacing)."""

    def __init__(
        self,
        nodes: Sequence[ClusterConfig],
        pool: SourcePoolConfig,
        metrics: Metrics,
        keys: Sequence[SourcePartition] = (),
        spread: bool = False,
    ):
        self.nodes = list(nodes)
        self.pool = pool
        self.metrics = metrics
        self.keys = list(keys)
        self.spread = spread
        self._views: dict[str, NodeView] = {n.name: NodeView(n.name, False) for n in nodes}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Each node's clients stay open from one check to the next (a new one would cost a
        # bootstrap: 3-4 round trips, more than request_timeout across a long link); a check
        # still running when the next is due makes that one fail rather than share them.
        self._clients = {n.name: (ClientCache(), threading.Lock()) for n in self.nodes}
        # Each node's real ends by (beginning, listed end) from its last answer (see
        # admin.real_end_offsets), forgotten when it does not answer: a node that restarts
        # empty and fills up again must be asked afresh.
        self._ends: dict[str, admin.EndMemo] = {n.name: {} for n in self.nodes}
        self._refusals: dict[str, str] = {}  # node -> the refused login last said

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="ktm-monitor", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop checking, at once. A check in flight is not waited for: a node that does not
        answer would hold a stop for request_timeout (seen: 5 s with the source frozen), and a
        far node's first answer takes a bootstrap, ~4 round trips (it held every stop of a
        copy from a source 240 ms away ~1 s). Such a check closes its node's clients itself
        when it ends (`_check`); `_stop` is set first, so one of the two always does."""
        self._stop.set()
        for cache, lock in self._clients.values():
            if lock.acquire(blocking=False):
                try:
                    cache.close()
                finally:
                    lock.release()

    def views(self) -> list[NodeView]:
        with self._lock:
            return [self._views[n.name] for n in self.nodes]

    def check_now(self) -> list[NodeView]:
        """Ask every node at once; each answer within request_timeout or the node is down. The
        checks run on daemon threads: one stuck on a node that does not answer must hold up
        neither a stop nor the process's exit (a thread pool's workers are joined at exit)."""
        answers: dict[str, NodeView | BaseException] = {}
        threads = [
            threading.Thread(
                target=self._answer, args=(node, answers), name="ktm-health", daemon=True
            )
            for node in self.nodes
        ]
        for thread in threads:
            thread.start()
        limit = self.pool.request_timeout * 2 + 1
        deadline = time.monotonic() + limit
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        views = []
        for node in self.nodes:
            found = answers.get(node.name, TimeoutError(f"no answer within {limit:g}s"))
            if isinstance(found, BaseException):
                found = NodeView(node.name, False, error=f"{type(found).__name__}: {found}")
            views.append(found)
        self._publish(views)
        return views

    def _answer(self, node: ClusterConfig, answers: dict[str, NodeView | BaseException]) -> None:
        try:
            answers[node.name] = self._check(node)
        except ConfigError as exc:  # a refused login (relay/clients/login.py): down for good
            if self._refusals.get(node.name) != str(exc):
                self._refusals[node.name] = str(exc)
                log.error(
                    "source node %s cannot be used until its config is fixed: %s", node.name, exc
                )
            answers[node.name] = exc
        except Exception as exc:  # noqa: BLE001 - any failure means: down
            answers[node.name] = exc

    def _loop(self) -> None:
        while not self._stop.wait(self.interval()):
            self.check_now()

    def interval(self) -> float:
        interval = self.pool.healthcheck_interval
        return spaced(interval, len(self.keys)) if self.spread else interval

    def _check(self, node: ClusterConfig) -> NodeView:
        cache, lock = self._clients[node.name]
        if not lock.acquire(blocking=False):
            raise TimeoutError("the previous health check has not answered yet")
        memo = self._ends[node.name]
        try:
            with cache.use():
                ends = admin.health_end_offsets(node, self.keys, self.pool.request_timeout, memo)
        except BaseException:
            memo.clear()
            raise
        finally:
            if self._stop.is_set():  # closed meanwhile, without waiting for this check
                cache.close()
            lock.release()
        return NodeView(node.name, True, ends)

    def _publish(self, views: list[NodeView]) -> None:
        """Log a node going down or up; set the gauges of what changed (at thousands of
        partitions, setting every series at every check was a good part of the driver's CPU)."""
        with self._lock:
            before = [self._views[view.name] for view in views]
            for view, was in zip(views, before, strict=True):
                if was.up and not view.up:
                    log.warning("source node %s is down: %s", view.name, view.error)
                elif view.up and not was.up:
                    log.info("source node %s is up", view.name)
                self._views[view.name] = view
        for view, was in zip(views, before, strict=True):
            self.metrics.node_up.labels(view.name).set(1 if view.up else 0)
            old = self._series(was.ends)
            for (topic, partition), end in self._series(view.ends).items():
                if old.get((topic, partition)) != end:
                    self.metrics.node_end_offset.labels(view.name, topic, partition).set(end)

    def _series(self, ends: dict[SourcePartition, int]) -> dict[tuple[str, str], float]:
        """End offsets by the labels of their series: per partition, or summed per topic."""
        found = ends if self.metrics.per_partition else per_topic(ends)
        return {(topic, str(partition)): end for (topic, partition), end in found.items()}


class SourcePool:
    """The source side of a relay: one cluster (single mode) or N identical nodes (failover).

    In failover mode it owns the health monitor and answers, between rounds and while one runs,
    whether to switch nodes. It never moves records and never decides resume offsets: the
    driver does, from the destination's provenance headers.
    """

    def __init__(
        self,
        nodes: Sequence[ClusterConfig],
        pool: SourcePoolConfig,
        metrics: Metrics,
        failover: bool,
    ):
        self.failover = failover
        self.nodes = list(nodes) if failover else [nodes[0]]
        if failover and pool.randomize_initial:
            random.shuffle(self.nodes)
        self.pool = pool
        self.metrics = metrics
        self.active = self.nodes[0]
        # Single mode checks its one node too, to observe (node-up gauge, source end offsets
        # for lag, /healthz; the tasks' fetches report the ends too): only failover mode acts
        # on the checks, and only its checks keep the interval at any number of partitions.
        self.monitor = NodeMonitor(self.nodes, pool, metrics, spread=not failover)

    def describe_all(self) -> str:
        return "; ".join(describe(node) for node in self.nodes)

    def partition_counts(self, topics: list[str], timeout: float) -> dict[str, int]:
        """The partition counts of `topics` (see `topic_counts`)."""
        wanted = set(topics)
        return {topic: n for topic, n in self.topic_counts(timeout).items() if topic in wanted}

    def topic_counts(self, timeout: float) -> dict[str, int]:
        """Every topic's partition count: in failover mode the fewest among the nodes that
        answer and hold the topic. A partition added to the nodes is relayed once each of them
        has it: relayed from one node alone, a failover would find no node to continue it on
        (the continuity rules refuse a node without it). A node without the topic at all came
        back empty and is never used (`can_serve`): it does not count."""
        if not self.failover:
            return first_answering(self.nodes, timeout)[1]
        return fewest_partitions(self.nodes, timeout)

    def start(self, keys: Sequence[SourcePartition], nexts: dict[SourcePartition, int]) -> None:
        """Pick the first active node (failover: one that holds everything relayed so far)."""
        self.watch(keys)
        if not self.failover:
            self._activate(self.active.name)
            self.monitor.start()
            return
        views = self.monitor.check_now()
        decision = choose(views, None, nexts, self.pool.offset_lag_threshold)
        if decision is None:
            raise ConnectionError("no source node can serve: " + _why(views, nexts))
        self._activate(decision.node)
        log.info("active source node %s (of %d)", decision.node, len(self.nodes))
        self.monitor.start()

    def watch(self, keys: Sequence[SourcePartition]) -> None:
        """The partitions the health checks read the ends of, from their next check on."""
        self.monitor.keys = list(keys)

    def boot_ends(self) -> dict[SourcePartition, int] | None:
        """--stop-at-end targets in failover mode: the most advanced healthy node's ends."""
        if not self.failover:
            return None
        views = [v for v in self.monitor.views() if v.up]
        best = best_ends(views)
        return dict(min(views, key=lambda v: max_lag(v, best)).ends)

    def next_switch(self, nexts: dict[SourcePartition, int], urgent: bool) -> Decision | None:
        """Whether to move to another node now (asked every tick); raises if none can serve."""
        if not self.failover:
            return None
        views = self.monitor.check_now() if urgent else self.monitor.views()
        decision = choose(views, self.active.name, nexts, self.pool.offset_lag_threshold)
        if decision is None and not urgent and not self._up(views):
            # Cached views may predate `nexts` (relayed since): a node can look behind what
            # was relayed only because it was asked earlier. Conclude from answers read after.
            views = self.monitor.check_now()
            decision = choose(views, self.active.name, nexts, self.pool.offset_lag_threshold)
        if decision is None and not self._up(views):
            raise ConnectionError("no source node can serve: " + _why(views, nexts))
        return decision

    def _up(self, views: Sequence[NodeView]) -> bool:
        return next(v for v in views if v.name == self.active.name).up

    def node(self, name: str) -> ClusterConfig:
        return next(n for n in self.nodes if n.name == name)

    def switch(self, decision: Decision) -> None:
        old = self.active.name
        self._activate(decision.node)
        self.metrics.failovers.labels(old, decision.node, decision.reason).inc()

    def _activate(self, name: str) -> None:
        self.active = self.node(name)
        for node in self.nodes:
            self.metrics.active_node.labels(node.name).set(1 if node.name == name else 0)

    def views(self) -> list[NodeView]:
        return self.monitor.views()

    def close(self) -> None:
        self.monitor.close()


def _why(views: Sequence[NodeView], nexts: dict[SourcePartition, int]) -> str:
    reasons = []
    for view in views:
        if not view.up:
            reasons.append(f"{view.name} down ({view.error})")
        else:
            behind = [k for k, nxt in nexts.items() if view.ends.get(k, -1) < nxt]
            reasons.append(f"{view.name} behind what was relayed on {len(behind)} partition(s)")
    return "; ".join(reasons)


def first_answering(
    nodes: Sequence[ClusterConfig], timeout: float
) -> tuple[ClusterConfig, dict[str, int]]:
    """The first node that answers, with every topic's partition count on it (all nodes hold
    the same topics); a node that fails for a retriable reason is passed over."""
    errors = []
    for node in nodes:
        try:
            return node, admin.all_partition_counts(node, timeout)
        except Exception as exc:
            if not is_retriable(exc):
                raise
            errors.append(f"{describe(node)}: {exc}")
    raise ConnectionError("no source node answered: " + "; ".join(errors))


def fewest_partitions(nodes: Sequence[ClusterConfig], timeout: float) -> dict[str, int]:
    """Each topic's partition count on the node that has the fewest, among those that answer
    (see SourcePool.topic_counts). A node that fails for a retriable reason, or refuses ktm's
    login (the monitor says so, and never uses it), is passed over; none answering raises."""
    counts: dict[str, int] = {}
    errors: list[Exception] = []
    for node in nodes:
        try:
            found = admin.all_partition_counts(node, timeout)
        except Exception as exc:
            if not is_retriable(exc) and not isinstance(exc, ConfigError):
                raise
            errors.append(exc)
            continue
        for topic, count in found.items():
            counts[topic] = min(count, counts.get(topic, count))
    if len(errors) == len(nodes):
        refused = [exc for exc in errors if isinstance(exc, ConfigError)]
        if refused:
            raise refused[0]
        whys = "; ".join(f"{describe(n)}: {e}" for n, e in zip(nodes, errors, strict=True))
        raise ConnectionError("no source node answered: " + whys)
    return counts

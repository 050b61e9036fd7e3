"""What the relay knows about its own progress: per-partition counts, lag, rates, health.

The driver feeds it task results after each epoch and the health checks' end offsets; the
metrics, `/healthz` (from the HTTP thread) and the progress view read from it. All state sits
behind one lock, because those readers run on other threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from relay.failover import NodeView
from relay.metrics import Metrics
from relay.plan import PartitionRoute, SourcePartition, TaskResult
from relay.task import SKIPPED_ERROR

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionRow:
    route: PartitionRoute
    next_offset: int
    end: int | None  # latest known source end offset
    stop: int | None  # --stop-at-end target
    relayed: int = 0
    filtered: int = 0
    rate: float = 0.0  # records/s in the last epoch

    @property
    def lag(self) -> int | None:
        return None if self.end is None else max(0, self.end - self.next_offset)


@dataclass(frozen=True)
class Snapshot:
    rows: tuple[PartitionRow, ...]
    active_node: str
    relayed: int
    filtered: int
    elapsed: float
    stop_at_end: bool

    @property
    def lag(self) -> int:
        return sum(row.lag or 0 for row in self.rows)

    @property
    def rate(self) -> float:
        return sum(row.rate for row in self.rows)

    @property
    def remaining(self) -> int | None:
        """Records left to the --stop-at-end targets."""
        if not self.stop_at_end:
            return None
        return sum(max(0, (row.stop or 0) - row.next_offset) for row in self.rows)


class Status:
    def __init__(
        self, metrics: Metrics, stuck_after: float, clock: Callable[[], float] = time.monotonic
    ):
        self.metrics = metrics
        self.stuck_after = stuck_after
        self.clock = clock
        self.started = clock()
        self.last_progress = clock()
        self.active_node = ""
        self.nodes: list[NodeView] = []
        self.epochs = 0
        self.epoch_overhead = 0.0
        self.stop_at_end = False
        self._rows: dict[SourcePartition, PartitionRow] = {}
        self._lock = threading.Lock()

    def start(
        self,
        routes: Sequence[PartitionRoute],
        next_offsets: dict[SourcePartition, int],
        ends: dict[SourcePartition, int],
        stops: dict[SourcePartition, int] | None,
    ) -> None:
        self.stop_at_end = stops is not None
        with self._lock:
            for route in routes:
                key = route.key
                stop = stops.get(key) if stops else None
                self._rows[key] = PartitionRow(route, next_offsets[key], ends.get(key), stop)
        self._publish_lag()

    def record_epoch(self, results: Sequence[TaskResult], wall: float) -> None:
        with self._lock:
            for result in results:
                self._record_result(result)
        busiest = max((r.elapsed for r in results), default=0.0)
        overhead = max(0.0, wall - busiest)
        self.metrics.epoch_duration.observe(wall)
        self.metrics.epoch_overhead.inc(overhead)
        self.epoch_overhead += overhead
        self.epochs += 1
        if any(r.produced or r.filtered for r in results):
            self.last_progress = self.clock()
        self._publish_lag()

    def _record_result(self, r: TaskResult) -> None:
        row = self._rows[r.key]
        route, m = row.route, self.metrics
        labels = (
            route.topic,
            str(route.partition),
            route.target_topic,
            str(route.target_partition),
        )
        m.consumed.labels(*labels).inc(r.consumed)
        m.produced.labels(*labels).inc(r.produced)
        m.bytes_produced.labels(route.target_topic).inc(r.produced_bytes)
        filtered = 0
        for filter_id, count in r.filtered.items():
            if filter_id.endswith(SKIPPED_ERROR):
                filter_id = filter_id.removesuffix(SKIPPED_ERROR)
                m.filter_errors.labels(filter_id, route.topic).inc(count)
            m.filtered.labels(filter_id, route.topic).inc(count)
            filtered += count
        for seconds in r.latencies:
            m.latency.observe(max(0.0, seconds))
        end = row.end if r.highwater is None else max(row.end or 0, r.highwater)
        self._rows[r.key] = replace(
            row,
            next_offset=max(row.next_offset, r.next_offset),
            end=end,
            relayed=row.relayed + r.produced,
            filtered=row.filtered + filtered,
            rate=r.produced / r.elapsed if r.elapsed > 0 else 0.0,
        )

    def advance(self, key: SourcePartition, next_offset: int) -> bool:
        """Move a resume point forward (the destination holds more than was acknowledged: a
        resync after a failure, or a failover); never back. True if it moved."""
        with self._lock:
            row = self._rows[key]
            if next_offset <= row.next_offset:
                return False
            self._rows[key] = replace(row, next_offset=next_offset)
            return True

    def next_offsets(self) -> dict[SourcePartition, int]:
        with self._lock:
            return {key: row.next_offset for key, row in self._rows.items()}

    def observe_nodes(self, views: list[NodeView], active: str) -> None:
        """Health-check answers: the active node's end offsets keep the lag current."""
        self.nodes, self.active_node = views, active
        with self._lock:
            for view in views:
                if view.name != active or not view.up:
                    continue
                for key, end in view.ends.items():
                    if key in self._rows:
                        row = self._rows[key]
                        self._rows[key] = replace(row, end=max(row.end or 0, end))
        self._publish_lag()

    def _publish_lag(self) -> None:
        with self._lock:
            rows = list(self._rows.values())
        for row in rows:
            labels = (row.route.topic, str(row.route.partition))
            self.metrics.next_offset.labels(*labels).set(row.next_offset)
            if row.lag is not None:
                self.metrics.lag.labels(*labels).set(row.lag)

    def snapshot(self) -> Snapshot:
        with self._lock:
            rows = tuple(self._rows[key] for key in sorted(self._rows))
        return Snapshot(
            rows=rows,
            active_node=self.active_node,
            relayed=sum(r.relayed for r in rows),
            filtered=sum(r.filtered for r in rows),
            elapsed=self.clock() - self.started,
            stop_at_end=self.stop_at_end,
        )

    def health(self) -> tuple[bool, dict[str, object]]:
        """200 while progressing or idle at the end of the topics; 503 when stuck or blind."""
        snap = self.snapshot()
        idle_for = self.clock() - self.last_progress
        detail: dict[str, object] = {
            "lag": snap.lag,
            "relayed": snap.relayed,
            "active_node": snap.active_node,
            "seconds_since_progress": round(idle_for, 1),
        }
        if self.nodes and not any(view.up for view in self.nodes):
            down = ", ".join(f"{v.name}: {v.error}" for v in self.nodes)
            return False, {**detail, "reason": f"no source node reachable ({down})"}
        if snap.lag > 0 and idle_for > self.stuck_after:
            reason = f"no progress for {idle_for:.0f}s with lag {snap.lag}"
            return False, {**detail, "reason": reason}
        return True, detail

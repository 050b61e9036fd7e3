"""What the driver knows about progress: per-partition counts, next offsets, lag, rates, health.

Fed while tasks run: every task report (relay.engine.channel, about twice a second per task) carries
cumulative totals for its attempt, of every partition (the final one) or of those that moved (live
ones), and `apply` turns them into deltas, so a report that arrives twice (live, then as the
Spark result) or not at all changes nothing. The metrics, `/healthz`
(from the HTTP thread) and the progress view read from here; all state sits behind one lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from relay.engine.driver.fetch_trouble import FetchTroubles
from relay.engine.driver.gauges import Gauges
from relay.engine.driver.halts import Halts
from relay.engine.driver.rows import (
    RATE_WINDOW,
    NodeView,
    PartitionRow,
    Snapshot,
    current,
    health,
)
from relay.engine.metrics import Metrics, partition_label
from relay.losses import Loss, LossCounter
from relay.spec import (
    NOT_WRITTEN,
    FetchTrouble,
    PartitionProgress,
    PartitionRoute,
    SourcePartition,
)

log = logging.getLogger(__name__)

Attempt = tuple[int, int, int]  # (round, task, attempt)


class Status:
    def __init__(
        self, metrics: Metrics, stuck_after: float, clock: Callable[[], float] = time.monotonic
    ):
        self.metrics = metrics
        self.stuck_after = stuck_after
        self.clock = clock
        self.started = clock()
        self.last_progress = clock()
        self.first_ack_at: float | None = None
        self.active_node = ""
        self.nodes: list[NodeView] = []
        self.rounds = 0
        self.stop_at_end = False
        self.owned: frozenset[SourcePartition] | None = None  # None: every partition is ours
        self.members = 1
        # before the partitions are known (restore --follow): topic -> what it waits for
        self.waiting_topics: Mapping[str, str] = {}
        self.fetches = FetchTroubles(metrics, clock)
        self.halts = Halts(metrics)
        self._losses = LossCounter()
        self._held: dict[Attempt, float] = {}  # each task attempt's throttled seconds so far
        self._rows: dict[SourcePartition, PartitionRow] = {}
        self._seen: dict[Attempt, dict[SourcePartition, PartitionProgress]] = {}
        # runs a failed task wrote and never saw acknowledged (PartitionProgress.unsure)
        self._unsure: dict[SourcePartition, tuple[tuple[int, int, int], ...]] = {}
        self.gauges = Gauges(metrics)
        # followed partitions (`follow`): the health-check answer seen then, older than the
        # new topic
        self._stale: dict[SourcePartition, NodeView | None] = {}
        # each node's health-check answer whose ends are in the rows: the runner shows the
        # answers every tick, a new one comes every check (10,000 compares a tick otherwise)
        self._observed: dict[str, NodeView] = {}
        self._lock = threading.Lock()

    def start(
        self,
        routes: Sequence[PartitionRoute],
        next_offsets: dict[SourcePartition, int],
        ends: dict[SourcePartition, int],
        stops: dict[SourcePartition, int] | None,
    ) -> None:
        self.stop_at_end = stops is not None
        now = self.clock()
        with self._lock:
            self._observed.clear()  # new rows take their ends from the answers already seen
            for route in routes:
                key = route.key
                stop = stops.get(key) if stops else None
                row = PartitionRow(route, next_offsets[key], ends.get(key), stop, rate_at=now)
                self._rows[key] = row
        self._publish(list(self._rows))

    def apply(
        self,
        attempt: Attempt,
        parts: Sequence[PartitionProgress],
        latencies: Sequence[float] = (),
        trouble: Sequence[FetchTrouble] = (),
        throttled: float = 0.0,
    ) -> None:
        """A task's cumulative totals: count what is new since its previous report (and the
        fetch trouble it reports since then)."""
        self.fetches.note(trouble)
        with self._lock:
            held, self._held[attempt] = self._held.get(attempt, 0.0), throttled
        if throttled > held:
            self.metrics.throttled.inc(throttled - held)
        now = self.clock()
        with self._lock:
            seen = self._seen.setdefault(attempt, {})
            moved = False
            for part in parts:
                before = seen.get(part.key)
                if part.key not in self._rows:
                    continue
                seen[part.key] = part
                moved |= self._add(part, before, now)
                if part.unsure:
                    self._unsure[part.key] = part.unsure
                for lost in part.lost[len(before.lost) if before else 0 :]:
                    self._count_loss(part.key, lost, going_on=True)
        for seconds in latencies:
            self.metrics.latency.observe(max(0.0, seconds))
        if moved:
            self.last_progress = now
            if self.first_ack_at is None:
                self.first_ack_at = now
        self._publish([part.key for part in parts])

    def _add(self, part: PartitionProgress, before: PartitionProgress | None, now: float) -> bool:
        """Count one partition's delta; True if records were relayed or dropped."""
        row = self._rows[part.key]
        produced, filtered = self.gauges.count(row.route, part, before)
        end = row.end if part.highwater is None else max(row.end or 0, part.highwater)
        row = replace(
            row,
            next_offset=max(row.next_offset, part.next_offset),
            end=end,
            relayed=row.relayed + max(0, produced),
            filtered=row.filtered + sum(filtered.values()),
            waiting=part.waiting,
        )
        if now - row.rate_at >= RATE_WINDOW:
            rate = (row.relayed - row.rate_base) / (now - row.rate_at)
            row = replace(row, rate=rate, rate_at=now, rate_base=row.relayed)
        row = self._pin(row, part)
        self._rows[part.key] = row
        return produced > 0 or bool(filtered)

    def count_loss(self, key: SourcePartition, lost: tuple[int, int, str]) -> None:
        """Source offsets a halted partition lost (the halt's line says so)."""
        with self._lock:
            self._count_loss(key, lost, going_on=False)

    def _count_loss(self, key: SourcePartition, lost: tuple[int, int, str], going_on: bool) -> None:
        """Count the offsets of `lost` not counted yet (a retried round may find the same ones
        again); when reading went on past them, one line says which (under the lock)."""
        first, end, cause = lost
        row = self._rows.get(key)
        count = self._losses.new(key, first, end, cause)
        if row is None or count == 0:
            return
        self._rows[key] = replace(row, lost=row.lost + count)
        partition = partition_label(self.metrics, key[1])
        self.metrics.records_lost.labels(key[0], partition, cause).inc(count)
        if going_on:
            loss = Loss(key, first, end, cause, first)
            log.warning(
                '%s; going on at offset %s ([source_pool].on_loss = "warn")',
                loss.describe(),
                loss.resume,
            )

    def _pin(self, row: PartitionRow, part: PartitionProgress) -> PartitionRow:
        """A hole pins the partition at its first unacknowledged record until records past it
        are acknowledged again (the next round relays from there)."""
        if part.hole and row.pinned_at is None:
            route = row.route
            log.warning(
                "hole at destination %s[%s]: records of %s[%s] from offset %s failed while later "
                "ones landed; relaying again from %s (those later records may arrive twice)",
                route.target_topic,
                route.target_partition,
                route.topic,
                route.partition,
                part.next_offset,
                part.next_offset,
            )
            self.metrics.holes.labels(
                route.topic, partition_label(self.metrics, route.partition)
            ).inc()
            return replace(row, pinned_at=part.next_offset)
        if row.pinned_at is not None and not part.hole and part.next_offset > row.pinned_at:
            return replace(row, pinned_at=None)
        return row

    def set_owned(self, keys: frozenset[SourcePartition], members: int) -> None:
        """The partitions this process relays now (its share of the group's). Their lag and
        next offset are published; a partition handed to another member has its series
        removed (this process no longer knows where it stands: its numbers would only age)."""
        with self._lock:
            gone = (self.owned if self.owned is not None else frozenset(self._rows)) - keys
            self.owned, self.members = frozenset(keys), members
        self.gauges.forget(set(gone), keys)
        self._publish(sorted(keys))

    def record_round(self, wall: float, reason: str) -> None:
        self.rounds += 1
        self.metrics.round_duration.observe(wall)
        self.metrics.rounds.labels(reason).inc()

    def follow(
        self,
        routes: Sequence[PartitionRoute],
        next_offsets: dict[SourcePartition, int],
        ends: dict[SourcePartition, int],
    ) -> None:
        """Partitions of a recreated topic start over at the new topic's log start, as a new
        incarnation (relay.pipelines.recreated): their rows take the new routes, offsets and
        ends (--stop-at-end: the new end is where they stop), keep what they counted, and
        their halts are lifted. Their ends only grew within the old topic; the new one's may
        be lower, so the first health check answered after this sets them (`observe_nodes`)."""
        with self._lock:
            seen = {view.name: view for view in self.nodes}
            self._observed.clear()  # the answers already seen are read again, as before
            for route in routes:
                self._stale[route.key] = seen.get(self.active_node)
                key, row = route.key, self._rows[route.key]
                stop = ends.get(key) if row.stop is not None else None
                self._rows[key] = replace(
                    row,
                    route=route,
                    next_offset=next_offsets[key],
                    end=ends.get(key),
                    stop=stop,
                    pinned_at=None,
                )
                self._unsure.pop(key, None)
        self.halts.lift(route.key for route in routes)
        self._publish([route.key for route in routes])

    def advance(self, key: SourcePartition, next_offset: int, ours: bool = False) -> bool:
        """Move a next offset forward (the destination holds more than was acknowledged: a
        resync after a failure, or a failover); never back, and never past a hole (the tail is
        past records the destination lacks). True if it moved. `ours`: this process wrote what
        lies in between (no other process owned the partition meanwhile): the runs its failed
        tasks wrote unacknowledged and that landed count as relayed, and a run the broker
        refused or never got, with the tail past it, is a hole: the partition resumes there."""
        with self._lock:
            row = self._rows[key]
            unsure = self._unsure.pop(key, ())
            unsure = unsure if ours else ()  # another process may have written them
            if row.pinned_at is not None:
                return False
            inside = [run for run in unsure if row.next_offset <= run[0] < next_offset]
            lost = [first for first, _, state in inside if state == NOT_WRITTEN]
            if lost:
                next_offset = min(lost)
                self._hole(row, next_offset)
            if next_offset <= row.next_offset:
                return False
            landed = sum(n for first, n, state in inside if first < next_offset)
            self._rows[key] = replace(row, next_offset=next_offset, relayed=row.relayed + landed)
        if landed:
            self.gauges.counters(row.route)[1].inc(landed)
        self._publish([key])
        return True

    def _hole(self, row: PartitionRow, at: int) -> None:
        """The destination's tail is past records it lacks (they were refused, or never sent,
        while later ones landed): said, counted, and the partition resumes at them."""
        route = row.route
        log.warning(
            "hole at destination %s[%s]: records of %s[%s] from offset %s were not written while "
            "later ones landed; relaying again from %s (those later records may arrive twice)",
            route.target_topic,
            route.target_partition,
            route.topic,
            route.partition,
            at,
            at,
        )
        self.metrics.holes.labels(route.topic, partition_label(self.metrics, route.partition)).inc()

    def next_offsets(self) -> dict[SourcePartition, int]:
        with self._lock:
            return {key: row.next_offset for key, row in self._rows.items()}

    def rows(self) -> dict[SourcePartition, PartitionRow]:
        """Every partition's row, its rate 0 once stale: a partition that stopped moving is
        left out of live reports, so its last rate is never measured again. A stale rate is
        kept as 0 (its window start stays: the next report measures from there), not made
        0 again at every call: a copy of the row per partition and call otherwise."""
        now = self.clock()
        with self._lock:
            for key, row in self._rows.items():
                fresh = current(row, now)
                if fresh is not row:
                    self._rows[key] = fresh
            return dict(self._rows)

    def observe_nodes(self, views: list[NodeView], active: str) -> None:
        """Health-check answers: the active node's end offsets keep the lag current."""
        self.nodes, self.active_node = views, active
        moved = []
        with self._lock:
            for view in views:
                if view.name != active or not view.up or self._observed.get(view.name) is view:
                    continue
                self._observed[view.name] = view
                for key, end in view.ends.items():
                    row = self._rows.get(key)
                    # a followed partition's first new answer sets its end, even lower
                    renewed = key in self._stale and self._stale[key] is not view
                    if renewed:
                        del self._stale[key]
                    if row is not None and (row.end is None or end > row.end or renewed):
                        self._rows[key] = replace(row, end=end)
                        moved.append(key)
        self._publish(moved)  # only what changed: at 2,000 partitions every check cost ~0.1 s

    def _publish(self, keys: Sequence[SourcePartition]) -> None:
        lags: dict[SourcePartition, int] = {}
        with self._lock:
            owned = self.owned
            rows = [
                self._rows[k] for k in keys if k in self._rows and (owned is None or k in owned)
            ]
            if not self.metrics.per_partition:  # a topic's lag: every owned partition of it
                topics = {row.route.topic for row in rows}
                mine = [r for k, r in self._rows.items() if owned is None or k in owned]
                lags = {r.route.key: r.lag or 0 for r in mine if r.route.topic in topics}
        self.gauges.publish(rows, lags)

    def snapshot(self) -> Snapshot:
        now = self.clock()
        with self._lock:
            owned, members = self.owned, self.members
            rows = tuple(
                replace(current(row, now), owned=owned is None or key in owned)
                for key, row in sorted(self._rows.items())
            )
        return Snapshot(
            rows=rows,
            active_node=self.active_node,
            relayed=sum(r.relayed for r in rows),
            filtered=sum(r.filtered for r in rows),
            elapsed=now - self.started,
            stop_at_end=self.stop_at_end,
            members=members,
            trouble=tuple(self.fetches.lines()),
            halted=self.halts.all(),
        )

    def health(self) -> tuple[bool, dict[str, object]]:
        """200 while progressing or idle at the end of the topics; 503 when stuck or blind."""
        idle_for = self.clock() - self.last_progress
        return health(self.snapshot(), idle_for, self.stuck_after, self.nodes, self.waiting_topics)

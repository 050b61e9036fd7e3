"""What the status says of each partition and of the run: rows, a snapshot, health.

Read-only views the driver's status (relay.engine.driver.status) hands out: the progress view,
`/healthz`, the summary and the round planner read them, never the status's own state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from relay.engine.pipeline import Halt, NodeView
from relay.spec import PartitionRoute

RATE_WINDOW = 1.0  # seconds over which a partition's rate is measured
RATE_STALE = 3.0  # a rate not refreshed for this long reads as 0

# restore --follow: why a partition waits (relay.pipelines.restore.store_reader), for logs and
# /healthz
WAIT_REASONS = {"empty": "its first segment", "late": "a late segment"}


@dataclass(frozen=True)
class PartitionRow:
    route: PartitionRoute
    next_offset: int
    end: int | None  # latest known source end offset
    stop: int | None  # --stop-at-end target
    relayed: int = 0
    filtered: int = 0
    owned: bool = True  # relayed by this process (others in its group relay the rest)
    rate: float = 0.0  # records/s over the last RATE_WINDOW
    rate_at: float = 0.0  # when `rate` was measured
    rate_base: int = 0  # `relayed` at rate_at
    waiting: tuple[str, float] | None = None  # restore --follow: (reason, seconds) it waits
    # a hole at the destination: the partition resumes at this next offset, not after the tail
    pinned_at: int | None = None
    lost: int = 0  # source offsets lost to the copy (relay.losses)

    @property
    def lag(self) -> int | None:
        return None if self.end is None else max(0, self.end - self.next_offset)

    @property
    def remaining(self) -> int | None:
        """Records left before its --stop-at-end target; None without one."""
        return None if self.stop is None else max(0, self.stop - self.next_offset)


@dataclass(frozen=True)
class Snapshot:
    rows: tuple[PartitionRow, ...]
    active_node: str
    relayed: int
    filtered: int
    elapsed: float
    stop_at_end: bool
    members: int = 1  # ktm processes in the group
    trouble: tuple[str, ...] = ()  # source brokers the tasks cannot fetch from, one line each
    halted: tuple[Halt, ...] = ()  # partitions the destination refuses a record of

    @property
    def lost(self) -> int:
        """Source offsets lost to the copy (relay.losses), every partition."""
        return sum(row.lost for row in self.rows)

    @property
    def owned(self) -> tuple[PartitionRow, ...]:
        return tuple(row for row in self.rows if row.owned)

    @property
    def lag(self) -> int:
        """Records behind on the partitions this process relays."""
        return sum(row.lag or 0 for row in self.owned)

    @property
    def rate(self) -> float:
        return sum(row.rate for row in self.rows)

    @property
    def remaining(self) -> int | None:
        """Records left to the --stop-at-end targets of the partitions this process relays."""
        if not self.stop_at_end:
            return None
        return sum(row.remaining or 0 for row in self.owned)


def current(row: PartitionRow, now: float) -> PartitionRow:
    """The row with its rate read as 0 once not refreshed for RATE_STALE seconds."""
    if row.rate and now - row.rate_at >= RATE_STALE:
        return replace(row, rate=0.0)
    return row


def health(
    snap: Snapshot,
    idle_for: float,
    stuck_after: float,
    nodes: list[NodeView],
    waiting_topics: Mapping[str, str] | None = None,
) -> tuple[bool, dict[str, object]]:
    """200 while progressing or idle at the end of the topics; 503 when stuck or blind."""
    detail: dict[str, object] = {
        "lag": snap.lag,
        "relayed": snap.relayed,
        "active_node": snap.active_node,
        "seconds_since_progress": round(idle_for, 1),
        "owned_partitions": len(snap.owned),
        "group_members": snap.members,
    }
    waiting = dict(waiting_topics or {})
    for row in snap.owned:
        if row.waiting is not None:
            waiting[f"{row.route.topic}[{row.route.partition}]"] = WAIT_REASONS[row.waiting[0]]
    if waiting:  # a state to wait in (restore --follow), not a fault
        detail["waiting"] = waiting
    if snap.trouble:
        detail["source_trouble"] = list(snap.trouble)
    if snap.lost:  # said and counted; a partition that halted for it is 503 below
        lost = {f"{r.route.topic}[{r.route.partition}]": r.lost for r in snap.rows if r.lost}
        detail["source_records_lost"] = lost
    if snap.halted:  # needs the operator: the destination refuses a record of each
        detail["halted"] = [halt.as_dict() for halt in snap.halted]
        where = ", ".join(halt.where for halt in snap.halted)
        return False, {**detail, "reason": f"partition(s) halted: {where}"}
    if nodes and not any(view.up for view in nodes):
        down = ", ".join(f"{v.name}: {v.error}" for v in nodes)
        return False, {**detail, "reason": f"no source node reachable ({down})"}
    if snap.lag > 0 and idle_for > stuck_after:
        reason = f"no progress for {idle_for:.0f}s with lag {snap.lag}"
        reason += "".join(f"; {line}" for line in snap.trouble)
        return False, {**detail, "reason": reason}
    return True, detail

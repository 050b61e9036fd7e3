"""What a run did, for the CLI's last lines and `--summary-json`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from relay.engine.driver.seams import Backend
from relay.engine.driver.status import Status
from relay.engine.metrics import Metrics
from relay.spec import SourcePartition


@dataclass
class RunSummary:
    relayed: int = 0
    filtered: int = 0
    rounds: int = 0
    elapsed: float = 0.0
    spark_start: float = 0.0
    first_record: float | None = None  # seconds from start to the first acknowledged record
    slots: int = 0
    rebalances: int = 0
    stopped_by_signal: bool = False
    next_offsets: dict[SourcePartition, int] = field(default_factory=dict)
    # partitions halted because the destination refuses one of their records (Halt.as_dict)
    halted: list[dict[str, object]] = field(default_factory=list)
    # source offsets lost to the copy (relay.losses): in all, and per "topic/partition"
    records_lost: int = 0
    lost: dict[str, int] = field(default_factory=dict)


def summarize(
    s: RunSummary,
    status: Status,
    backend: Backend,
    rebalances: int,
    stopped_by_signal: bool,
    begun: float,
    metrics: Metrics,
) -> None:
    """Fill `s` in at the end of a run (monotonic `begun`: when the run started)."""
    snap = status.snapshot()
    s.elapsed = time.monotonic() - begun
    s.stopped_by_signal = stopped_by_signal
    s.next_offsets = status.next_offsets()
    s.relayed, s.filtered, s.rounds = snap.relayed, snap.filtered, status.rounds
    s.spark_start, s.slots = backend.start_seconds, backend.engine_slots()
    s.rebalances = rebalances
    s.halted = [halt.as_dict() for halt in snap.halted]
    s.records_lost = snap.lost
    s.lost = {f"{r.route.topic}/{r.route.partition}": r.lost for r in snap.rows if r.lost}
    if status.first_ack_at is not None:
        s.first_record = status.first_ack_at - begun
        metrics.first_record.set(s.first_record)

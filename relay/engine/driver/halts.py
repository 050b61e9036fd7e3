"""Halted partitions: source partitions ktm stopped relaying because the destination refuses one
of their records for good (relay.refusals), or because the source lost records before they were
copied (relay.losses: `on_loss = "stop"`, a truncated log, a recreated topic), while the others
go on.

A halt is kept for the life of the process: the records before the refused one are relayed (the
partition's stop offset is the refused record's), nothing from it on is, and no round retries
it. It shows in one ERROR line, `ktm_partitions_halted`, `/healthz`, the progress view and
`--summary-json`; `--stop-at-end` exits 1 naming them. A restart tries the partition again (after
the destination's config was changed, say).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from relay.engine.metrics import Metrics, partition_label
from relay.engine.pipeline import Halt
from relay.spec import PartitionRoute, SourcePartition

log = logging.getLogger(__name__)


class Halts:
    """The halted partitions of this process (shared by the main and HTTP threads)."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        self._halts: dict[SourcePartition, Halt] = {}
        self._lock = threading.Lock()

    def add(self, route: PartitionRoute, offset: int, reason: str) -> bool:
        """Halt a partition at `offset` (an earlier refused record moves it back); one ERROR
        line the first time and whenever the offset moves. True if it changed."""
        with self._lock:
            before = self._halts.get(route.key)
            if before is not None and before.offset <= offset:
                return False
            self._halts[route.key] = Halt(route, offset, reason)
        log.error(
            "halted source partition %s[%s] at offset %s: %s; every record before offset %s is "
            "relayed and committed, none from it on (the other partitions go on)",
            route.topic,
            route.partition,
            offset,
            reason,
            offset,
        )
        if before is None:
            label = partition_label(self.metrics, route.partition)
            self.metrics.halted.labels(route.topic, label).inc()
        return True

    def offsets(self) -> dict[SourcePartition, int]:
        with self._lock:
            return {key: halt.offset for key, halt in self._halts.items()}

    def all(self) -> tuple[Halt, ...]:
        with self._lock:
            return tuple(halt for _, halt in sorted(self._halts.items()))

    def lift(self, keys: Iterable[SourcePartition]) -> None:
        """The partitions relay again (a recreated topic followed: its new incarnation starts
        over, and what halted the old one says nothing of it)."""
        with self._lock:
            lifted = [self._halts.pop(key) for key in keys if key in self._halts]
        for halt in lifted:
            label = partition_label(self.metrics, halt.route.partition)
            self.metrics.halted.labels(halt.route.topic, label).dec()

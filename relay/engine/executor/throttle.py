"""A task's share of `[limits]`: records and bytes per second it may read.

The driver splits the group's limit by partitions (a process's share is the partitions it owns
of all of the config's; a task's, the partitions it serves of the process's) and hands each task
its rates in its spec. The task asks `wait()` before each read and tells `spend()` what the read
brought: a read is allowed while the balance is not negative, so one read may overdraw it and
the next waits until the debt is paid. What one read may bring is bounded by the fetch sizes
(relay.engine.executor.task lowers them under a bytes limit), so over any stretch of seconds
the rate stays within a read of the limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BURST = 0.1  # seconds of the rate a task may read ahead of it after idling


class Throttle:
    def __init__(
        self,
        records_per_second: float | None,
        bytes_per_second: float | None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.rates = {
            "records": records_per_second or None,
            "bytes": bytes_per_second or None,
        }
        self.clock = clock
        self._balance = {kind: rate * BURST for kind, rate in self.rates.items() if rate}
        self._at = clock()
        self.held = 0.0  # seconds reads were held back (cumulative)

    @property
    def limited(self) -> bool:
        return bool(self._balance)

    def wait(self) -> float:
        """Seconds until the next read may go (0: now)."""
        self._refill()
        waits = [
            -balance / self.rates[kind]  # type: ignore[operator]
            for kind, balance in self._balance.items()
            if balance < 0
        ]
        return max(waits, default=0.0)

    def spend(self, records: int, size: int) -> None:
        self._refill()
        for kind, amount in (("records", records), ("bytes", size)):
            if kind in self._balance:
                self._balance[kind] -= amount

    def _refill(self) -> None:
        now = self.clock()
        elapsed, self._at = now - self._at, now
        for kind, rate in self.rates.items():
            if rate and kind in self._balance:
                self._balance[kind] = min(rate * BURST, self._balance[kind] + rate * elapsed)

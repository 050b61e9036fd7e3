"""Source brokers the tasks cannot fetch from: never silent.

Tasks report, with their progress, the fetches that failed since their last report and how
long a fetch has been out to a broker (`relay.spec.FetchTrouble`). A fetch that keeps failing
or timing out is retried by the task without end: without this, a relay that cannot read
would print `relayed=0 ... eta=?` forever. Here each broker's failures over the last minute are
counted, logged at most every `LOG_EVERY` seconds (broker, failures, the error, since when),
exported (`ktm_fetch_failures_total{node}`, `ktm_fetch_waiting_seconds{node}`) and summed up in
one line for `/healthz` and the progress view ("waiting for HOST:PORT: 37 fetches failed in the
last 60 s (RequestTimedOutError: ...)").
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from relay.engine.metrics import Metrics
from relay.spec import FetchTrouble

log = logging.getLogger(__name__)

WINDOW = 60.0  # seconds of failures counted
LOG_EVERY = 30.0  # seconds between two warnings about one broker
WAITING_NOTICE = 5.0  # seconds a fetch may be out before the progress line says so
WAITING_FRESH = 3.0  # a waiting fetch not reported again for this long is over (its task too)
# A broker with no failure reported for this long is not waited for any more: the progress line
# drops it (its failures still count for the minute). Tasks report every second or so while
# failures go on; a fetch that hangs instead shows as waiting.
FAILING_FRESH = 10.0


@dataclass
class _Broker:
    failures: deque[tuple[float, int]] = field(default_factory=deque)  # (when, how many)
    error: str = ""
    since: float | None = None  # when the current run of failures began
    failed_at: float = float("-inf")  # when a failure was last reported
    waiting: float = 0.0  # the longest a fetch to it is out, from the latest report
    waiting_at: float = 0.0
    logged_at: float = -LOG_EVERY


class FetchTroubles:
    def __init__(self, metrics: Metrics, clock: Callable[[], float] = time.monotonic):
        self.metrics, self.clock = metrics, clock
        self._brokers: dict[str, _Broker] = {}
        self._lock = threading.Lock()

    def note(self, reports: Sequence[FetchTrouble]) -> None:
        """A task's report (the channel thread, or the driver at a round's end)."""
        now = self.clock()
        for report in reports:
            with self._lock:
                broker = self._brokers.setdefault(report.node, _Broker())
                if report.failures:
                    broker.failures.append((now, report.failures))
                    broker.error = report.error
                    broker.since = broker.since if broker.since is not None else now
                    broker.failed_at = now
                broker.waiting, broker.waiting_at = report.waiting, now
                self._expire(broker, now)
                due = broker.failures and now - broker.logged_at >= LOG_EVERY
                if due:
                    broker.logged_at = now
                failed, since, error = self._count(broker), broker.since, broker.error
            if report.failures:
                self.metrics.fetch_failures.labels(report.node).inc(report.failures)
            self.metrics.fetch_waiting.labels(report.node).set(report.waiting)
            if due:
                log.warning(
                    "fetches from source broker %s keep failing: %d in the last %.0f s, for "
                    "%.0f s now (last: %s); retrying",
                    report.node,
                    failed,
                    WINDOW,
                    now - (since or now),
                    error,
                )

    def lines(self) -> list[str]:
        """One line per broker in trouble now, for the progress view and /healthz."""
        now = self.clock()
        found = []
        with self._lock:
            for node, broker in sorted(self._brokers.items()):
                self._expire(broker, now)
                failed = self._count(broker)
                waiting = broker.waiting if now - broker.waiting_at < WAITING_FRESH else 0.0
                if failed and now - broker.failed_at <= FAILING_FRESH:
                    found.append(
                        f"waiting for {node}: {failed} fetches failed in the last "
                        f"{WINDOW:.0f} s ({broker.error})"
                    )
                elif waiting >= WAITING_NOTICE:
                    found.append(f"waiting for {node}: a fetch has been out for {waiting:.0f} s")
        return found

    @staticmethod
    def _count(broker: _Broker) -> int:
        return sum(count for _, count in broker.failures)

    @staticmethod
    def _expire(broker: _Broker, now: float) -> None:
        while broker.failures and now - broker.failures[0][0] > WINDOW:
            broker.failures.popleft()
        if not broker.failures:
            broker.since = None

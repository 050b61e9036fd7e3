"""Periodic sampling on a thread, and the arithmetic on (time, value) series."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

Sample = tuple[float, int]  # (time.monotonic() when the value was read, value)


class Sampler:
    """Calls ``read`` every ``every`` seconds on a thread and keeps (time, value) pairs; a None
    value (e.g. /metrics not up yet) is skipped. The time is taken after the read returned:
    the value was true at that time at the latest."""

    def __init__(self, read: Callable[[], int | None], every: float):
        self.samples: list[Sample] = []
        self._read, self._every = read, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        tick = time.monotonic()
        while not self._stop.is_set():
            value = self._read()
            if value is not None:
                self.samples.append((time.monotonic(), value))
            tick += self._every
            self._stop.wait(max(0.0, tick - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def last(self) -> int | None:
        return self.samples[-1][1] if self.samples else None


def in_window(samples: Sequence[Sample], low: float, high: float) -> list[Sample]:
    """The samples whose value lies in [low, high]."""
    return [(t, n) for t, n in samples if low <= n <= high]


def slope(samples: Sequence[Sample], low: float, high: float) -> tuple[float | None, int, float]:
    """Least-squares records/s over the samples whose value lies in [low, high]: the steady
    part of a run, without start-up and the tail. (rate or None, samples used, seconds)."""
    window = in_window(samples, low, high)
    if len(window) < 3:
        return None, len(window), 0.0
    mean_t = sum(t for t, _ in window) / len(window)
    mean_n = sum(n for _, n in window) / len(window)
    var = sum((t - mean_t) ** 2 for t, _ in window)
    cov = sum((t - mean_t) * (n - mean_n) for t, n in window)
    return (cov / var if var else None), len(window), window[-1][0] - window[0][0]


def value_at(samples: Sequence[Sample], at: float) -> float | None:
    """The value at time ``at``, linearly between the samples around it; None outside them."""
    for (t0, v0), (t1, v1) in zip(samples, samples[1:], strict=False):
        if t0 <= at <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (at - t0) / (t1 - t0)
    return None


def growth_per_second(samples: Sequence[Sample], start: float, end: float) -> float | None:
    """How fast the sampled value grew between two times (e.g. CPU ms of a process tree per
    second over the window a rate was measured on); None if the samples do not span it."""
    first, last = value_at(samples, start), value_at(samples, end)
    if first is None or last is None or end <= start:
        return None
    return (last - first) / (end - start)


def trailing_lags(truth: Sequence[Sample], metric: Sequence[Sample]) -> tuple[list[float], int]:
    """For each truth sample (t, n): the first metric sample (t', m) with m >= n; lag t' - t
    (negative when the metric was there first). Returns the sorted lags and how many truth
    samples the metric never reached."""
    lags: list[float] = []
    never = 0
    i = 0
    for t, n in sorted(truth, key=lambda s: s[1]):  # counts only grow: one pass over the metric
        while i < len(metric) and metric[i][1] < n:
            i += 1
        if i == len(metric):
            never += 1
        else:
            lags.append(metric[i][0] - t)
    return sorted(lags), never

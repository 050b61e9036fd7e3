"""The status's metrics: counters a task report moves, and the gauges of where partitions stand.

Metric children are looked up once per partition and kept: a label lookup costs microseconds,
and thousands of partitions report twice a second. Used under the status's lock or with rows
read under it (relay.engine.driver.status).
"""

from __future__ import annotations

import logging

from prometheus_client import Counter, Gauge

from relay.engine.driver.rows import WAIT_REASONS, PartitionRow
from relay.engine.metrics import ALL_PARTITIONS, Metrics, partition_label, per_topic
from relay.spec import PartitionProgress, PartitionRoute, SourcePartition

log = logging.getLogger(__name__)


class Gauges:
    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        self._counters: dict[SourcePartition, tuple[Counter, Counter, Counter]] = {}
        self._gauges: dict[tuple[str, str], tuple[Gauge, Gauge]] = {}
        self._waited: set[tuple[tuple[str, str], str]] = set()

    def count(
        self, route: PartitionRoute, part: PartitionProgress, before: PartitionProgress | None
    ) -> tuple[int, dict[str, int]]:
        """Count what a partition's report adds to the one `before` it; the records produced
        and those each filter dropped."""
        m = self.metrics
        consumed, produced_counter, bytes_counter = self.counters(route)
        produced = part.produced - (before.produced if before else 0)
        consumed.inc(max(0, part.consumed - (before.consumed if before else 0)))
        produced_counter.inc(max(0, produced))
        bytes_counter.inc(max(0, part.produced_bytes - (before.produced_bytes if before else 0)))
        segments = part.segments - (before.segments if before else 0)
        if segments > 0:
            m.segments_written.labels(route.topic, partition_label(m, route.partition)).inc(
                segments
            )
        filtered = _count_delta(part.filtered, before.filtered if before else ())
        for filter_id, count in filtered.items():
            m.filtered.labels(filter_id, route.topic).inc(count)
        errors = _count_delta(part.filter_errors, before.filter_errors if before else ())
        for filter_id, count in errors.items():
            m.filter_errors.labels(filter_id, route.topic).inc(count)
        return produced, filtered

    def counters(self, route: PartitionRoute) -> tuple[Counter, Counter, Counter]:
        """A partition's consumed, produced and bytes counters."""
        found = self._counters.get(route.key)
        if found is None:
            m = self.metrics
            labels = (
                route.topic,
                partition_label(m, route.partition),
                route.target_topic,
                partition_label(m, route.target_partition),
            )
            found = (
                m.consumed.labels(*labels),
                m.produced.labels(*labels),
                m.bytes_produced.labels(route.target_topic),
            )
            self._counters[route.key] = found
        return found

    def publish(self, rows: list[PartitionRow], lags: dict[SourcePartition, int]) -> None:
        """The next offset, lag and waiting of `rows`; without per-partition series, each
        topic's lag from `lags` (every owned partition of the rows' topics)."""
        for row in rows:
            labels = (row.route.topic, str(row.route.partition))
            if self.metrics.per_partition:
                next_offset, lag_gauge = self._gauge(labels)
                next_offset.set(row.next_offset)
                if row.lag is not None:
                    lag_gauge.set(row.lag)
            self._publish_waiting(row, labels)
        if not self.metrics.per_partition:
            for (topic, partition), lag in per_topic(lags).items():
                self.metrics.lag.labels(topic, str(partition)).set(lag)

    def forget(self, gone: set[SourcePartition], kept: frozenset[SourcePartition]) -> None:
        """Remove the series of partitions handed to another member (a topic's, without
        per-partition series, when none of it is `kept`)."""
        series = {(topic, str(partition)) for topic, partition in gone}
        if not self.metrics.per_partition:
            series = {(t, ALL_PARTITIONS) for t, _ in gone} - {(t, ALL_PARTITIONS) for t, _ in kept}
        for topic, partition in sorted(series):
            self._gauges.pop((topic, str(partition)), None)
            for gauge in (self.metrics.lag, self.metrics.next_offset):
                try:
                    gauge.remove(topic, str(partition))
                except KeyError:
                    pass  # never published

    def _gauge(self, labels: tuple[str, str]) -> tuple[Gauge, Gauge]:
        found = self._gauges.get(labels)
        if found is None:
            found = (self.metrics.next_offset.labels(*labels), self.metrics.lag.labels(*labels))
            self._gauges[labels] = found
        return found

    def _publish_waiting(self, row: PartitionRow, labels: tuple[str, str]) -> None:
        """One series per reason a partition ever waited for; 0 once it no longer waits."""
        for reason in WAIT_REASONS:
            seconds = row.waiting[1] if row.waiting and row.waiting[0] == reason else 0.0
            if seconds or (labels, reason) in self._waited:
                if (labels, reason) not in self._waited:
                    self._waited.add((labels, reason))
                    log.info(
                        "restore topic=%s partition=%s waits for %s", *labels, WAIT_REASONS[reason]
                    )
                self.metrics.restore_waiting.labels(*labels, reason).set(seconds)


def _count_delta(
    now: tuple[tuple[str, int], ...], before: tuple[tuple[str, int], ...]
) -> dict[str, int]:
    old = dict(before)
    return {name: count - old.get(name, 0) for name, count in now if count > old.get(name, 0)}

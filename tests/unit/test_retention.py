"""Copies the destination will delete (relay.retention): which topics delete by time, and how
many of the records to copy are older than their retention."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relay.pipelines.restore.retention import stored_at_risk
from relay.retention import AtRisk, at_risk, cutoffs, retention_ms
from relay.spec import PartitionRoute
from relay.store import SegmentBuffer
from relay.store.store import open_store

DAY = 86_400_000
ROUTES = [
    PartitionRoute("orders", 0, "short", 0),
    PartitionRoute("orders", 1, "short", 1),
    PartitionRoute("audit", 0, "forever", 0),
]


def test_only_topics_that_delete_by_the_records_timestamps_have_a_retention() -> None:
    assert retention_ms({"retention.ms": "604800000", "cleanup.policy": "delete"}) == 7 * DAY
    assert retention_ms({"retention.ms": "3600000", "cleanup.policy": "compact,delete"}) == (
        3_600_000
    )
    assert retention_ms({"retention.ms": "-1"}) is None
    assert retention_ms({"retention.ms": "1000", "cleanup.policy": "compact"}) is None
    assert retention_ms({"retention.ms": "1000", "message.timestamp.type": "LogAppendTime"}) is None
    assert retention_ms({}) is None  # a broker that describes nothing


def test_the_records_older_than_the_retention_are_counted_per_destination_topic() -> None:
    now = 100 * DAY
    retention = {"short": 7 * DAY, "forever": None}
    assert cutoffs(ROUTES, retention, now) == {("orders", 0): 93 * DAY, ("orders", 1): 93 * DAY}
    nexts = {("orders", 0): 10, ("orders", 1): 0, ("audit", 0): 0}
    ends = {("orders", 0): 500, ("orders", 1): 80, ("audit", 0): 900}
    # partition 0: records from 300 on are recent; partition 1: none is
    young = {("orders", 0): 300, ("orders", 1): None}
    (risk,) = at_risk(ROUTES, retention, nexts, ends, young)
    assert risk == AtRisk("short", 7 * DAY, 290 + 80, 2)
    assert "destination topic short deletes records older than retention.ms = 604800000 (7d)" in (
        risk.line()
    )
    assert "370 of the records to copy into it (2 partition(s))" in risk.line()


def test_a_copy_past_its_old_records_is_not_at_risk() -> None:
    retention = {"short": DAY}
    nexts = {("orders", 0): 400, ("orders", 1): 80}
    ends = {("orders", 0): 500, ("orders", 1): 80}
    assert at_risk(ROUTES, retention, nexts, ends, {("orders", 0): 300, ("orders", 1): None}) == []


def stored(tmp_path: Path) -> Any:
    """Offsets 0-99 in four segments of 25, record o stamped at o seconds."""
    store = open_store(str(tmp_path / "backups"))
    for first in range(0, 100, 25):
        buffer = SegmentBuffer()
        for offset in range(first, first + 25):
            buffer.append(offset, offset * 1000, 0, b"k", b"v", [])
        store.write_segment("parquet", buffer, buffer.meta("prod", "orders", 0, level=0))
    return store


def test_a_restore_counts_the_stored_records_older_than_the_retention(tmp_path: Path) -> None:
    """Retention 40 s at 100 s: records stamped before 60 s (offsets 0-59) are at risk; from
    offset 10 on, within --from-time 20 s: offsets 20-59, 40 records."""
    store, routes = stored(tmp_path), [ROUTES[0]]
    retention = {"short": 40_000}
    (risk,) = stored_at_risk(store, "prod", routes, {("orders", 0): 10}, retention, 100_000)
    assert risk == AtRisk("short", 40_000, 50, 1)
    (risk,) = stored_at_risk(store, "prod", routes, {("orders", 0): 10}, retention, 100_000,
                             (20_000, None))  # fmt: skip
    assert risk.records == 40
    assert stored_at_risk(store, "prod", routes, {("orders", 0): 60}, retention, 100_000) == []

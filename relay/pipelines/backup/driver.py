"""The backup pipeline: Kafka partitions into store segments, resumed from the store.

The store is the truth: each partition resumes at its last segment's next offset (a kill -9 at
any moment leaves no overlap and no hole, since a segment appears only when complete). Source
group offsets are committed only for offsets in written segments (or dropped by a filter).

Processes on one config coordinate through a group on the source cluster (backup has no target
cluster): in failover mode on the first node that answers at start-up.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence
from typing import Unpack

from relay.clients import admin, consumer_groups
from relay.config import Config
from relay.engine.pipeline import CommonFields, Halt, Partitions, Plan, Progress
from relay.errors import KafkaSetupError
from relay.pipelines.backup.executor import BackupSides
from relay.pipelines.backup.spec import BackupTask
from relay.pipelines.sources import FromSources, SourceArgs
from relay.provenance.resume import Delivered, SourceOffsets, source_offsets
from relay.spec import PartitionRoute, SourcePartition
from relay.store import group_snapshot_path
from relay.store.configured import store_of

log = logging.getLogger(__name__)


class BackupPipeline(FromSources):
    kind = "backup"
    sides = BackupSides

    def __init__(self, cfg: Config, **sources: Unpack[SourceArgs]):
        super().__init__(cfg, **sources)
        self.store_cfg = cfg.need_store()
        self.store = store_of(self.store_cfg)
        self.coordinator = cfg.sources[0]
        self.group_topics: Sequence[str] = sorted({r.source for r in cfg.topics})
        self.routes: list[PartitionRoute] = []
        self._source_counts: dict[str, int] = {}  # read by `partitions`
        self._snapshot_at = 0.0

    def partitions(self) -> Partitions:
        self.calls.call("store", self.store.check, self.store.describe())
        names = [r.source for r in self.cfg.topics]
        self._source_counts = self.calls.call("source", lambda: self._counts(names))
        self.routes = [
            PartitionRoute(t.source, p, t.source, p)
            for t in self.cfg.topics
            for p in range(self._count(self._source_counts, t.source))
        ]
        return Partitions(self.routes)

    def resume(self, routes: list[PartitionRoute], stop_at_end: bool) -> Plan:
        where = self.store.describe()
        self.calls.call("store", lambda: self._describe_topics(self._source_counts), where)
        stored = self.calls.call("store", lambda: self.where(routes), where)
        self.calls.call("source", lambda: self.pool.start([r.key for r in routes], stored))
        source = self.pool.active
        offsets = self.calls.call("source", lambda: source_offsets(source, routes, self.timeout))
        nexts = {}
        for route in routes:
            nexts[route.key] = self._resume(route.key, stored.get(route.key), offsets)
        stops = (self.pool.boot_ends() or dict(offsets.end)) if stop_at_end else None
        return Plan(routes, nexts, dict(offsets.end), stops)

    def _describe_topics(self, counts: dict[str, int]) -> None:
        """Tell a restore following this store every partition, before each has a segment."""
        for topic in sorted({t.source for t in self.cfg.topics}):
            count = self._count(counts, topic)
            self.store.write_partition_count(self.store_cfg.cluster, topic, count)

    def _counts(self, names: list[str]) -> dict[str, int]:
        """Partition counts from the first node that answers; that node hosts the group."""
        for node in self.pool.nodes:
            try:
                counts = admin.partition_counts(node, names, self.timeout)
            except Exception as exc:  # noqa: BLE001 - the next node, or the pool's error below
                log.debug("source node %s: %s", node.name, exc)
                continue
            self.coordinator = node
            return counts
        return self.pool.partition_counts(names, self.timeout)

    def _count(self, counts: dict[str, int], topic: str) -> int:
        if topic not in counts:
            raise KafkaSetupError(
                f"[topics].{topic}: source topic {topic!r} does not exist on "
                f"{self.pool.describe_all()}"
            )
        return counts[topic]

    def _resume(self, key: SourcePartition, stored: int | None, offsets: SourceOffsets) -> int:
        """After the last segment; from the log's start when the store has nothing yet."""
        begin = offsets.begin[key]
        if stored is None:
            log.info("backup topic=%s partition=%s from the beginning (%s)", key[0], key[1], begin)
            return begin
        end = offsets.limit(key, stored)
        if stored > end:
            raise KafkaSetupError(
                f"{key[0]}[{key[1]}]: the store holds offsets up to {stored} but the source ends "
                f"at {end}; was the source topic recreated? Use another [store].cluster."
            )
        # Below the log start: the first fetch finds the records deleted before they were
        # backed up and counts them (relay.losses), or halts there ([source_pool].on_loss).
        log.info("backup topic=%s partition=%s next_offset=%s (store)", key[0], key[1], stored)
        return stored

    def where(self, routes: Sequence[PartitionRoute]) -> dict[SourcePartition, int]:
        """Each partition's next offset in the store (its last segment's)."""
        found = {}
        for route in routes:
            nxt = self.store.next_offset(self.store_cfg.cluster, route.topic, route.partition)
            if nxt is not None:
                found[route.key] = nxt
        return found

    def adopt(self, routes: Sequence[PartitionRoute]) -> None:
        """Leftovers of a crashed write (temporary files of a directory store) go, now that no
        other process writes these partitions."""
        for route in routes:
            removed = self.store.clean_leftovers(
                self.store_cfg.cluster, route.topic, route.partition
            )
            if removed:
                log.info(
                    "removed %d leftover file(s) of %s[%s]", removed, route.topic, route.partition
                )

    def spec(self, **common: Unpack[CommonFields]) -> BackupTask:
        source = self.source_fields(common["rates"], common["partitions"])
        return BackupTask(**common, **source, store=self.store_cfg)

    def last_delivered(self) -> dict[SourcePartition, Delivered]:
        """The last record backed up of each partition (read from its last segment), to check
        that a new node holds the same record at that offset."""
        found = {}
        for route in self.routes:
            refs = self.store.list_segments(self.store_cfg.cluster, route.topic, route.partition)
            if not refs:
                continue
            ref = max(refs, key=lambda r: (r.last, r.level))
            last = collections.deque(self.store.read_records(ref), maxlen=1)
            if last:
                found[route.key] = Delivered(last[0].offset + 1, last[0])
        return found

    def tick(self, progress: Progress) -> tuple[Halt, ...]:
        """Snapshot the committed offsets of `[store].groups` every max_segment_age."""
        now = time.monotonic()
        if self.store_cfg.groups and now - self._snapshot_at >= self.store_cfg.max_segment_age:
            self._snapshot_at = now
            self.snapshot_groups()
        return ()

    def snapshot_groups(self) -> None:
        keys = [r.key for r in self.routes]
        for group in self.store_cfg.groups:
            try:
                committed = consumer_groups.committed_offsets(
                    self.pool.active, group, keys, self.timeout
                )
                offsets: dict[str, dict[str, int]] = {}
                for (topic, partition), offset in sorted(committed.items()):
                    if offset is not None:
                        offsets.setdefault(topic, {})[str(partition)] = offset
                snapshot = {
                    "group": group,
                    "cluster": self.store_cfg.cluster,
                    "taken_at_ms": int(time.time() * 1000),
                    "offsets": offsets,
                }
                self.store.write_json(group_snapshot_path(self.store_cfg.cluster, group), snapshot)
            except Exception as exc:  # noqa: BLE001 - the next snapshot tries again
                log.warning("group %s: offsets snapshot failed: %s", group, exc)

    def close(self) -> None:
        if self.store_cfg.groups and self.routes:
            self.snapshot_groups()
        super().close()

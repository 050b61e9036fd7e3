"""The restore pipeline: store segments into Kafka, resumed from the destination's provenance.

Restored records carry the relay's provenance header (named after the stored cluster), so a
restore run again writes nothing new, a restore into an empty topic writes everything, and a
`ktm relay` into the same topic afterwards resumes after the last restored offset.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Unpack

from relay.clients import admin, topic_create
from relay.clients.settings import describe
from relay.config import Config
from relay.engine.metrics import Metrics
from relay.engine.pipeline import CommonFields, Partitions, Pipeline, Plan
from relay.errors import KafkaSetupError
from relay.pipelines.calls import Calls
from relay.pipelines.restore.executor import RestoreSides
from relay.pipelines.restore.retention import stored_at_risk
from relay.pipelines.restore.spec import FROM_FIRST_SEGMENT, RestoreTask
from relay.pipelines.routes import plan_routes
from relay.pipelines.target_fit import fit
from relay.provenance.resume import destination_next_offsets
from relay.refusals import Rules
from relay.spec import PartitionRoute, SourcePartition
from relay.store import ChainLink, plan_chain
from relay.store.configured import store_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestoreOptions:
    follow: bool = False
    from_time: int | None = None  # ms since the epoch, inclusive
    until_time: int | None = None  # exclusive
    create_topics: bool = False


class RestorePipeline(Pipeline):
    kind = "restore"
    sides = RestoreSides

    def __init__(
        self, cfg: Config, *, stop_event: threading.Event, metrics: Metrics, options: RestoreOptions
    ):
        self.cfg, self.options = cfg, options
        self.store_cfg = cfg.need_store()
        self.store = store_of(self.store_cfg)
        self.target = cfg.need_target()
        self.rules: Rules = ()  # what the destination topics refuse for good, read at plan
        self.calls = Calls(cfg, stop_event, metrics)
        self.timeout = self.calls.timeout
        self.retention: Mapping[str, int | None] = {}  # the destination topics', read at plan
        self.coordinator = self.target.cluster
        self.group_topics: Sequence[str] = sorted({r.target for r in cfg.topics})
        self.routes: list[PartitionRoute] = []
        self._said_waiting: set[str] = set()  # topics whose wait was logged

    def partitions(self) -> Partitions:
        """The partitions of the stored topics; with --follow, start-up waits (asked again)
        while a topic has no segment yet and nothing else says its partitions: its
        destination's partition count stands in when the destination exists (each partition
        then waits for its first segment)."""
        where = self.store.describe()
        self.calls.call("store", lambda: self.store.check(write=False), where)
        target = self.target.cluster
        names = [r.target for r in self.cfg.topics]
        counts = self.calls.call(
            "target", lambda: admin.partition_counts(target, names, self.timeout)
        )
        stored = self.calls.call("store", self._stored_counts, where)
        pending = self._pending(stored, counts) if self.options.follow else []
        if pending:
            for topic in sorted(set(pending) - self._said_waiting):
                log.info("restore: waiting for the first segment of topic %s in %s", topic, where)
            self._said_waiting.update(pending)
            waiting = dict.fromkeys(sorted(pending), "its first segment")
            return Partitions(None, waiting, self.store_cfg.follow_interval)
        if self.options.create_topics:
            counts = self._create_missing(stored, counts)
        self.routes = plan_routes(self.cfg.topics, stored, counts, where, describe(target))
        fitted = fit(self.cfg, {r.target_topic for r in self.routes}, self.timeout)
        self.target, self.rules, self.retention = fitted
        return Partitions(self.routes)

    def resume(self, routes: list[PartitionRoute], stop_at_end: bool) -> Plan:
        where = self.store.describe()
        at_destination = self.calls.call("target", lambda: self.where(routes))
        ranges = self.calls.call("store", lambda: self._ranges(routes), where)
        nexts, ends = {}, {}
        for route in routes:
            # Following a partition with no segment yet: it starts where its first one will.
            empty = FROM_FIRST_SEGMENT if self.options.follow else 0
            first, ends[route.key] = ranges.get(route.key, (empty, empty))
            nexts[route.key] = max(first, at_destination.get(route.key, first))
            log.info(
                "restore topic=%s partition=%s next_offset=%s store end=%s",
                *route.key,
                nexts[route.key],
                ends[route.key],
            )
        stops = dict(ends) if stop_at_end else None
        self._warn_retention(nexts)
        return Plan(routes, nexts, _known(ends), stops)

    def _warn_retention(self, nexts: dict[SourcePartition, int]) -> None:
        """One warning per destination topic whose retention would delete records this restore
        writes (ktm keeps their timestamps: relay.retention); a check, never a reason not to
        start."""
        window = (self.options.from_time, self.options.until_time)
        now = int(time.time() * 1000)
        try:
            risks = stored_at_risk(
                self.store, self.store_cfg.cluster, self.routes, nexts, self.retention, now, window
            )
        except Exception as exc:  # noqa: BLE001 - informative only
            log.info("store not read for the retention check (%s)", exc)
            return
        for risk in risks:
            log.warning("%s", risk.line())

    def _pending(self, stored: dict[str, int], counts: dict[str, int]) -> list[str]:
        """--follow: the topics with no segment yet whose destination cannot stand in (to be
        created, or mapped to one fixed partition); `stored` gets the others' counts."""
        pending = []
        for route in self.cfg.topics:
            if route.partition is None and route.target in counts:
                stored[route.source] = max(stored.get(route.source, 0), counts[route.target])
            elif route.source not in stored:
                pending.append(route.source)
        return pending

    def _stored_counts(self) -> dict[str, int]:
        """Each [topics] key's partition count in the store (SegmentStore.partition_count);
        following, topics the store knows nothing of yet are left out (they are waited for)."""
        counts = {}
        for route in self.cfg.topics:
            count = self.store.partition_count(self.store_cfg.cluster, route.source)
            if count:
                counts[route.source] = count
            elif not self.options.follow:
                raise KafkaSetupError(
                    f"[topics].{route.source}: no segments of topic {route.source!r} in store "
                    f"{self.store.describe()} (cluster {self.store_cfg.cluster!r}); "
                    "ktm restore --follow waits for them"
                )
        return counts

    def _create_missing(self, stored: dict[str, int], counts: dict[str, int]) -> dict[str, int]:
        """--create-topics: the missing destination topics, with the stored partition count."""
        missing = {r.target: stored[r.source] for r in self.cfg.topics if r.target not in counts}
        if missing:
            topic_create.create_topics(self.target.cluster, missing, self.timeout)
            for topic, partitions in sorted(missing.items()):
                log.info("created topic %s with %d partitions on the target", topic, partitions)
        return {**counts, **missing}

    def _ranges(self, routes: Sequence[PartitionRoute]) -> dict[SourcePartition, tuple[int, int]]:
        """Per partition: where its chain of segments starts and where it ends."""
        found = {}
        for route in routes:
            refs = self.store.list_segments(self.store_cfg.cluster, route.topic, route.partition)
            links = [ChainLink.of(ref, self.store.read_meta(ref)) for ref in refs]
            plan = plan_chain(links)
            if plan.links:
                found[route.key] = (plan.links[0].start, plan.links[-1].next_offset)
        return found

    def active_source(self) -> str:
        return self.store.describe()

    def where(self, routes: Sequence[PartitionRoute]) -> dict[SourcePartition, int]:
        return destination_next_offsets(self.target.cluster, routes, self.timeout)

    def adopt(self, routes: Sequence[PartitionRoute]) -> None:
        pass

    def spec(self, **common: Unpack[CommonFields]) -> RestoreTask:
        o = self.options
        return RestoreTask(
            **common,
            store=self.store_cfg,
            target=self.target,
            follow=o.follow,
            from_time=o.from_time,
            until_time=o.until_time,
            rules=self.rules,
        )


def _known(ends: dict[SourcePartition, int]) -> dict[SourcePartition, int]:
    """End offsets of the partitions that have segments (the others' lag is unknown)."""
    return {key: end for key, end in ends.items() if end != FROM_FIRST_SEGMENT}

"""The restore pipeline: store segments into Kafka, resumed from the destination's provenance.

Restored records carry the relay's provenance header (named after the stored cluster), so a
restore run again writes nothing new, a restore into an empty topic writes everything, and a
`ktm relay` into the same topic afterwards resumes after the last restored offset.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from relay.clients import admin, topic_create
from relay.clients.settings import describe
from relay.config import Config
from relay.engine.driver.status import Status
from relay.engine.metrics import Metrics
from relay.engine.pipeline import Pipeline, Plan
from relay.errors import KafkaSetupError, StoppedWhileWaiting
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
        self.status: Status | None = None

    def bind(self, status: Status) -> None:
        self.status = status  # shows what start-up waits for (--follow)

    def plan(
        self, stop_at_end: bool, on_routes: Callable[[list[PartitionRoute]], None] | None
    ) -> Plan:
        where = self.store.describe()
        self.calls.call("store", lambda: self.store.check(write=False), where)
        target = self.target.cluster
        names = [r.target for r in self.cfg.topics]
        counts = self.calls.call(
            "target", lambda: admin.partition_counts(target, names, self.timeout)
        )
        stored = self._wait_for_counts(counts, where)
        if self.options.create_topics:
            counts = self._create_missing(stored, counts)
        self.routes = plan_routes(self.cfg.topics, stored, counts, where, describe(target))
        fitted = fit(self.cfg, {r.target_topic for r in self.routes}, self.timeout)
        self.target, self.rules, self.retention = fitted
        if on_routes is not None:
            on_routes(self.routes)
        at_destination = self.calls.call("target", lambda: self.where(self.routes))
        ranges = self.calls.call("store", lambda: self._ranges(self.routes), where)
        nexts, ends = {}, {}
        for route in self.routes:
            # Following a partition with no segment yet: it starts where its first one will.
            empty = FROM_FIRST_SEGMENT if self.options.follow else 0
            first, ends[route.key] = ranges.get(route.key, (empty, empty))
            nexts[route.key] = max(first, at_destination.get(route.key, first))
            log.info(
                "restore topic=%s partition=%s next_offset=%s store end=%s",
                route.topic,
                route.partition,
                nexts[route.key],
                ends[route.key],
            )
        stops = dict(ends) if stop_at_end else None
        self._warn_retention(nexts)
        return Plan(self.routes, nexts, _known(ends), stops)

    def _warn_retention(self, nexts: dict[SourcePartition, int]) -> None:
        """One warning per destination topic whose retention would delete records this restore
        writes (ktm keeps their timestamps: relay.retention); a check, never a reason not to
        start."""
        window = (self.options.from_time, self.options.until_time)
        now = int(time.time() * 1000)
        try:
            risks = stored_at_risk(self.store, self.store_cfg.cluster, self.routes, nexts,
                                   self.retention, now, window)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - informative only
            log.info("store not read for the retention check (%s)", exc)
            return
        for risk in risks:
            log.warning("%s", risk.line())

    def _wait_for_counts(self, counts: dict[str, int], where: str) -> dict[str, int]:
        """Each topic's partition count from the store. With --follow, a topic with no
        segment yet is a state to wait in: its destination's partition count stands in when
        the destination exists (each partition waits for its first segment); otherwise (the
        topic is to be created, or mapped to one fixed partition) start-up waits here."""
        logged: set[str] = set()
        while True:
            stored = self.calls.call("store", self._stored_counts, where)
            if not self.options.follow:
                return stored
            pending = []
            for route in self.cfg.topics:
                if route.partition is None and route.target in counts:
                    stored[route.source] = max(stored.get(route.source, 0), counts[route.target])
                elif route.source not in stored:
                    pending.append(route.source)
            if not pending:
                self._show_waiting(())
                return stored
            for topic in sorted(set(pending) - logged):
                log.info("restore: waiting for the first segment of topic %s in %s", topic, where)
            logged.update(pending)
            self._show_waiting(tuple(sorted(pending)))
            if self.calls.stop.wait(self.store_cfg.follow_interval):
                raise StoppedWhileWaiting("restore: stopped before the first segment landed")

    def _show_waiting(self, topics: tuple[str, ...]) -> None:
        if self.status is not None:
            self.status.waiting_topics = topics

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

    def spec(self, **common: Any) -> RestoreTask:
        o = self.options
        return RestoreTask(**common, store=self.store_cfg, target=self.target, follow=o.follow,
                           from_time=o.from_time, until_time=o.until_time,
                           rules=self.rules)  # fmt: skip


def _known(ends: dict[SourcePartition, int]) -> dict[SourcePartition, int]:
    """End offsets of the partitions that have segments (the others' lag is unknown)."""
    return {key: end for key, end in ends.items() if end != FROM_FIRST_SEGMENT}

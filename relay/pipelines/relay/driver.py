"""The relay pipeline: Kafka to Kafka, resumed from the destination's provenance headers.

Besides the records it keeps up with the source while running: new topics matched by
`[discover]` and partitions added to a source topic are found every `[discover].interval`
(relay.pipelines.relay.topics) and handed to the runner between rounds (`changes`), and the
consumer groups of `[groups]` are carried over (relay.pipelines.relay.group_sync), topic ACLs
copied (`[acls]`, relay.pipelines.relay.acl_sync) and topic configs kept in step
(`[target].config_sync`, relay.pipelines.relay.config_sync).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Unpack

from relay.clients import admin, consumer_groups
from relay.config import Config
from relay.engine.pipeline import CommonFields, Halt, Partitions, Plan, Progress
from relay.pipelines.relay.acl_sync import AclPlan, AclSync
from relay.pipelines.relay.chores import Periodic
from relay.pipelines.relay.config_sync import Changes, ConfigSync
from relay.pipelines.relay.executor import RelaySides
from relay.pipelines.relay.group_sync import GroupResult, GroupSync
from relay.pipelines.relay.relayed import Relayed
from relay.pipelines.relay.spec import RelayTask
from relay.pipelines.relay.topics import Short, TopicPlan, Topics
from relay.pipelines.sources import FromSources, SourceArgs
from relay.pipelines.target_fit import fit
from relay.provenance.attribution import attribute
from relay.provenance.header import commit_mark
from relay.provenance.resume import (
    Delivered,
    at_destination,
    delivered,
    destination_next_offsets,
    source_offsets,
    warn_unsettled,
)
from relay.refusals import Rules
from relay.retention import AtRisk
from relay.spec import PartitionRoute, SourcePartition

log = logging.getLogger(__name__)

COMMITTED_TIMEOUT = 2.0  # seconds to ask the source for its group's committed offsets
CHORE_JOIN = 2.0  # seconds a stop waits for a background chore (discovery, group sync)


class RelayPipeline(FromSources):
    kind = "relay"
    sides = RelaySides

    def __init__(self, cfg: Config, *, dry_run: bool = False, **sources: Unpack[SourceArgs]):
        super().__init__(cfg, **sources)
        metrics = sources["metrics"]
        self.coordinator = cfg.need_target().cluster
        self.group_topics: Sequence[str] = sorted({r.target for r in cfg.topics})
        self.relayed = Relayed(self.pool)  # what the chores read of the running relay
        self.target = cfg.need_target()  # with batch_size fitted to the destination at plan
        self.rules: Rules = ()  # what the destination topics refuse for good, read at plan
        self.retention: Mapping[str, int | None] = {}  # their retention.ms, read at plan
        self.metrics, self.dry_run = metrics, dry_run
        self.topics = Topics(
            cfg,
            lambda: self.pool.active,
            self.calls.call,
            metrics,
            self.timeout,
            self.pool.topic_counts,
        )
        self.topic_plan: TopicPlan | None = None
        self.groups = GroupSync(cfg, self.relayed, metrics)
        self.acls = AclSync(cfg, self.relayed, metrics)
        self.configs = ConfigSync(cfg, self.relayed, metrics)
        self._chores: list[Periodic] = []  # started by the first tick
        if cfg.acls.sync:
            self._chores.append(Periodic("ACL sync", cfg.acls.interval, self.acls.sync_once))
        if self.target.config_sync:
            self._chores.append(
                Periodic(
                    "topic config sync", self.target.config_sync_interval, self.configs.sync_once
                )
            )
        self._found_plan: Plan | None = None  # partitions found, not yet handed over
        self._short: set[SourcePartition] = set()  # found, but the destination lacks them
        self._halts: list[Halt] = []  # of those: not yet handed to the runner (`tick`)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._discovery = threading.Thread(target=self._discover, name="ktm-discovery", daemon=True)
        self._follow = False  # look for new topics and partitions (not with --stop-at-end)
        self.follows_recreated = cfg.source_pool.on_recreate == "follow"
        self.at_risk: list[AtRisk] = []  # destination topics whose retention deletes copies

    @property
    def routes(self) -> list[PartitionRoute]:
        return self.relayed.routes

    def partitions(self) -> Partitions:
        """The partitions of the topics (`[discover]` patterns resolved, destinations created
        or grown as configured), and the target fitted to the destination topics before Spark
        starts: the workers' warm-up opens its producer."""
        self.topic_plan = self.topics.resolve(dry_run=self.dry_run)
        self.relayed.held = self.topic_plan.held
        topics = self.topic_plan.routes
        self.group_topics = sorted({r.target for r in topics})
        routes = self.planner.routes(topics, self.topic_plan.source_counts)
        fitted = fit(self.cfg, {r.target_topic for r in routes}, self.timeout)
        self.target, self.rules, self.retention = fitted
        return Partitions(routes)

    def resume(self, routes: list[PartitionRoute], stop_at_end: bool) -> Plan:
        plan = self.planner.resumed(routes, stop_at_end)
        # copies the destination will delete
        self.at_risk = self.planner.retention_risk(plan, self.retention)
        self.relayed.routes = plan.routes
        self._follow = not stop_at_end and not self.dry_run
        return plan

    def where(self, routes: Sequence[PartitionRoute]) -> dict[SourcePartition, int]:
        """The destination's provenance tail, or the group's committed offset when that is
        later: with filters (the last records may have been filtered out by whoever relayed
        them), and for the partitions a compacted destination cannot settle (its log cleaner
        removed the provenance of what may be their last copies: relay.provenance.resume).

        Otherwise the committed offset only saves reading filtered records again (they would
        be dropped again), so it is not asked: a takeover or a retry then costs no round trip
        to the source (about 1.3 s across a 240 ms link), and a source that does not answer
        just goes without it."""
        tails = at_destination(self.cfg.need_target().cluster, routes, self.timeout)
        found = tails.next_offsets
        if not self.filters and not tails.unsettled:
            return found
        keys = [r.key for r in routes if self.filters or r.key in tails.unsettled]
        committed = self._committed(keys, tails.unsettled)
        for key, offset in committed.items():
            if offset is not None and offset > found.get(key, -1):
                found[key] = offset
        if tails.unsettled:
            try:
                stands, unsettled = attribute(self.pool.active, tails, committed, self.timeout)
            except Exception as exc:  # noqa: BLE001 - the tail and the commits are what it has
                log.warning("reading the source to settle a compacted destination: %s", exc)
                stands, unsettled = {}, tails.unsettled
            for key, offset in stands.items():
                found[key] = max(offset, found.get(key, offset))
            warn_unsettled(found, unsettled)
        return found

    def _committed(
        self, keys: list[SourcePartition], unsettled: frozenset[SourcePartition]
    ) -> dict[SourcePartition, int | None]:
        """The relay group's committed offsets of `keys`; {} if the source does not answer
        (logged as a warning where the destination could not settle them)."""
        try:
            return consumer_groups.committed_offsets(
                self.pool.active, self.cfg.app.group_id, keys, COMMITTED_TIMEOUT
            )
        except Exception as exc:  # noqa: BLE001 - see where(); the tail is what it can do
            log.log(
                logging.WARNING if unsettled else logging.DEBUG,
                "committed offsets unavailable: %s",
                exc,
            )
            return {}

    def adopt(self, routes: Sequence[PartitionRoute]) -> None:
        pass

    def spec(self, **common: Unpack[CommonFields]) -> RelayTask:
        source = self.source_fields(common["rates"], common["partitions"])
        return RelayTask(**common, **source, target=self.target, rules=self.rules)

    def last_delivered(self) -> dict[SourcePartition, Delivered]:
        return delivered(self.cfg.need_target().cluster, self.routes, self.timeout)

    def tick(self, progress: Progress) -> list[Halt]:
        """The first tick starts the background chores: they need a running relay. Gives the
        new partitions the destination lacks (they halt)."""
        self.relayed.progress = progress
        with self._lock:
            halts, self._halts = self._halts, []
        if self._stopping.is_set():
            return halts
        if self._follow and self._discovery.ident is None:
            self._discovery.start()
        if self.cfg.groups.include:
            self.groups.start()
        for chore in self._chores:
            chore.start()
        return halts

    def has_changes(self) -> bool:
        return self._found_plan is not None

    def changes(self) -> Plan | None:
        """Partitions found while running, with where each starts; taken once."""
        with self._lock:
            plan, self._found_plan = self._found_plan, None
            if plan is None:
                return None
            self.relayed.routes = self.routes + plan.routes
            self.group_topics = sorted({r.target_topic for r in self.routes})
        self.pool.watch([r.key for r in self.routes])
        return plan

    def follow(self, routes: list[PartitionRoute], owned: frozenset[SourcePartition]) -> Plan:
        """See Pipeline.follow. The commit comes before any copy of the new topic: a restart
        in between then resumes the new incarnation at its log start, not where the old one
        was copied up to (relay.pipelines.source_plan: incarnations)."""
        source, group = self.pool.active, self.cfg.app.group_id
        topics = sorted({r.topic for r in routes})
        counts = self.calls.call(
            "source", lambda: admin.partition_counts(source, topics, self.timeout)
        )
        new = [
            replace(r, incarnation=r.incarnation + 1)
            for r in routes
            if r.partition < counts.get(r.topic, 0)
        ]
        offsets = self.calls.call("source", lambda: source_offsets(source, new, self.timeout))
        nexts = {r.key: offsets.begin[r.key] for r in new}
        mine = {r.key: nexts[r.key] for r in new if r.key in owned}
        marks = {r.key: commit_mark(r.incarnation) for r in new}
        if mine:
            self.calls.call(
                "source",
                lambda: consumer_groups.commit_group(source, group, mine, self.timeout, marks),
            )
        followed = {r.key: r for r in new}
        with self._lock:
            self.relayed.routes = [followed.get(r.key, r) for r in self.routes]
        named = ", ".join(sorted({f"{r.topic} (incarnation {r.incarnation})" for r in new}))
        log.info("following %d partition(s) of recreated %s from their log start", len(new), named)
        return Plan(new, nexts, dict(offsets.end), None)

    def group_plan(self) -> list[GroupResult]:
        """What a sync would commit now (ktm check)."""
        return self.groups.translate(commit=False) if self.cfg.groups.include else []

    def acl_plan(self) -> AclPlan | None:
        """The ACLs a sync would create now (ktm check); None without [acls].sync."""
        return self.acls.plan() if self.cfg.acls.sync else None

    def config_plan(self) -> Changes | None:
        """The config changes a sync would make now (ktm check); None without config_sync."""
        return self.configs.plan() if self.cfg.need_target().config_sync else None

    def close(self) -> None:
        """The chores stop at their next wait; one busy with a cluster that does not answer is
        left to end by itself (daemon threads) rather than hold the stop up."""
        self._stopping.set()
        self.groups.close()
        for chore in self._chores:
            chore.close()
        if self._discovery.is_alive():
            self._discovery.join(timeout=CHORE_JOIN)
        super().close()

    # ---- background -------------------------------------------------------------------

    def _discover(self) -> None:
        while not self._stopping.wait(self.cfg.discover.interval):
            try:
                self._look_for_partitions()
            except Exception as exc:  # noqa: BLE001 - looked for again at the next interval
                log.warning("looking for new topics and partitions failed: %s", exc)

    def _look_for_partitions(self) -> None:
        with self._lock:
            pending = self._found_plan.routes if self._found_plan else []
            known = {r.key for r in self.routes + pending} | self._short
        new = self.topics.new_partitions(known)
        self._halt_short(new.short)
        found = new.routes
        if not found:
            return
        target = self.cfg.need_target().cluster
        at_destination = self.calls.call(
            "target", lambda: destination_next_offsets(target, found, self.timeout)
        )
        points, offsets = self.planner.resume(found, at_destination)
        topics = {key[0] for key in known}
        nexts = {}
        for route in found:
            point = points[route.key]
            fresh = route.topic not in topics and point.reason == "beginning"
            at_end = fresh and self.cfg.discover.start == "end"
            nexts[route.key] = offsets.end[route.key] if at_end else point.next_offset
        self._remember_start(found, nexts, topics)
        self.metrics.partitions_found.inc(len(found))
        log.info(
            "found %d new partition(s) to relay: %s",
            len(found),
            ", ".join(
                f"{r.topic}[{r.partition}]->{r.target_topic}[{r.target_partition}]@{nexts[r.key]}"
                for r in found
            ),
        )
        with self._lock:
            earlier = self._found_plan
            routes = (earlier.routes if earlier else []) + found
            merged = {**(earlier.next_offsets if earlier else {}), **nexts}
            ends = {**(earlier.ends if earlier else {}), **offsets.end}
            self._found_plan = Plan(routes, merged, ends, None)

    def _halt_short(self, short: list[Short]) -> None:
        """New partitions of a relayed topic that its destination lacks halt at their first
        record: the partitions with a destination go on (a stop would halt them all for the
        sake of a few new ones), nothing is written to another partition number, and the halt
        is loud (ERROR line, ktm_partitions_halted, /healthz 503). A restart after the
        destination has grown relays them from their start."""
        if not short:
            return
        begin, _ = self.calls.call(
            "source",
            lambda: admin.offset_bounds(
                self.pool.active, [s.route.key for s in short], self.timeout
            ),
        )
        with self._lock:
            for one in short:
                self._short.add(one.route.key)
                self._halts.append(Halt(one.route, begin[one.route.key], one.reason))

    def _remember_start(
        self, found: list[PartitionRoute], nexts: dict[SourcePartition, int], topics: set[str]
    ) -> None:
        """`start = "end"`: the relay group's offset on the source remembers where a new topic
        starts, so a restart before its first record resumes there, not at its beginning."""
        if self.cfg.discover.start != "end":
            return
        fresh = {r.key: nexts[r.key] for r in found if r.topic not in topics}
        if fresh:
            group = self.cfg.app.group_id
            self.calls.call(
                "source",
                lambda: consumer_groups.commit_group(self.pool.active, group, fresh, self.timeout),
            )

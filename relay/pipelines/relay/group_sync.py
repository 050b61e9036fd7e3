"""Consumer groups carried over while relaying (`[groups]`), exactly.

Every `[groups].interval` the driver reads each carried group's committed offsets on the source
and commits on the target, for each destination partition, the offset of the first copy of a
record at or after the committed source offset (relay.provenance.translation: found through
provenance, never approximated). A consumer that stops on the source and starts on the target
after the next sync reads no record twice and skips none; one that starts earlier re-reads what
it committed since the last sync, and skips nothing.

The rules:
- The relay's own progress is read before the destination's end. A group whose committed offset
  has no copy yet is translated to that end only when the relay had passed the offset (the
  records in between were dropped by a filter); otherwise the partition waits for the next sync.
- Several source partitions in one destination partition (`dest:N`) get the smallest of their
  translations: the consumer may re-read a few records of the others, never skip one.
- A target group is never moved backwards, and nothing is committed for a group that is
  active on the target (its consumers moved there and commit for themselves), whichever
  protocol its consumers use: ListGroups says each group's state for both (KIP-848's
  consumer groups are described by the classic DescribeGroups as dead with no members);
  where a broker says no state (Tansu), DescribeGroups counts the members.
- Share groups (KIP-932) keep no committed offsets: they are not carried.
- One process of a group of ktm processes syncs: the one that owns the first partition.
"""

from __future__ import annotations

import logging
import time
from contextlib import closing
from dataclasses import dataclass

from relay.clients import consumer_groups
from relay.clients.kept import keep_clients
from relay.config import ClusterConfig, Config
from relay.engine.metrics import Metrics, per_topic
from relay.pipelines.relay.chores import Periodic
from relay.pipelines.relay.relayed import Relayed
from relay.provenance.translation import TP, Ask, Translator
from relay.selection import carried_groups
from relay.spec import PartitionRoute, SourcePartition

log = logging.getLogger(__name__)

# ListGroups states (KIP-518, and KIP-848's for consumer groups) of a group with members, and
# of one without; any other ("Unknown": Tansu's, or none before ListGroups v4) is asked of
# DescribeGroups.
ACTIVE_STATES = frozenset(
    {"Stable", "PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling"}
)
IDLE_STATES = frozenset({"Empty", "Dead"})
NO_OFFSETS = frozenset({"share"})  # group types that commit no offsets (KIP-932)
AGE_EVERY = 1.0  # seconds between updates of the sync-age gauges


@dataclass(frozen=True)
class Translated:
    dest: TP
    offset: int | None  # None: the relay has not reached the group's committed offset yet
    end: int  # the destination partition's end when it was searched
    before: int | None  # the group's committed offset on the target before this sync
    sources: tuple[tuple[SourcePartition, int], ...]  # the group's committed source offsets


@dataclass(frozen=True)
class GroupResult:
    group: str
    read_at: float  # unix time the group's source offsets were read
    partitions: tuple[Translated, ...]
    active: str  # why the group is active on the target ("": it is not); then no commit
    committed: int = 0  # destination partitions committed by this sync

    @property
    def complete(self) -> bool:
        return not self.active and all(p.offset is not None for p in self.partitions)


class GroupSync:
    def __init__(
        self,
        cfg: Config,
        relayed: Relayed,
        metrics: Metrics,
    ):
        self.cfg, self.metrics = cfg, metrics
        self.target = cfg.need_target().cluster
        self.timeout = cfg.need_target().request_timeout
        self.relayed = relayed
        self._last: dict[str, GroupResult] = {}  # each group's last complete sync
        # (destination, source partition, committed offset) -> its first copy, found before
        self._copies: dict[tuple[TP, SourcePartition, int], int] = {}
        self._seen: dict[tuple[TP, SourcePartition, int], int] = {}
        self._found: dict[tuple[TP, SourcePartition, int], int] = {}  # this sync's searches
        # each source partition as its copies' provenance names it: a recreated topic followed
        # into the same destination is searched among its current incarnation's copies only
        self._origin: dict[SourcePartition, SourcePartition] = {}
        self._active: set[str] = set()
        self._next_sync = 0.0
        # woken every AGE_EVERY: the sync-age gauges move between syncs
        self._chore = Periodic("group sync", AGE_EVERY, self._tick)

    def start(self) -> None:
        """Once (later calls do nothing), and never after close()."""
        self._chore.start()

    def close(self) -> None:
        self._chore.close()

    def translate(self, commit: bool) -> list[GroupResult]:
        """One sync: every carried group's translation, committed on the target if `commit`."""
        cfg, source = self.cfg, self.relayed.source
        routes = list(self.relayed.routes)
        found = consumer_groups.listed_groups(source, self.timeout)
        with_offsets = [g for g, listed in found.items() if listed.type not in NO_OFFSETS]
        groups = carried_groups(
            cfg.groups.include, cfg.groups.exclude, cfg.app.group_id, with_offsets
        )
        if not groups:
            return []
        read_at = time.time()
        on_source = consumer_groups.groups_committed(source, groups, self.timeout)
        progress = self._relay_progress(source, routes)  # read before the destination's ends
        on_target = consumer_groups.groups_committed(self.target, groups, self.timeout)
        target_groups = consumer_groups.listed_groups(self.target, self.timeout)
        by_dest = _by_destination(routes)
        self._origin = {route.key: route.origin for route in routes}
        wanted = sorted(
            {d for g in groups for d, keys in by_dest.items() if _any(on_source[g], keys)}
        )
        self._seen = {}
        sole = frozenset(dest for dest, keys in by_dest.items() if len(keys) == 1)
        with closing(Translator(self.target, self.timeout, sole)) as translator:
            bounds = translator.bounds(wanted) if wanted else {}
            self._search_all(translator, groups, by_dest, on_source, bounds)
        results = []
        for group in groups:
            parts = tuple(
                self._translated(
                    dest, keys, on_source[group], progress, bounds, on_target[group].get(dest)
                )
                for dest, keys in sorted(by_dest.items())
                if _any(on_source[group], keys)
            )
            active = self._activity(group, target_groups.get(group))
            results.append(GroupResult(group, read_at, parts, active))
        self._copies = self._seen  # only what this sync used: the cache never grows
        return [self._commit(r) for r in results] if commit else results

    def _search_all(
        self,
        translator: Translator,
        groups: list[str],
        by_dest: dict[TP, list[SourcePartition]],
        on_source: dict[str, dict[TP, int]],
        bounds: dict[TP, tuple[int, int]],
    ) -> None:
        """Find every committed offset's first copy that is not known yet, all searches
        together (one fetch per round for all of them); found ones go to `_seen`."""
        asks: dict[tuple[TP, SourcePartition, int], Ask] = {}
        for group in groups:
            for dest, keys in by_dest.items():
                begin, end = bounds.get(dest, (0, 0))
                for key in keys:
                    committed, origin = on_source[group].get(key), self._origin[key]
                    if committed is None or (dest, origin, committed) in asks:
                        continue
                    known = self._copies.get((dest, origin, committed))
                    if known is not None and begin <= known < end:
                        self._seen[(dest, origin, committed)] = known  # did not move: no search
                    else:
                        asks[(dest, origin, committed)] = (dest, origin, committed, (begin, end))
        found = translator.first_copies(list(asks.values()))
        self._found = dict(zip(asks, found, strict=True))

    def _relay_progress(
        self, source: ClusterConfig, routes: list[PartitionRoute]
    ) -> dict[SourcePartition, int]:
        """Where the relay stands on each source partition: this process's acknowledged next
        offsets, or the relay group's commits (other processes relay the rest)."""
        keys, incarnations = [r.key for r in routes], {r.key: r.incarnation for r in routes}
        group = self.cfg.app.group_id
        committed = consumer_groups.committed_offsets(
            source, group, keys, self.timeout, incarnations
        )
        mine = self.relayed.progress.next_offsets
        return {k: max(mine.get(k, -1), committed.get(k) or -1) for k in keys}

    def _translated(
        self,
        dest: TP,
        keys: list[SourcePartition],
        on_source: dict[TP, int],
        progress: dict[SourcePartition, int],
        bounds: dict[TP, tuple[int, int]],
        before: int | None,
    ) -> Translated:
        sources = tuple((key, on_source[key]) for key in keys if key in on_source)
        (_, end), offset = bounds[dest], None
        for key, committed in sources:
            # A copy found once stays where it is: a group that did not move costs no search.
            search = (dest, self._origin[key], committed)
            found = self._seen.get(search)
            if found is None:
                found = self._found[search]
            if found == end and progress.get(key, -1) < committed:
                return Translated(dest, None, end, before, sources)  # not relayed that far yet
            if found < end:
                self._seen[search] = found
            offset = found if offset is None else min(offset, found)
        return Translated(dest, offset, end, before, sources)

    def _activity(self, group: str, listed: consumer_groups.ListedGroup | None) -> str:
        """Why `group` counts as active on the target ("": it does not)."""
        if listed is not None and listed.state in ACTIVE_STATES:
            return f"{listed.state}, {listed.type or 'classic'} protocol"
        if listed is not None and listed.state in IDLE_STATES:
            return ""
        members = consumer_groups.group_members(self.target, group, self.timeout)  # no state said
        return f"{members} member(s)" if members else ""

    def _commit(self, result: GroupResult) -> GroupResult:
        if result.active:
            return result
        moved = {
            p.dest: p.offset
            for p in result.partitions
            if p.offset is not None and (p.before is None or p.offset > p.before)
        }
        if moved:
            try:
                consumer_groups.commit_group(self.target, result.group, moved, self.timeout)
            except consumer_groups.GroupHasMembers as exc:  # one joined since the state was read
                return GroupResult(result.group, result.read_at, result.partitions, str(exc))
        return GroupResult(result.group, result.read_at, result.partitions, "", len(moved))

    # ---- the sync thread ----------------------------------------------------------------

    def _tick(self) -> None:
        if time.monotonic() >= self._next_sync:
            self._next_sync = time.monotonic() + self.cfg.groups.interval
            self._sync_once()
        self._publish_ages()

    def _sync_once(self) -> None:
        if not self.relayed.may_sync():
            return
        try:
            with keep_clients():  # one admin client for every group's reads and commits
                results = self.translate(commit=True)
        except Exception as exc:  # noqa: BLE001 - the next interval tries again
            log.warning("group sync failed (next try in %gs): %s", self.cfg.groups.interval, exc)
            return
        for result in results:
            self._report(result)
        self.metrics.groups_synced.set(sum(1 for r in self._last.values() if r.complete))

    def _report(self, result: GroupResult) -> None:
        m, group = self.metrics, result.group
        m.group_active.labels(group).set(1 if result.active else 0)
        if result.active and group not in self._active:
            log.warning(
                "group %s is active on the target (%s): ktm does not commit its offsets there "
                "while it is (its consumers moved; they commit for themselves)",
                group,
                result.active,
            )
        self._active = (self._active | {group}) if result.active else (self._active - {group})
        trailing = {p.dest: p.end - p.offset for p in result.partitions if p.offset is not None}
        for (topic, partition), records in (
            trailing if m.per_partition else per_topic(trailing)
        ).items():
            m.group_trailing.labels(group, topic, str(partition)).set(records)
        if not result.complete:
            waiting = [p.dest for p in result.partitions if p.offset is None]
            if waiting:
                log.debug("group %s: the relay has not reached its offsets on %s", group, waiting)
            return
        first = group not in self._last
        self._last[group] = result
        m.group_sync_time.labels(group).set(result.read_at)
        if result.committed or first:
            log.info(
                "group %s synced: %d partition(s) committed on the target, from source offsets "
                "read at %s",
                group,
                result.committed,
                time.strftime("%H:%M:%S", time.localtime(result.read_at))
                + f".{int(result.read_at * 1000) % 1000:03d}",
            )

    def _publish_ages(self) -> None:
        now = time.time()
        for group, result in self._last.items():
            self.metrics.group_sync_age.labels(group).set(now - result.read_at)


def _any(committed: dict[TP, int], keys: list[SourcePartition]) -> bool:
    return any(key in committed for key in keys)


def _by_destination(routes: list[PartitionRoute]) -> dict[TP, list[SourcePartition]]:
    """The source partitions copied into each destination partition."""
    by_dest: dict[TP, list[SourcePartition]] = {}
    for route in routes:
        by_dest.setdefault((route.target_topic, route.target_partition), []).append(route.key)
    return by_dest

"""A verify task on an executor: one pass over its destination partitions, each read from
where the last pass left it, every source partition feeding it read alongside
(relay.pipelines.verify.compare). Reads only.

Either side is a Kafka cluster or a store: a relay compares Kafka with Kafka, a backup a
store's segments with their Kafka source (`--store`), a restore a Kafka destination with the
store it came from (`--from-store`). The store modules (pyarrow) are imported only where a
store is read. Clients are kept per worker process from one pass to the next.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple, Protocol

from relay.batches.records import Decoded
from relay.clients.batch_fetch import BatchFetcher
from relay.clients.tails import stream_range
from relay.config import ClusterConfig, StoreConfig
from relay.filters import Filter, FilterRecord, FilterRuntimeError, apply_filters, cached_filters
from relay.pipelines.verify.compare import Checker, NotVerified
from relay.pipelines.verify.records import (
    BatchClaim,
    Claim,
    Expected,
    claims,
    expected,
    expected_stored,
    stored_copy,
)
from relay.pipelines.verify.spec import (
    Copy,
    DestWork,
    Feeder,
    FeederState,
    PartitionReport,
    Scope,
    VerifyResult,
    VerifyTask,
    WorkState,
)
from relay.provenance.header import Provenance, split_origin
from relay.spec import SourcePartition

if TYPE_CHECKING:  # executors import the store only to verify a backup or restore
    from relay.store import ChainLink
    from relay.store.records import StoredRecord

FETCH_BYTES = 4 * 1024 * 1024  # per partition and fetch: one partition is read at a time
MAX_WAIT = 0.01  # seconds
# In one check, source records may wait this many offsets below the highest claim before they
# are called missing at the end of a pass (a later claim then still reads as out of order);
# following a running copy, none wait (it writes each partition in order).
MARGIN = 10_000
Kept = Callable[[Decoded], bool] | None
# One destination record as a side reads it: the source partition it names (None: none of
# this config's), the source offset, its own offset (-1 in a store), its copy, and where it
# lies in a store ("" in Kafka).
Found = tuple[SourcePartition | None, int, int, Copy, str]


class Chunk(NamedTuple):
    records: Sequence[Found | BatchClaim]  # a BatchClaim: a batch to compare whole if it can be
    next_position: int  # where the next pass reads on (a batch's or a segment's end)


class Side(Protocol):
    def expected(
        self, feeder: Feeder, cursor: int, scope: Scope, kept: Kept, keep_type: bool
    ) -> Iterator[Expected]: ...
    def found(
        self, work: DestWork, position: int, scope: Scope, clusters: tuple[str, ...]
    ) -> Iterator[Chunk]: ...
    def notes(self, work: DestWork) -> tuple[str, ...]: ...


_sides: dict[tuple[ClusterConfig | StoreConfig, float], Side] = {}  # per worker process


def run(task: VerifyTask) -> VerifyResult:
    """One pass: each work from its state on, until its end or the task's time budget."""
    try:
        filters = cached_filters(task.filters) if task.filters else []
    except Exception as exc:  # noqa: BLE001 - a filter that cannot load verifies nothing
        why = f"a filter could not be loaded: {exc}"
        return VerifyResult(tuple(_unverified(work, why) for work in task.works))
    skip = {spec.id for spec in task.filters if spec.on_error == "skip"}
    source, target = _side(task.source, task.timeout), _side(task.target, task.timeout)
    deadline = time.monotonic() + task.budget if task.budget else float("inf")
    states: list[WorkState] = []
    read = 0
    for work, state in zip(task.works, task.states, strict=True):
        state = state or _fresh(work)
        if state.done or time.monotonic() > deadline:
            states.append(state)
            continue
        checkers = _checkers(work, state, task, source, filters, skip)
        try:
            checked, count = _check(work, state, task, checkers, target, deadline)
        except Exception as exc:  # a store's unreadable segment is named, not raised
            if not _is_store_error(exc):
                raise
            checked, count = _unverified(work, f"the store cannot be read: {exc}"), 0
        states.append(checked)
        read += count
    return VerifyResult(tuple(states), read)


def _checkers(
    work: DestWork,
    state: WorkState,
    task: VerifyTask,
    source: Side,
    filters: list[Filter],
    skip: set[str],
) -> dict[SourcePartition, Checker]:
    dest = (work.topic, work.partition)
    keep_type = isinstance(task.target, StoreConfig)
    checkers: dict[SourcePartition, Checker] = {}
    for f, fs in zip(work.feeders, state.feeders, strict=True):
        kept = functools.partial(_kept, f.key, filters, skip) if filters else None
        records = source.expected(f, fs.cursor, task.scope, kept, keep_type)
        checkers[f.origin] = Checker(f, dest, records, task.scope, fs)
    return checkers


def _check(
    work: DestWork,
    state: WorkState,
    task: VerifyTask,
    checkers: dict[SourcePartition, Checker],
    target: Side,
    deadline: float,
) -> tuple[WorkState, int]:
    """One destination partition against its feeders, from `state` on; records naming no
    feeder are counted apart, those of an earlier incarnation of a feeder's topic too."""
    stray, first_stray, position, read = state.stray, state.first_stray, state.dest_next, 0
    earlier: dict[SourcePartition, int] = {}  # by the feeder's origin
    finished = True
    for chunk in target.found(work, position, task.scope, task.clusters):
        for item in chunk.records:
            if isinstance(item, BatchClaim):
                found, read = _claimed(item, checkers), read + item.record_count
            else:
                found, read = [item], read + 1
            strays = _claim(found, checkers, earlier)
            if strays:
                stray += len(strays)
                first_stray = strays[0] if first_stray < 0 else first_stray
        position = chunk.next_position
        if time.monotonic() > deadline:
            finished = False
            break
    notes = target.notes(work)
    if finished and not task.follow:
        feeders = tuple(
            FeederState(c.finish(), f.end)
            for f, c in zip(work.feeders, checkers.values(), strict=True)
        )
        feeders = _noted(_earlier(feeders, work, earlier), notes)
        return WorkState(position, feeders, stray, first_stray, True), read
    margin = 0 if task.follow else MARGIN
    feeders = _earlier(tuple(c.settle(margin) for c in checkers.values()), work, earlier)
    return WorkState(position, _noted(feeders, notes), stray, first_stray), read


def _claim(
    found: list[Found],
    checkers: dict[SourcePartition, Checker],
    earlier: dict[SourcePartition, int],
) -> list[int]:
    """Each record found to its feeder's checker, or counted in `earlier` (a copy of an earlier
    incarnation of a feeder's topic); the destination offsets of those naming no feeder."""
    strays = []
    for key, source_offset, dest_offset, copy, where in found:
        checker = checkers.get(key) if key is not None else None
        if checker is not None:
            checker.claim(source_offset, dest_offset, copy, where)
        elif (later := _later(key, checkers)) is not None:
            earlier[later] = earlier.get(later, 0) + 1
        else:
            strays.append(dest_offset)
    return strays


def _later(
    key: SourcePartition | None, checkers: dict[SourcePartition, Checker]
) -> SourcePartition | None:
    """The origin of the feeder whose topic `key` names in an earlier incarnation, if any."""
    if key is None:
        return None
    topic, incarnation = split_origin(key[0])
    for origin, checker in checkers.items():
        if checker.feeder.key == (topic, key[1]) and checker.feeder.incarnation > incarnation:
            return origin
    return None


def _earlier(
    feeders: tuple[FeederState, ...], work: DestWork, counts: dict[SourcePartition, int]
) -> tuple[FeederState, ...]:
    """The feeders' reports with the copies of their topics' earlier incarnations counted."""
    if not counts:
        return feeders
    return tuple(
        replace(s, report=replace(s.report, earlier=s.report.earlier + counts.get(f.origin, 0)))
        for f, s in zip(work.feeders, feeders, strict=True)
    )


def _claimed(item: BatchClaim, checkers: dict[SourcePartition, Checker]) -> list[Found]:
    """A destination batch compared whole where it copied a source batch whole (all but its
    last record: the claims left), record by record otherwise."""
    p = item.provenance
    checker = checkers.get(p.origin)
    start = checker.claim_whole(item) if checker is not None else None
    if start is not None:
        return [_found(item.last_claim(start))]
    return [_found(claim) for claim in item.claims()]


def _found(claim: Claim) -> Found:
    p = claim.provenance
    named = p.origin if p is not None else None
    return named, claim.source_offset, claim.dest_offset, claim.copy, ""


class KafkaSide:
    """A cluster read as record batches, one partition at a time."""

    def __init__(self, cluster: ClusterConfig, timeout: float):
        self.timeout = timeout
        # A fetch at a partition's end waits MAX_WAIT at most: a pass reads up to the end and
        # moves on. Not 0: such a fetch got no answer at all here (kafka-python 3.0.12 against
        # Tansu; not looked into further), 10 ms works.
        self.fetcher = BatchFetcher(
            cluster,
            timeout,
            max_wait=MAX_WAIT,
            partition_max_bytes=FETCH_BYTES,
            max_bytes=FETCH_BYTES,
        )

    def expected(
        self, feeder: Feeder, cursor: int, scope: Scope, kept: Kept, keep_type: bool
    ) -> Iterator[Expected]:
        chunks = stream_range(self.fetcher, feeder.key, cursor, feeder.end, self.timeout)
        return expected(chunks, replace(feeder, start=cursor), scope, kept, keep_type)

    def found(
        self, work: DestWork, position: int, scope: Scope, clusters: tuple[str, ...]
    ) -> Iterator[Chunk]:
        def wanted(
            p: Provenance,
        ) -> bool:  # --sample: a batch of none of the picked blocks is skipped
            return any(scope.picks_any((p.topic, p.partition), a, b + 1) for a, b in p.runs)

        chosen = wanted if scope.sample < 1.0 else None
        key = (work.topic, work.partition)
        for batches in stream_range(self.fetcher, key, position, work.end, self.timeout):
            records: list[Found | BatchClaim] = []
            for batch in batches:
                whole = scope.everything and batch.base_offset >= position
                for claim in claims(batch, chosen, whole):
                    if isinstance(claim, BatchClaim):
                        ours = claim.provenance.cluster in clusters
                        records += [claim] if ours else [_stray(c) for c in claim.claims()]
                    elif claim.dest_offset >= position:  # not read by an earlier pass
                        p = claim.provenance
                        ours = p is not None and p.cluster in clusters
                        records.append(_found(claim) if ours else _stray(claim))
            yield Chunk(records, max(position, batches[-1].next_offset))

    def notes(self, work: DestWork) -> tuple[str, ...]:
        return ()


class StoreSide:
    """A store's segments of a partition, in chain order (relay.store.chain): segments
    contained in another (a compaction's leftovers) are skipped as a restore skips them."""

    def __init__(self, cfg: StoreConfig):
        from relay.store.configured import cached_store

        self.cluster = cfg.cluster
        self.store = cached_store(cfg)
        self._problems: dict[tuple[str, int], tuple[str, ...]] = {}

    def expected(
        self, feeder: Feeder, cursor: int, scope: Scope, kept: Kept, keep_type: bool
    ) -> Iterator[Expected]:
        records = (r for _, segment in self._segments(feeder.key, cursor) for r in segment)
        return expected_stored(records, replace(feeder, start=cursor), scope, keep_type)

    def found(
        self, work: DestWork, position: int, scope: Scope, clusters: tuple[str, ...]
    ) -> Iterator[Chunk]:
        key = (work.topic, work.partition)
        for link, segment in self._segments(key, position):
            records: list[Found] = [
                (key, r.offset, -1, stored_copy(r, keep_type=True), link.key)
                for r in segment
                if r.offset >= position and scope.picked(key, r.offset)
            ]
            yield Chunk(records, link.next_offset)

    def notes(self, work: DestWork) -> tuple[str, ...]:
        return self._problems.get((work.topic, work.partition), ())

    def _segments(
        self, key: tuple[str, int], position: int
    ) -> Iterator[tuple[ChainLink, Iterator[StoredRecord]]]:
        """The chain's segments holding offsets at or after `position`, each with its records
        (read when iterated)."""
        from relay.store import ChainLink, plan_chain

        topic, partition = key
        refs = self.store.list_segments(self.cluster, topic, partition)
        plan = plan_chain(ChainLink.of(ref, self.store.read_meta(ref)) for ref in refs)
        self._problems[key] = tuple(str(problem) for problem in plan.problems)
        for link in plan.links:
            if link.next_offset > position and link.ref is not None:
                yield link, self.store.read_records(link.ref)


def _stray(claim: Claim) -> Found:
    return None, claim.source_offset, claim.dest_offset, claim.copy, ""


def _side(where: ClusterConfig | StoreConfig, timeout: float) -> Side:
    """The worker's reader of a cluster or a store, kept from one pass to the next."""
    key = (where, timeout)
    if key not in _sides:
        side: Side = (
            StoreSide(where) if isinstance(where, StoreConfig) else KafkaSide(where, timeout)
        )
        _sides[key] = side
    return _sides[key]


def _is_store_error(exc: BaseException) -> bool:
    from relay.store.errors import SegmentError, StoreError

    return isinstance(exc, (SegmentError, StoreError))


def _noted(feeders: tuple[FeederState, ...], notes: tuple[str, ...]) -> tuple[FeederState, ...]:
    if not notes:
        return feeders
    return tuple(replace(f, report=replace(f.report, notes=notes)) for f in feeders)


def _fresh(work: DestWork) -> WorkState:
    dest = (work.topic, work.partition)
    feeders = tuple(
        FeederState(PartitionReport(f.key, dest, f.start, f.end), f.start) for f in work.feeders
    )
    return WorkState(work.start, feeders)


def _kept(key: SourcePartition, filters: list[Filter], skip: set[str], record: Decoded) -> bool:
    """Whether the relay copies this source record: every filter allows it. A filter that
    raises drops it under on_error = "skip" (as the relay does); otherwise the relay stopped
    there, and nothing past it can be judged."""
    view = FilterRecord(
        *key, record.offset, record.timestamp, record.key, record.value, list(record.headers)
    )
    try:
        return apply_filters(filters, view) is None
    except FilterRuntimeError as exc:
        if exc.filter_id in skip:
            return False
        raise NotVerified(
            f"filter {exc.filter_id} failed at offset {record.offset}: {exc.error}"
        ) from exc


def _unverified(work: DestWork, why: str) -> WorkState:
    dest = (work.topic, work.partition)
    feeders = tuple(
        FeederState(PartitionReport(f.key, dest, f.start, f.end, not_verified=why), f.end)
        for f in work.feeders
    )
    return WorkState(work.end, feeders, done=True)

"""A verify task on an executor: each of its destination partitions read once, whole, and every
source partition feeding it read alongside (relay.pipelines.verify.compare). Reads only."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import ExitStack

from relay.batches.records import Decoded
from relay.clients.batch_fetch import BatchFetcher
from relay.clients.tails import stream_range
from relay.config import ClusterConfig
from relay.filters import Filter, FilterRecord, FilterRuntimeError, apply_filters, cached_filters
from relay.pipelines.verify.compare import Checker, Claim, NotVerified, claims, expected
from relay.pipelines.verify.spec import (
    DestWork,
    Finding,
    PartitionReport,
    VerifyResult,
    VerifyTask,
)
from relay.spec import SourcePartition

FETCH_BYTES = 4 * 1024 * 1024  # per partition and fetch: one partition is read at a time


def run(task: VerifyTask) -> VerifyResult:
    try:
        filters = cached_filters(task.filters) if task.filters else []
    except Exception as exc:  # noqa: BLE001 - a filter that cannot load verifies nothing
        why = f"a filter could not be loaded: {exc}"
        return VerifyResult(tuple(r for work in task.works for r in _unverified(work, why)))
    skip = {spec.id for spec in task.filters if spec.on_error == "skip"}
    reports: list[PartitionReport] = []
    with ExitStack() as stack:
        source, target = _fetcher(task.source, task.timeout), _fetcher(task.target, task.timeout)
        stack.callback(source.close)
        stack.callback(target.close)
        for work in task.works:
            reports.extend(_check(work, task, source, target, filters, skip))
    return VerifyResult(tuple(reports))


def _check(
    work: DestWork,
    task: VerifyTask,
    source: BatchFetcher,
    target: BatchFetcher,
    filters: list[Filter],
    skip: set[str],
) -> list[PartitionReport]:
    """One destination partition against its feeders; a record naming no feeder is counted
    in a report of its own (key None)."""
    dest = (work.topic, work.partition)
    checkers = {
        f.key: Checker(f, dest, expected(
            stream_range(source, f.key, f.start, f.end, task.timeout), f.start, f.end,
            functools.partial(_kept, f.key, filters, skip) if filters else None,
        ))
        for f in work.feeders
    }  # fmt: skip
    stray: list[int] = []  # destination offsets of records naming no feeder
    for chunk in stream_range(target, dest, work.start, work.end, task.timeout):
        for batch in chunk:
            for claim in claims(batch):
                checker = _checker_of(claim, checkers, task.clusters)
                if checker is None:
                    stray.append(claim.dest_offset)
                else:
                    checker.claim(claim.source_offset, claim.dest_offset, claim.copy)
    reports = [checker.finish() for checker in checkers.values()]
    if stray:  # no provenance, or a source this config does not relay
        first = Finding("unexpected", -1, stray[0])
        reports.append(PartitionReport(None, dest, 0, 0, len(stray), 0,
                                       (("unexpected", len(stray)),), (first,)))  # fmt: skip
    return reports


def _checker_of(
    claim: Claim, checkers: dict[SourcePartition, Checker], clusters: tuple[str, ...]
) -> Checker | None:
    p = claim.provenance
    if p is None or p.cluster not in clusters:
        return None
    return checkers.get((p.topic, p.partition))


def _kept(key: SourcePartition, filters: list[Filter], skip: set[str], record: Decoded) -> bool:
    """Whether the relay copies this source record: every filter allows it. A filter that
    raises drops it under on_error = "skip" (as the relay does); otherwise the relay stopped
    there, and nothing past it can be judged."""
    view = FilterRecord(key[0], key[1], record.offset, record.timestamp, record.key,
                        record.value, list(record.headers))  # type: ignore[arg-type]  # fmt: skip
    try:
        return apply_filters(filters, view) is None
    except FilterRuntimeError as exc:
        if exc.filter_id in skip:
            return False
        raise NotVerified(
            f"filter {exc.filter_id} failed at offset {record.offset}: {exc.error}"
        ) from exc


def _unverified(work: DestWork, why: str) -> Iterator[PartitionReport]:
    for f in work.feeders:
        yield PartitionReport(f.key, (work.topic, work.partition), f.start, f.end,
                              not_verified=why)  # fmt: skip


def _fetcher(cluster: ClusterConfig, timeout: float) -> BatchFetcher:
    return BatchFetcher(cluster, timeout, partition_max_bytes=FETCH_BYTES, max_bytes=FETCH_BYTES)

"""ktm compact on an executor: merge runs of small segments of a few partitions into big ones.

A merged segment is written (atomically) before anything is deleted, and read back and checked
first: its metadata and its records' offsets must be exactly those of its inputs. A crash
anywhere leaves the store restorable: a merged segment and its inputs both present are fine
(restore replays the merged one and skips what it contains), and the next `--delete` run
deletes such leftovers after checking them against the segment that contains them.
"""

from __future__ import annotations

import itertools
import logging
import time
from array import array
from collections.abc import Iterator

from relay.pipelines.compact.spec import CompactResult, CompactTask
from relay.store import ChainLink, SegmentBuffer, SegmentMeta, SegmentStore, merged_meta, plan_chain
from relay.store.chain import compaction_plan
from relay.store.configured import cached_store

log = logging.getLogger(__name__)

CHUNK_BYTES = 32 * 1024 * 1024  # records held in memory at once while merging


class CompactionError(Exception):
    """A merged segment does not hold exactly its inputs: nothing is deleted."""


def compact_partitions(task: CompactTask) -> CompactResult:
    """Every partition of the task; one failing partition does not stop the others."""
    store = cached_store(task.store)
    total = CompactResult()
    for topic, partition in task.partitions:
        try:
            done = _compact_one(store, task, topic, partition)
        except Exception as exc:  # noqa: BLE001 - reported per partition to the driver
            done = CompactResult(errors=(f"{topic}[{partition}]: {type(exc).__name__}: {exc}",))
        total = CompactResult(
            total.merged + done.merged,
            total.inputs + done.inputs,
            total.deleted + done.deleted,
            total.records + done.records,
            total.errors + done.errors,
        )
    return total


def _compact_one(
    store: SegmentStore, task: CompactTask, topic: str, partition: int
) -> CompactResult:
    cluster = task.store.cluster
    metas: dict[str, SegmentMeta] = {}
    links = []
    for ref in store.list_segments(cluster, topic, partition):
        metas[ref.path] = store.read_meta(ref)
        links.append(ChainLink.of(ref, metas[ref.path]))
    deleted = _delete_superseded(store, links) if task.delete else 0
    runs = compaction_plan(
        links, level=task.level, max_bytes=task.target_bytes, min_age=task.min_age, now=time.time()
    )
    merged = inputs = records = 0
    for run in runs:
        records += _merge(store, task, run, [metas[link.key] for link in run])
        merged, inputs = merged + 1, inputs + len(run)
        if task.delete:
            for link in run:
                assert link.ref is not None
                store.delete(link.ref)
                deleted += 1
    return CompactResult(merged, inputs, deleted, records)


def _merge(
    store: SegmentStore, task: CompactTask, run: list[ChainLink], metas: list[SegmentMeta]
) -> int:
    """Stream the run's records into one segment (a chunk at a time: a merged segment may be
    far bigger than memory), then read it back and check it holds exactly their offsets."""
    offsets = array("q")  # 8 bytes a record, the one thing kept whole
    meta = merged_meta(metas)
    chunks = _chunks(store, run, offsets)
    ref = store.write_segment_chunks(task.store.format, chunks, meta, task.store.compression)
    written = store.read_meta(ref)
    fields = ("start", "first", "last", "next_offset", "count", "level")
    if any(getattr(written, f) != getattr(meta, f) for f in fields):
        raise CompactionError(f"{ref.path}: metadata {written} differs from {meta}")
    read_back = (r.offset for r in store.read_records(ref))
    if any(a != b for a, b in itertools.zip_longest(read_back, offsets)):
        raise CompactionError(f"{ref.path}: its records are not those of its {len(run)} inputs")
    log.info("compacted %d segments into %s (%d records)", len(run), ref.path, meta.count)
    return meta.count


def _chunks(
    store: SegmentStore, run: list[ChainLink], offsets: array[int]
) -> Iterator[SegmentBuffer]:
    """The run's records in buffers of about CHUNK_BYTES, noting every offset."""
    buffer = SegmentBuffer()
    for link in run:
        assert link.ref is not None
        for record in store.read_records(link.ref):
            buffer.extend((record,))
            offsets.append(record.offset)
            if buffer.size_bytes >= CHUNK_BYTES:
                yield buffer
                buffer = SegmentBuffer()
    yield buffer


def _delete_superseded(store: SegmentStore, links: list[ChainLink]) -> int:
    """Leftovers of a crashed compaction: segments inside a merged one. Each is deleted only
    after the merged segment was read and found to hold the same offsets."""
    plan = plan_chain(links)
    deleted = 0
    for inner in plan.superseded:
        outer = next(
            link
            for link in plan.links
            if link.start <= inner.start and inner.next_offset <= link.next_offset
        )
        assert outer.ref is not None and inner.ref is not None
        held = {
            r.offset for r in store.read_records(outer.ref) if inner.first <= r.offset <= inner.last
        }
        if held == {r.offset for r in store.read_records(inner.ref)}:
            store.delete(inner.ref)
            deleted += 1
        else:
            log.warning("kept %s: %s does not hold the same records", inner.key, outer.key)
    return deleted

"""SegmentStore: write, list, read and delete segments and JSON snapshots in one store.

Kafka-free. Every failure of the directory or bucket becomes a StoreError naming the store's
URL, the key and a short cause; every problem with a file's content becomes a SegmentError
naming the file. Listings come from names only (layout.py), so they cost no reads.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from relay.store.errors import SegmentError, StoreError
from relay.store.formats import SegmentFormat, check_compression, get_format
from relay.store.fs import Backend, Sink, open_backend
from relay.store.layout import (
    GROUPS_DIR,
    SegmentRef,
    check_cluster_name,
    check_topic_name,
    decode_group,
    groups_dir,
    is_temp_name,
    level_dir,
    parse_segment_path,
    partition_dir,
    segment_path,
    topic_descriptor_path,
)
from relay.store.records import SegmentBuffer, SegmentMeta, StoredRecord

PROBE_PREFIX = ".ktm-probe-"


def open_store(
    url: str,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
) -> SegmentStore:
    """A store on a directory (a path or file:// URL) or on S3 (s3://bucket/prefix).

    For S3, ``endpoint`` ("http://127.0.0.1:8333") points at a non-AWS server, ``region``
    defaults to us-east-1, and without keys pyarrow's default credential chain applies. Nothing
    is contacted until the first operation: call check() to fail early.
    """
    backend = open_backend(
        url, endpoint=endpoint, region=region, access_key=access_key, secret_key=secret_key
    )
    return SegmentStore(backend)


class SegmentStore:
    def __init__(self, backend: Backend):
        self._backend = backend

    def __repr__(self) -> str:
        return f"SegmentStore({self.describe()!r})"

    def describe(self) -> str:
        """The store's URL (or absolute directory), for logs: never credentials."""
        return self._backend.url

    def location(self, key: str | SegmentRef) -> str:
        """Where a key lives, as error messages name it."""
        return f"{self._backend.url}/{key.path if isinstance(key, SegmentRef) else key}"

    @contextmanager
    def _errors(self, action: str, key: str = "") -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            cause = self._backend.describe_error(exc)
            where = f" {self.location(key)}" if key else f" {self.describe()}"
            message = f"cannot {action}{where}: {cause.text}"
            raise StoreError(message, retriable=cause.retriable) from exc

    def check(self, write: bool = True) -> None:
        """Fail unless the store is reachable and (with `write`) writable: put, read and delete
        a probe file. Without `write` (a restore may hold read-only credentials), list it.

        Raises StoreError("cannot use store <url>: <cause>"), e.g. a missing bucket, wrong
        credentials, an unreachable endpoint. A missing directory is created, like mkdir -p.
        """
        key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        payload = b"ktm store probe\n"
        with self._errors("use store"):
            cause = self._backend.check_root()
            if cause is not None:
                raise StoreError(f"cannot use store {self.describe()}: {cause.text}")
            if not write:
                self._backend.list("", recursive=False)
                return
            self._backend.put(key, payload)
            read_back = self._backend.get(key)
            self._backend.delete(key)
        if read_back != payload:
            raise StoreError(f"cannot use store {self.describe()}: the probe file read back wrong")

    # --- segments ------------------------------------------------------------------------

    def write_segment(
        self,
        segment_format: str | SegmentFormat,
        buffer: SegmentBuffer,
        meta: SegmentMeta,
        compression: str | None = None,
    ) -> SegmentRef:
        """Write ``buffer`` as one segment, atomically (see fs.py); returns its ref.

        ``compression`` defaults to the format's first (zstd for Parquet, none for JSON lines).
        """
        fmt, compression, ref = _segment_target(segment_format, meta, compression)
        _check_matches_buffer(buffer, meta)
        # Encoded in memory first: nothing reaches the store unless the encoding succeeded.
        sink = pa.BufferOutputStream()
        fmt.write(sink, [buffer], meta, compression)
        data = sink.getvalue()
        with self._errors("write segment", ref.path):
            self._backend.put(ref.path, memoryview(data))
        return _with_file_info(ref, size=data.size)

    def write_segment_chunks(
        self,
        segment_format: str | SegmentFormat,
        chunks: Iterable[SegmentBuffer],
        meta: SegmentMeta,
        compression: str | None = None,
    ) -> SegmentRef:
        """Like write_segment, for a segment too big for memory: ``chunks`` are encoded and
        uploaded one at a time. The segment appears only if its records match ``meta``."""
        fmt, compression, ref = _segment_target(segment_format, meta, compression)
        seen = _Tally()

        def write(sink: Sink) -> None:
            fmt.write(sink, seen.counting(chunks), meta, compression)
            seen.check(meta)  # raising here leaves nothing under the final key

        with self._errors("write segment", ref.path):
            self._backend.put_stream(ref.path, write)
        return ref

    def list_segments(
        self, cluster: str, topic: str, partition: int, level: int | None = None
    ) -> list[SegmentRef]:
        """The partition's segments by (first, level); temporary and foreign files are skipped."""
        if level is None:
            folder = partition_dir(cluster, topic, partition)
        else:
            folder = level_dir(cluster, topic, partition, level)
        with self._errors("list", folder):
            infos = self._backend.list(folder, recursive=True)
        refs = []
        for info in infos:
            ref = parse_segment_path(self._backend.relative(info.path))
            if ref is not None and info.type == pafs.FileType.File:
                if level is None or ref.level == level:
                    refs.append(_with_file_info(ref, size=info.size, mtime=info.mtime))
        return sorted(refs, key=lambda r: (r.first, r.level, r.last))

    def read_meta(self, ref: SegmentRef) -> SegmentMeta:
        """The segment's metadata (Parquet: the footer only), checked against its name."""
        fmt = get_format(ref.format)
        with self._errors("read", ref.path):
            with self._backend.open(ref.path) as source:
                meta = fmt.read_meta(source, self.location(ref))
        _check_matches_name(ref, meta, self.location(ref))
        return meta

    def read_records(self, ref: SegmentRef) -> Iterator[StoredRecord]:
        """The segment's records in offset order, checked against its metadata and name."""
        fmt = get_format(ref.format)
        where = self.location(ref)
        with self._errors("read", ref.path):
            source = self._backend.open(ref.path)
        try:
            with self._errors("read", ref.path):
                meta, records = fmt.read(source, where)
            _check_matches_name(ref, meta, where)
            while True:
                with self._errors("read", ref.path):
                    record = next(records, None)
                if record is None:
                    return
                yield record
        finally:
            source.close()

    def next_offset(self, cluster: str, topic: str, partition: int) -> int | None:
        """The partition's next offset in the store: after its last segment (None: none yet).
        One listing and one footer read."""
        refs = self.list_segments(cluster, topic, partition)
        if not refs:
            return None
        last = max(refs, key=lambda ref: (ref.last, ref.level))
        return self.read_meta(last).next_offset

    def delete(self, ref: SegmentRef) -> None:
        """Delete a segment; a segment already gone is fine (a retried compaction)."""
        with self._errors("delete", ref.path):
            try:
                self._backend.delete(ref.path)
            except FileNotFoundError:
                pass

    def clean_leftovers(self, cluster: str, topic: str, partition: int) -> int:
        """Delete temporary files a crashed write left in the partition; returns how many.

        Call it only while no other process writes this partition (its temporary files would
        go too). On S3 only put_stream() writes temporary keys (see fs.py).
        """
        folder = partition_dir(cluster, topic, partition)
        with self._errors("list", folder):
            infos = self._backend.list(folder, recursive=True)
        removed = 0
        for info in infos:
            if info.type == pafs.FileType.File and is_temp_name(info.base_name):
                key = self._backend.relative(info.path)
                with self._errors("delete", key):
                    self._backend.delete(key)
                removed += 1
        return removed

    def list_topics(self, cluster: str) -> list[str]:
        """Topics with a folder under ``cluster``, sorted."""
        return sorted(
            name for name in self._subfolders(check_cluster_name(cluster)) if _is_topic(name)
        )

    def list_partitions(self, cluster: str, topic: str) -> list[int]:
        """Partitions with a folder under the topic, sorted."""
        folder = f"{check_cluster_name(cluster)}/{check_topic_name(topic)}"
        names = self._subfolders(folder)
        return sorted(int(name) for name in names if name.isdigit() and str(int(name)) == name)

    def _subfolders(self, folder: str) -> list[str]:
        with self._errors("list", folder):
            infos = self._backend.list(folder, recursive=False)
        return [i.base_name for i in infos if i.type == pafs.FileType.Directory]

    # --- JSON snapshots ------------------------------------------------------------------

    def write_json(self, key: str, obj: object) -> None:
        """Write ``obj`` as JSON under ``key`` (e.g. layout.group_snapshot_path()), atomically."""
        data = json.dumps(obj, indent=2, sort_keys=True).encode() + b"\n"
        with self._errors("write", key):
            self._backend.put(key, data)

    def read_json(self, key: str) -> Any:
        """The JSON value under ``key``, or None if there is no such file."""
        with self._errors("read", key):
            try:
                data = self._backend.get(key)
            except FileNotFoundError:
                return None
        try:
            return json.loads(data)
        except ValueError as exc:
            raise StoreError(f"cannot read {self.location(key)}: not valid JSON ({exc})") from None

    def write_partition_count(self, cluster: str, topic: str, partitions: int) -> None:
        """Record how many partitions the backed-up topic has (backup, at start-up)."""
        descriptor = {"cluster": cluster, "topic": topic, "partitions": partitions}
        self.write_json(topic_descriptor_path(cluster, topic), descriptor)

    def partition_count(self, cluster: str, topic: str) -> int:
        """The topic's partition count as far as the store knows: the most a backup recorded
        or its highest partition holding segments, plus one (0: nothing of the topic yet)."""
        listed = self.list_partitions(cluster, topic)
        descriptor = self.read_json(topic_descriptor_path(cluster, topic)) or {}
        recorded = descriptor.get("partitions") if isinstance(descriptor, dict) else None
        return max(max(listed, default=-1) + 1, recorded if isinstance(recorded, int) else 0)

    def list_groups(self, cluster: str) -> list[str]:
        """Consumer groups with a snapshot backed up from ``cluster``, sorted."""
        folder = groups_dir(cluster)
        with self._errors("list", folder):
            infos = self._backend.list(folder, recursive=False)
        groups = (decode_group(i.base_name) for i in infos if i.type == pafs.FileType.File)
        return sorted(g for g in groups if g is not None)


def _is_topic(name: str) -> bool:
    try:
        return check_topic_name(name) == name and name != GROUPS_DIR
    except ValueError:
        return False


def _with_file_info(
    ref: SegmentRef, *, size: int | None, mtime: datetime | None = None
) -> SegmentRef:
    modified = mtime.timestamp() if mtime is not None else None
    return dataclasses.replace(ref, size=size, modified=modified)


def _segment_target(
    segment_format: str | SegmentFormat, meta: SegmentMeta, compression: str | None
) -> tuple[SegmentFormat, str, SegmentRef]:
    """The format, the compression (default: the format's first) and the ref a segment
    described by ``meta`` is written as."""
    fmt = get_format(segment_format) if isinstance(segment_format, str) else segment_format
    compression = compression or fmt.compressions[0]
    check_compression(fmt, compression)
    key = segment_path(
        meta.cluster, meta.topic, meta.partition, meta.level, meta.first, meta.last, fmt.name
    )
    ref = parse_segment_path(key)
    assert ref is not None, key
    return fmt, compression, ref


class _Tally:
    """Count, first and last offset of the chunks passing through ``counting``."""

    def __init__(self) -> None:
        self.count = 0
        self.first: int | None = None
        self.last: int | None = None

    def counting(self, chunks: Iterable[SegmentBuffer]) -> Iterator[SegmentBuffer]:
        for chunk in chunks:
            if chunk.count:
                self.count += chunk.count
                self.first = chunk.first if self.first is None else self.first
                self.last = chunk.last
            yield chunk

    def check(self, meta: SegmentMeta) -> None:
        _check_counts((self.count, self.first, self.last), meta, "the records written")


def _check_matches_buffer(buffer: SegmentBuffer, meta: SegmentMeta) -> None:
    _check_counts((buffer.count, buffer.first, buffer.last), meta, "the buffer")


def _check_counts(actual: tuple[int, int | None, int | None], meta: SegmentMeta, what: str) -> None:
    if actual != (meta.count, meta.first, meta.last):
        raise ValueError(
            f"metadata (count, first, last) = {(meta.count, meta.first, meta.last)} does not "
            f"describe {what} {actual}"
        )


def _check_matches_name(ref: SegmentRef, meta: SegmentMeta, where: str) -> None:
    named = (ref.cluster, ref.topic, ref.partition, ref.level, ref.first, ref.last)
    stored = (meta.cluster, meta.topic, meta.partition, meta.level, meta.first, meta.last)
    if named != stored:
        raise SegmentError(
            f"segment {where}: its metadata says {_describe(*stored)}, its name says "
            f"{_describe(*named)}"
        )


def _describe(cluster: str, topic: str, partition: int, level: int, first: int, last: int) -> str:
    return f"{cluster}/{topic}/{partition} level {level} offsets {first}-{last}"

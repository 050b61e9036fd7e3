"""The provenance header: which source records a destination record or batch holds.

Header `ktm.src`, two forms (the rule that reads them is in `relay.provenance.copies`):
- **batch**: `<cluster>/<topic>/<partition>/<a>-<b>[,<c>-<d>...]`, once per destination batch,
  on its last record: the runs of consecutive source offsets whose records the batch holds, in
  order (one run unless a compaction gap, a transaction marker, a filtered record or a mid-batch
  start lies between them; every run is written `a-b`, also when a == b). The batch's i-th record
  is the i-th offset of the runs, so a source offset maps to a destination offset exactly.
- **record**: `<cluster>/<topic>/<partition>/<offset>` on every record (the record path of
  older versions, and the fallback when the batch path is unavailable): the record's own source
  offset.

The cluster is ktm's name for the source in its config. Topic names cannot hold '/'; the cluster
is split off from the right so that it may.

The topic may end in `~<n>` (n >= 1), a character no topic name holds: the **incarnation**, how
many times ktm followed the source topic into the same destination after it was deleted and
created again under its name (`[source_pool].on_recreate = "follow"`). Each incarnation's
offsets start over, so a copy's records are named by (topic, incarnation, partition, offset);
the first incarnation, and every copy made without following, writes no suffix.

The header of a hop is the *last* `ktm.src` header of its record: a record relayed twice (A to B
to C) keeps the first hop's header before this hop's. Inside a batch-form destination batch,
records other than the last may carry an *earlier hop's* header as their last one; a reader
therefore takes a batch-form header only from the last record of a destination batch
(`relay.provenance.copies.origins`) and never reads the records before it.

Pure text, no batches: `relay.batches.records.provenance_header` encodes the batch form as a
record header, and `relay.provenance.copies` reads it back out of destination batches.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

PROVENANCE_HEADER = "ktm.src"  # both forms; relay.spec.PROVENANCE_HEADER is this one

Runs = tuple[tuple[int, int], ...]  # (first, last) source offsets, inclusive, ascending
INCARNATION = "~"  # no topic name holds it: Kafka allows [a-zA-Z0-9._-] only


COMMIT_MARK = "ktm.incarnation="  # the relay group's commit metadata of a later incarnation


def commit_mark(incarnation: int) -> str:
    """The metadata a commit of a source partition carries: its incarnation, after the first
    (a restart then knows a topic was followed before any copy of the new one was written)."""
    return f"{COMMIT_MARK}{incarnation}" if incarnation else ""


def marked_incarnation(metadata: str | None) -> int:
    """The incarnation a commit's metadata names (0: none, as every commit before following)."""
    if metadata and metadata.startswith(COMMIT_MARK) and metadata[len(COMMIT_MARK) :].isdigit():
        return int(metadata[len(COMMIT_MARK) :])
    return 0


def origin_topic(topic: str, incarnation: int) -> str:
    """The topic as a header names it: the source topic, and its incarnation after the first."""
    return f"{topic}{INCARNATION}{incarnation}" if incarnation else topic


class Provenance(NamedTuple):
    cluster: str
    topic: str  # the source topic, without its incarnation
    partition: int
    runs: Runs
    batch: bool = True  # the batch form; False: one record's own offset (the record form)
    incarnation: int = 0

    @property
    def origin(self) -> tuple[str, int]:
        """(topic as the header names it, partition): one incarnation of a source partition."""
        return origin_topic(self.topic, self.incarnation), self.partition

    @property
    def first(self) -> int:
        return self.runs[0][0]

    @property
    def last(self) -> int:
        return self.runs[-1][1]

    @property
    def next_offset(self) -> int:
        return self.last + 1

    @property
    def records(self) -> int:
        return sum(last - first + 1 for first, last in self.runs)

    def index_at_or_after(self, offset: int) -> int | None:
        """The position, among the records this header covers, of the first one whose source
        offset is >= `offset`; None when all of them lie before it."""
        index = 0
        for first, last in self.runs:
            if offset <= last:
                return index + max(0, offset - first)
            index += last - first + 1
        return None


def format_runs(cluster: str, topic: str, partition: int, runs: Iterable[tuple[int, int]]) -> bytes:
    """The batch form's header value."""
    offsets = ",".join(f"{first}-{last}" for first, last in runs)
    return f"{cluster}/{topic}/{partition}/{offsets}".encode()


def provenance_prefix(cluster: str, topic: str, partition: int) -> bytes:
    """The record form's header value up to the offset: `cluster/topic/partition/`. Topic names
    cannot hold '/'."""
    return f"{cluster}/{topic}/{partition}/".encode()


def parse_provenance(value: bytes) -> Provenance | None:
    """A header value of either form, None if it is not ktm's."""
    try:
        cluster, named, partition, offsets = value.decode().rsplit("/", 3)
        topic, incarnation = split_origin(named)
        if "-" not in offsets:
            offset = int(offsets)
            return Provenance(
                cluster, topic, int(partition), ((offset, offset),), False, incarnation
            )
        runs = []
        previous = -1
        for run in offsets.split(","):
            low, high = (int(part) for part in run.split("-"))  # exactly two, else ValueError
            if not previous < low <= high:
                return None
            runs.append((low, high))
            previous = high
        return Provenance(cluster, topic, int(partition), tuple(runs), True, incarnation)
    except (UnicodeDecodeError, ValueError):
        return None


def split_origin(named: str) -> tuple[str, int]:
    """('orders', 2) of 'orders~2'; ValueError where the suffix is not a number above 0."""
    topic, mark, number = named.partition(INCARNATION)
    if not mark:
        return topic, 0
    incarnation = int(number)
    if incarnation < 1 or str(incarnation) != number:
        raise ValueError(named)
    return topic, incarnation


def last_provenance(headers: Iterable[tuple[str, bytes | None]]) -> Provenance | None:
    """The last `ktm.src` header of a record's headers, parsed (this hop's)."""
    last = None
    for name, value in headers:
        if name == PROVENANCE_HEADER:
            last = value
    return parse_provenance(last) if last is not None else None

"""Source records lost before ktm copied them: what a reader's position out of the source log's
range means, and how the driver counts it once.

A fetch from a position outside [log start, log end] is answered OFFSET_OUT_OF_RANGE:

- below the log start: retention (or DeleteRecords) removed records ktm had not read yet. They
  are gone: `deleted`, the offsets from the position up to the log start.
- above the log end: the log was cut below what ktm already copied (an unclean leader election,
  a node that came back empty, a topic deleted and recreated). The copy holds records the source
  no longer has, and the source's next records will reuse their offsets: `truncated`, the
  offsets from the log end up to the position. A new leader whose log has already grown past
  the position answers in range: the batch reader names the epoch of the last batch it read,
  and the leader says where its log parts from that one (`diverged`): truncated from there.

`[source_pool].on_loss` says what to do about deleted records: "warn" goes on at the log start,
counting; "stop" halts the partition at the position (relay.engine.driver.halts). A truncation
always halts: the source's next records will reuse offsets the copy holds, so going on would
either skip them or put two records under one source offset in the copy. Pure: no Kafka client.
"""

from __future__ import annotations

from dataclasses import dataclass

from relay.spec import SourcePartition

DELETED, TRUNCATED = "deleted", "truncated"


@dataclass(frozen=True)
class Loss:
    """Offsets [first, end) of a source partition lost to the copy; reading goes on at `resume`
    (on_loss = "warn") or stops at `position` ("stop")."""

    key: SourcePartition
    first: int
    end: int
    cause: str  # DELETED or TRUNCATED
    position: int  # where the reader was when it found out

    @property
    def count(self) -> int:
        return self.end - self.first

    @property
    def resume(self) -> int:
        """Where reading goes on: the log start past deleted records; at the position past a
        truncation, which always halts (the source's next records reuse offsets the copy
        holds: going on would skip them or copy them under offsets already there)."""
        return self.end if self.cause == DELETED else self.position

    def halts(self, on_loss: str) -> bool:
        return on_loss == "stop" or self.cause == TRUNCATED

    @property
    def as_range(self) -> tuple[int, int, str]:
        return (self.first, self.end, self.cause)

    def describe(self) -> str:
        """One line naming the topic, partition and offsets, as the log and a halt say it."""
        topic, partition = self.key
        where = f"topic={topic} partition={partition} offsets={self.first}-{self.end - 1}"
        if self.cause == DELETED:
            return (
                f"source records deleted before they were copied: {where} ({self.count} records, "
                f"the log now starts at {self.end})"
            )
        return (
            f"source log truncated below what was copied: {where} ({self.count} records the "
            f"copy holds are gone at the source, whose log now parts from it at {self.first}: an "
            "unclean leader election, a node that came back empty, or the topic recreated)"
        )


def out_of_range(key: SourcePartition, position: int, begin: int, end: int) -> Loss | None:
    """What a position the broker calls out of range means, given the log's bounds now; None
    when it lies inside them (a stale answer, or a follower behind: fetch again)."""
    if position < begin:
        return Loss(key, position, begin, DELETED, position)
    if position > end:
        return Loss(key, end, position, TRUNCATED, position)
    return None


def diverged(key: SourcePartition, position: int, end: int) -> Loss | None:
    """What a leader saying its log parts at `end` from the one ktm read up to `position`
    means (Fetch's DivergingEpoch: an unclean leader election, found even when the new log has
    grown past the position): the offsets from `end` on are truncated. None when `end` is not
    below the position (the same rule as Kafka's consumer: nothing read was lost)."""
    if 0 <= end < position:
        return Loss(key, end, position, TRUNCATED, position)
    return None


class LossCounter:
    """What the driver counts per partition, once: task attempts report their losses again
    (cumulative reports, a retried round that finds the same range), and each offset counts the
    first time."""

    def __init__(self) -> None:
        self._deleted_to: dict[SourcePartition, int] = {}  # offsets below it were counted
        self._truncated: set[tuple[SourcePartition, int, int]] = set()

    def new(self, key: SourcePartition, first: int, end: int, cause: str) -> int:
        """How many offsets of [first, end) were not counted yet (and counts them now)."""
        if cause == TRUNCATED:
            if (key, first, end) in self._truncated:
                return 0
            self._truncated.add((key, first, end))
            return end - first
        counted = self._deleted_to.get(key, first)
        self._deleted_to[key] = max(counted, end)
        return max(0, end - max(first, counted))

"""Which source record each destination record copies, read from the provenance headers ktm
writes (relay.provenance.header has their two forms): for the tests' checks and the
benchmarks', with no code of ktm's own, so a bug in the relay cannot hide itself in them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

PROVENANCE = "ktm.src"  # the provenance header


class Relayed(NamedTuple):
    """A destination record and the source record it copies."""

    record: Any
    source: str
    topic: str
    partition: int
    offset: int


def attributed(records: Iterable[Any]) -> list[Relayed]:
    """Each destination record with the source record it copies, read from the ktm.src headers
    in destination order (per destination topic and partition):
    - the record form, `<source>/<topic>/<p>/<offset>` on a record, names that record's own;
    - the batch form, `<source>/<topic>/<p>/<a>-<b>[,<c>-<d>...]` on the last record of a
      destination batch, lists the offsets of that batch's records in order: the records since
      the previous header, and itself.
    Every record must be accounted for, exactly."""
    out: list[Relayed] = []
    waiting: dict[tuple[str, int], list[Any]] = {}
    for record in records:
        stream = waiting.setdefault((record.topic, record.partition), [])
        values = [value for name, value in record.headers if name == PROVENANCE]
        stream.append(record)
        if not values:
            continue
        source, topic, partition, offsets = values[-1].decode().rsplit("/", 3)
        numbers = [int(offsets)] if "-" not in offsets else _offsets_of_runs(offsets)
        assert len(numbers) == len(stream), f"{values[-1]!r} does not cover {len(stream)} records"
        out += [
            Relayed(r, source, topic, int(partition), o)
            for r, o in zip(stream, numbers, strict=True)
        ]
        stream.clear()
    left = {key: len(stream) for key, stream in waiting.items() if stream}
    assert not left, f"records with no provenance after them: {left}"
    return out


def _offsets_of_runs(runs: str) -> list[int]:
    offsets: list[int] = []
    for run in runs.split(","):
        first, last = run.split("-")
        offsets += range(int(first), int(last) + 1)
    return offsets

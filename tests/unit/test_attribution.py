"""relay.provenance.attribution: batches of a compacted destination that lost their provenance, told
apart by their records, on crafted tails (the cleaner's work as Kafka does it:
tests.support.batches.cleaned) and a source read through a stand-in."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from relay.batches import split_batches
from relay.provenance import attribution
from relay.provenance.header import format_runs
from relay.provenance.resume import AtDestination, delivered_in, unsettled_in
from tests.support.batches import T0, Rec, cleaned, make_batch

A, B = ("t", 0), ("t", 1)
DEST = ("d", 0)


def source(partition: int, count: int) -> list[Rec]:
    return [Rec(o, T0 + o, b"k%d-%d" % (partition, o % 5), b"v%d-%d" % (partition, o),
                [("h", b"%d" % o)]) for o in range(count)]  # fmt: skip


def copied(records: list[Rec], key: tuple[str, int], at: int, kept: list[int] | None = None,
           attributes: int = 0) -> bytes:  # fmt: skip
    """A destination batch at offset `at` as ktm writes it (the batch form's header on its last
    record), then cleaned down to the records at the destination offsets `kept`."""
    runs = format_runs("src", *key, [(records[0].offset, records[-1].offset)])
    copies = [Rec(at + i, r.timestamp, r.key, r.value,
                  r.headers + ([("ktm.src", runs)] if i == len(records) - 1 else []))
              for i, r in enumerate(records)]  # fmt: skip
    data = make_batch(copies, attributes=attributes, producer=(3, 0, 0))
    return data if kept is None else cleaned(data, kept)


def settle(monkeypatch, tail: list[bytes], sources: dict[tuple[str, int], list[Rec]],
           committed: dict[Any, int | None]) -> tuple[dict, frozenset, list]:  # fmt: skip
    """attribute() over the destination `tail`; also what it read of the source."""
    batches = split_batches(b"".join(tail))[0]
    feeders = set(sources)
    at = AtDestination(delivered_in(batches, feeders), frozenset(unsettled_in(batches, feeders)),
                       {DEST: batches}, {DEST: feeders})  # fmt: skip
    reads: list[tuple[Any, int, int]] = []
    held = {key: split_batches(make_batch(records))[0] for key, records in sources.items()}

    def fetch_range(fetcher: Any, key: Any, lower: int, upper: int, timeout: float) -> Any:
        reads.append((key, lower, upper))
        return [b for b in held[key] if b.next_offset > lower and b.base_offset < upper]

    monkeypatch.setattr(attribution, "fetch_range", fetch_range)
    monkeypatch.setattr(attribution, "BatchFetcher", lambda *a: SimpleNamespace(close=lambda: 0))
    stands, unsettled = attribution.attribute(SimpleNamespace(), at, committed, 1.0)  # type: ignore[arg-type]
    return stands, unsettled, reads


def test_a_kill_9_s_last_batch_is_found_by_its_records_though_its_header_was_cleaned(
    monkeypatch,
) -> None:
    """A's batch 3..5 was acknowledged, not yet committed (committed: 3), and its last record
    (the header) was cleaned; B wrote after it. A stands at 6: its survivors are A's 3 and 4."""
    a, b = source(0, 6), source(1, 4)
    tail = [copied(a[0:3], A, 100), copied(a[3:6], A, 103, kept=[103, 104]),
            copied(b[0:2], B, 106), copied(b[2:4], B, 108)]  # fmt: skip
    stands, unsettled, reads = settle(monkeypatch, tail, {A: a, B: b}, {A: 3, B: 4})
    assert stands == {A: 6} and unsettled == frozenset()
    assert reads == [(A, 3, 10)]  # from A's next, as far as the 7 destination offsets after


def test_a_batch_the_cleaner_dropped_whole_is_passed_over(monkeypatch) -> None:
    """A's 3..4 were all superseded: their batch is gone (offsets 103..104 hold nothing); its
    next batch, 5..7, lost its header: its survivors fit A's records two offsets on."""
    a = source(0, 8)
    tail = [copied(a[0:3], A, 100), copied(a[5:8], A, 105, kept=[105, 106]),
            copied(source(1, 1), B, 108)]  # fmt: skip
    stands, unsettled, _ = settle(monkeypatch, tail, {A: a, B: source(1, 1)}, {})
    assert stands == {A: 8} and unsettled == frozenset()


def test_another_source_partitions_lost_batch_is_not_taken(monkeypatch) -> None:
    a, b = source(0, 3), source(1, 6)
    tail = [copied(b[0:3], B, 100), copied(a, A, 103), copied(b[3:6], B, 106, kept=[106]),
            copied(source(1, 7)[6:7], B, 109)]  # fmt: skip
    stands, unsettled, _ = settle(monkeypatch, tail, {A: a, B: source(1, 7)}, {})
    assert stands == {A: 3} and unsettled == frozenset()


def test_a_batch_whose_survivors_fit_no_single_shift_leaves_the_partition_unsettled(
    monkeypatch,
) -> None:
    """A filter dropped A's 4 (the batch held 3, 5, 6): its survivors 3 and 5 are A's records
    at deltas 0 and 1, not at one shift. It may be A's; A stays where it was, unsettled."""
    a = source(0, 7)
    runs = format_runs("src", *A, [(3, 3), (5, 6)])
    held = [a[3], a[5], a[6]]
    copies = [Rec(103 + i, r.timestamp, r.key, r.value,
                  r.headers + ([("ktm.src", runs)] if i == 2 else []))
              for i, r in enumerate(held)]  # fmt: skip
    lost = cleaned(make_batch(copies, producer=(3, 0, 0)), [103, 104])
    tail = [copied(a[0:3], A, 100), lost, copied(source(1, 1), B, 106)]
    stands, unsettled, _ = settle(monkeypatch, tail, {A: a, B: source(1, 1)}, {})
    assert stands == {A: 3} and unsettled == frozenset({A})


def test_on_a_log_append_time_destination_the_timestamps_are_not_compared(monkeypatch) -> None:
    a = source(0, 6)
    lost = copied(a[3:6], A, 103, kept=[103], attributes=0x08)  # the broker's time on it
    tail = [copied(a[0:3], A, 100), lost, copied(source(1, 1), B, 106)]
    stands, unsettled, _ = settle(monkeypatch, tail, {A: a, B: source(1, 1)}, {})
    assert stands == {A: 6} and unsettled == frozenset()


@pytest.mark.parametrize("committed", [None, 0])
def test_with_nothing_named_it_starts_from_the_committed_offset_or_stays_unsettled(
    monkeypatch, committed
) -> None:
    """No batch names A: the committed offset is where its batches may start; without one
    nothing is read and A stays unsettled."""
    a = source(0, 3)
    tail = [copied(a, A, 100, kept=[100, 101]), copied(source(1, 1), B, 103)]
    stands, unsettled, reads = settle(monkeypatch, tail, {A: a, B: source(1, 1)},
                                      {A: committed})  # fmt: skip
    if committed is None:
        assert (stands, unsettled, reads) == ({}, frozenset({A}), [])
    else:
        assert stands == {A: 3} and unsettled == frozenset()


def test_records_the_source_holds_twice_make_it_stand_too_early_never_too_late(
    monkeypatch,
) -> None:
    """A's 3..5 and 6..8 hold the same records (a producer that sent them twice): a lost batch
    of survivors like 6 and 7 fits at 3 first. A stands at 6, and A's 6..8 come again:
    duplicates, never a record skipped."""
    a = source(0, 9)
    for o in (6, 7, 8):
        twin = a[o - 3]
        a[o] = Rec(o, twin.timestamp, twin.key, twin.value, twin.headers)
    tail = [copied(a[0:3], A, 100), copied(a[6:9], A, 103, kept=[103, 104]),
            copied(source(1, 1), B, 106)]  # fmt: skip
    stands, _, _ = settle(monkeypatch, tail, {A: a, B: source(1, 1)}, {})
    assert stands == {A: 6}


def test_a_later_incarnation_resumes_after_its_own_copies_not_the_earlier_ones() -> None:
    """A destination partition holds source t[0] copied up to offset 49, then (the topic
    deleted, recreated and followed) its next incarnation's offsets 0-9: t[0] resumes at 10 of
    incarnation 1, though the earlier one's offsets are higher; a route still at incarnation 0
    learns it is behind."""
    from relay.provenance.header import origin_topic
    from relay.spec import PartitionRoute

    old = copied(source(0, 50), A, 0)
    new_records = [r._replace(offset=o) for o, r in enumerate(source(0, 10))]
    runs = format_runs("src", origin_topic("t", 1), 0, [(0, 9)])
    copies = [Rec(50 + i, r.timestamp, r.key, r.value,
                  r.headers + ([("ktm.src", runs)] if i == 9 else []))
              for i, r in enumerate(new_records)]  # fmt: skip
    batches = split_batches(old + make_batch(copies, producer=(3, 0, 50)))[0]
    found = delivered_in(batches, {A})
    assert (found[A].next_offset, found[A].incarnation) == (10, 1)
    at = AtDestination(found, frozenset(), {DEST: batches}, {DEST: {A}})
    (route,) = at.later([PartitionRoute("t", 0, "d", 0)])
    assert (route.incarnation, route.origin) == (1, ("t~1", 0))
    assert at.later([route]) == [route]

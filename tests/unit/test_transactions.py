"""read_committed over real batch bytes (relay.batches.transactions): the batches of aborted
transactions are dropped as Apache Kafka's Java consumer drops them, markers stay (never
copied), and what is left rebuilds into destination batches whose provenance lists the runs
around the gaps, so resume and offset translation stay exact."""

from __future__ import annotations

import struct

import pytest

from relay.batches import Origin, SourceBatch, drop_aborted, rebuild, split_batches
from relay.batches.records import decode_batch
from relay.batches.transactions import is_abort_marker
from relay.provenance.copies import copies_in
from relay.provenance.header import format_runs
from relay.provenance.resume import delivered_in
from relay.provenance.translation import search
from tests.support.batches import control_batch, make_batch, recs, txn_batch

ORIGIN = Origin("src", "orders", 0)
A, B = 41, 42  # two transactional producers


def offsets(batches: list[SourceBatch]) -> list[int]:
    return [r.offset for b in batches for r in decode_batch(b)]


def interleaved() -> bytes:
    """0-2 plain | A commits 3-5 | B aborts 6-7 (interleaved with A's next, committed) ... :
    A 3-5, plain 6, B 7-8, A 9, marker A commit 10, B 11, marker B abort 12, plain 13-14,
    B 15-16 (a new transaction of B, committed), marker B commit 17."""
    return (
        make_batch(recs(0, 3))
        + txn_batch(recs(3, 3), A)
        + make_batch(recs(6, 1))
        + txn_batch(recs(7, 2), B)
        + txn_batch(recs(9, 1), A)
        + control_batch(10, commit=True, producer_id=A)
        + txn_batch(recs(11, 1), B)
        + control_batch(12, commit=False, producer_id=B)
        + make_batch(recs(13, 2))
        + txn_batch(recs(15, 2), B)
        + control_batch(17, commit=True, producer_id=B)
    )


def test_aborted_batches_are_dropped_and_the_producer_reads_again_after_its_abort_marker() -> None:
    batches, _ = split_batches(interleaved())

    kept = drop_aborted(batches, [(B, 7)])

    # B's aborted 7-8 and 11 are gone; its next transaction (15-16) is read: the ABORT marker
    # at 12 ended the aborted one; markers stay in the list, never read as records
    assert offsets(kept) == [0, 1, 2, 3, 4, 5, 6, 9, 13, 14, 15, 16]
    assert [b.base_offset for b in kept if b.is_control] == [10, 12, 17]


def test_a_producer_aborted_twice_is_dropped_twice() -> None:
    data = (
        txn_batch(recs(0, 2), A)
        + control_batch(2, commit=False, producer_id=A)
        + txn_batch(recs(3, 2), A)
        + control_batch(5, commit=True, producer_id=A)
        + txn_batch(recs(6, 2), A)
        + control_batch(8, commit=False, producer_id=A)
    )
    batches, _ = split_batches(data)
    # the list is in no particular order: the broker's order is by producer, not offset
    assert offsets(drop_aborted(batches, [(A, 6), (A, 0)])) == [3, 4]


def test_an_answer_starting_inside_an_aborted_transaction_drops_its_rest() -> None:
    """The broker lists every aborted transaction the fetched range overlaps, those that began
    before the fetch offset too: a fetch from 11 gets B's (first offset 7)."""
    batches, _ = split_batches(interleaved())
    from_11 = [b for b in batches if b.next_offset > 11]

    assert offsets(drop_aborted(from_11, [(B, 7)])) == [13, 14, 15, 16]


def test_a_transaction_listed_past_the_answer_drops_nothing_yet() -> None:
    batches, _ = split_batches(interleaved())
    # 100: a transaction beginning after these batches (the answer was cut by its size)
    assert offsets(drop_aborted(batches, [(B, 100)])) == offsets(batches)


def test_non_transactional_batches_of_an_aborted_producer_id_are_kept() -> None:
    """Only a transactional batch can be aborted (an idempotent producer's batches carry a
    producer id too)."""
    data = make_batch(recs(0, 2), producer=(B, 0, 0)) + txn_batch(recs(2, 2), B)
    batches, _ = split_batches(data)
    assert offsets(drop_aborted(batches, [(B, 0)])) == [0, 1]


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_compressed_aborted_batches_are_dropped_whole(codec: str) -> None:
    data = txn_batch(recs(0, 50), A, codec) + control_batch(50, commit=False, producer_id=A)
    data += txn_batch(recs(51, 50), A, codec) + control_batch(101, producer_id=A)
    batches, _ = split_batches(data)
    assert offsets(drop_aborted(batches, [(A, 0)])) == list(range(51, 101))


def test_no_aborted_transaction_costs_nothing() -> None:
    batches, _ = split_batches(interleaved())
    assert drop_aborted(batches, ()) is batches  # read_uncommitted, Tansu, no transaction


def test_markers_are_told_apart() -> None:
    commit, abort = split_batches(control_batch(0) + control_batch(1, commit=False))[0]
    plain = split_batches(make_batch(recs(0, 1)))[0][0]
    assert (is_abort_marker(commit), is_abort_marker(abort), is_abort_marker(plain)) == (
        False,
        True,
        False,
    )


def rebuilt_runs(batches: list[SourceBatch], start: int) -> tuple[list[str], int]:
    rebuilt = rebuild(batches, start, ORIGIN)
    headers = []
    for dest in rebuilt.batches:
        last = decode_batch(split_batches(bytes(dest.payload))[0][0], last_only=True)[0]
        headers.append((last.headers[-1][1] or b"").decode())
    return headers, rebuilt.next_offset


@pytest.mark.parametrize(
    ("first", "runs", "next_offset"),
    [
        # the answer starts on the aborted transaction: a gap at the start
        (7, [(9, 9), (13, 16)], 18),
        # a gap in the middle (7-8, 10-12) and markers: runs around them
        (0, [(0, 6), (9, 9), (13, 16)], 18),
    ],
)
def test_rebuilt_provenance_lists_the_runs_around_aborted_records(
    first: int, runs: list[tuple[int, int]], next_offset: int
) -> None:
    batches, _ = split_batches(interleaved())
    kept = drop_aborted([b for b in batches if b.next_offset > first], [(B, 7)])

    headers, got_next = rebuilt_runs(kept, first)

    assert headers == [format_runs("src", "orders", 0, runs).decode()]
    assert got_next == next_offset


def test_an_answer_ending_on_an_aborted_transaction_leaves_the_reader_past_it() -> None:
    """A gap at the end: the rebuild stops after the last record it holds; the reader's
    position (past every fetched batch) is what moves the partition past the gap."""
    data = make_batch(recs(0, 3)) + txn_batch(recs(3, 4), B)  # its marker not fetched yet
    batches, _ = split_batches(data)
    kept = drop_aborted(batches, [(B, 3)])

    headers, next_offset = rebuilt_runs(kept, 0)

    assert headers == [format_runs("src", "orders", 0, [(0, 2)]).decode()]
    assert next_offset == 3 and batches[-1].next_offset == 7  # BatchReader's position


def destination(batches: list[SourceBatch], first: int) -> list[SourceBatch]:
    """The rebuilt batches as a destination stores them, from destination offset `first`."""
    out = []
    for dest in rebuild(batches, 0, ORIGIN, budget=600).batches:
        payload = bytearray(dest.payload)
        struct.pack_into(">q", payload, 0, first)
        first += dest.count
        out += split_batches(bytes(payload))[0]
    return out


def test_resume_and_translation_are_exact_across_aborted_gaps() -> None:
    batches, _ = split_batches(interleaved())
    dest = destination(drop_aborted(batches, [(B, 7)]), 100)
    assert len(dest) > 2  # several destination batches, gaps inside and between them

    copies = [pair for batch in dest for pair in copies_in(batch, ("orders", 0))]
    assert [s for _, s in copies] == [0, 1, 2, 3, 4, 5, 6, 9, 13, 14, 15, 16]
    assert [d for d, _ in copies] == list(range(100, 112))

    # resume: after the last record the destination holds
    assert delivered_in(dest, {("orders", 0)})[("orders", 0)].next_offset == 17

    # a group committed inside the aborted gap resumes at the next committed record's copy
    def next_copies(lower: int, upper: int) -> list[tuple[int, int]]:
        for batch in dest:
            found = [(d, s) for d, s in copies_in(batch, ("orders", 0)) if lower <= d < upper]
            if found:
                return found
        return []

    for committed, expected in [(7, 107), (8, 107), (10, 108), (12, 108), (17, 112)]:
        assert search(100, 112, committed, next_copies) == expected, committed

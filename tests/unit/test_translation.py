"""The binary search that translates a source offset to a destination offset, on simulated
destinations: fan-in from several source partitions, batches, offsets the source never had."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from relay.batches import split_batches
from relay.provenance.header import format_runs
from relay.provenance.translation import search
from tests.support.batches import T0, Rec, cleaned, make_batch

Copy = tuple[int, str, int]  # destination offset, source partition, source offset


def destination(feeds: dict[str, list[int]], batch: int, seed: int) -> list[list[Copy]]:
    """Batches of copies from several source partitions interleaved at random, each feed in
    its own order (one writer per source partition); destination offsets from 100."""
    rng = random.Random(seed)
    queues = {name: list(offsets) for name, offsets in feeds.items()}
    batches, offset = [], 100
    while any(queues.values()):
        name = rng.choice([n for n, q in queues.items() if q])
        size = min(len(queues[name]), rng.randint(1, batch))
        batches.append([(offset + i, name, queues[name].pop(0)) for i in range(size)])
        offset += size
    return batches


def next_copies_of(batches: list[list[Copy]], source: str):
    def next_copies(lower: int, upper: int) -> list[tuple[int, int]]:
        for batch in batches:
            found = [(d, s) for d, name, s in batch if name == source and lower <= d < upper]
            if found:
                return found
        return []

    return next_copies


def expected(batches: list[list[Copy]], source: str, offset: int, end: int) -> int:
    copies = [(d, s) for b in batches for d, name, s in b if name == source]
    return next((d for d, s in copies if s >= offset), end)


@pytest.mark.parametrize("seed", range(20))
def test_the_search_finds_the_first_copy_at_or_after_the_offset(seed: int) -> None:
    rng = random.Random(seed)
    # source offsets with gaps (filtered records, compaction, transaction markers)
    feeds = {
        name: sorted(rng.sample(range(1000), rng.randint(0, 120))) for name in ("p0", "p1", "p2")
    }
    batches = destination(feeds, batch=rng.choice([1, 5, 40]), seed=seed)
    end = 100 + sum(len(b) for b in batches)
    for source in feeds:
        for offset in [0, 1, 500, 999, 1000, *rng.sample(range(1000), 15)]:
            got = search(100, end, offset, next_copies_of(batches, source))
            assert got == expected(batches, source, offset, end), (source, offset)


def test_an_empty_destination_translates_to_its_end() -> None:
    assert search(7, 7, 3, next_copies_of([], "p0")) == 7


def test_many_searches_run_together_in_as_many_rounds_as_the_deepest_one(monkeypatch) -> None:
    """relay.provenance.translation.Translator.first_copies: every search of one round shares a
    fetch; each destination partition holds record-form copies (a ktm.src header on each
    record)."""
    from relay.batches import split_batches
    from relay.provenance import translation
    from tests.support.batches import Rec, make_batch

    dests = {("d", n): [(100 + i, o) for i, o in enumerate(range(0, 3000, 2))] for n in range(20)}
    batches = {}
    for dest, copies in dests.items():
        records = [Rec(d, 1, b"k", b"v", [("ktm.src", b"src/t/%d/%d" % (dest[1], o))])
                   for d, o in copies]  # fmt: skip
        data = b"".join(make_batch(records[i : i + 50]) for i in range(0, len(records), 50))
        batches[dest] = split_batches(data)[0]
    rounds: list[dict[Any, Any]] = []

    def fetch_ranges(fetcher: Any, ranges: dict[Any, tuple[int, int]], timeout: float) -> Any:
        rounds.append(ranges)
        return {k: [b for b in batches[k] if b.next_offset > lo and b.base_offset < hi]
                for k, (lo, hi) in ranges.items()}  # fmt: skip

    monkeypatch.setattr(translation, "fetch_ranges", fetch_ranges)
    monkeypatch.setattr(translation, "BatchFetcher", lambda *a: SimpleNamespace(close=lambda: 0))
    translator = translation.Translator(SimpleNamespace(), 1.0)  # type: ignore[arg-type]
    end = 100 + 1500
    asks = [
        (dest, ("t", dest[1]), offset, (100, end))
        for dest in dests
        for offset in (1, 777, 2999, 5000)
    ]
    found = translator.first_copies(asks)
    expect = [next((d for d, o in dests[dest] if o >= offset), end) for dest, _, offset, _ in asks]
    assert found == expect
    deepest = 0
    for ask in asks:
        rounds.clear()
        translation.Translator(SimpleNamespace(), 1.0).first_copies([ask])  # type: ignore[arg-type]
        deepest = max(deepest, len(rounds))
    rounds.clear()
    translation.Translator(SimpleNamespace(), 1.0).first_copies(asks)  # type: ignore[arg-type]
    # the four searches of a partition may queue for its one window a round; not 80 in a row
    assert len(rounds) <= 4 * deepest < len(asks)


# ---- compacted destinations: batches whose provenance the log cleaner removed ---------------


def written_by_ktm(feeds: dict[int, list[int]], seed: int) -> list[tuple[int, list[Rec]]]:
    """Destination batches from offset 100 as ktm writes them, (source partition, records):
    each of one source partition ("t", p) of `feeds` (its offsets, in order), the batch form's
    header on its last record."""
    rng = random.Random(seed)
    queues = {p: list(offsets) for p, offsets in feeds.items()}
    out, at = [], 100
    while any(queues.values()):
        p = rng.choice([q for q, left in queues.items() if left])
        taken = [queues[p].pop(0) for _ in range(min(len(queues[p]), rng.randint(1, 6)))]
        runs = format_runs("src", "t", p, _runs(taken))
        records = [Rec(at + i, T0 + o, b"k%d" % o, b"v%d" % o,
                       [("ktm.src", runs)] if i == len(taken) - 1 else [])
                   for i, o in enumerate(taken)]  # fmt: skip
        out.append((p, records))
        at += len(taken)
    return out


def compacted(
    written: list[tuple[int, list[Rec]]], seed: int
) -> tuple[bytes, dict[int, list[tuple[int, int]]]]:
    """The destination after a cleaner's passes: records removed at random, the last batch
    (the active segment) untouched; and, per source partition, [(destination, source)] of
    what survived, from the test's own bookkeeping."""
    rng = random.Random(seed)
    data = b""
    survivors: dict[int, list[tuple[int, int]]] = {}
    for index, (p, records) in enumerate(written):
        batch = make_batch(records, producer=(5, 0, 0))
        last = index == len(written) - 1
        kept = [r.offset for r in records if last or rng.random() < 0.4]
        if kept or index % 3 == 0:  # an emptied batch is dropped, but a producer's last is kept
            data += batch if last else cleaned(batch, kept)
        runs = [o for name, value in records[-1].headers for o in _offsets(value)]
        survivors.setdefault(p, []).extend(
            (r.offset, runs[i]) for i, r in enumerate(records) if r.offset in kept
        )
    return data, survivors


def _offsets(value: bytes | None) -> list[int]:
    assert value is not None
    out: list[int] = []
    for run in value.decode().rsplit("/", 1)[1].split(","):
        first, last = run.split("-")
        out += range(int(first), int(last) + 1)
    return out


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for o in offsets:
        if runs and runs[-1][1] + 1 == o:
            runs[-1] = (runs[-1][0], o)
        else:
            runs.append((o, o))
    return runs


def translate_all(monkeypatch, data: bytes, asks: list[tuple[int, int]], sole: bool) -> list[int]:
    from relay.batches import split_batches
    from relay.provenance import translation

    batches = split_batches(data)[0]
    end = batches[-1].next_offset

    def fetch_ranges(fetcher: Any, ranges: dict[Any, tuple[int, int]], timeout: float) -> Any:
        return {k: [b for b in batches if b.next_offset > lo and b.base_offset < hi]
                for k, (lo, hi) in ranges.items()}  # fmt: skip

    monkeypatch.setattr(translation, "fetch_ranges", fetch_ranges)
    monkeypatch.setattr(translation, "BatchFetcher", lambda *a: SimpleNamespace(close=lambda: 0))
    dest = ("d", 0)
    sole_set = frozenset({dest} if sole else ())
    translator = translation.Translator(SimpleNamespace(), 1.0, sole_set)  # type: ignore[arg-type]
    return translator.first_copies([(dest, ("t", p), o, (100, end)) for p, o in asks])


@pytest.mark.parametrize("seed", range(25))
def test_one_source_in_a_compacted_destination_translates_exactly(monkeypatch, seed) -> None:
    """One source partition, contiguous: a committed offset whose copies the cleaner left
    without their header translates to the first survivor of it or later, exactly, once a
    named copy of an earlier offset lies before it (the offsets between say which record
    held which); before any named copy, to the first survivor (never later)."""
    written = written_by_ktm({0: list(range(300))}, seed)
    data, survivors = compacted(written, seed)
    end = split_batches(data)[0][-1].next_offset
    named = sorted(s for d, s in _named(data))
    offsets = sorted(set(random.Random(seed).sample(range(310), 60)) | {0, 299, 300})
    got = translate_all(monkeypatch, data, [(0, o) for o in offsets], sole=True)
    for offset, found in zip(offsets, got, strict=True):
        truth = next((d for d, s in survivors[0] if s >= offset), end)
        assert found <= truth, (offset, found, truth)  # never skips a survivor
        if any(s < offset for s in named):
            assert found == truth, (offset, found, truth)


@pytest.mark.parametrize("seed", range(25))
def test_fan_in_to_a_compacted_destination_never_skips_a_survivor(monkeypatch, seed) -> None:
    rng = random.Random(seed)
    feeds = {p: sorted(rng.sample(range(400), 150)) for p in (0, 1)}  # gaps: filters, say
    data, survivors = compacted(written_by_ktm(feeds, seed), seed)
    end = split_batches(data)[0][-1].next_offset
    asks = [(p, o) for p in feeds for o in sorted(rng.sample(range(410), 30))]
    for (p, offset), found in zip(asks, translate_all(monkeypatch, data, asks, sole=False),
                                   strict=True):  # fmt: skip
        truth = next((d for d, s in survivors[p] if s >= offset), end)
        assert found <= truth, (p, offset, found, truth)


def test_an_intact_destination_translates_as_before(monkeypatch) -> None:
    """Nothing cleaned: every translation is the first copy, fan-in or not."""
    feeds = {0: list(range(0, 200, 3)), 1: list(range(200))}
    written = written_by_ktm(feeds, 1)
    data = b"".join(make_batch(records) for _, records in written)
    copies = {p: [(r.offset, s) for q, records in written if q == p
                  for r, s in zip(records, _offsets(records[-1].headers[-1][1]), strict=True)]
              for p in feeds}  # fmt: skip
    end = split_batches(data)[0][-1].next_offset
    asks = [(p, o) for p in feeds for o in range(0, 205, 7)]
    for (p, offset), found in zip(asks, translate_all(monkeypatch, data, asks, sole=False),
                                   strict=True):  # fmt: skip
        assert found == next((d for d, s in copies[p] if s >= offset), end), (p, offset)


def _named(data: bytes) -> list[tuple[int, int]]:
    from relay.provenance.copies import copies_in

    return [pair for batch in split_batches(data)[0] for pair in copies_in(batch, ("t", 0))]

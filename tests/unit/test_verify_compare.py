"""ktm verify's comparison: each single fault found, named, located, and nothing else."""

from __future__ import annotations

from relay.batches import split_batches
from relay.batches.provenance import PROVENANCE_HEADER, format_runs
from relay.pipelines.verify.compare import Checker, claims, expected
from relay.pipelines.verify.spec import Feeder, PartitionReport
from tests.support.batches import Rec, make_batch, recs

KEY = ("orders", 0)
DEST = ("copy", 0)


def source(count: int = 20) -> list[Rec]:
    return recs(0, count, size=20)


def dest_batches(records: list[Rec], per_batch: int = 5, form: str = "batch") -> bytes:
    """A destination as ktm writes it: the source records renumbered from 0, each batch's last
    record naming the source offsets of the batch (or every record its own)."""
    return written([records[i : i + per_batch] for i in range(0, len(records), per_batch)], form)


def written(chunks: list[list[Rec]], form: str = "batch") -> bytes:
    out, at = [], 0
    for chunk in chunks:
        copied = []
        for j, r in enumerate(chunk):
            headers = list(r.headers)
            if form == "record":
                headers.append((PROVENANCE_HEADER, b"src/orders/0/%d" % r.offset))
            elif j == len(chunk) - 1:
                runs = _runs([c.offset for c in chunk])
                headers.append((PROVENANCE_HEADER, format_runs("src", *KEY, runs)))
            copied.append(Rec(at + j, r.timestamp, r.key, r.value, headers))
        out.append(make_batch(copied))
        at += len(chunk)
    return b"".join(out)


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for o in offsets:
        if runs and runs[-1][1] + 1 == o:
            runs[-1] = (runs[-1][0], o)
        else:
            runs.append((o, o))
    return runs


def check(dest: bytes, src: list[Rec] | None = None, kept=lambda r: True) -> PartitionReport:
    src = src if src is not None else source()
    batches, _ = split_batches(make_batch(src))
    end = src[-1].offset + 1
    checker = Checker(Feeder(KEY, 0, end), DEST, expected([batches], 0, end, kept))
    dest_split, _ = split_batches(dest)
    for batch in dest_split:
        for claim in claims(batch):
            assert claim.provenance is not None
            checker.claim(claim.source_offset, claim.dest_offset, claim.copy)
    return checker.finish()


def faults(report: PartitionReport) -> dict[str, tuple[int, int, int]]:
    """kind -> (records, first source offset, first destination offset)"""
    first = {f.kind: f for f in report.first}
    return {k: (n, first[k].source_offset, first[k].dest_offset) for k, n in report.counts}


def test_an_exact_copy_in_either_provenance_form_is_exact():
    for form in ("batch", "record"):
        report = check(dest_batches(source(), form=form))
        assert report.exact, form
        assert (report.compared, report.equal) == (20, 20)


def test_a_missing_record_is_found_at_the_head_in_the_middle_and_at_the_tail():
    for gone in (0, 7, 19):
        kept = [r for r in source() if r.offset != gone]
        report = check(dest_batches(kept))
        assert faults(report) == {"missing": (1, gone, -1)}, gone
        assert report.equal == 19


def test_a_record_twice_and_a_batch_twice_are_duplicates():
    once = source()
    report = check(written([once[:8], [once[7]], once[8:]]))  # a batch of one, sent again
    assert faults(report) == {"duplicated": (1, 7, 8)}
    report = check(dest_batches(once[:10] + once[5:10] + once[10:]))
    assert faults(report) == {"duplicated": (5, 5, 10)}


def test_each_changed_field_is_named():
    changes = {
        "value": lambda r: r._replace(value=b"other"),
        "key": lambda r: r._replace(key=b"other"),
        "headers": lambda r: r._replace(headers=[("h1", b"changed")]),
        "timestamp": lambda r: r._replace(timestamp=r.timestamp + 1),
    }
    for name, change in changes.items():
        records = source()
        records[12] = change(records[12])
        assert faults(check(dest_batches(records))) == {f"different:{name}": (1, 12, 12)}, name


def test_two_records_swapped_are_out_of_order_and_nothing_else():
    records = source()
    records[3], records[4] = records[4], records[3]
    report = check(dest_batches(records, form="record"))
    assert faults(report) == {"out_of_order": (1, 3, 4)}
    assert report.equal == 19


def test_a_record_the_filters_dropped_is_unexpected_at_the_destination():
    report = check(dest_batches(source()), kept=lambda r: r.offset != 9)
    assert faults(report) == {"unexpected": (1, 9, 9)}
    filtered = [r for r in source() if r.offset != 9]
    assert check(dest_batches(filtered), kept=lambda r: r.offset != 9).exact


def test_a_source_with_compaction_gaps_verifies_exact_against_its_copy():
    gappy = recs(0, 10, step=3, size=20)  # offsets 0, 3, 6, ...
    report = check(dest_batches(gappy), src=gappy)
    assert report.exact and report.equal == 10

"""ktm verify's comparison: each single fault found, named, located, and nothing else."""

from __future__ import annotations

import dataclasses
import struct

from relay.batches import split_batches
from relay.batches.build import Origin, rebuild
from relay.batches.format import LOG_APPEND_TIME
from relay.pipelines.verify.compare import Checker, ClaimedRuns
from relay.pipelines.verify.records import (
    BatchClaim,
    claims,
    differing_field,
    expected,
    stored_copy,
)
from relay.pipelines.verify.report import line, summary
from relay.pipelines.verify.spec import Feeder, PartitionReport, Scope
from relay.provenance.header import PROVENANCE_HEADER, format_runs
from relay.store import StoredRecord
from tests.support.batches import Rec, make_batch, recs

KEY = ("orders", 0)
DEST = ("copy", 0)


def source(count: int = 20) -> list[Rec]:
    return recs(0, count, size=20)


def dest_batches(
    records: list[Rec], per_batch: int = 5, form: str = "batch", attributes: int = 0
) -> bytes:
    """A destination as ktm writes it: the source records renumbered from 0, each batch's last
    record naming the source offsets of the batch (or every record its own)."""
    chunks = [records[i : i + per_batch] for i in range(0, len(records), per_batch)]
    return written(chunks, form, attributes)


def written(chunks: list[list[Rec]], form: str = "batch", attributes: int = 0) -> bytes:
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
        out.append(make_batch(copied, attributes=attributes))
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


def check(
    dest: bytes, src: list[Rec] | None = None, kept=lambda r: True, scope: Scope | None = None
) -> PartitionReport:
    src = src if src is not None else source()
    scope = scope or Scope()
    batches, _ = split_batches(make_batch(src))
    feeder = Feeder(KEY, 0, src[-1].offset + 1)
    checker = Checker(feeder, DEST, expected([batches], feeder, scope, kept), scope)
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


def test_a_log_append_time_destination_is_exact_and_its_other_fields_still_compared():
    """A destination topic with message.timestamp.type=LogAppendTime: every record holds its
    batch's append time (here the batch's max timestamp, not the record's own), the broker's;
    it is not compared, the key, value and headers are."""
    for form in ("batch", "record"):
        report = check(dest_batches(source(), form=form, attributes=LOG_APPEND_TIME))
        assert report.exact and report.equal == 20, form
        changes = {
            "value": lambda r: r._replace(value=b"other"),
            "headers": lambda r: r._replace(headers=[("h1", b"changed")]),
        }
        for name, change in changes.items():
            records = source()
            records[12] = change(records[12])
            dest = dest_batches(records, form=form, attributes=LOG_APPEND_TIME)
            assert faults(check(dest)) == {f"different:{name}": (1, 12, 12)}, (form, name)


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


def test_a_sample_checks_the_same_blocks_on_every_run_and_only_those():
    src = recs(0, 4000, size=10)
    scope = Scope(sample=0.5)
    picked = [b for b in range(4) if scope.picked(KEY, b * 1000)]
    assert picked == [b for b in range(4) if Scope(sample=0.5).picked(KEY, b * 1000)]
    assert 0 < len(picked) < 4  # this key and fraction pick some blocks, not all
    whole = check(dest_batches(src, per_batch=100), src=src, scope=scope)
    assert whole.exact and whole.equal == 1000 * len(picked)
    skipped = next(b for b in range(4) if b not in picked)
    gone = [r for r in src if r.offset != skipped * 1000 + 5]  # a fault the sample cannot see
    assert check(dest_batches(gone, per_batch=100), src=src, scope=scope).exact
    lost = picked[0] * 1000 + 5
    seen = [r for r in src if r.offset != lost]
    report = check(dest_batches(seen, per_batch=100), src=src, scope=scope)
    assert faults(report) == {"missing": (1, lost, -1)}


def test_records_outside_the_time_window_are_read_not_checked():
    src = source()
    window = Scope(from_time=src[5].timestamp, until_time=src[15].timestamp)
    inside = [r for r in src if 5 <= r.offset < 15]
    report = check(dest_batches(inside), scope=window)  # a point-in-time copy
    assert report.exact and report.equal == 10
    changed = [r._replace(value=b"x") if r.offset == 2 else r for r in src]
    assert check(dest_batches(changed), scope=window).exact  # the change is outside


def test_a_stored_copy_compares_the_timestamp_type_too():
    record = StoredRecord(5, 1000, 0, b"k", b"v", (("h", b"1"),))
    same = stored_copy(record, keep_type=True)
    assert differing_field(same, stored_copy(record, keep_type=True)) is None
    appended = stored_copy(dataclasses.replace(record, timestamp_type=1), keep_type=True)
    assert differing_field(same, appended) == "timestamp_type"
    assert differing_field(same, stored_copy(record, keep_type=False)) == "timestamp_type"
    # Framed as a batch frames it: the copy of a record read from Kafka is the same bytes.
    batch = split_batches(make_batch([Rec(5, 1000, b"k", b"v", [("h", b"1")])]))[0][0]
    from_kafka = next(expected([[batch]], Feeder(KEY, 0, 6), Scope(), None, keep_type=True))
    assert from_kafka == (5, same)


def test_following_a_relay_each_pass_settles_what_lies_below_the_highest_claim():
    src = source()
    feeder = Feeder(KEY, 0, 20)
    batches, _ = split_batches(make_batch(src))
    checker = Checker(feeder, DEST, expected([batches], feeder, Scope(), None), Scope())
    first_pass, _ = split_batches(dest_batches([r for r in src[:10] if r.offset != 4]))
    for batch in first_pass:
        for claim in claims(batch):
            checker.claim(claim.source_offset, claim.dest_offset, claim.copy)
    state = checker.settle(margin=0)
    assert (state.cursor, checker.verified_next) == (10, 10)  # 0..9 judged: 4 is missing
    assert dict(checker.counts) == {"missing": 1}
    assert checker.report().first[0].source_offset == 4


def test_a_check_split_into_passes_finds_what_one_pass_finds():
    """The state handed from pass to pass carries what is pending: a swap across the cut is
    still out of order, a record missing before the cut is still missing, nothing twice."""
    src = source()
    records = [r for r in src if r.offset != 3]
    records[9], records[10] = records[10], records[9]  # source offsets 10 and 11 swapped
    batches, _ = split_batches(make_batch(src))
    feeder, state = Feeder(KEY, 0, 20), None
    dest = [claim for b in split_batches(dest_batches(records, form="record"))[0]
            for claim in claims(b)]  # fmt: skip
    for cut in (slice(0, 10), slice(10, 19)):  # the cut falls between the swapped two
        rest = expected([batches], dataclasses.replace(feeder, start=state.cursor if state else 0),
                        Scope(), None)  # fmt: skip
        checker = Checker(feeder, DEST, rest, Scope(), state)
        for claim in dest[cut]:
            checker.claim(claim.source_offset, claim.dest_offset, claim.copy)
        state = checker.settle(margin=100)
    assert faults(checker.finish()) == {"missing": (1, 3, -1), "out_of_order": (1, 10, 10)}


def test_claimed_runs_hold_many_offsets_in_few_runs_and_forget_the_oldest():
    runs = ClaimedRuns()
    for offset in [*range(0, 50), *range(60, 70), 55]:
        runs.add(offset)
    assert runs.runs() == ((0, 49), (55, 55), (60, 69))
    assert 49 in runs and 55 in runs and 50 not in runs and 70 not in runs
    again = ClaimedRuns(runs.runs())
    assert again.runs() == runs.runs()


def test_batches_a_relay_copied_whole_are_compared_whole_and_a_change_inside_is_still_named():
    """ktm's own rebuild copies 500-record source batches byte for byte but for the last
    record: such a pair is compared as two runs of bytes, and a change anywhere falls back to
    record by record, naming the record."""
    src = recs(0, 2000, size=20)
    source_bytes = b"".join(make_batch(src[i : i + 500]) for i in range(0, 2000, 500))
    assert check_whole(source_bytes, relayed(source_bytes)) == ({}, 2000, 4)
    changed = list(src)
    changed[1234] = changed[1234]._replace(value=b"changed")
    other = b"".join(make_batch(changed[i : i + 500]) for i in range(0, 2000, 500))
    found, equal, _ = check_whole(source_bytes, relayed(other))
    assert (found, equal) == ({"different:value": (1, 1234, 1234)}, 1999)


def relayed(source: bytes) -> bytes:
    """The destination ktm writes for these source batches (relay.batches.build), renumbered
    from 0 as a destination partition would be."""
    built = rebuild(split_batches(source)[0], 0, Origin("src", *KEY))
    out, at = [], 0
    for dest in built.batches:
        payload = bytearray(dest.payload)
        struct.pack_into(">q", payload, 0, at)
        out.append(bytes(payload))
        at += dest.count
    return b"".join(out)


def check_whole(source: bytes, dest: bytes) -> tuple[dict[str, tuple[int, int, int]], int, int]:
    """(faults, records equal, destination batches compared whole)."""
    batches, _ = split_batches(source)
    feeder = Feeder(KEY, 0, batches[-1].next_offset)
    checker = Checker(feeder, DEST, expected([batches], feeder, Scope(), None), Scope())
    whole = 0
    for batch in split_batches(dest)[0]:
        for claim in claims(batch, None, True):
            if isinstance(claim, BatchClaim):
                start = checker.claim_whole(claim)
                whole += start is not None
                one = [claim.last_claim(start)] if start is not None else list(claim.claims())
            else:
                one = [claim]
            for c in one:
                checker.claim(c.source_offset, c.dest_offset, c.copy)
    report = checker.finish()
    return faults(report), report.equal, whole


def test_records_deleted_at_the_source_before_they_were_copied_are_counted_apart() -> None:
    """The copy holds offsets 0-4 and 12-19; the source's log now starts at 12: 5-11 were
    deleted before they were copied. The copy is exact over what the source still has, and
    says how many were deleted."""
    everything = source()
    src = everything[12:]
    batches, _ = split_batches(make_batch(src))
    feeder, scope = Feeder(KEY, 12, 20), Scope()
    checker = Checker(feeder, DEST, expected([batches], feeder, scope, lambda r: True), scope)
    for batch in split_batches(dest_batches(everything[:5] + src))[0]:
        for claim in claims(batch):
            checker.claim(claim.source_offset, claim.dest_offset, claim.copy)
    report = checker.finish()
    assert report.exact and (report.compared, report.deleted) == (8, 7)
    assert "7 deleted at the source before they were copied (below its log start, 12)" in (
        line(report)
    )
    assert "7 deleted at the source" in summary([report])


def test_a_copy_that_holds_nothing_older_than_the_source_says_nothing_was_deleted() -> None:
    src = source()[12:]
    report = check(dest_batches(src), src)
    assert report.exact and report.deleted == 0

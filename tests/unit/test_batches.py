"""relay.batches on crafted batch bytes: built with kafka-python's DefaultRecordBatchBuilder (or
patched by hand where a producer cannot write them: control batches, LogAppendTime, compaction
gaps), rebuilt, and read back with kafka-python's DefaultRecordBatch."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch

from relay.batches import (
    Origin,
    SourceBatch,
    UnsupportedBatch,
    codecs,
    rebuild,
    split_batches,
    stamp_producer,
)
from relay.batches.records import last_record_start
from relay.batches.varint import encode_varint, read_varint
from relay.provenance.copies import origins
from relay.provenance.header import Provenance, format_runs, parse_provenance
from tests.support.batches import T0, Rec, control_batch, make_batch, recs

ORIGIN = Origin("src", "orders", 3)
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def read_back(payload: bytes | bytearray) -> tuple[DefaultRecordBatch, list[Any]]:
    batch = DefaultRecordBatch(bytes(payload))
    assert batch.validate_crc()
    return batch, list(batch)


def provenance_of(headers: list[tuple[str, bytes | None]]) -> Provenance | None:
    values = [v for k, v in headers if k == "ktm.src"]
    return parse_provenance(values[-1]) if values and values[-1] is not None else None


def runs_of(offsets: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive offsets, as the batch-form provenance header lists them."""
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and runs[-1][1] + 1 == offset:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs


def check_rebuilt(
    data: bytes,
    start: int,
    expected: list[Rec],
    codec: str = "none",
    budget: int = 1 << 18,
    limit: int = 1_000_000,
) -> list[list[Rec]]:
    """Rebuild, read every destination batch back, compare every record with `expected`
    (offsets now 0..n-1 per batch, provenance on each batch's last record); returns the
    expected records grouped as the destination batches hold them."""
    batches, used = split_batches(data)
    assert used == len(data)
    rebuilt = rebuild(batches, start, ORIGIN, codecs.BY_NAME[codec], budget, limit)
    pos = 0
    groups = []
    for dest in rebuilt.batches:
        batch, records = read_back(dest.payload)
        want = expected[pos : pos + len(records)]
        pos += len(records)
        groups.append(want)
        assert batch.records_count == dest.count == len(want)
        assert batch.last_offset_delta == dest.count - 1
        assert (batch.producer_id, batch.base_sequence, batch.is_transactional) == (-1, -1, False)
        assert batch.timestamp_type == 0
        assert batch.max_timestamp == dest.max_timestamp == max(r.timestamp for r in want)
        for index, (got, rec) in enumerate(zip(records, want, strict=True)):
            assert (got.offset, got.timestamp) == (index, rec.timestamp)
            assert (got.key, got.value) == (rec.key, rec.value)
            if index < len(want) - 1:
                assert got.headers == rec.headers
            else:
                assert got.headers[:-1] == rec.headers
                runs = runs_of([r.offset for r in want])
                assert got.headers[-1] == ("ktm.src", format_runs("src", "orders", 3, runs))
        assert (dest.first_offset, dest.last_offset) == (want[0].offset, want[-1].offset)
    assert pos == len(expected)
    return groups


@pytest.mark.parametrize("codec", CODECS)
def test_one_batch_of_each_codec_is_copied_and_reads_back(codec: str) -> None:
    source = recs(40, 300)
    data = make_batch(source, codec)
    (batch,), _ = split_batches(data)
    assert batch.codec == codecs.BY_NAME[codec] and batch.crc_ok()
    check_rebuilt(data, 40, source, codec)
    rebuilt = rebuild([batch], 40, ORIGIN, codecs.BY_NAME[codec])
    (dest,) = rebuilt.batches
    assert dest.copied and rebuilt.next_offset == 340
    assert DefaultRecordBatch(bytes(dest.payload)).compression_type == codecs.BY_NAME[codec]


@pytest.mark.parametrize("source_codec", CODECS)
@pytest.mark.parametrize("target_codec", ["none", "zstd"])
def test_the_codec_changes_between_source_and_destination(
    source_codec: str, target_codec: str
) -> None:
    source = recs(0, 200)
    check_rebuilt(make_batch(source, source_codec), 0, source, target_codec)


def test_the_copied_records_part_is_the_source_bytes_but_the_last_record() -> None:
    source = recs(10, 50)
    data = make_batch(source)
    (dest,) = rebuild(split_batches(data)[0], 0, ORIGIN).batches
    last_start = 61 + last_record_start(data[61:], 50)
    assert last_start < len(data) - 100
    assert bytes(dest.payload[61:last_start]) == data[61:last_start]
    assert struct.unpack_from(">qq", dest.payload, 27) == struct.unpack_from(">qq", data, 27)


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_compaction_gaps_inside_a_batch_are_rebased(codec: str) -> None:
    source = recs(100, 40, step=3)  # offsets 100, 103, ...: lastOffsetDelta 117, 40 records
    data = make_batch(source, codec)
    (batch,), _ = split_batches(data)
    assert not batch.contiguous and batch.next_offset == 218
    check_rebuilt(data, 100, source, codec)
    rebuilt = rebuild([batch], 100, ORIGIN)
    assert not rebuilt.batches[0].copied and rebuilt.next_offset == 218


def test_control_batches_are_never_copied_and_transactional_data_is() -> None:
    txn = recs(0, 5)
    aborted = recs(6, 3)
    after = recs(10, 4)
    data = (
        make_batch(txn, attributes=0x10, producer=(7, 0, 0))
        + control_batch(5, commit=True)
        + make_batch(aborted, attributes=0x10, producer=(7, 0, 5))
        + control_batch(9, commit=False)
        + make_batch(after)
    )
    batches, _ = split_batches(data)
    assert [b.is_control for b in batches] == [False, True, False, True, False]
    # read_uncommitted: aborted records arrive too, markers never (module docstring)
    groups = check_rebuilt(data, 0, txn + aborted + after)
    assert len(groups) == 1
    assert rebuild(batches, 0, ORIGIN).next_offset == 14


def test_a_fetch_ending_on_markers_moves_the_next_offset_past_them() -> None:
    data = make_batch(recs(0, 2)) + control_batch(2)
    rebuilt = rebuild(split_batches(data)[0], 2, ORIGIN)
    assert rebuilt.batches == [] and rebuilt.next_offset == 3


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_a_mid_batch_start_drops_the_records_before_it(codec: str) -> None:
    source = recs(1000, 100)
    data = make_batch(source[:60], codec) + make_batch(source[60:], codec)
    groups = check_rebuilt(data, 1037, source[37:], codec)
    assert groups[0][0].offset == 1037
    # the first destination batch starts with the record at 1037: timestamps rebased on it
    dest = rebuild(split_batches(data)[0], 1037, ORIGIN).batches[0]
    assert DefaultRecordBatch(bytes(dest.payload)).first_timestamp == source[37].timestamp


def test_batches_wholly_before_the_start_are_skipped() -> None:
    source = recs(0, 30)
    data = make_batch(source[:10]) + make_batch(source[10:20]) + make_batch(source[20:])
    check_rebuilt(data, 20, source[20:])
    (dest,) = rebuild(split_batches(data)[0], 20, ORIGIN).batches
    assert dest.copied


def test_many_one_record_batches_merge_up_to_the_budget() -> None:
    source = recs(0, 1000)
    data = b"".join(make_batch([r]) for r in source)
    groups = check_rebuilt(data, 0, source, budget=16 * 1024)
    sizes = [len(g) for g in groups]
    assert len(groups) > 1 and sum(sizes) == 1000
    rebuilt = rebuild(split_batches(data)[0], 0, ORIGIN, budget=16 * 1024)
    assert all(d.records_size <= 16 * 1024 for d in rebuilt.batches)
    assert not any(d.copied for d in rebuilt.batches)


def test_merging_re_frames_varints_of_every_width() -> None:
    """The merge loop encodes 0..8191 by table; past it the long way: timestamp deltas of
    hours and negative ones, offset deltas over 8191, records over 8 KiB."""
    tiny = [Rec(o, T0 + (o % 7) * 3_600_000 - 5_000 * (o % 3), None, b"v", []) for o in range(9000)]
    data = b"".join(make_batch(tiny[i : i + 3]) for i in range(0, 9000, 3))
    assert [len(g) for g in check_rebuilt(data, 0, tiny, budget=1 << 20)] == [9000]
    big = [Rec(o, T0 - o * 60_000, b"k", b"x" * 10_000, [("h", b"y")]) for o in range(10)]
    data = b"".join(make_batch([r]) for r in big)
    assert [len(g) for g in check_rebuilt(data, 0, big, budget=1 << 20)] == [10]


def test_whole_and_gapped_batches_merge_in_order() -> None:
    """Members taken whole (contiguous) and record by record (a compaction gap) share one
    destination batch: offset deltas run on across them."""
    whole, gapped, after = recs(0, 10), recs(10, 10, step=2), recs(30, 10)
    data = make_batch(whole) + make_batch(gapped) + make_batch(after) + make_batch(recs(40, 5))
    assert len(check_rebuilt(data, 3, whole[3:] + gapped + after + recs(40, 5))) == 1


def test_merged_compressed_batches_of_different_codecs() -> None:
    source = recs(0, 100)
    data = b"".join(make_batch(source[i : i + 20], CODECS[i // 20]) for i in range(0, 100, 20))
    assert len(check_rebuilt(data, 0, source, "lz4")) == 1


def test_a_batch_larger_than_the_budget_stays_whole() -> None:
    source = recs(0, 500)
    data = make_batch(source[:400]) + make_batch(source[400:])
    groups = check_rebuilt(data, 0, source, budget=1024)
    assert [len(g) for g in groups] == [400, 100]


@pytest.mark.parametrize("start", [0, 1150])
def test_a_batch_over_the_limit_is_split_into_batches_of_the_budget(start: int) -> None:
    source = recs(1000, 400)  # ~57 KiB of records
    data = make_batch(source[:300], "lz4") + make_batch(source[300:])
    kept = source[start - 1000 :] if start else source
    groups = check_rebuilt(data, start, kept, "zstd", budget=8192, limit=16384)
    rebuilt = rebuild(split_batches(data)[0], start, ORIGIN, budget=8192, limit=16384)
    *pieces, second = rebuilt.batches
    assert len(pieces) == len(groups) - 1 >= (2 if start else 5)
    assert all(d.records_size <= 8192 and not d.copied for d in pieces)
    assert second.copied and second.records_size > 8192  # over the budget, under the limit
    assert rebuilt.next_offset == 1400


def test_log_append_time_becomes_create_time_of_the_append_time() -> None:
    source = recs(0, 20)
    data = bytearray(make_batch(source, attributes=0x08))
    append_time = T0 + 999_999
    struct.pack_into(">q", data, 35, append_time)  # maxTimestamp: the broker's append time
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    (batch,), _ = split_batches(data)
    assert batch.log_append_time and batch.crc_ok()
    kept = [r._replace(timestamp=append_time) for r in source]
    check_rebuilt(bytes(data), 0, kept)
    assert list(DefaultRecordBatch(bytes(data)))[3].timestamp == append_time  # what a consumer saw


def test_a_trailing_partial_batch_is_left_for_the_next_fetch() -> None:
    whole = make_batch(recs(0, 10)) + make_batch(recs(10, 10))
    for cut in (1, 11, 20, 60, 100):
        batches, used = split_batches(whole + make_batch(recs(20, 10))[:cut])
        assert [b.base_offset for b in batches] == [0, 10] and used == len(whole)
    assert split_batches(b"")[0] == []


def test_old_message_formats_and_bad_crcs_are_refused() -> None:
    data = bytearray(make_batch(recs(0, 3)))
    old = bytearray(data)
    old[16] = 1
    with pytest.raises(UnsupportedBatch):
        split_batches(old)
    data[-1] ^= 0xFF
    batches, _ = split_batches(data)
    with pytest.raises(UnsupportedBatch, match="CRC"):
        rebuild(batches, 0, ORIGIN)


def test_stamping_the_producer_fields_keeps_the_crc_valid() -> None:
    (dest,) = rebuild(split_batches(make_batch(recs(0, 5)))[0], 0, ORIGIN).batches
    payload = dest.payload
    stamp_producer(payload, 4242, 3, 17, False)
    batch, records = read_back(payload)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (4242, 3, 17)
    assert batch.last_sequence == 21 and len(records) == 5


def test_provenance_header_formats_round_trip() -> None:
    assert parse_provenance(format_runs("a/b", "t", 2, [(5, 9)])) == Provenance(
        "a/b", "t", 2, ((5, 9),)
    )
    gaps = parse_provenance(format_runs("c", "t", 0, [(3, 3), (5, 9), (12, 12)]))
    assert gaps == Provenance("c", "t", 0, ((3, 3), (5, 9), (12, 12)))
    assert (gaps.first, gaps.last, gaps.next_offset, gaps.records) == (3, 12, 13, 7)
    assert [gaps.index_at_or_after(o) for o in (0, 3, 4, 5, 9, 10, 12, 13)] == [
        0, 0, 1, 1, 5, 6, 6, None
    ]  # fmt: skip
    old = parse_provenance(b"src/orders/3/41")  # the record form (every record, older versions)
    assert old == Provenance("src", "orders", 3, ((41, 41),), batch=False)
    assert old is not None and old.next_offset == 42
    bad_values = (
        b"nope", b"c/t/x/1", b"c/t/1/9-5", b"c/t/1/-5", b"\xff/t/1/2", b"c/t/1/1-2-3",
        b"c/t/1/1-4,3-5", b"c/t/1/1-4,", b"c/t/1/4-4,4-6",
    )  # fmt: skip
    for bad in bad_values:
        assert parse_provenance(bad) is None


def test_origins_reads_the_last_record_of_a_destination_batch() -> None:
    source = recs(0, 10)
    source[-1].headers.append(("ktm.src", b"upstream/orders/0/77"))  # an earlier hop's header
    (dest,) = rebuild(split_batches(make_batch(source, "gzip"))[0], 0, ORIGIN).batches
    (batch,), _ = split_batches(dest.payload)
    ((found, record),) = origins(batch)
    assert found == Provenance("src", "orders", 3, ((0, 9),)) and record.offset == 9
    _, records = read_back(dest.payload)
    assert provenance_of(records[-1].headers) == Provenance("src", "orders", 3, ((0, 9),))
    # an older destination: every record carries its own offset; the last one resumes exactly
    old = [r._replace(headers=[("ktm.src", b"src/orders/3/%d" % r.offset)]) for r in source]
    (batch,), _ = split_batches(make_batch(old))
    found_each = [found for found, _ in origins(batch)]
    assert found_each[-1] == Provenance("src", "orders", 3, ((9, 9),), batch=False)
    assert len(found_each) == 10  # each record counts


def test_null_keys_values_and_header_values_survive() -> None:
    source = [
        Rec(i, T0 + i, None if i % 2 else b"k", None if i % 3 else b"v", []) for i in range(9)
    ]
    check_rebuilt(make_batch(source), 0, source)
    check_rebuilt(b"".join(make_batch([r]) for r in source), 0, source)


@pytest.mark.parametrize("n", [0, 1, -1, 63, -64, 64, 300, -300, 2**31, -(2**40), 2**62])
def test_varints_round_trip(n: int) -> None:
    assert read_varint(encode_varint(n) + b"\x00", 0) == (n, len(encode_varint(n)))


def test_source_batches_are_views_not_copies() -> None:
    data = bytearray(make_batch(recs(0, 3)) + make_batch(recs(3, 3)))
    batches, _ = split_batches(data)
    assert all(isinstance(b, SourceBatch) and b.data.obj is data for b in batches)


def test_big_copyable_batches_are_copied_alone_and_small_ones_merged() -> None:
    source = recs(0, 430)
    data = (
        make_batch(source[:200])  # ~27 KiB: over 1/16 of a 256 KiB budget
        + b"".join(make_batch([r]) for r in source[200:230])
        + make_batch(source[230:])
    )
    groups = check_rebuilt(data, 0, source)
    assert [len(g) for g in groups] == [200, 30, 200]
    rebuilt = rebuild(split_batches(data)[0], 0, ORIGIN)
    assert [d.copied for d in rebuilt.batches] == [True, False, True]


def test_prebuilt_records_stand_in_for_kafka_pythons_builder() -> None:
    from kafka.errors import IllegalStateError

    from relay.clients.batch_produce import PrebuiltRecords

    (dest,) = rebuild(split_batches(make_batch(recs(0, 7)))[0], 0, ORIGIN).batches
    records = PrebuiltRecords(dest)
    assert records.append(0, b"k", b"v", []) is None and not records.is_full()
    assert records.next_offset() == 7  # how far the sender moves the partition's sequence
    records.set_producer_state(99, 2, 40, False)
    records.close()
    records.close()  # a retry closes again: stamped once, bytes unchanged
    with pytest.raises(IllegalStateError):
        records.set_producer_state(99, 3, 0, False)
    batch, got = read_back(records.buffer())
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (99, 2, 40)
    assert len(got) == 7 and records.buffer() is dest.payload  # stamped in place, no copy


def test_a_stop_offset_leaves_out_the_records_at_and_after_it() -> None:
    data = make_batch(recs(0, 10)) + make_batch(recs(10, 10)) + make_batch(recs(20, 10))
    batches, _ = split_batches(data)
    rebuilt = rebuild(batches, 4, ORIGIN, stop=15)
    assert rebuilt.next_offset == 15  # never past the stop, though the fetch went on
    kept = [r for dest in rebuilt.batches for r in read_back(dest.payload)[1]]
    assert [r.key for r in kept] == [b"k%d" % o for o in range(4, 15)]
    (dest,) = rebuilt.batches  # merged, the straddling batch rebased
    assert (dest.first_offset, dest.last_offset, dest.copied) == (4, 14, False)
    assert rebuild(batches, 0, ORIGIN, stop=0).batches == []
    # a whole batch before the stop is copied as it is
    copied = rebuild(batches[:1], 0, ORIGIN, stop=10, budget=1024).batches
    assert [d.copied for d in copied] == [True]


def test_a_followed_topics_incarnation_travels_in_the_headers_topic() -> None:
    """`[source_pool].on_recreate = "follow"`: copies of a recreated topic's n-th incarnation
    name `topic~n`; the first incarnation names no suffix, as every copy before following."""
    from relay.provenance.header import commit_mark, marked_incarnation, origin_topic

    later = parse_provenance(format_runs("src", origin_topic("orders", 2), 1, [(0, 4)]))
    assert later == Provenance("src", "orders", 1, ((0, 4),), True, 2)
    assert later is not None and later.origin == ("orders~2", 1)
    first = parse_provenance(format_runs("src", origin_topic("orders", 0), 1, [(0, 4)]))
    assert first is not None and (first.incarnation, first.origin) == (0, ("orders", 1))
    record = parse_provenance(b"src/orders~1/3/41")
    assert record == Provenance("src", "orders", 3, ((41, 41),), False, 1)
    for bad in (b"src/orders~0/1/0-4", b"src/orders~x/1/0-4", b"src/orders~01/1/0-4",
                b"src/orders~/1/0-4"):  # fmt: skip
        assert parse_provenance(bad) is None
    assert [marked_incarnation(commit_mark(n)) for n in (0, 1, 12)] == [0, 1, 12]
    assert commit_mark(0) == "" and marked_incarnation("someone else's") == 0

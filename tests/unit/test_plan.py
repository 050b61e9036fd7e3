"""Planning: partition routes, provenance headers, resume points (the next-offset rule)."""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import pytest
from crc32c import crc32c

from relay.batches import Origin, rebuild, split_batches
from relay.config import ClusterConfig, TopicRoute
from relay.errors import KafkaSetupError
from relay.pipelines.routes import plan_routes
from relay.provenance import resume
from relay.provenance.copies import copies_in, origins, provenance_lost
from relay.provenance.header import PROVENANCE_HEADER as HEADER
from relay.provenance.header import Provenance, parse_provenance, provenance_prefix
from relay.provenance.resume import (
    SourceOffsets,
    choose_start,
    delivered_in,
    resume_points,
    unsettled_in,
)
from relay.spec import PartitionRoute
from tests.support.batches import T0, Rec, cleaned, make_batch, recs


def _prov(topic: str, partition: int, offset: int, cluster: str = "src") -> bytes:
    return provenance_prefix(cluster, topic, partition) + str(offset).encode()


def _record_form(*origins: tuple[str, int, int], cluster: str = "src", at: int = 0) -> Any:
    """A destination batch of the record path: every record carries its own source offset."""
    records = [
        Rec(
            at + i,
            T0 + i,
            b"k%d" % i,
            b"v%d" % o,
            [("app", b"x"), (HEADER, _prov(t, p, o, cluster))],
        )
        for i, (t, p, o) in enumerate(origins)
    ]
    return split_batches(make_batch(records))[0][0]


def _batch_form(source: list[Rec], first: int, cluster: str = "src", at: int = 0) -> Any:
    """A destination batch of the batch path, rebuilt from `source` (topic "a", partition 0)."""
    (built,) = rebuild(split_batches(make_batch(source))[0], first, Origin(cluster, "a", 0)).batches
    payload = bytearray(built.payload)
    struct.pack_into(">q", payload, 0, at)  # the offset the destination gave it
    return split_batches(payload)[0][0]


def test_provenance_round_trip_even_with_slashes_in_cluster_name() -> None:
    value = provenance_prefix("dc/one", "orders.v1", 7) + b"123456"
    assert parse_provenance(value) == Provenance(
        "dc/one", "orders.v1", 7, ((123456, 123456),), False
    )


@pytest.mark.parametrize("value", [b"", b"garbage", b"a/b/c/notanint", b"\xff\xfe/t/1/2"])
def test_foreign_header_values_are_ignored(value: bytes) -> None:
    assert parse_provenance(value) is None


def test_plan_routes_preserves_partitions_and_fixed_partition_fans_in() -> None:
    routes = [TopicRoute("a", "x", None), TopicRoute("b", "y", 1)]
    planned = plan_routes(routes, {"a": 2, "b": 3}, {"x": 2, "y": 2}, "src")
    assert planned == [
        PartitionRoute("a", 0, "x", 0),
        PartitionRoute("a", 1, "x", 1),
        PartitionRoute("b", 0, "y", 1),
        PartitionRoute("b", 1, "y", 1),
        PartitionRoute("b", 2, "y", 1),
    ]


@pytest.mark.parametrize(
    ("route", "source", "target", "message"),
    [
        (TopicRoute("a", "x", None), {}, {"x": 1}, "source topic 'a' does not exist"),
        (TopicRoute("a", "x", None), {"a": 1}, {}, "destination topic 'x' does not exist"),
        (
            TopicRoute("a", "x", None),
            {"a": 4},
            {"x": 2},
            "has 2 partitions, fewer than the source's 4",
        ),
        (TopicRoute("a", "x", 5), {"a": 1}, {"x": 2}, 'partition 5 of "x" does not exist'),
    ],
)
def test_plan_routes_refuses_what_would_lose_records(route, source, target, message) -> None:
    with pytest.raises(KafkaSetupError, match="topics") as err:
        plan_routes([route], source, target, "src")
    assert message in str(err.value)


def _nexts(batches, wanted) -> dict:
    return {key: d.next_offset for key, d in delivered_in(batches, wanted).items()}


def test_record_form_batches_count_every_record_and_fan_in_is_kept_apart() -> None:
    # the record path appends runs of several source partitions into one producer batch
    batches = [
        _record_form(("a", 0, 5), ("a", 1, 9), ("a", 0, 6), ("b", 0, 99)),
        _record_form(("a", 1, 10), at=4),
    ]
    assert _nexts(batches, {("a", 0), ("a", 1)}) == {("a", 0): 7, ("a", 1): 11}
    last = delivered_in(batches, {("a", 0)})[("a", 0)]
    assert (last.offset, last.record.key, last.record.value) == (6, b"k2", b"v6")


def test_delivered_matches_any_node_name() -> None:
    # Failover nodes carry different names but the same offsets: the node is not part of the key.
    batches = [
        _record_form(("a", 0, 5), cluster="node1"),
        _record_form(("a", 0, 8), cluster="node2"),
    ]
    assert _nexts(batches, {("a", 0)}) == {("a", 0): 9}


def test_a_batch_form_batch_is_read_by_its_last_record_only() -> None:
    source = recs(10, 6)
    # relayed twice (A to B to C): a middle record carries the first hop's header, naming the
    # same topic and partition at a later offset; this hop added none to it
    source[2].headers.append((HEADER, b"A/a/0/700-720"))
    batch = _batch_form(source, 12, at=40)  # a restart inside the source batch: 12..15 only
    (found,) = origins(batch)
    assert found[0] == Provenance("src", "a", 0, ((12, 15),))
    assert (found[1].offset, found[1].key, found[1].timestamp) == (43, b"k15", source[-1].timestamp)
    assert _nexts([batch], {("a", 0)}) == {("a", 0): 16}


def test_older_record_form_batches_then_batch_form_resume_after_the_last() -> None:
    older = _record_form(("a", 0, 0), ("a", 0, 1), ("a", 0, 2))
    newer = _batch_form(recs(3, 4), 3, at=3)
    assert _nexts([older], {("a", 0)}) == {("a", 0): 3}
    assert _nexts([older, newer], {("a", 0)}) == {("a", 0): 7}
    # each copy's destination offset beside its source offset, in either form
    assert copies_in(older, ("a", 0)) == [(0, 0), (1, 1), (2, 2)]
    assert copies_in(newer, ("a", 0)) == [(3, 3), (4, 4), (5, 5), (6, 6)]
    assert copies_in(newer, ("a", 1)) == []


def test_copies_in_a_batch_follow_its_runs_past_gaps() -> None:
    # a filter dropped 12 and 13 (source batch 10..17, the relay restarted at 11)
    source = recs(10, 8)
    (built,) = rebuild(
        split_batches(make_batch(source))[0], 11, Origin("src", "a", 0), drop={12, 13}
    ).batches
    payload = bytearray(built.payload)
    struct.pack_into(">q", payload, 0, 500)
    batch = split_batches(payload)[0][0]
    assert copies_in(batch, ("a", 0)) == [(500, 11), (501, 14), (502, 15), (503, 16), (504, 17)]


def test_choose_start_prefers_the_latest_safe_point() -> None:
    assert choose_start(("a", 0), None, None, 3, 10).next_offset == 3
    assert choose_start(("a", 0), 5, None, 0, 10).next_offset == 5
    # filtered tail: the committed offset is past the last delivered record
    point = choose_start(("a", 0), 5, 8, 0, 10)
    assert (point.next_offset, point.reason) == (8, "committed")
    # retention removed records not yet copied: resume where the copy stopped, so the first
    # fetch finds and counts them (relay.losses)
    point = choose_start(("a", 0), 5, None, 7, 10)
    assert (point.next_offset, point.reason) == (5, "destination")


def test_choose_start_refuses_a_destination_ahead_of_the_source() -> None:
    with pytest.raises(KafkaSetupError, match="recreated"):
        choose_start(("a", 0), 51, None, 0, 10)


def test_a_copy_past_the_stable_offset_is_checked_against_the_log_end() -> None:
    """read_committed: the end is the last stable offset (30); a destination an older ktm wrote
    read_uncommitted may hold an open transaction's records up to the log end (50), which is
    read only then; past the log end it is refused as before."""
    key, route = ("a", 0), PartitionRoute("a", 0, "b", 0)
    asked: list[Any] = []

    def log_end(k: Any) -> int:
        asked.append(k)
        return 50

    offsets = SourceOffsets({key: 0}, {key: 30}, log_end)

    assert resume_points([route], offsets, {key: 20}, {key: None})[key].next_offset == 20
    assert asked == []  # within the stable offset: no question
    point = resume_points([route], offsets, {key: 45}, {key: 40})[key]
    assert (point.next_offset, asked) == (45, [key])
    with pytest.raises(KafkaSetupError, match="recreated"):
        resume_points([route], offsets, {key: 51}, {key: None})
    # read_uncommitted: no second end
    with pytest.raises(KafkaSetupError, match="recreated"):
        resume_points([route], SourceOffsets({key: 0}, {key: 30}), {key: 45}, {key: None})


class SourceRecord(NamedTuple):
    """What `admin.records_at` gives: a kafka-python ConsumerRecord's fields compared."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp: int


def _broker_time(batch: Any, append_time: int) -> Any:
    """`batch` as a LogAppendTime destination topic stores it: the attribute set and its max
    timestamp overwritten by the broker's append time."""
    payload = bytearray(batch.data)
    (attributes,) = struct.unpack_from(">h", payload, 21)
    struct.pack_into(">h", payload, 21, attributes | 0x08)
    struct.pack_into(">q", payload, 35, append_time)
    struct.pack_into(">I", payload, 17, crc32c(bytes(payload[21:])))
    return split_batches(payload)[0][0]


def _continuity(monkeypatch, batch: Any, source: SourceRecord) -> None:
    monkeypatch.setattr(resume.admin, "records_at", lambda node, wanted, timeout: {
        key: source for key in wanted})  # fmt: skip
    node = ClusterConfig("node2", ("n:1",))
    resume.check_continuity(node, delivered_in([batch], {("a", 0)}), "stop", 1.0)


def test_continuity_on_a_log_append_time_destination_compares_all_but_the_timestamp(
    monkeypatch,
) -> None:
    """The destination's broker stamped its own time on the copy: a failover to a node that
    holds the same record goes on; one that holds another record still stops."""
    source = recs(10, 4)
    last = source[-1]
    batch = _broker_time(_batch_form(source, 10, at=40), append_time=T0 + 10**9)
    (found,) = delivered_in([batch], {("a", 0)}).values()
    assert found.broker_time and found.record.timestamp == T0 + 10**9
    same = SourceRecord(last.key, last.value, list(last.headers), last.timestamp)
    _continuity(monkeypatch, batch, same)
    for other in (same._replace(value=b"other"), same._replace(headers=[("h1", b"y")])):
        with pytest.raises(resume.ContinuityError, match=r"\(key/value/headers\)"):
            _continuity(monkeypatch, batch, other)


def test_continuity_on_a_create_time_destination_compares_the_timestamp(monkeypatch) -> None:
    source = recs(10, 4)
    last = source[-1]
    batch = _batch_form(source, 10, at=40)
    same = SourceRecord(last.key, last.value, list(last.headers), last.timestamp)
    _continuity(monkeypatch, batch, same)
    with pytest.raises(resume.ContinuityError, match="key/value/headers/timestamp"):
        _continuity(monkeypatch, batch, same._replace(timestamp=last.timestamp + 1))


def test_continuity_keeps_an_earlier_hops_provenance_as_the_records_own_header(
    monkeypatch,
) -> None:
    """Relayed twice (A to B to C): the source record on B has A's header; the copy on C has
    it and C's own after it, which alone is not the record's."""
    source = recs(10, 3)
    source[-1].headers.append((HEADER, b"A/a/0/700-720"))
    last = source[-1]
    batch = _batch_form(source, 10, at=40)
    _continuity(monkeypatch, batch,
                SourceRecord(last.key, last.value, list(last.headers), last.timestamp))  # fmt: skip


# ---- a compacted destination: batches whose provenance the log cleaner removed -------------


def _cleaned(batch: Any, kept: list[int]) -> Any:
    return split_batches(cleaned(bytes(batch.data), kept))[0][0]


def test_a_batch_whose_header_record_was_cleaned_names_nothing_not_even_an_earlier_hop() -> None:
    """Relayed twice (A to B to C), then compacted on C: the last survivor carries A's header,
    naming the same topic and partition at later offsets. It is not this hop's (that was on
    the record at the batch's last offset, now gone): taking it would resume past records."""
    source = recs(10, 6)
    source[3].headers.append((HEADER, b"A/a/0/700-720"))
    batch = _cleaned(_batch_form(source, 10, at=40), kept=[41, 43])
    assert batch.last_offset == 45 and batch.header.record_count == 2
    assert origins(batch) == [] and provenance_lost(batch)
    assert _nexts([batch], {("a", 0)}) == {}
    assert copies_in(batch, ("a", 0)) == []
    kept_last = _cleaned(_batch_form(source, 10, at=40), kept=[41, 45])
    assert not provenance_lost(kept_last)
    # the survivors keep their offsets: the i-th offset of the runs is at the i-th delta
    assert copies_in(kept_last, ("a", 0)) == [(41, 11), (45, 15)]
    assert provenance_lost(_cleaned(_batch_form(source, 10, at=40), kept=[]))  # header only


def test_what_a_compacted_tail_cannot_settle() -> None:
    """Fan-in: a source partition whose last copies lie before a batch that lost its
    provenance, or before offsets no batch holds (a batch dropped whole), may have written
    that batch: its next offset is unsettled. One named after it, or with nothing doubtful
    after it, is settled; one never named is unsettled only where something was cleaned."""
    a0 = _batch_form(recs(0, 3), 0, at=100)
    b0 = _record_form(("b", 0, 0), ("b", 0, 1), at=103)
    lost = _cleaned(_batch_form(recs(3, 3), 3, at=105), kept=[105])
    b1 = _record_form(("b", 0, 2), at=108)
    wanted = {("a", 0), ("b", 0), ("c", 0)}
    assert unsettled_in([a0, b0, lost, b1], wanted) == {("a", 0), ("c", 0)}
    assert unsettled_in([a0, b0, _record_form(("b", 0, 2), at=105)], wanted) == set()
    b2 = _record_form(("b", 0, 3), at=120)  # 109..119 dropped whole
    assert unsettled_in([a0, b0, b1, b2], wanted) == {("a", 0), ("c", 0)}


def test_resume_names_in_one_line_those_still_unsettled(caplog) -> None:
    """After the source's records were compared (relay.provenance.attribution), the source
    partitions still unsettled resume where they are, and one line says so."""
    routes = [PartitionRoute("a", p, "x", 0) for p in (0, 1, 2)]
    offsets = resume.SourceOffsets({r.key: 0 for r in routes}, {r.key: 50 for r in routes})
    found = {("a", 0): 10, ("a", 1): 10, ("a", 2): 10}
    committed: dict[tuple[str, int], int | None] = {("a", 0): 20, ("a", 1): 5, ("a", 2): None}
    points = resume.resume_points(routes, offsets, found, committed, frozenset({("a", 1)}))
    assert [points[r.key].next_offset for r in routes] == [20, 10, 10]
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert line.startswith("1 source partition(s) resume where a compacted destination cannot")
    assert "(a[1]@10)" in line

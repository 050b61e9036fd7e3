"""Restore chains and compaction runs: containment, holes, overlaps, legal gaps."""

from __future__ import annotations

import pytest

from relay.store.chain import (
    ChainError,
    ChainLink,
    compaction_plan,
    merged_meta,
    plan_chain,
    restore_chain,
)
from relay.store.layout import SegmentRef
from relay.store.records import SegmentMeta


def link(
    first: int,
    last: int,
    next_offset: int | None = None,
    *,
    level: int = 0,
    size: int = 100,
    modified: float | None = None,
) -> ChainLink:
    next_offset = last + 1 if next_offset is None else next_offset
    key = f"c/t/0/{level}/{first:020d}-{last:020d}.parquet"
    count = last - first + 1
    return ChainLink(key, level, first, last, next_offset, count, size, modified)


def spans(links: list[ChainLink]) -> list[tuple[int, int, int]]:
    return [(x.first, x.last, x.level) for x in links]


def test_a_clean_chain_is_replayed_in_order_whatever_the_input_order() -> None:
    links = [link(20, 29), link(0, 9), link(10, 19)]
    assert spans(restore_chain(links)) == [(0, 9, 0), (10, 19, 0), (20, 29, 0)]
    assert restore_chain([]) == []


def test_gaps_inside_segments_are_legal() -> None:
    # 10-14 skipped inside the first segment (compaction or transaction markers): no hole.
    links = [link(0, 9, 15), link(15, 20, 30), link(30, 31)]
    assert spans(restore_chain(links)) == [(0, 9, 0), (15, 20, 0), (30, 31, 0)]


def test_merged_segment_and_its_inputs_replay_each_record_once() -> None:
    # A crash between writing the level-1 merge of 0-19 and deleting its inputs.
    links = [link(0, 9), link(10, 19), link(0, 19, level=1), link(20, 29)]
    plan = plan_chain(links)
    assert spans(list(plan.links)) == [(0, 19, 1), (20, 29, 0)]
    assert spans(list(plan.superseded)) == [(0, 9, 0), (10, 19, 0)]
    assert plan.problems == ()


def test_levels_nest() -> None:
    links = [
        link(0, 9), link(10, 19), link(0, 19, level=1), link(20, 29, level=1),
        link(0, 29, level=2), link(30, 39),
    ]  # fmt: skip
    assert spans(restore_chain(links)) == [(0, 29, 2), (30, 39, 0)]


def test_the_same_range_at_two_levels_prefers_the_higher() -> None:
    assert spans(restore_chain([link(0, 9), link(0, 9, level=1)])) == [(0, 9, 1)]


def test_a_hole_names_both_segments_and_the_missing_offsets() -> None:
    links = [link(0, 9), link(15, 19), link(20, 29)]
    with pytest.raises(ChainError) as caught:
        restore_chain(links)
    assert str(caught.value) == (
        f"broken segment chain: offsets 10-14 are missing between {links[0].key} and {links[1].key}"
    )
    (problem,) = caught.value.problems
    assert (problem.kind, problem.first, problem.last) == ("hole", 10, 14)


def test_a_hole_after_a_gap_counts_from_next_offset() -> None:
    plan = plan_chain([link(0, 9, 12), link(14, 20)])
    assert [(p.kind, p.first, p.last) for p in plan.problems] == [("hole", 12, 13)]


def test_a_partial_overlap_is_reported() -> None:
    links = [link(0, 9), link(5, 14), link(15, 19)]
    with pytest.raises(ChainError, match="both cover offsets 5-9 and neither contains"):
        restore_chain(links)


def test_records_inside_a_declared_gap_are_an_overlap() -> None:
    # The first segment says offsets 10-14 do not exist; the next one starts at 12.
    plan = plan_chain([link(0, 9, 15), link(12, 20)])
    assert [(p.kind, p.first, p.last) for p in plan.problems] == [("overlap", 12, 14)]


def test_all_problems_are_counted() -> None:
    with pytest.raises(ChainError, match=r"\(and 1 more problems\)$") as caught:
        restore_chain([link(0, 9), link(20, 29), link(25, 39)])
    assert len(caught.value.problems) == 2


def test_start_skips_earlier_segments_and_finds_a_missing_beginning() -> None:
    links = [link(0, 9), link(10, 19), link(20, 29)]
    assert spans(restore_chain(links, start=15)) == [(10, 19, 0), (20, 29, 0)]
    assert spans(restore_chain(links, start=30)) == []
    with pytest.raises(ChainError, match="offsets 5-9 are missing before"):
        restore_chain(links[1:], start=5)


def test_link_from_a_ref_and_its_meta() -> None:
    ref = SegmentRef("c/t/0/1/x.parquet", "c", "t", 0, 1, 5, 9, "parquet", 1234, 99.0)
    meta = SegmentMeta("c", "t", 0, 1, 5, 9, 12, 3, 0, 0)
    made = ChainLink.of(ref, meta)
    assert made == ChainLink("c/t/0/1/x.parquet", 1, 5, 9, 12, 3, 1234, 99.0)
    assert made.ref is ref


# --- compaction ----------------------------------------------------------------------------


def test_runs_stay_under_the_size_target() -> None:
    links = [link(i * 10, i * 10 + 9, size=100) for i in range(7)]
    runs = compaction_plan(links, level=0, max_bytes=300)
    assert [[x.first for x in run] for run in runs] == [[0, 10, 20], [30, 40, 50]]  # 60 alone


def test_runs_by_record_count() -> None:
    links = [link(0, 9), link(10, 19), link(20, 29)]
    runs = compaction_plan(links, level=0, max_records=25)
    assert [[x.first for x in run] for run in runs] == [[0, 10]]


def test_runs_break_at_holes_other_levels_and_young_segments() -> None:
    links = [
        link(0, 9), link(10, 19),  # a run
        link(20, 29, level=1),  # another level breaks it
        link(30, 39), link(40, 49, modified=990.0), link(50, 59),  # too young in the middle
        link(70, 79), link(80, 89, 95), link(95, 99),  # a hole before 70; a legal gap at 90-94
    ]  # fmt: skip
    runs = compaction_plan(links, level=0, max_bytes=10_000, min_age=60, now=1000.0)
    assert [[x.first for x in run] for run in runs] == [[0, 10], [70, 80, 95]]


def test_superseded_segments_are_never_merged_again() -> None:
    links = [link(0, 9), link(10, 19), link(0, 19, level=1), link(20, 29), link(30, 39)]
    runs = compaction_plan(links, level=0, max_bytes=10_000)
    assert [[x.first for x in run] for run in runs] == [[20, 30]]


def test_compaction_needs_a_limit() -> None:
    with pytest.raises(ValueError, match="max_bytes or max_records"):
        compaction_plan([link(0, 9)], level=0)


def test_merged_meta_spans_its_inputs() -> None:
    a = SegmentMeta("c", "t", 0, 0, 0, 9, 12, 8, 50, 60)
    b = SegmentMeta("c", "t", 0, 0, 12, 19, 25, 8, 40, 55)
    merged = merged_meta([a, b])
    assert (merged.level, merged.first, merged.last, merged.next_offset) == (1, 0, 19, 25)
    assert (merged.count, merged.min_timestamp, merged.max_timestamp) == (16, 40, 60)
    with pytest.raises(ValueError, match="does not follow"):
        merged_meta([b, a])
    with pytest.raises(ValueError, match="nothing to merge"):
        merged_meta([])

"""Segment and snapshot names: built, parsed back, foreign files ignored."""

from __future__ import annotations

import pytest

from relay.store.layout import (
    SegmentRef,
    decode_group,
    encode_group,
    group_snapshot_path,
    is_temp_name,
    parse_segment_path,
    segment_path,
    temp_name,
)

FIRST, LAST = 5, 9_223_372_036_854_775_806  # int64 max - 1 still fits the 20 digits


def test_segment_path_is_the_documented_layout() -> None:
    path = segment_path("prod", "orders.v1", 3, 0, FIRST, LAST, "parquet", prefix="backups/")
    assert path == ("backups/prod/orders.v1/3/0/00000000000000000005-09223372036854775806.parquet")


def test_names_sort_like_offsets() -> None:
    names = [segment_path("c", "t", 0, 0, f, f + 1, "jsonl") for f in (9, 10, 100, 99)]
    assert sorted(names) == [names[0], names[1], names[3], names[2]]


@pytest.mark.parametrize("prefix", ["", "a", "a/b/c", "/abs/dir", "bucket/pre fix"])
def test_parse_inverts_build(prefix: str) -> None:
    path = segment_path("c-1", "t_2", 12, 3, 7, 7, "jsonl", prefix=prefix)
    assert parse_segment_path(path) == SegmentRef(path, "c-1", "t_2", 12, 3, 7, 7, "jsonl")


@pytest.mark.parametrize(
    "path",
    [
        "c/t/0/0/00000000000000000001-00000000000000000002.csv",  # unknown extension
        "c/t/0/0/1-2.parquet",  # not padded
        "c/t/0/0/00000000000000000003-00000000000000000002.parquet",  # first > last
        "c/t/00/0/00000000000000000001-00000000000000000002.parquet",  # partition "00"
        "c/t/0/x/00000000000000000001-00000000000000000002.parquet",  # level not a number
        "c/t/-1/0/00000000000000000001-00000000000000000002.parquet",
        "c/t t/0/0/00000000000000000001-00000000000000000002.parquet",  # illegal topic
        "c/_groups/0/0/00000000000000000001-00000000000000000002.parquet",
        "t/0/0/00000000000000000001-00000000000000000002.parquet",  # too short
        "c/t/0/0/.tmp-0123456789abcdef0123456789abcdef-"
        "00000000000000000001-00000000000000000002.parquet",  # our own temporary file
        "c/t/0/0/README.md",
        "",
    ],
)
def test_parse_rejects_foreign_names(path: str) -> None:
    assert parse_segment_path(path) is None


@pytest.mark.parametrize(
    ("cluster", "topic", "message"),
    [
        ("a/b", "t", "cluster name"),
        ("..", "t", "cluster name"),
        ("", "t", "cluster name"),
        ("c", "a/b", "legal Kafka topic"),
        ("c", "x" * 250, "legal Kafka topic"),
        ("c", "_groups", "reserved"),
    ],
)
def test_unsafe_names_are_refused(cluster: str, topic: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        segment_path(cluster, topic, 0, 0, 1, 2, "parquet")


def test_bad_offsets_and_extensions_are_refused() -> None:
    with pytest.raises(ValueError, match="first <= last"):
        segment_path("c", "t", 0, 0, 3, 2, "parquet")
    with pytest.raises(ValueError, match="extension"):
        segment_path("c", "t", 0, 0, 1, 2, "csv")
    with pytest.raises(ValueError, match="partition"):
        segment_path("c", "t", -1, 0, 1, 2, "parquet")


def test_temp_names_are_recognised() -> None:
    name = temp_name("00000000000000000001-00000000000000000002.parquet")
    assert is_temp_name(name)
    assert name.endswith("-00000000000000000001-00000000000000000002.parquet")
    assert not is_temp_name("00000000000000000001-00000000000000000002.parquet")
    assert not is_temp_name(".tmp-short-x")


@pytest.mark.parametrize(
    "group", ["ktm", "a/b", "..", ".hidden", ".", "spaces and %25", "ünïcode ✓", "x?y#z"]
)
def test_group_names_round_trip_and_stay_one_plain_file_name(group: str) -> None:
    path = group_snapshot_path("prod", group, prefix="p")
    directory, file_name = path.rsplit("/", 1)
    assert directory == "p/prod/_groups"
    assert not file_name.startswith(".")
    assert decode_group(file_name) == group


def test_decode_group_ignores_other_files() -> None:
    assert decode_group("notes.txt") is None
    assert decode_group(".tmp-x.json") is None
    assert decode_group("%ff.json") is None  # not UTF-8
    assert encode_group("a/b") == "a%2Fb.json"


def test_an_empty_group_id_has_no_file_name() -> None:
    with pytest.raises(ValueError, match="empty"):
        encode_group("")

"""SegmentStore on a directory: atomic writes, listings from names, damaged and misnamed files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from relay.errors import ConfigError
from relay.store import SegmentBuffer, SegmentError, SegmentMeta, StoredRecord, StoreError
from relay.store.formats import FORMATS, get_format
from relay.store.layout import group_snapshot_path
from relay.store.store import SegmentStore, open_store
from tests.support.store import assert_broken_streams_publish_nothing

REPO = Path(__file__).resolve().parents[2]


def buffer_of(first: int, last: int, *, step: int = 1) -> SegmentBuffer:
    buffer = SegmentBuffer()
    for offset in range(first, last + 1, step):
        buffer.append(offset, 1_000 + offset, 0, b"k%d" % offset, b"v" * 10, [("h", None)])
    return buffer


def write(
    store: SegmentStore,
    first: int,
    last: int,
    *,
    level: int = 0,
    fmt: str = "parquet",
    partition: int = 0,
    topic: str = "orders",
) -> Any:
    buffer = buffer_of(first, last)
    return store.write_segment(fmt, buffer, buffer.meta("prod", topic, partition, level=level))


@pytest.fixture
def store(tmp_path: Path) -> SegmentStore:
    return open_store(str(tmp_path / "backups"))


def visible_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


# --- opening -----------------------------------------------------------------------------------


def test_paths_and_file_urls_open_directory_stores(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    assert open_store("rel/dir").describe() == str(tmp_path / "rel" / "dir")
    assert open_store(f"file://{tmp_path}/a%20b").describe() == str(tmp_path / "a b")
    assert open_store(str(tmp_path)).describe() == str(tmp_path)


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("", {}, "expected a directory"),
        ("gs://bucket/x", {}, "expected a directory, file:// or s3://"),
        ("s3:///prefix", {}, "no bucket"),
        ("/tmp/x", {"endpoint": "http://127.0.0.1:9000"}, "apply to s3:// only"),
        ("s3://b", {"endpoint": "127.0.0.1:9000"}, "must look like http://host:port"),
        ("s3://b", {"access_key": "only-the-key"}, "both the access key and the secret key"),
    ],
)
def test_bad_store_settings_are_config_errors(
    url: str, options: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        open_store(url, **options)


def test_s3_store_describes_itself_without_credentials() -> None:
    store = open_store(
        "s3://bucket/some/prefix/",
        endpoint="http://127.0.0.1:1",
        access_key="AKID",
        secret_key="SUPERSECRET",
    )
    assert store.describe() == "s3://bucket/some/prefix"
    assert "SUPERSECRET" not in repr(store) and "AKID" not in repr(store)


# --- segments ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_write_list_read_delete(store: SegmentStore, fmt: str) -> None:
    buffer = buffer_of(10, 20, step=2)
    meta = buffer.meta("prod", "orders", 3, next_offset=25)
    ref = store.write_segment(fmt, buffer, meta)
    assert ref.path == f"prod/orders/3/0/{10:020d}-{20:020d}.{fmt}"
    assert ref.size == os.path.getsize(store.location(ref))
    (listed,) = store.list_segments("prod", "orders", 3)
    assert (listed.path, listed.size, listed.format) == (ref.path, ref.size, fmt)
    assert listed.modified is not None
    assert store.read_meta(listed) == meta
    assert list(store.read_records(listed)) == list(buffer.records())
    store.delete(listed)
    store.delete(listed)  # already gone: fine
    assert store.list_segments("prod", "orders", 3) == []


def test_listing_is_sorted_by_first_then_level_and_skips_foreign_files(
    store: SegmentStore,
) -> None:
    for first, last, level in [(20, 29, 0), (0, 9, 0), (0, 19, 1), (10, 19, 0)]:
        write(store, first, last, level=level)
    folder = Path(store.location("prod/orders/0/0"))
    (folder / "notes.txt").write_text("not a segment")
    (folder / "00000000000000000001-00000000000000000002.csv").write_text("nor this")
    refs = store.list_segments("prod", "orders", 0)
    assert [(r.first, r.level) for r in refs] == [(0, 0), (0, 1), (10, 0), (20, 0)]
    assert [r.first for r in store.list_segments("prod", "orders", 0, level=1)] == [0]
    assert store.list_segments("prod", "orders", 7) == []


def test_topics_and_partitions_are_listed(store: SegmentStore) -> None:
    assert store.list_topics("prod") == []
    write(store, 0, 1, topic="b", partition=2)
    write(store, 0, 1, topic="b", partition=10)
    write(store, 0, 1, topic="a")
    store.write_json(group_snapshot_path("prod", "g"), {"b": 1})
    assert store.list_topics("prod") == ["a", "b"]
    assert store.list_partitions("prod", "b") == [2, 10]


def test_metadata_must_match_the_name(store: SegmentStore) -> None:
    ref = write(store, 0, 4)
    moved = Path(store.location("prod/orders/1/0")) / ref.file_name  # partition 1, not 0
    moved.parent.mkdir(parents=True)
    shutil.copy(store.location(ref), moved)
    (misnamed,) = store.list_segments("prod", "orders", 1)
    with pytest.raises(SegmentError) as caught:
        store.read_meta(misnamed)
    assert str(caught.value) == (
        f"segment {moved}: its metadata says prod/orders/0 level 0 offsets 0-4, "
        "its name says prod/orders/1 level 0 offsets 0-4"
    )
    with pytest.raises(SegmentError, match="its metadata says"):
        list(store.read_records(misnamed))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_truncated_segment_is_a_segment_error_naming_its_path(
    store: SegmentStore, fmt: str
) -> None:
    ref = write(store, 0, 99, fmt=fmt)
    path = Path(store.location(ref))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(SegmentError, match=f"^segment {path}"):
        list(store.read_records(ref))


def test_a_vanished_segment_is_a_store_error(store: SegmentStore) -> None:
    ref = write(store, 0, 4)
    os.remove(store.location(ref))
    with pytest.raises(StoreError, match=f"cannot read {store.location(ref)}: no such file"):
        store.read_meta(ref)


def test_metadata_must_describe_the_buffer(store: SegmentStore) -> None:
    buffer = buffer_of(0, 4)
    wrong = SegmentMeta("prod", "orders", 0, 0, 0, 5, 6, 5, 1000, 1004)
    with pytest.raises(ValueError, match="does not describe the buffer"):
        store.write_segment("parquet", buffer, wrong)


# --- atomic writes -----------------------------------------------------------------------------


class FailingFormat:
    """A format that writes half a file, then fails: what a bug or a full disk looks like."""

    name = extension = "parquet"
    compressions = ("none",)

    def write(self, sink: Any, chunks: Any, meta: SegmentMeta, compression: str) -> None:
        sink.write(b"PAR1 half a segment")
        raise RuntimeError("boom")


def test_an_error_mid_write_leaves_nothing(store: SegmentStore, monkeypatch: Any) -> None:
    buffer = buffer_of(0, 9)
    with pytest.raises(RuntimeError, match="boom"):
        store.write_segment(FailingFormat(), buffer, buffer.meta("prod", "orders", 0))  # type: ignore[arg-type]
    monkeypatch.setattr(os, "fsync", _raise_eio)
    with pytest.raises(StoreError, match="cannot write segment .*: input/output error"):
        store.write_segment("parquet", buffer, buffer.meta("prod", "orders", 0))
    root = Path(store.describe())
    assert visible_files(root) == []
    assert store.list_segments("prod", "orders", 0) == []


def _raise_eio(fd: int) -> None:
    raise OSError(5, "Input/output error", "somewhere")


def test_a_crash_before_the_rename_leaves_only_a_leftover(store: SegmentStore) -> None:
    """A real crash: a child process dies (os._exit) between writing and renaming."""
    script = textwrap.dedent(
        f"""
        import os
        from relay.store import SegmentBuffer, open_store
        os.replace = lambda *args: os._exit(3)
        buffer = SegmentBuffer()
        buffer.append(0, 0, 0, None, b"v")
        store = open_store({store.describe()!r})
        store.write_segment("parquet", buffer, buffer.meta("prod", "orders", 0))
        """
    )
    child = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True)
    assert child.returncode == 3, child.stderr.decode()
    (leftover,) = visible_files(Path(store.describe()))
    assert Path(leftover).name.startswith(".tmp-")
    assert store.list_segments("prod", "orders", 0) == []
    write(store, 5, 6)  # a segment written later is not a leftover
    assert store.clean_leftovers("prod", "orders", 0) == 1
    assert store.clean_leftovers("prod", "orders", 0) == 0
    assert [r.first for r in store.list_segments("prod", "orders", 0)] == [5]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_segment_streamed_in_chunks_reads_back_whole(store: SegmentStore, fmt: str) -> None:
    chunks = [buffer_of(0, 9), SegmentBuffer(), buffer_of(10, 19), buffer_of(20, 29)]
    whole = buffer_of(0, 29)
    meta = whole.meta("prod", "orders", 0, level=1)
    ref = store.write_segment_chunks(fmt, iter(chunks), meta)
    assert store.read_meta(ref) == meta
    assert list(store.read_records(ref)) == list(whole.records())
    assert visible_files(Path(store.describe())) == [ref.path]


def test_a_streamed_segment_appears_only_when_whole_and_as_described(
    store: SegmentStore,
) -> None:
    published = lambda: visible_files(Path(store.describe()))  # noqa: E731
    assert_broken_streams_publish_nothing(store, buffer_of, published)


def test_rewriting_a_segment_replaces_it_whole(store: SegmentStore) -> None:
    first = write(store, 0, 9)
    second = write(store, 0, 9)
    assert first.path == second.path
    assert [r.path for r in store.list_segments("prod", "orders", 0)] == [first.path]


# --- JSON snapshots and check() ------------------------------------------------------------------


def test_json_snapshots(store: SegmentStore) -> None:
    key = group_snapshot_path("prod", "my/group ✓")
    assert store.read_json(key) is None
    snapshot = {"group": "my/group ✓", "offsets": {"orders": {"0": 42}}}
    store.write_json(key, snapshot)
    assert store.read_json(key) == snapshot
    store.write_json(group_snapshot_path("prod", "other"), {})
    assert store.list_groups("prod") == ["my/group ✓", "other"]
    Path(store.location(key)).write_text("{half")
    with pytest.raises(StoreError, match="not valid JSON"):
        store.read_json(key)


def test_check_creates_the_directory_and_leaves_nothing(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "new" / "dir"))
    store.check()
    assert (tmp_path / "new" / "dir").is_dir()
    assert visible_files(tmp_path) == []


def test_check_names_the_directory_and_the_cause(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file, not a directory")
    store = open_store(str(tmp_path / "file" / "dir"))
    with pytest.raises(StoreError) as caught:
        store.check()
    assert str(caught.value).startswith(f"cannot use store {tmp_path / 'file' / 'dir'}: ")
    assert "not a directory" in str(caught.value)


def test_stored_records_read_from_one_store_extend_a_new_buffer(store: SegmentStore) -> None:
    ref = write(store, 0, 9, fmt="jsonl")
    merged = SegmentBuffer()
    merged.extend(store.read_records(ref))
    merged.append(10, 0, 1, None, None)
    assert list(merged.records())[-1] == StoredRecord(10, 0, 1, None, None, ())
    assert get_format("jsonl").name == ref.format

"""SegmentStore on a real S3 server: SeaweedFS started once for this module (testbed/seaweed.py)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from relay.store import SegmentBuffer, SegmentError, SegmentMeta, StoreError
from relay.store.formats import FORMATS
from relay.store.layout import group_snapshot_path
from relay.store.store import SegmentStore, open_store
from testbed import seaweed
from testbed.ports import free_port
from testbed.seaweed import S3Server, s3_filesystem
from tests.support.store import assert_broken_streams_publish_nothing

pytestmark = pytest.mark.timeout(60)


def s3_store(s3: S3Server, url: str, **overrides: Any) -> SegmentStore:
    options = {"endpoint": s3.endpoint, "access_key": s3.access_key, "secret_key": s3.secret_key}
    return open_store(url, **{**options, **overrides})


@pytest.fixture
def store(s3: S3Server) -> SegmentStore:
    """A store under a fresh prefix of the shared bucket: tests do not see each other."""
    return s3_store(s3, f"s3://{s3.bucket}/run-{uuid.uuid4().hex[:8]}/backups")


def buffer_of(first: int, last: int, value: bytes = b"v" * 100) -> SegmentBuffer:
    buffer = SegmentBuffer()
    for offset in range(first, last + 1):
        buffer.append(offset, 1_000 + offset, 0, b"k", value, [("h", b"1"), ("h", None)])
    return buffer


def objects_under(s3: S3Server, store: SegmentStore) -> list[str]:
    fs = s3_filesystem(s3.endpoint, s3.access_key, s3.secret_key)
    root = store.describe().removeprefix("s3://")
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    return sorted(i.path for i in fs.get_file_info(selector) if i.type == pafs.FileType.File)


def test_check_passes_and_leaves_no_probe(s3: S3Server, store: SegmentStore) -> None:
    store.check()
    assert objects_under(s3, store) == []


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_write_list_read_delete(store: SegmentStore, fmt: str) -> None:
    metas: list[SegmentMeta] = []
    for first, last, level in [(10, 19, 0), (0, 9, 0), (0, 19, 1)]:
        buffer = buffer_of(first, last)
        metas.append(buffer.meta("prod", "orders", 2, level=level))
        ref = store.write_segment(fmt, buffer, metas[-1])
        assert ref.path.endswith(f"{first:020d}-{last:020d}.{fmt}")
    refs = store.list_segments("prod", "orders", 2)
    assert [(r.first, r.level) for r in refs] == [(0, 0), (0, 1), (10, 0)]
    assert all(r.size and r.modified for r in refs)
    assert [r.first for r in store.list_segments("prod", "orders", 2, level=1)] == [0]
    assert store.read_meta(refs[1]) == metas[2]
    assert list(store.read_records(refs[2])) == list(buffer_of(10, 19).records())
    for ref in refs:
        store.delete(ref)
    store.delete(refs[0])  # already gone: fine
    assert store.list_segments("prod", "orders", 2) == []
    with pytest.raises(
        StoreError, match=rf"^cannot read s3://.*\.{fmt}: no such file or directory$"
    ):
        store.read_meta(refs[0])
    assert store.clean_leftovers("prod", "orders", 2) == 0


def test_a_multipart_sized_segment_round_trips(store: SegmentStore) -> None:
    buffer = buffer_of(0, 11, value=os.urandom(1024 * 1024))  # 12 MB: several upload parts
    ref = store.write_segment("parquet", buffer, buffer.meta("prod", "big", 0), "none")
    assert ref.size is not None and ref.size > 12 * 1024 * 1024
    assert [r.value for r in store.read_records(ref)] == [r.value for r in buffer.records()]


def test_topics_partitions_and_group_snapshots(store: SegmentStore) -> None:
    for topic, partition in [("b", 0), ("b", 11), ("a", 3)]:
        buffer = buffer_of(0, 0)
        store.write_segment("jsonl", buffer, buffer.meta("prod", topic, partition))
    key = group_snapshot_path("prod", "group/with spaces")
    assert store.read_json(key) is None
    store.write_json(key, {"offsets": {"b": {"0": 1}}})
    assert store.read_json(key) == {"offsets": {"b": {"0": 1}}}
    assert store.list_topics("prod") == ["a", "b"]
    assert store.list_partitions("prod", "b") == [0, 11]
    assert store.list_groups("prod") == ["group/with spaces"]


def test_a_failed_write_publishes_nothing(s3: S3Server, store: SegmentStore) -> None:
    class HalfWriter:
        name = extension = "parquet"
        compressions = ("none",)

        def write(self, sink: Any, chunks: Any, meta: Any, compression: str) -> None:
            sink.write(b"PAR1 half a segment")
            raise RuntimeError("boom")

    buffer = buffer_of(0, 9)
    with pytest.raises(RuntimeError, match="boom"):
        store.write_segment(HalfWriter(), buffer, buffer.meta("prod", "orders", 0))  # type: ignore[arg-type]
    assert objects_under(s3, store) == []


def test_a_streamed_segment_is_moved_to_its_key_whole(s3: S3Server, store: SegmentStore) -> None:
    """put_stream: a temporary key, then a server-side move; several upload parts."""
    chunks = [buffer_of(i * 4, i * 4 + 3, value=os.urandom(1024 * 1024)) for i in range(3)]
    meta = buffer_of(0, 11).meta("prod", "big", 0, level=1)
    ref = store.write_segment_chunks("parquet", iter(chunks), meta, "none")
    assert objects_under(s3, store) == [f"{store.describe().removeprefix('s3://')}/{ref.path}"]
    expected = [r.value for chunk in chunks for r in chunk.records()]
    assert [r.value for r in store.read_records(ref)] == expected
    assert store.read_meta(ref) == meta


def test_a_streamed_segment_failing_halfway_publishes_nothing(
    s3: S3Server, store: SegmentStore
) -> None:
    assert_broken_streams_publish_nothing(store, buffer_of, lambda: objects_under(s3, store))


def test_a_corrupt_object_names_its_s3_url(s3: S3Server, store: SegmentStore) -> None:
    buffer = buffer_of(0, 9)
    ref = store.write_segment("parquet", buffer, buffer.meta("prod", "orders", 0))
    fs = s3_filesystem(s3.endpoint, s3.access_key, s3.secret_key)
    with fs.open_output_stream(store.location(ref).removeprefix("s3://")) as stream:
        stream.write(b"not parquet at all")
    with pytest.raises(SegmentError, match=f"^segment s3://{s3.bucket}/.*/{ref.file_name}: "):
        store.read_meta(ref)


def test_a_store_at_the_bucket_root(s3: S3Server) -> None:
    bucket = s3.make_bucket(f"ktm-root-{uuid.uuid4().hex[:8]}")
    store = s3_store(s3, f"s3://{bucket}")
    store.check()
    buffer = buffer_of(0, 4)
    ref = store.write_segment("parquet", buffer, buffer.meta("prod", "orders", 0))
    assert store.location(ref) == f"s3://{bucket}/{ref.path}"
    (listed,) = store.list_segments("prod", "orders", 0)
    assert (listed.path, listed.size) == (ref.path, ref.size)
    assert list(store.read_records(listed)) == list(buffer.records())


# --- check() and errors: one line naming the URL and the cause ----------------------------------


def test_missing_bucket(s3: S3Server) -> None:
    store = s3_store(s3, "s3://no-such-bucket-ktm/prefix")
    with pytest.raises(StoreError) as caught:
        store.check()
    assert str(caught.value) == (
        "cannot use store s3://no-such-bucket-ktm/prefix: "
        "bucket 'no-such-bucket-ktm' does not exist"
    )
    assert not caught.value.retriable


def test_wrong_credentials(s3: S3Server) -> None:
    store = s3_store(s3, f"s3://{s3.bucket}/x", secret_key="not-the-secret")
    with pytest.raises(StoreError) as caught:
        store.check()
    assert str(caught.value) == (
        f"cannot use store s3://{s3.bucket}/x: access denied (check s3_access_key/s3_secret_key)"
    )
    buffer = buffer_of(0, 0)
    with pytest.raises(
        StoreError,
        match=rf"^cannot write segment s3://{s3.bucket}/x/prod/.*"
        r"\.parquet: access denied",
    ):
        store.write_segment("parquet", buffer, buffer.meta("prod", "orders", 0))


def test_unreachable_endpoint(s3: S3Server) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    store = s3_store(s3, "s3://bucket/p", endpoint=endpoint)
    with pytest.raises(StoreError) as caught:
        store.check()
    assert str(caught.value) == f"cannot use store s3://bucket/p: cannot connect to {endpoint}"
    assert caught.value.retriable


def test_log_dir_keeps_the_server_log(s3: S3Server) -> None:
    log_path = getattr(s3, "log_path", None)
    if log_path is None:
        pytest.skip("an external S3 server has no log here")
    assert Path(log_path).exists()


def test_a_server_that_does_not_come_up_fails_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho 'Port allocation failed: pretend' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(seaweed, "weed_binary", lambda: str(fake))
    server = seaweed.SeaweedS3(log_dir=tmp_path)
    with pytest.raises(seaweed.S3StartError) as caught:
        server.start(timeout=2)
    message = str(caught.value)
    assert "not ready within 2s after 3 attempt(s)" in message
    assert message.endswith("Port allocation failed: pretend")
    assert not server.is_running

"""Where segments and consumer-group snapshots live inside a store, and how their names parse.

    <prefix>/<cluster>/<topic>/<partition>/<level>/<first:020d>-<last:020d>.<ext>
    <prefix>/<cluster>/<topic>/_topic.json       (the partition count a backup planned)
    <prefix>/<cluster>/_groups/<percent-encoded group>.json

Offsets are zero-padded to 20 digits (int64 needs 19) so that a listing sorted by key, which is
what S3 returns, is also sorted by offset. Level 0 holds segments written by the backup loop;
compaction merges runs of level-N segments into one level-N+1 segment covering the same offsets.

Names are the whole index: listing a partition costs one LIST and no reads. Anything under the
prefix that does not parse (foreign files, our own temporary files) is ignored, never an error.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from urllib.parse import quote, unquote

SEGMENT_EXTENSIONS = ("parquet", "jsonl")  # each is also the name of its format (formats.py)
GROUPS_DIR = "_groups"
TOPIC_FILE = "_topic.json"  # beside the partition folders, so it never parses as one
GROUP_SUFFIX = ".json"
TEMP_PREFIX = ".tmp-"

# Kafka's own rule for topic names; cluster names follow it too so that both are safe path parts.
_NAME = re.compile(r"[A-Za-z0-9._-]+")
_MAX_TOPIC_LENGTH = 249
_SEGMENT_FILE = re.compile(r"(\d{20})-(\d{20})\.([a-z0-9]+)")
_TEMP_FILE = re.compile(re.escape(TEMP_PREFIX) + r"[0-9a-f]{32}-.+")


@dataclass(frozen=True)
class SegmentRef:
    """A segment as named in a listing: everything but the records, from the name alone.

    ``path`` is the key relative to the store's root. ``size`` (bytes) and ``modified`` (Unix
    seconds) come free with a listing and are None when the ref was built from a name only.
    """

    path: str
    cluster: str
    topic: str
    partition: int
    level: int
    first: int
    last: int
    format: str
    size: int | None = None
    modified: float | None = None

    @property
    def file_name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def check_cluster_name(cluster: str) -> str:
    """``cluster`` if it is usable as a path part, else ValueError saying what is allowed."""
    if not _NAME.fullmatch(cluster) or cluster in (".", ".."):
        raise ValueError(
            f"cluster name {cluster!r} cannot be used in a store path "
            "(allowed: letters, digits, '.', '_', '-')"
        )
    return cluster


def check_topic_name(topic: str) -> str:
    """``topic`` if it is a legal Kafka topic name and not the reserved ``_groups``."""
    if not _NAME.fullmatch(topic) or topic in (".", "..") or len(topic) > _MAX_TOPIC_LENGTH:
        raise ValueError(f"{topic!r} is not a legal Kafka topic name")
    if topic == GROUPS_DIR:
        raise ValueError(f"topic name {topic!r} is reserved for consumer-group snapshots")
    return topic


def _join(prefix: str, *parts: str) -> str:
    return "/".join(p for p in (prefix.rstrip("/"), *parts) if p)


def partition_dir(cluster: str, topic: str, partition: int, prefix: str = "") -> str:
    if partition < 0:
        raise ValueError(f"partition must be >= 0, got {partition}")
    return _join(prefix, check_cluster_name(cluster), check_topic_name(topic), str(partition))


def level_dir(cluster: str, topic: str, partition: int, level: int, prefix: str = "") -> str:
    if level < 0:
        raise ValueError(f"level must be >= 0, got {level}")
    return _join(partition_dir(cluster, topic, partition, prefix), str(level))


def segment_file_name(first: int, last: int, extension: str) -> str:
    if not 0 <= first <= last:
        raise ValueError(f"segment offsets must satisfy 0 <= first <= last, got {first}-{last}")
    if extension not in SEGMENT_EXTENSIONS:
        raise ValueError(f"unknown segment extension {extension!r}")
    return f"{first:020d}-{last:020d}.{extension}"


def segment_path(
    cluster: str,
    topic: str,
    partition: int,
    level: int,
    first: int,
    last: int,
    extension: str,
    prefix: str = "",
) -> str:
    """The key of a segment; raises ValueError for names that would not parse back."""
    directory = level_dir(cluster, topic, partition, level, prefix)
    return _join(directory, segment_file_name(first, last, extension))


def _canonical_int(text: str) -> int | None:
    """int(text) for plain decimal without sign or leading zeros ("0", "17"), else None."""
    if not text.isdigit() or not text.isascii() or (len(text) > 1 and text[0] == "0"):
        return None
    return int(text)


def parse_segment_path(path: str) -> SegmentRef | None:
    """The SegmentRef a key names (keeping ``path`` as given), or None if it is not a segment."""
    parts = path.split("/")
    if len(parts) < 5:
        return None
    cluster, topic, partition_text, level_text, name = parts[-5:]
    match = _SEGMENT_FILE.fullmatch(name)
    partition, level = _canonical_int(partition_text), _canonical_int(level_text)
    if match is None or partition is None or level is None:
        return None
    first, last, extension = int(match[1]), int(match[2]), match[3]
    if extension not in SEGMENT_EXTENSIONS or first > last:
        return None
    try:
        check_cluster_name(cluster)
        check_topic_name(topic)
    except ValueError:
        return None
    return SegmentRef(path, cluster, topic, partition, level, first, last, extension)


def temp_name(final_name: str) -> str:
    """A unique temporary name in the same folder, for write-then-rename."""
    return f"{TEMP_PREFIX}{uuid.uuid4().hex}-{final_name}"


def is_temp_name(name: str) -> bool:
    """True for names made by temp_name(): leftovers of a crashed write."""
    return _TEMP_FILE.fullmatch(name) is not None


def encode_group(group: str) -> str:
    """A file name for a consumer group id: percent-encoded, never hidden (no leading '.')."""
    if not group:
        raise ValueError("an empty consumer group id has no snapshot file name")
    encoded = quote(group, safe="")
    if encoded.startswith("."):
        encoded = "%2E" + encoded[1:]
    return encoded + GROUP_SUFFIX


def decode_group(file_name: str) -> str | None:
    """The group id a snapshot file name encodes, or None for other files."""
    if not file_name.endswith(GROUP_SUFFIX) or file_name.startswith("."):
        return None
    try:
        return unquote(file_name[: -len(GROUP_SUFFIX)], errors="strict")
    except UnicodeDecodeError:
        return None


def groups_dir(cluster: str, prefix: str = "") -> str:
    return _join(prefix, check_cluster_name(cluster), GROUPS_DIR)


def group_snapshot_path(cluster: str, group: str, prefix: str = "") -> str:
    """Key of the consumer-group offsets snapshot of ``group`` backed up from ``cluster``."""
    return _join(groups_dir(cluster, prefix), encode_group(group))


def topic_descriptor_path(cluster: str, topic: str, prefix: str = "") -> str:
    """Key of the small file a backup writes when it starts: the topic's partition count, so a
    restore knows every partition before each one has a segment."""
    return _join(prefix, check_cluster_name(cluster), check_topic_name(topic), TOPIC_FILE)

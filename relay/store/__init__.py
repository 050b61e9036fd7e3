"""The segment store: Kafka partitions backed up as immutable segment files, and read back.

A segment holds consecutive records of one partition (layout.py names it, records.py models
it, formats.py encodes it as Parquet or JSON lines). A SegmentStore (store.py) keeps segments
in a directory or an S3 bucket (fs.py) and writes them atomically; chain.py decides which
segments a restore replays and which a compaction merges. No Kafka and no Spark in here.
"""

from relay.store.chain import (
    ChainError,
    ChainLink,
    ChainPlan,
    ChainProblem,
    compaction_plan,
    merged_meta,
    plan_chain,
    restore_chain,
)
from relay.store.errors import SegmentError, StoreError
from relay.store.formats import (
    DEFAULT_COMPRESSION,
    DEFAULT_FORMAT,
    FORMATS,
    SegmentFormat,
    check_compression,
    get_format,
)
from relay.store.layout import SegmentRef, group_snapshot_path, segment_path
from relay.store.records import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    SegmentBuffer,
    SegmentMeta,
    StoredRecord,
)
from relay.store.store import SegmentStore, open_store

__all__ = [
    "CREATE_TIME",
    "ChainError",
    "ChainLink",
    "ChainPlan",
    "ChainProblem",
    "DEFAULT_COMPRESSION",
    "DEFAULT_FORMAT",
    "FORMATS",
    "LOG_APPEND_TIME",
    "SegmentBuffer",
    "SegmentError",
    "SegmentFormat",
    "SegmentMeta",
    "SegmentRef",
    "SegmentStore",
    "StoreError",
    "StoredRecord",
    "check_compression",
    "compaction_plan",
    "get_format",
    "group_snapshot_path",
    "merged_meta",
    "open_store",
    "plan_chain",
    "restore_chain",
    "segment_path",
]

"""The values config keys may take: each key's choices, and the lists they default to."""

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
LOG_LEVELS = ("debug", "info", "warning", "error")
ON_ERROR = ("stop", "skip")
ON_MISMATCH = ("stop", "continue")
ON_LOSS = ("warn", "stop")  # relay.losses
ON_RECREATE = ("stop", "follow")  # relay.pipelines.recreated
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
TOP_LEVEL_KEYS = (
    "app", "spark", "topics", "discover", "groups", "sources", "source_pool", "target",
    "filters", "store", "limits", "verify", "acls",
)  # fmt: skip
DISCOVER_STARTS = ("beginning", "end")
# The topic configs MirrorMaker 2 never copies (its DefaultConfigPropertyFilter): they describe
# the cluster (throttles, ISR size, leader election), not the data, or would change the copies.
MM2_CONFIG_EXCLUDE = (
    "follower.replication.throttled.replicas",
    "leader.replication.throttled.replicas",
    "message.timestamp.difference.max.ms",
    "message.timestamp.type",
    "unclean.leader.election.enable",
    "min.insync.replicas",
)
# [target].config_exclude's default: MirrorMaker 2's list, plus what a target refuses or must
# decide itself: tiered storage (a target without it refuses remote.storage.enable), vendor keys
# (Confluent's), and keys Kafka 4.0 removed (a 4.x target refuses them). A name ending in "*"
# stands for every name it begins.
CONFIG_EXCLUDE = (
    *MM2_CONFIG_EXCLUDE,
    "message.format.version",
    "message.downconversion.enable",
    "remote.storage.enable",
    "remote.log.*",
    "local.retention.*",
    "confluent.*",
)
SEGMENT_FORMATS = ("parquet", "jsonl")
SEGMENT_COMPRESSIONS = ("zstd", "snappy", "gzip", "lz4", "none")

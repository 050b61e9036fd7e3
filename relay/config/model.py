"""The configuration as frozen dataclasses. Each field read from TOML names its reader in its
metadata (`_reads`), so a key's type, default and checks sit on one line."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from relay.config.choices import (
    COMPRESSIONS,
    CONFIG_EXCLUDE,
    ISOLATION_LEVELS,
    LOG_LEVELS,
    ON_LOSS,
    ON_MISMATCH,
    ON_RECREATE,
)
from relay.config.readers import (
    _SECRET_WORDS,
    Secret,
    _acks,
    _bool,
    _cert_path,
    _choice,
    _duration,
    _int,
    _mechanism,
    _metrics_addr,
    _optional_names,
    _optional_text,
    _password,
    _reads,
    _servers,
    _size,
    _spark_conf,
    _text,
)
from relay.config.sections import (
    AclsConfig,
    DiscoverConfig,
    FilterConfig,
    GroupsConfig,
    StoreConfig,
    VerifyConfig,
)
from relay.errors import ConfigError


@dataclass(frozen=True)
class ClusterConfig:
    """How to reach one cluster: a `[[sources]]` entry, or the connection keys of `[target]`."""

    name: str = field(metadata=_reads(_text))  # "target" for the target
    servers: tuple[str, ...] = field(metadata=_reads(_servers))
    sasl_mechanism: str | None = field(default=None, metadata=_reads(_mechanism))
    username: str | None = field(default=None, metadata=_reads(_optional_text))
    password: Secret | None = field(default=None, metadata=_reads(_password))
    tls: bool = field(default=False, metadata=_reads(_bool))
    ca_cert_path: str | None = field(default=None, metadata=_reads(_cert_path))
    client_cert_path: str | None = field(default=None, metadata=_reads(_cert_path))
    client_key_path: str | None = field(default=None, metadata=_reads(_cert_path))
    # How its records are read: a [[sources]] cluster takes [source_pool].isolation_level; any
    # other (the target, a destination read back) is read whole: ktm writes no transactions.
    isolation_level: str = "read_uncommitted"
    # Its table in the config ("[target]", "[[sources]][1]"): errors name its keys. Where a
    # cluster is written is not what it is: not compared.
    section: str = field(default="", compare=False)

    def key(self, name: str) -> str:
        """How an error names one of its config keys: `[target].password`."""
        return f"{self.section or self.name}.{name}"

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"


@dataclass(frozen=True)
class TopicRoute:
    """One `[topics]` entry; partition None keeps each record's source partition number."""

    source: str
    target: str
    partition: int | None = None
    discovered: bool = False  # matched by a [discover] pattern, not named in [topics]

    @property
    def where(self) -> str:
        """Where the route comes from, for errors: the TOML key, or the pattern section."""
        return f"[discover] topic {self.source}" if self.discovered else f"[topics].{self.source}"


@dataclass(frozen=True)
class AppConfig:
    log_level: str = field(default="info", metadata=_reads(_choice, choices=LOG_LEVELS))
    metrics_addr: tuple[str, int] | None = field(
        default=("127.0.0.1", 7081), metadata=_reads(_metrics_addr)
    )
    group_id: str = field(default="ktm", metadata=_reads(_text))  # source consumer group
    # /healthz answers 503 when nothing was relayed for this long while there is lag.
    stuck_after: float = field(default=120.0, metadata=_reads(_duration, positive=True))
    # Session timeout of the group ktm processes on one config coordinate through: a process
    # that dies hands its partitions over after about this long.
    session_timeout: float = field(
        default=6.0, metadata=_reads(_duration, minimum=1.0, maximum=300.0)
    )
    # /metrics: a series per partition, or (false) per topic with partition "*": at 10,000
    # partitions a scrape is ~4 MB of per-partition series (docs: "Operating").
    partition_metrics: bool = field(default=True, metadata=_reads(_bool))


@dataclass(frozen=True)
class SparkConfig:
    master: str | None = field(default=None, metadata=_reads(_optional_text))  # None: local[N]
    app_name: str = field(default="ktm", metadata=_reads(_text))
    slots: int = field(default=0, metadata=_reads(_int, minimum=0))  # 0: ask Spark
    # How often the driver checks whether re-planning the tasks' partitions would pay off.
    rebalance_interval: float = field(default=30.0, metadata=_reads(_duration, positive=True))
    control_port: int = field(default=0, metadata=_reads(_int, minimum=0, maximum=65535))
    conf: tuple[tuple[str, str], ...] = field(default=(), metadata=_reads(_spark_conf))
    # Where the driver JVM's class archive is kept (relay.engine.class_archive); "": none.
    class_cache: str | None = field(default="~/.cache/ktm", metadata=_reads(_optional_text))


@dataclass(frozen=True)
class FetchConfig:
    """How tasks fetch from a source node (the `fetch_*` keys of `[source_pool]`), carried in
    the task specs. The defaults hold from loopback to a 300 ms round trip: one fetch per
    leader stays out as long as it takes (up to `timeout`), and a response may carry up to
    `max_bytes` (`partition_max_bytes` of each partition), far more than a 300 ms link at
    100 MB/s holds in flight. `min_bytes` and `max_wait` trade CPU for latency at low rates."""

    timeout: float = 30.0
    max_bytes: int = 64 * 1024 * 1024
    partition_max_bytes: int = 8 * 1024 * 1024
    min_bytes: int = 64 * 1024
    max_wait: float = 0.03
    in_flight: int = 2  # fetches on the wire per broker, each for its share of the partitions
    idle_wait: float = 0.5  # a fetch's wait once its partitions had nothing for a while

    def within(self, records_per_second: float, bytes_per_second: float) -> FetchConfig:
        """Fetch sizes that bring at most about `LIMITED_READ` seconds of a rate limit per
        answer (a task throttled to 1 MB/s must not get 64 MB at once). With a records limit
        alone, records are taken to be at least 64 bytes."""
        caps = [self.max_bytes]
        if bytes_per_second:
            caps.append(int(bytes_per_second * LIMITED_READ))
        if records_per_second:
            caps.append(int(records_per_second * LIMITED_READ * 64))
        most = max(MIN_LIMITED_FETCH, min(caps))
        # a fetch may not wait for more than it may bring: Tansu waits out far more than
        # max_wait then (30,000 records under a 5,000/s cap took 226 s instead of 6)
        return dataclasses.replace(
            self,
            max_bytes=most,
            partition_max_bytes=min(self.partition_max_bytes, most),
            min_bytes=min(self.min_bytes, most),
        )


LIMITED_READ = 0.2  # seconds of a [limits] rate one fetch answer may bring
MIN_LIMITED_FETCH = 16 * 1024  # bytes: a fetch smaller than this costs more than it saves


@dataclass(frozen=True)
class LimitsConfig:
    """`[limits]`: what the whole group of ktm processes on this config may read per second
    (0: no limit). Each process takes its share of the partitions it owns, each task of the
    partitions it serves; changed by restarting the processes one at a time."""

    records_per_second: int = field(default=0, metadata=_reads(_int, minimum=0))
    bytes_per_second: int = field(default=0, metadata=_reads(_size, minimum=0))

    @property
    def any(self) -> bool:
        return bool(self.records_per_second or self.bytes_per_second)


@dataclass(frozen=True)
class SourcePoolConfig:
    healthcheck_interval: float = field(default=3.0, metadata=_reads(_duration, positive=True))
    # A health check takes ~4 round trips: 2 s holds up to a 300 ms link.
    request_timeout: float = field(default=2.0, metadata=_reads(_duration, positive=True))
    offset_lag_threshold: int = field(default=1000, metadata=_reads(_int, minimum=0))
    max_retries: int = field(default=-1, metadata=_reads(_int, minimum=-1))  # -1: forever
    backoff_min: float = field(default=1.0, metadata=_reads(_duration))
    backoff_max: float = field(default=10.0, metadata=_reads(_duration))
    randomize_initial: bool = field(default=False, metadata=_reads(_bool))
    # What to do when the record at the resume point on a new node differs from what was relayed.
    on_mismatch: str = field(default="stop", metadata=_reads(_choice, choices=ON_MISMATCH))
    # Source records deleted (retention) before they were read: "warn" goes on at the log start,
    # counting them; "stop" halts the partition there (relay.losses).
    on_loss: str = field(default="warn", metadata=_reads(_choice, choices=ON_LOSS))
    # A source topic deleted and created again under its name while relayed: "stop" halts its
    # partitions where they were copied up to; "follow" copies the new topic from its log start
    # into the same destination, its copies named by a new incarnation (relay.provenance.header).
    on_recreate: str = field(default="stop", metadata=_reads(_choice, choices=ON_RECREATE))
    # Records of aborted and still-open source transactions: "read_committed" never copies them
    # (an open one's records wait until it commits), "read_uncommitted" copies every record.
    # Every read of a [[sources]] cluster (relay, backup, verify, check) uses it.
    isolation_level: str = field(
        default="read_committed", metadata=_reads(_choice, choices=ISOLATION_LEVELS)
    )
    # How the relay and backup tasks fetch (FetchConfig says why the defaults are what they are).
    fetch_timeout: float = field(default=30.0, metadata=_reads(_duration, minimum=1.0))
    fetch_max_bytes: int = field(
        default=64 * 1024 * 1024, metadata=_reads(_size, minimum=64 * 1024)
    )
    fetch_partition_max_bytes: int = field(
        default=8 * 1024 * 1024, metadata=_reads(_size, minimum=16 * 1024)
    )
    fetch_min_bytes: int = field(default=64 * 1024, metadata=_reads(_size, minimum=1))
    fetch_max_wait: float = field(default=0.03, metadata=_reads(_duration, maximum=10.0))
    # Fetches on the wire per source broker, each for its share of the task's partitions: a
    # broker that answers less than a round trip's worth per fetch (Tansu: ~5 MB, one
    # partition's data) still keeps a long link busy. Only while its answers are full: a
    # broker answering light gets one (relay.clients.batch_fetch).
    fetch_in_flight: int = field(default=2, metadata=_reads(_int, minimum=1, maximum=8))
    # A fetch's wait once its partitions had nothing for a while (0: never more than
    # fetch_max_wait): answered at the first record by Apache Kafka, so an idle relay costs
    # little and loses no latency.
    fetch_idle_wait: float = field(default=0.5, metadata=_reads(_duration, maximum=10.0))

    @property
    def fetch(self) -> FetchConfig:
        return FetchConfig(
            self.fetch_timeout,
            self.fetch_max_bytes,
            self.fetch_partition_max_bytes,
            self.fetch_min_bytes,
            self.fetch_max_wait,
            self.fetch_in_flight,
            self.fetch_idle_wait,
        )


@dataclass(frozen=True)
class TargetConfig:
    cluster: ClusterConfig
    compression: str = field(default="none", metadata=_reads(_choice, choices=COMPRESSIONS))
    # How long a produced batch may wait for more before it is sent. 0: a task step queues
    # every partition's batches and wakes the sender once, so waiting merges nothing more on
    # the batch path and only delays each record (measured: docs/performance.md "Rates").
    linger: float = field(default=0.0, metadata=_reads(_duration))
    batch_size: int = field(
        default=262144, metadata=_reads(_int, minimum=1024, maximum=64 * 1024 * 1024)
    )
    max_retries: int = field(default=5, metadata=_reads(_int, minimum=-1))  # -1: forever
    backoff_min: float = field(default=0.5, metadata=_reads(_duration))
    backoff_max: float = field(default=10.0, metadata=_reads(_duration))
    acks: str = field(default="all", metadata=_reads(_acks))
    request_timeout: float = field(default=30.0, metadata=_reads(_duration, positive=True))
    # Produce requests on the wire per connection (idempotence allows up to five): across a
    # long link one at a time would carry one batch per partition per round trip.
    max_in_flight: int = field(default=5, metadata=_reads(_int, minimum=1, maximum=5))
    # Bytes a task may have written and not yet acknowledged before it stops fetching: a slow
    # or far target makes the task wait instead of queueing records until they expire.
    buffer_memory: int = field(
        default=64 * 1024 * 1024, metadata=_reads(_size, minimum=1024 * 1024)
    )
    # Not a key: the largest batch the destination takes, its max.message.bytes where its
    # topics describe one (relay.pipelines.target_fit), else about Kafka's default.
    max_batch_bytes: int = 1_000_000
    # ktm relay creates a missing destination topic (and adds partitions to one that has fewer
    # than its source) only when asked: a mistyped destination must not become a new topic.
    create_topics: bool = field(default=False, metadata=_reads(_bool))
    replication_factor: int = field(  # -1: the broker's default.replication.factor
        default=-1, metadata=_reads(_int, minimum=-1, maximum=32767)
    )
    # Topic configs copied to a created topic: those set on the source topic, named in
    # config_include ([] = all of them) and not in config_exclude (MirrorMaker 2's list and
    # what a target refuses: relay.config.choices.CONFIG_EXCLUDE); "name*": names beginning so.
    config_include: tuple[str, ...] = field(default=(), metadata=_reads(_optional_names))
    config_exclude: tuple[str, ...] = field(
        default=CONFIG_EXCLUDE, metadata=_reads(_optional_names)
    )
    # Keep those configs of every destination topic in step with its source topic while
    # relaying (set, changed, deleted back to the default), every config_sync_interval. Off by
    # default: unlike MirrorMaker 2's own "source.topic" copies, a destination may be a topic
    # the target's owners configure (relay.pipelines.relay.config_sync).
    config_sync: bool = field(default=False, metadata=_reads(_bool))
    config_sync_interval: float = field(default=60.0, metadata=_reads(_duration, minimum=1.0))


@dataclass(frozen=True)
class Config:
    path: str
    app: AppConfig
    spark: SparkConfig
    topics: tuple[TopicRoute, ...]
    sources: tuple[ClusterConfig, ...]  # () when the command reads no cluster (restore)
    source_pool: SourcePoolConfig
    target: TargetConfig | None  # None when the command writes to no cluster (backup)
    filters: tuple[FilterConfig, ...]
    store: StoreConfig | None = None
    discover: DiscoverConfig = DiscoverConfig()
    groups: GroupsConfig = GroupsConfig()
    acls: AclsConfig = AclsConfig()
    limits: LimitsConfig = LimitsConfig()
    verify: VerifyConfig = VerifyConfig()

    def need_target(self) -> TargetConfig:
        if self.target is None:
            raise ConfigError("[target]: missing section (the cluster to write to)")
        return self.target

    def need_store(self) -> StoreConfig:
        if self.store is None:
            raise ConfigError("[store]: missing section (where segments live)")
        return self.store

    def redacted(self) -> dict[str, Any]:
        """Everything as plain dicts and lists, for `--debug`, with every secret shown as "***"."""
        dumped: dict[str, Any] = _dump(self)
        return dumped


def _dump(value: Any, name: str = "") -> Any:
    if isinstance(value, Secret) or (name and any(w in name.lower() for w in _SECRET_WORDS)):
        return None if value is None else "***"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        dumped = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            # conf/config hold (key, value) pairs: shown as tables so that their keys get redacted.
            dumped[f.name] = _dump(dict(item) if f.name in ("conf", "config") else item, f.name)
        return dumped
    if isinstance(value, Mapping):
        return {key: _dump(item, str(key)) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_dump(item) for item in value]
    return value

"""Kafka queries the driver (and a retried task) makes: topic metadata, offset bounds (a
partition's real end: relay.clients.ends), topic and broker configs, tail reads (consumer
groups: relay.clients.consumer_groups).

The modules of `relay.clients` are the only code that imports kafka-python.
Everything here must be correct for Apache Kafka; where Tansu (the test broker) differs, the
workaround is one that is also right for Kafka, and a comment says so.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import (
    IncompatibleBrokerVersion,
    KafkaTimeoutError,
    UnsupportedVersionError,
)

from relay.clients import committed
from relay.clients.batch_fetch import TP, BatchFetcher
from relay.clients.ends import EndMemo, end_probe, listing, real_end_offsets
from relay.clients.kept import Ahead, kept
from relay.clients.login import check_login, login_problem
from relay.clients.seed import Seed, seed_of
from relay.clients.settings import (  # noqa: F401
    NO_CLIENT_METRICS,
    client_settings,
    describe,
    is_retriable,
    never_create_topics,
)
from relay.config import ClusterConfig, FetchConfig

log = logging.getLogger(__name__)


@contextmanager
def admin_client(cluster: ClusterConfig, timeout: float = 10.0) -> Iterator[KafkaAdminClient]:
    """An admin client (kept open across calls inside `relay.clients.kept.keep_clients`)."""

    def make() -> KafkaAdminClient:
        check_login(cluster, timeout)
        try:
            return never_create_topics(KafkaAdminClient(**client_settings(cluster, timeout)))
        except KafkaTimeoutError as exc:  # kafka-python 3 raises this when bootstrap fails
            raise _unreachable(cluster, timeout) from exc

    with kept(("admin", cluster, timeout), make, lambda admin: admin.close()) as admin:
        yield admin


@contextmanager
def probe_consumer(
    cluster: ClusterConfig, timeout: float = 10.0, group_id: str | None = None
) -> Iterator[KafkaConsumer]:
    """A consumer for metadata and tail reads: manual assignment only, never subscribes (kept
    open across calls inside `relay.clients.kept.keep_clients`).

    With `group_id` it can also read committed offsets; it never joins the group.
    """

    with kept(*_probe(cluster, timeout, group_id)) as consumer:
        yield consumer


def _probe(cluster: ClusterConfig, timeout: float, group_id: str | None) -> Ahead:
    """How `probe_consumer` keeps its consumer: the key, the making, the closing."""
    make = functools.partial(_make_probe, cluster, timeout, group_id)
    return Ahead(("probe", cluster, timeout, group_id), make, _close_probe)


def _make_probe(cluster: ClusterConfig, timeout: float, group_id: str | None) -> KafkaConsumer:
    check_login(cluster, timeout)
    try:
        consumer = KafkaConsumer(
            **client_settings(cluster, timeout),
            **NO_CLIENT_METRICS,
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
            isolation_level=cluster.isolation_level,
        )
    except KafkaTimeoutError as exc:  # kafka-python 3 raises this when bootstrap fails
        raise _unreachable(cluster, timeout) from exc
    return never_create_topics(consumer)


def _close_probe(consumer: KafkaConsumer) -> None:
    consumer.close(autocommit=False)


def offset_readers(
    cluster: ClusterConfig,
    topics: Iterable[str],
    timeout: float,
    on_seed: Callable[[Seed], None] | None = None,
) -> list[Ahead]:
    """The clients `offset_bounds(cluster, ...)` reads with (its probe consumer, its end
    fetcher with the leaders of `topics` connected), to open ahead (relay.clients.kept.HeadStart):
    each is a bootstrap of two or three round trips, over a second across a long link. Once the
    fetcher knows the topics, `on_seed` is given its metadata (relay.clients.seed)."""
    end, wanted = end_probe(cluster, timeout), frozenset(topics)

    def warmed() -> BatchFetcher:
        fetcher: BatchFetcher = end.make()
        fetcher.warm(wanted, timeout)
        seed = fetcher.seed(wanted) if on_seed is not None else None
        if seed is not None and on_seed is not None:
            on_seed(seed)
        return fetcher

    return [_probe(listing(cluster), timeout, None), end._replace(make=warmed)]


class Unsupported(Exception):
    """The broker does not implement an admin call (Tansu lacks CreatePartitions)."""


@contextmanager
def supported(what: str) -> Iterator[None]:
    try:
        yield
    except (IncompatibleBrokerVersion, UnsupportedVersionError) as exc:
        raise Unsupported(f"the broker does not implement {what} ({exc})") from exc


def _unreachable(cluster: ClusterConfig, timeout: float) -> Exception:
    """Why bootstrap failed. kafka-python only times out (it logs the cause); a refused TLS
    handshake or SASL login is not worth retrying, and its reason is what the operator needs:
    a ConfigError naming the key (relay/clients/login.py)."""
    if cluster.tls or cluster.sasl_mechanism:
        problem = login_problem(cluster, timeout)
        if problem is not None:
            return problem
    return ConnectionError(f"no broker answered within {timeout:g}s")


def partition_counts(
    cluster: ClusterConfig, topics: Iterable[str], timeout: float
) -> dict[str, int]:
    """Partition count of each existing topic among `topics`; missing topics are left out.

    Asks for the metadata of ALL topics, which names none (see settings.never_create_topics
    for why naming one used to create it).
    """
    wanted = set(topics)
    return {t: n for t, n in all_partition_counts(cluster, timeout).items() if t in wanted}


def all_partition_counts(cluster: ClusterConfig, timeout: float) -> dict[str, int]:
    """Every topic of the cluster with its partition count (internal ones too)."""
    with admin_client(cluster, timeout) as admin:
        described = admin.describe_topics()  # no names: every topic, nothing created
    return {
        topic["name"]: len(topic["partitions"])
        for topic in described
        if not topic.get("error_code")
    }


def offset_bounds(
    cluster: ClusterConfig, tps: list[TP], timeout: float, *, settled: bool = False
) -> tuple[dict[TP, int], dict[TP, int]]:
    """(beginning, real end) offset of each partition. See `real_end_offsets`. `settled`: the
    end once the leader committed what it had appended (relay.clients.committed)."""
    parts = [TopicPartition(*tp) for tp in tps]
    with probe_consumer(listing(cluster), timeout) as consumer:
        require_topics(consumer, cluster, tps)
        answer = committed.asking(consumer, parts, timeout) if settled else dict
        begin = consumer.beginning_offsets(parts, timeout_ms=int(timeout * 1000))
        ends = answer()  # asked before the high watermark is read
        end = real_end_offsets(cluster, consumer, parts, begin, timeout)
        limit = functools.partial(tail_wait_limit, cluster, timeout)
        committed.await_commits(cluster, consumer, ends, begin, end, timeout, limit)
    return {tuple(tp): v for tp, v in begin.items()}, {tuple(tp): v for tp, v in end.items()}


_lag_limits: dict[ClusterConfig, str | None] = {}  # a broker setting, asked once a process


def tail_wait_limit(cluster: ClusterConfig, timeout: float) -> float:
    """committed.settle_limit for the cluster's brokers (one describes it: they agree), asked
    only when a tail waits; a describe that failed is asked again the next time."""
    name = "replica.lag.time.max.ms"
    if cluster not in _lag_limits:
        try:
            _lag_limits[cluster] = broker_settings(cluster, [name], timeout).get(name)
        except Exception as exc:  # noqa: BLE001 - the default limit holds: said, not fatal
            log.debug("describing %s of %s: %s", name, describe(cluster), exc)
            return committed.settle_limit(None)
    return committed.settle_limit(_lag_limits[cluster])


def metadata_seed(cluster: ClusterConfig, topics: Iterable[str], timeout: float) -> Seed | None:
    """What the probe that read `cluster`'s offset bounds knows of `topics`, for the workers
    (relay.clients.seed): no round trip inside the `keep_clients` block that read them."""
    wanted = set(topics)
    with probe_consumer(listing(cluster), timeout) as consumer:
        for topic in wanted:
            consumer.partitions_for_topic(topic)  # known by then: asked only if it was not
        return seed_of(consumer, cluster.servers, wanted)


def require_topics(consumer: KafkaConsumer, cluster: ClusterConfig, tps: Iterable[TP]) -> None:
    """LookupError naming the topics among `tps` the cluster does not have (from the all-topics
    metadata, which names none): a missing topic is an answer, not a wait for metadata."""
    missing = sorted({topic for topic, _ in tps} - set(consumer.topics()))
    if missing:
        raise LookupError(f"topic {', '.join(missing)} missing on {describe(cluster)}")


def health_end_offsets(
    cluster: ClusterConfig, tps: list[TP], timeout: float, memo: EndMemo | None = None
) -> dict[TP, int]:
    """A node's real end offsets, or an exception if it cannot answer within `timeout`
    (LookupError at once when the node lacks a topic, e.g. it came back empty). `memo`: see
    `real_end_offsets`."""
    with probe_consumer(listing(cluster), timeout) as consumer:
        require_topics(consumer, cluster, tps)
        parts = [TopicPartition(*tp) for tp in tps]
        begin = consumer.beginning_offsets(parts, timeout_ms=int(timeout * 1000))
        ends = real_end_offsets(cluster, consumer, parts, begin, timeout, memo)
    return {(tp.topic, tp.partition): end for tp, end in ends.items()}


def records_at(
    cluster: ClusterConfig, wanted: dict[TP, int], timeout: float
) -> dict[TP, ConsumerRecord | None]:
    """The record at each (partition, offset), or None where that offset holds no record.
    Read uncommitted whatever the cluster's isolation level: whether two nodes' logs line up
    does not depend on how their transactions ended (a destination an older ktm wrote read
    uncommitted may end on an aborted record)."""
    found: dict[TP, ConsumerRecord | None] = {}
    with probe_consumer(listing(cluster), timeout) as consumer:
        require_topics(consumer, cluster, wanted)
        for key, offset in wanted.items():
            records = read_range(consumer, TopicPartition(*key), offset, offset + 1, timeout)
            found[key] = records[0] if records else None
    return found


def read_range(
    consumer: KafkaConsumer, tp: TopicPartition, lower: int, upper: int, timeout: float
) -> list[ConsumerRecord]:
    """Records with lower <= offset < upper. Offsets may have gaps (compaction, markers)."""
    consumer.assign([tp])
    consumer.seek(tp, lower)
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while consumer.position(tp) < upper:
        if time.monotonic() > deadline:
            raise TimeoutError(f"reading {tp.topic}[{tp.partition}] {lower}..{upper} timed out")
        batch = consumer.poll(timeout_ms=200).get(tp, [])
        out.extend(r for r in batch if r.offset < upper)
    return out


def topic_configs(
    cluster: ClusterConfig, topics: Iterable[str], timeout: float, set_only: bool = False
) -> dict[str, dict[str, str]]:
    """Every config the cluster describes for each topic (DescribeConfigs, defaults included),
    or with `set_only` those set on the topic itself (not defaults, not the broker's: what a
    copy of the topic takes over). A topic it describes nothing of is {}, and left out with
    `set_only` (Tansu describes nothing; Apache Kafka describes every topic, most with nothing
    set). Asks for all config names: naming one makes Tansu (the test broker) drop the
    connection, and every broker answers "all" the same."""
    resources = [ConfigResource("TOPIC", topic) for topic in sorted(set(topics))]
    if not resources:
        return {}
    with admin_client(cluster, timeout) as client, supported("DescribeConfigs"):
        described = client.describe_configs(resources, config_filter="all")
    return {
        topic: {
            name: _config_value(data)
            for name, data in (configs or {}).items()
            if not set_only or _source(data) == "DYNAMIC_TOPIC_CONFIG"
        }
        for topic, configs in (described.get("topic") or {}).items()
        if configs or not set_only
    }


def broker_settings(cluster: ClusterConfig, names: Iterable[str], timeout: float) -> dict[str, str]:
    """Settings of one of the cluster's brokers (DescribeConfigs of the BROKER resource), as it
    describes them: {} where it describes nothing (Tansu)."""
    with admin_client(cluster, timeout) as client, supported("DescribeConfigs"):
        brokers = client.describe_cluster()["brokers"]
        if not brokers:
            return {}
        resource = ConfigResource("BROKER", str(brokers[0]["broker_id"]))
        described = client.describe_configs([resource], config_filter="all")
    configs = next(iter((described.get("broker") or {}).values()), None) or {}
    return {name: _config_value(configs[name]) for name in names if name in configs}


def _source(data: object) -> str | None:
    return data.get("config_source") if isinstance(data, dict) else None


def _config_value(data: object) -> str:
    """A described config's value: kafka-python gives a dict per config (or the bare value)."""
    value = data.get("value") if isinstance(data, dict) else data
    return "" if value is None else str(value)


# A KRaft controller refuses a request that would write more than 10,000 metadata records (a
# topic and each of its partitions is one), with PolicyViolationError for every topic in it
# (seen: 2,000 topics of 5 partitions). Half that leaves room.
MAX_RECORDS_PER_REQUEST = 5_000


def in_requests(counts: Mapping[str, int]) -> list[dict[str, int]]:
    """`counts` (topic: partitions) split into requests of at most MAX_RECORDS_PER_REQUEST
    records each, a topic counting 1 plus its partitions (a larger topic goes alone)."""
    requests: list[dict[str, int]] = []
    size = 0
    for name, partitions in counts.items():
        if not requests or size + 1 + partitions > MAX_RECORDS_PER_REQUEST:
            requests.append({})
            size = 0
        requests[-1][name] = partitions
        size += 1 + partitions
    return requests


def grow_partitions(cluster: ClusterConfig, counts: dict[str, int], timeout: float) -> None:
    """Add partitions to topics, up to the given totals (Unsupported: no CreatePartitions)."""
    with admin_client(cluster, timeout) as admin, supported("CreatePartitions"):
        for part in in_requests(counts):  # totals: more than what is added, never less
            admin.create_partitions(part)


def probe(
    cluster: ClusterConfig, positions: Mapping[TP, int], fetch: FetchConfig
) -> tuple[float, dict[TP, BaseException]]:
    """One fetch of every partition at its position, as a task would send it (ktm check):
    how long the answer took, and the partitions that failed, with their errors."""
    # min_bytes 1: answered as soon as anything is there (the configured wait, not 0: Tansu
    # answers a fetch that may not wait at all with no partition)
    fetcher = BatchFetcher(
        cluster,
        fetch.timeout,
        max_wait=fetch.max_wait,
        min_bytes=1,
        partition_max_bytes=fetch.partition_max_bytes,
        max_bytes=fetch.max_bytes,
    )
    try:
        fetcher.fetch(positions, fetch.timeout)  # connections and metadata: not timed
        began = time.monotonic()
        found = fetcher.fetch(positions, fetch.timeout)
        took = time.monotonic() - began
    finally:
        fetcher.close()
    return took, {key: f.error for key, f in found.items() if f.error is not None}

"""Every use of a library's private parts, each behind a small named function.

ktm's speed rests on a few internals of kafka-python 3.0 (its producer's accumulator and sender,
its coordinator, its admin client's requests) and of PySpark 4.3 (the context's gateway and
accumulator server). They live here, and only here, with one policy:

- at start-up `check()` looks for every one that can be seen on the classes; one without a
  public fallback missing stops ktm with one line naming the library and the version ktm
  needs; one with a fallback missing is said in one warning, and the fallback runs;
- each function below either does its job or raises `Missing` (never an AttributeError from
  deep inside), so a caller with a fallback catches it and the others fail with that line;
- tests/integration/test_internals.py lists each internal on real objects: an upgrade that
  moves one fails it. setup.cfg pins both libraries to the versions that test passed on.

The modules of relay.clients call the kafka-python ones; relay.engine.spark the PySpark ones.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from relay.errors import KtmError

log = logging.getLogger(__name__)

KAFKA_PYTHON = "3.0"  # the versions these were read from, and tested on
PYSPARK = "4.3"


class Missing(KtmError):
    """A library internal ktm uses is not where it was: the library changed (exit 1)."""

    def __init__(self, what: str, library: str = "kafka-python"):
        wanted = KAFKA_PYTHON if library == "kafka-python" else PYSPARK
        super().__init__(
            f"{library} {wanted} is needed (found {_installed(library)}): {what} is missing"
        )


@dataclass(frozen=True)
class Internal:
    what: str  # as the message names it
    library: str
    present: Callable[[], bool]  # seen on the classes, without an instance
    fallback: str | None  # what ktm does without it; None: it cannot run without it


def check() -> None:
    """At start-up: raise Missing for the first required internal that is gone; warn once for
    each missing one that has a fallback."""
    for internal in INTERNALS:
        if internal.present():
            continue
        if internal.fallback is None:
            raise Missing(internal.what, internal.library)
        log.warning("%s; %s", Missing(internal.what, internal.library), internal.fallback)


# ---- kafka-python: the producer ---------------------------------------------------------------


def accumulator(producer: Any) -> Any:
    """The producer's RecordAccumulator: batches per partition, waiting to be sent."""
    return _attr(producer, "_accumulator", "KafkaProducer._accumulator")


def sender(producer: Any) -> Any:
    """The producer's Sender: the I/O thread that drains the accumulator."""
    return _attr(producer, "_sender", "KafkaProducer._sender")


def partition_queue(acc: Any, tp: Any) -> Any:
    """The deque of batches of one partition (hold `partition_lock` while using it)."""
    return _attr(acc, "_batches", "RecordAccumulator._batches")[tp]


def partition_lock(acc: Any, tp: Any) -> Any:
    """The lock that guards one partition's queue, as the accumulator takes it."""
    return _attr(acc, "_tp_lock", "RecordAccumulator._tp_lock")(tp)


@contextmanager
def appending(acc: Any) -> Iterator[None]:
    """An append in progress: a flush waits for it (what RecordAccumulator.append does)."""
    counter = _attr(acc, "_appends_in_progress", "RecordAccumulator._appends_in_progress")
    counter.increment()
    try:
        yield
    finally:
        counter.decrement()


def track(acc: Any, batch: Any) -> None:
    """Count a batch as incomplete: flush() waits for it, expiry sees it."""
    _attr(acc, "_incomplete", "RecordAccumulator._incomplete").add(batch)


def still_incomplete(acc: Any, batch: Any) -> bool:
    """Whether the accumulator still tracks `batch` (a batch it split is dropped from it)."""
    incomplete = _attr(acc, "_incomplete", "RecordAccumulator._incomplete")
    batches = _attr(incomplete, "_incomplete", "IncompleteProducerBatches._incomplete")
    with _attr(incomplete, "_lock", "IncompleteProducerBatches._lock"):
        return batch in batches


def accumulator_closed(acc: Any) -> bool:
    return bool(_attr(acc, "_closed", "RecordAccumulator._closed"))


def known_partitions(producer: Any, topic: str, partition: int | None = None) -> set[int]:
    """A topic's partitions, from the producer's metadata, waited for if not known yet; with
    `partition`, its metadata is refreshed until that one is in it too (a topic grown while
    running: kafka-python learns of new partitions only at its next refresh, up to
    `metadata.max.age.ms`, 5 minutes, later) or `max_block_ms` passed."""
    metadata = _attr(producer, "_metadata", "KafkaProducer._metadata")
    found = metadata.partitions_for_topic(topic)
    if found is None:
        wait = _attr(producer, "_wait_on_metadata", "KafkaProducer._wait_on_metadata")
        found = wait(topic, producer.config["max_block_ms"])
    deadline = time.monotonic() + producer.config["max_block_ms"] / 1000
    while partition is not None and partition not in found and time.monotonic() < deadline:
        metadata.request_update()
        sender(producer).wakeup()
        time.sleep(METADATA_PAUSE)
        found = metadata.partitions_for_topic(topic) or set()
    return set(found)


METADATA_PAUSE = 0.05  # seconds between two looks at a producer's metadata being refreshed


def know_topics(producer: Any, topics: Iterable[str]) -> None:
    """The partitions of every one of `topics` in the producer's metadata, in about one
    metadata request: kafka-python waits for one topic at a time, and each of its requests
    names every topic asked for so far (2,000 topics: 2,000 requests of up to 2,000 topics).
    A topic known from the bootstrap but not tracked would be dropped by the next update:
    every one is tracked first."""
    metadata = _attr(producer, "_metadata", "KafkaProducer._metadata")
    add_topic = _attr(sender(producer), "add_topic", "Sender.add_topic")
    topics = list(topics)
    for topic in topics:
        add_topic(topic)
    for topic in topics:
        if metadata.partitions_for_topic(topic) is None:
            known_partitions(producer, topic)  # the first wait brings the others too


def is_transactional(producer: Any) -> bool:
    manager = getattr(producer, "_transaction_manager", None)
    return manager is not None and bool(manager.is_transactional())


def on_batch_failure(producer: Any, hook: Callable[[Any, Any], None]) -> None:
    """Call `hook(batch, outcome future)` on the I/O thread after kafka-python decided what
    becomes of a failed batch (retry, split, or fail)."""
    the_sender = sender(producer)
    dispatch = _attr(the_sender, "_dispatch_error", "Sender._dispatch_error")

    def dispatch_and_hook(batch: Any, exception: Any, partition_response: Any) -> Any:
        outcome = dispatch(batch, exception, partition_response)
        hook(batch, batch.produce_future)
        return outcome

    the_sender._dispatch_error = dispatch_and_hook


def on_batch_split(acc: Any, hook: Callable[[Any, list[Any]], None]) -> None:
    """Call `hook(batch, halves)` when the sender splits a batch a broker refused as too large
    into halves it re-enqueues (the first entries of the partition's queue right after)."""
    split = _attr(acc, "split_and_reenqueue", "RecordAccumulator.split_and_reenqueue")

    def split_and_hook(batch: Any, now: float | None = None) -> int:
        count = split(batch, now)
        with partition_lock(acc, batch.topic_partition):
            halves = list(partition_queue(acc, batch.topic_partition))[:count]
        hook(batch, halves)
        return int(count)

    acc.split_and_reenqueue = split_and_hook


def several_batches_in_flight(producer: Any) -> None:
    """Let up to max_in_flight batches of one partition travel at once under idempotence.

    kafka-python mutes a partition while one of its batches is out whenever idempotence is on
    (`guarantee_message_order`); its drain assigns each batch the next sequence number and its
    sender treats a duplicate sequence as success, as the Java client does with five in flight.
    A connection with all its requests out then reads as not ready, and the sender would poll
    for `connection_delay`: 0 for a connected node, a busy loop; such a node's delay is "until an
    answer comes" (the poll wakes on it)."""
    the_sender = sender(producer)
    config = _attr(the_sender, "config", "Sender.config")
    if "guarantee_message_order" not in config:
        raise Missing("Sender.config['guarantee_message_order']")
    client = _attr(the_sender, "_client", "Sender._client")
    config["guarantee_message_order"] = False
    delay = client.connection_delay

    def busy_aware(node_id: int) -> float:
        if client.connected(node_id) and not client.is_ready(node_id):
            return float("inf")
        return float(delay(node_id))

    client.connection_delay = busy_aware


def on_reenqueue(acc: Any, reenqueue: Callable[[Any, float | None], None]) -> None:
    """Let `reenqueue(batch, now)` put a batch the sender retries back in its partition's queue
    (kafka-python puts it first, `appendleft`). Called on the I/O thread."""
    _attr(acc, "reenqueue", "RecordAccumulator.reenqueue")
    acc.reenqueue = lambda batch, now=None: reenqueue(batch, now)


def on_drain(acc: Any, hook: Callable[[dict[int, list[Any]]], None]) -> None:
    """Call `hook({node id: batches})` with what each drain took from the queues (I/O thread)."""
    drain = _attr(acc, "drain", "RecordAccumulator.drain")

    def drain_and_hook(cluster: Any, nodes: Any, max_size: int, now: float | None = None) -> Any:
        drained = drain(cluster, nodes, max_size, now=now)
        hook(drained)
        return drained

    acc.drain = drain_and_hook


def on_answered(producer: Any, hook: Callable[[Any], None]) -> None:
    """Call `hook(batch)` once a batch is no longer in flight: acknowledged, failed, split or
    re-enqueued (kafka-python drops it from `Sender._in_flight_batches` then; I/O thread)."""
    the_sender = sender(producer)
    forget = _attr(
        the_sender,
        "_maybe_remove_from_inflight_batches",
        "Sender._maybe_remove_from_inflight_batches",
    )

    def forget_and_hook(batch: Any) -> None:
        forget(batch)
        hook(batch)

    the_sender._maybe_remove_from_inflight_batches = forget_and_hook


def batches_in_flight(producer: Any, tp: Any) -> list[Any]:
    """The batches of one partition sent and not answered yet (I/O thread only)."""
    in_flight = _attr(sender(producer), "_in_flight_batches", "Sender._in_flight_batches")
    return [batch for _, batch in in_flight.get(tp, ())]


def muted_partitions(acc: Any) -> set[Any]:
    """The partitions the sender neither drains nor counts as ready (I/O thread only)."""
    muted = _attr(acc, "muted", "RecordAccumulator.muted")
    if not isinstance(muted, set):
        raise Missing("RecordAccumulator.muted")
    return muted


def on_batch_error(producer: Any, translate: Callable[[Any, Any], Any]) -> None:
    """Let `translate(batch, error)` replace the error kafka-python decides a failed batch's
    fate by (retry, split or fail), before it decides (I/O thread)."""
    the_sender = sender(producer)
    dispatch = _attr(the_sender, "_dispatch_error", "Sender._dispatch_error")

    def translate_and_dispatch(batch: Any, exception: Any, partition_response: Any) -> Any:
        return dispatch(batch, translate(batch, exception), partition_response)

    the_sender._dispatch_error = translate_and_dispatch


def stop_sending(producer: Any, timeout: float) -> None:
    """End the I/O thread without sending what is queued (every delivery not completed fails)."""
    the_sender = sender(producer)
    the_sender.force_close()
    the_sender.join(timeout)


def wake_sender(producer: Any) -> None:
    sender(producer).wakeup()


# ---- kafka-python: consumers, groups, admin, metadata -----------------------------------------


def position(consumer: Any, tp: Any) -> int | None:
    """A partition's next offset from the consumer's subscription state, without the round trip
    `KafkaConsumer.position()` may make; None if it is not known there."""
    state = _attr(consumer, "_subscription", "KafkaConsumer._subscription").assignment.get(tp)
    found = getattr(state, "position", None)
    return None if found is None else int(found.offset)


def request_rejoin(consumer: Any) -> None:
    """Make this member rejoin its group (with new metadata) without leaving it."""
    coordinator = _attr(consumer, "_coordinator", "KafkaConsumer._coordinator")
    _attr(coordinator, "request_rejoin", "ConsumerCoordinator.request_rejoin")()


def joining(consumer: Any) -> bool:
    """This member's JoinGroup/SyncGroup exchange is on the wire (False once it ended).

    kafka-python 3.0.12 keeps that exchange as a task across polls, but when it completes
    after one poll gave up waiting and before the next one looks, the next one finds it done,
    drops its outcome and sends a new JoinGroup: one more rebalance (3 s more at Tansu, a new
    generation for every member on Kafka), seen in 1 start of 5 on a busy driver. A caller
    that knows a join is out can wait for it longer (`await_join`)."""
    coordinator = _attr(consumer, "_coordinator", "KafkaConsumer._coordinator")
    task = _attr(coordinator, "_join_task", "BaseCoordinator._join_task")
    return task is not None and not task.is_done


def await_join(consumer: Any, timeout: float) -> None:
    """Wait up to `timeout` seconds for the join that is out, returning as soon as it ends
    (with its callbacks run, as in a poll): a consumer's poll, given no partition to fetch,
    waits out its whole timeout even after the join ended."""
    coordinator = _attr(consumer, "_coordinator", "KafkaConsumer._coordinator")
    ensure = _attr(coordinator, "ensure_active_group", "ConsumerCoordinator.ensure_active_group")
    ensure(timeout_ms=int(timeout * 1000))


def last_heartbeat(consumer: Any) -> float:
    """When the coordinator last answered this member's heartbeat (monotonic), -inf while the
    member is not stable in its group."""
    coordinator = _attr(consumer, "_coordinator", "KafkaConsumer._coordinator")
    if not coordinator.stable():
        return float("-inf")
    heartbeat = _attr(coordinator, "heartbeat", "ConsumerCoordinator.heartbeat")
    return float(_attr(heartbeat, "last_receive", "Heartbeat.last_receive"))


def group_member_count(admin: Any, group: str) -> int:
    """Members of a consumer group, from DescribeGroups read without kafka-python's decoding of
    the authorized operations (which fails on brokers that answer a value it does not know:
    Tansu does)."""
    find = _attr(admin, "_find_coordinator_ids", "KafkaAdminClient._find_coordinator_ids")
    build = _attr(admin, "_describe_groups_request", "KafkaAdminClient._describe_groups_request")
    manager = _attr(admin, "_manager", "KafkaAdminClient._manager")

    async def describe(_: Any) -> int:
        coordinators = await find([group])
        response = await manager.send(build([group]), node_id=coordinators[group])
        return sum(len(described.members) for described in response.groups)

    return int(manager.run(describe, admin))


def metadata_config(client: Any) -> dict[str, Any]:
    """The config dict a client's cluster metadata reads (`allow_auto_create_topics`)."""
    cluster = getattr(client, "_metadata", None)  # a producer's
    if cluster is None:  # a consumer's or an admin client's
        cluster = getattr(getattr(client, "_manager", None), "cluster", None)
    config = getattr(cluster, "config", None)
    if not isinstance(config, dict) or "allow_auto_create_topics" not in config:
        raise Missing("ClusterMetadata.config['allow_auto_create_topics']")
    return config


# ---- PySpark ----------------------------------------------------------------------------------


def active_spark_context() -> Any:
    """The SparkContext this process already runs (an embedding program's), or None."""
    from pyspark import SparkContext

    if not hasattr(SparkContext, "_active_spark_context"):
        raise Missing("SparkContext._active_spark_context", "pyspark")
    return SparkContext._active_spark_context


def detach_accumulator_server(context: Any) -> Any:
    """Take the context's accumulator server away from it (None if it has none): ktm shuts it
    down on the side, after the JVM is gone, and sends its errors to the debug log."""
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        context._accumulatorServer = None
    return server


def quiet_accumulator_server(context: Any, handle_error: Callable[[Any, Any], None]) -> None:
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = handle_error


def forget_gateway() -> None:
    """After the JVM is gone: the next SparkContext of this process starts a new gateway."""
    from pyspark import SparkContext

    SparkContext._gateway = None
    SparkContext._jvm = None


def gateway_process(gateway: Any) -> Any:
    """The JVM's process (its stdin pipe ends it), or None."""
    return getattr(gateway, "proc", None)


# ---- the list -----------------------------------------------------------------------------------


def _has(module: str, owner: str, *names: str) -> Callable[[], bool]:
    def present() -> bool:
        try:
            found = __import__(module, fromlist=[owner])
            cls = getattr(found, owner)
        except (ImportError, AttributeError):
            return False
        return all(hasattr(cls, name) for name in names)

    return present


def _all(*checks: Callable[[], bool]) -> Callable[[], bool]:
    return lambda: all(check() for check in checks)


def _takes_popen_kwargs() -> bool:
    try:
        from pyspark.java_gateway import launch_gateway
    except ImportError:
        return False
    return "popen_kwargs" in inspect.signature(launch_gateway).parameters


INTERNALS = (
    Internal(
        "RecordAccumulator._tp_lock and split_and_reenqueue", "kafka-python",
        _has("kafka.producer.record_accumulator", "RecordAccumulator", "_tp_lock",
             "split_and_reenqueue", "deallocate"),
        "producing one record at a time (several times the CPU)",
    ),
    Internal(
        "Sender._dispatch_error, force_close and add_topic", "kafka-python",
        _has("kafka.producer.sender", "Sender", "_dispatch_error", "force_close", "wakeup",
             "add_topic"),
        None,
    ),
    Internal(
        "RecordAccumulator.reenqueue and drain, Sender._maybe_remove_from_inflight_batches",
        "kafka-python",
        _all(_has("kafka.producer.record_accumulator", "RecordAccumulator", "reenqueue", "drain"),
             _has("kafka.producer.sender", "Sender", "_maybe_remove_from_inflight_batches")),
        "one produce request per partition at a time (slower across long links)",
    ),
    Internal(
        "KafkaProducer._wait_on_metadata", "kafka-python",
        _has("kafka.producer.kafka", "KafkaProducer", "_wait_on_metadata"),
        "producing one record at a time (several times the CPU)",
    ),
    Internal(
        "ConsumerCoordinator.request_rejoin and ensure_active_group", "kafka-python",
        _has("kafka.coordinator.consumer", "ConsumerCoordinator", "request_rejoin", "stable",
             "ensure_active_group"),
        None,
    ),
    Internal(
        "KafkaAdminClient._find_coordinator_ids and _describe_groups_request", "kafka-python",
        _has("kafka.admin.client", "KafkaAdminClient", "_find_coordinator_ids",
             "_describe_groups_request"),
        None,
    ),
    Internal(
        "KafkaNetClient.connection_delay", "kafka-python",
        _has("kafka.net.compat", "KafkaNetClient", "connection_delay", "connected", "is_ready"),
        "one produce request per partition at a time (slower across long links)",
    ),
    Internal(
        "SparkContext._active_spark_context", "pyspark",
        _has("pyspark", "SparkContext", "_active_spark_context", "_gateway", "_jvm"),
        None,
    ),
    Internal("launch_gateway(popen_kwargs=...)", "pyspark", _takes_popen_kwargs, None),
)  # fmt: skip


def _attr(owner: Any, name: str, what: str) -> Any:
    try:
        return getattr(owner, name)
    except AttributeError:
        raise Missing(what, "pyspark" if "Spark" in what else "kafka-python") from None


def _installed(library: str) -> str:
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return "none"

"""kafka-python's producer: its accumulator and sender (relay.internals)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from relay.internals.missing import Missing, attr

if TYPE_CHECKING:  # kafka-python's own classes (untyped: they say what each argument is)
    from kafka import KafkaProducer, TopicPartition
    from kafka.cluster import ClusterMetadata
    from kafka.producer.future import FutureProduceResult
    from kafka.producer.producer_batch import ProducerBatch
    from kafka.producer.record_accumulator import RecordAccumulator
    from kafka.producer.sender import Sender


def accumulator(producer: KafkaProducer) -> RecordAccumulator:
    """The producer's RecordAccumulator: batches per partition, waiting to be sent."""
    return attr(producer, "_accumulator", "KafkaProducer._accumulator")


def sender(producer: KafkaProducer) -> Sender:
    """The producer's Sender: the I/O thread that drains the accumulator."""
    return attr(producer, "_sender", "KafkaProducer._sender")


def partition_queue(acc: RecordAccumulator, tp: TopicPartition) -> deque[ProducerBatch]:
    """The deque of batches of one partition (hold `partition_lock` while using it)."""
    queue: deque[ProducerBatch] = attr(acc, "_batches", "RecordAccumulator._batches")[tp]
    return queue


def partition_lock(acc: RecordAccumulator, tp: TopicPartition) -> threading.Lock:
    """The lock that guards one partition's queue, as the accumulator takes it."""
    lock: threading.Lock = attr(acc, "_tp_lock", "RecordAccumulator._tp_lock")(tp)
    return lock


@contextmanager
def appending(acc: RecordAccumulator) -> Iterator[None]:
    """An append in progress: a flush waits for it (what RecordAccumulator.append does)."""
    counter = attr(acc, "_appends_in_progress", "RecordAccumulator._appends_in_progress")
    counter.increment()
    try:
        yield
    finally:
        counter.decrement()


def track(acc: RecordAccumulator, batch: ProducerBatch) -> None:
    """Count a batch as incomplete: flush() waits for it, expiry sees it."""
    attr(acc, "_incomplete", "RecordAccumulator._incomplete").add(batch)


def still_incomplete(acc: RecordAccumulator, batch: ProducerBatch) -> bool:
    """Whether the accumulator still tracks `batch` (a batch it split is dropped from it)."""
    incomplete = attr(acc, "_incomplete", "RecordAccumulator._incomplete")
    batches = attr(incomplete, "_incomplete", "IncompleteProducerBatches._incomplete")
    with attr(incomplete, "_lock", "IncompleteProducerBatches._lock"):
        return batch in batches


def accumulator_closed(acc: RecordAccumulator) -> bool:
    return bool(attr(acc, "_closed", "RecordAccumulator._closed"))


def known_partitions(producer: KafkaProducer, topic: str, partition: int | None = None) -> set[int]:
    """A topic's partitions, from the producer's metadata, waited for if not known yet; with
    `partition`, its metadata is refreshed until that one is in it too (a topic grown while
    running: kafka-python learns of new partitions only at its next refresh, up to
    `metadata.max.age.ms`, 5 minutes, later) or `max_block_ms` passed."""
    metadata = attr(producer, "_metadata", "KafkaProducer._metadata")
    found = metadata.partitions_for_topic(topic)
    if found is None:
        wait = attr(producer, "_wait_on_metadata", "KafkaProducer._wait_on_metadata")
        found = wait(topic, producer.config["max_block_ms"])
    deadline = time.monotonic() + producer.config["max_block_ms"] / 1000
    while partition is not None and partition not in found and time.monotonic() < deadline:
        metadata.request_update()
        sender(producer).wakeup()
        time.sleep(METADATA_PAUSE)
        found = metadata.partitions_for_topic(topic) or set()
    return set(found)


METADATA_PAUSE = 0.05  # seconds between two looks at a producer's metadata being refreshed


def know_topics(producer: KafkaProducer, topics: Iterable[str]) -> None:
    """The partitions of every one of `topics` in the producer's metadata, in about one
    metadata request: kafka-python waits for one topic at a time, and each of its requests
    names every topic asked for so far (2,000 topics: 2,000 requests of up to 2,000 topics).
    A topic known from the bootstrap but not tracked would be dropped by the next update:
    every one is tracked first."""
    metadata = attr(producer, "_metadata", "KafkaProducer._metadata")
    add_topic = attr(sender(producer), "add_topic", "Sender.add_topic")
    topics = list(topics)
    for topic in topics:
        add_topic(topic)
    for topic in topics:
        if metadata.partitions_for_topic(topic) is None:
            known_partitions(producer, topic)  # the first wait brings the others too


def is_transactional(producer: KafkaProducer) -> bool:
    manager = getattr(producer, "_transaction_manager", None)
    return manager is not None and bool(manager.is_transactional())


def on_batch_failure(
    producer: KafkaProducer, hook: Callable[[ProducerBatch, FutureProduceResult], None]
) -> None:
    """Call `hook(batch, outcome future)` on the I/O thread after kafka-python decided what
    becomes of a failed batch (retry, split, or fail)."""
    the_sender = sender(producer)
    dispatch = attr(the_sender, "_dispatch_error", "Sender._dispatch_error")

    def dispatch_and_hook(
        batch: ProducerBatch, exception: BaseException, partition_response: object
    ) -> object:
        outcome = dispatch(batch, exception, partition_response)
        hook(batch, batch.produce_future)
        return outcome

    the_sender._dispatch_error = dispatch_and_hook


def on_batch_split(
    acc: RecordAccumulator, hook: Callable[[ProducerBatch, list[ProducerBatch]], None]
) -> None:
    """Call `hook(batch, halves)` when the sender splits a batch a broker refused as too large
    into halves it re-enqueues (the first entries of the partition's queue right after)."""
    split = attr(acc, "split_and_reenqueue", "RecordAccumulator.split_and_reenqueue")

    def split_and_hook(batch: ProducerBatch, now: float | None = None) -> int:
        count = split(batch, now)
        with partition_lock(acc, batch.topic_partition):
            halves = list(partition_queue(acc, batch.topic_partition))[:count]
        hook(batch, halves)
        return int(count)

    acc.split_and_reenqueue = split_and_hook


def several_batches_in_flight(producer: KafkaProducer) -> None:
    """Let up to max_in_flight batches of one partition travel at once under idempotence.

    kafka-python mutes a partition while one of its batches is out whenever idempotence is on
    (`guarantee_message_order`); its drain assigns each batch the next sequence number and its
    sender treats a duplicate sequence as success, as the Java client does with five in flight.
    A connection with all its requests out then reads as not ready, and the sender would poll
    for `connection_delay`: 0 for a connected node, a busy loop; such a node's delay is "until an
    answer comes" (the poll wakes on it)."""
    the_sender = sender(producer)
    config = attr(the_sender, "config", "Sender.config")
    if "guarantee_message_order" not in config:
        raise Missing("Sender.config['guarantee_message_order']")
    client = attr(the_sender, "_client", "Sender._client")
    config["guarantee_message_order"] = False
    delay = client.connection_delay

    def busy_aware(node_id: int) -> float:
        if client.connected(node_id) and not client.is_ready(node_id):
            return float("inf")
        return float(delay(node_id))

    client.connection_delay = busy_aware


def on_reenqueue(
    acc: RecordAccumulator, reenqueue: Callable[[ProducerBatch, float | None], None]
) -> None:
    """Let `reenqueue(batch, now)` put a batch the sender retries back in its partition's queue
    (kafka-python puts it first, `appendleft`). Called on the I/O thread."""
    attr(acc, "reenqueue", "RecordAccumulator.reenqueue")
    acc.reenqueue = lambda batch, now=None: reenqueue(batch, now)


def on_drain(
    acc: RecordAccumulator, hook: Callable[[dict[int, list[ProducerBatch]]], None]
) -> None:
    """Call `hook({node id: batches})` with what each drain took from the queues (I/O thread)."""
    drain = attr(acc, "drain", "RecordAccumulator.drain")

    def drain_and_hook(
        cluster: ClusterMetadata, nodes: set[int], max_size: int, now: float | None = None
    ) -> dict[int, list[ProducerBatch]]:
        drained: dict[int, list[ProducerBatch]] = drain(cluster, nodes, max_size, now=now)
        hook(drained)
        return drained

    acc.drain = drain_and_hook


def forget_drained_queues(acc: RecordAccumulator) -> None:
    """Drop a partition's queue from the accumulator once a drain left it empty.

    kafka-python keeps a queue for every partition ever written to and walks all of them, each
    under its lock, on every loop of the I/O thread (`ready`, `expired_batches`): at 10,000
    partitions that was most of a worker's CPU. The next append makes the queue anew
    (`_batches` is a defaultdict). Only for producers that append through ktm's bulk paths,
    which take the queue under the partition's lock and use it before letting go:
    `RecordAccumulator.append` (`send()`) takes it under one hold of the lock and appends to
    it under a second, and would append to a forgotten queue."""
    queues = attr(acc, "_batches", "RecordAccumulator._batches")
    lock = attr(acc, "_tp_lock", "RecordAccumulator._tp_lock")

    def forget(drained: dict[int, list[ProducerBatch]]) -> None:
        for batches in drained.values():
            for batch in batches:
                tp = batch.topic_partition
                with lock(tp):
                    queue = queues.get(tp)
                    if queue is not None and not queue:
                        del queues[tp]

    on_drain(acc, forget)


def on_answered(producer: KafkaProducer, hook: Callable[[ProducerBatch], None]) -> None:
    """Call `hook(batch)` once a batch is no longer in flight: acknowledged, failed, split or
    re-enqueued (kafka-python drops it from `Sender._in_flight_batches` then; I/O thread)."""
    the_sender = sender(producer)
    forget = attr(
        the_sender,
        "_maybe_remove_from_inflight_batches",
        "Sender._maybe_remove_from_inflight_batches",
    )

    def forget_and_hook(batch: ProducerBatch) -> None:
        forget(batch)
        hook(batch)

    the_sender._maybe_remove_from_inflight_batches = forget_and_hook


def batches_in_flight(producer: KafkaProducer, tp: TopicPartition) -> list[ProducerBatch]:
    """The batches of one partition sent and not answered yet (I/O thread only)."""
    in_flight = attr(sender(producer), "_in_flight_batches", "Sender._in_flight_batches")
    return [batch for _, batch in in_flight.get(tp, ())]


def muted_partitions(acc: RecordAccumulator) -> set[TopicPartition]:
    """The partitions the sender neither drains nor counts as ready (I/O thread only)."""
    muted = attr(acc, "muted", "RecordAccumulator.muted")
    if not isinstance(muted, set):
        raise Missing("RecordAccumulator.muted")
    return muted


def on_batch_error(
    producer: KafkaProducer, translate: Callable[[ProducerBatch, BaseException], BaseException]
) -> None:
    """Let `translate(batch, error)` replace the error kafka-python decides a failed batch's
    fate by (retry, split or fail), before it decides (I/O thread)."""
    the_sender = sender(producer)
    dispatch = attr(the_sender, "_dispatch_error", "Sender._dispatch_error")

    def translate_and_dispatch(
        batch: ProducerBatch, exception: BaseException, partition_response: object
    ) -> object:
        return dispatch(batch, translate(batch, exception), partition_response)

    the_sender._dispatch_error = translate_and_dispatch


def stop_sending(producer: KafkaProducer, error: Exception) -> None:
    """Send nothing more: batches not sent yet fail at once with `error`, nothing is retried,
    and the I/O thread ends once the requests already sent are answered (`sending_ended`). A
    request on the wire cannot be called back; abandoned unanswered, it may land after the
    destination was read again (seen: a Tansu busy for 5-9 s at 10,000 partitions, the requests
    of tasks that lost their lease landing after the resync, whole partitions written twice)."""
    the_sender = sender(producer)
    attr(the_sender, "config", "Sender.config")["retries"] = 0
    acc = accumulator(producer)
    abort = attr(acc, "abort_undrained_batches", "RecordAccumulator.abort_undrained_batches")
    abort(error)
    the_sender.initiate_close()


def sending_ended(producer: KafkaProducer, timeout: float) -> bool:
    """Whether the I/O thread ended (waiting up to `timeout` seconds)."""
    the_sender = sender(producer)
    the_sender.join(timeout)
    return not the_sender.is_alive()


def drop_in_flight(producer: KafkaProducer) -> None:
    """End the I/O thread now: what is still unanswered fails."""
    the_sender = sender(producer)
    the_sender.force_close()
    the_sender.join(1.0)


def wake_sender(producer: KafkaProducer) -> None:
    sender(producer).wakeup()

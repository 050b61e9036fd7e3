"""Fetch record batches as bytes, for a set of source partitions (kafka-python as transport).

kafka-python's consumer turns every fetched record into a Python object. This module sends the
Fetch requests itself, through kafka-python's network client (`KafkaNetClient`: connections,
TLS, SASL, API versions, metadata, as `client_settings` configures them) and its protocol
classes (`FetchRequest`), and hands back each partition's `records` field untouched: the
batches as the broker stored them, to be split and rebuilt by `relay.batches`.

No fetch session (session id 0, epoch -1: a full fetch each time) and read_uncommitted, which is
what the relay's consumer reads today. A response may end with a partial batch; the caller
fetches again from the next offset after the last whole batch (`relay.batches.rebuild` gives
it), so nothing is returned twice or skipped.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from contextlib import closing
from typing import Any, NamedTuple

from kafka import TopicPartition
from kafka import errors as kafka_errors
from kafka.net.compat import KafkaNetClient
from kafka.protocol.consumer import FetchRequest

from relay.batches import SourceBatch, split_batches
from relay.clients import admin
from relay.clients.settings import client_settings, never_create_topics
from relay.config import ClusterConfig

TP = tuple[str, int]

_FetchTopic = FetchRequest.FetchTopic
_FetchPartition = _FetchTopic.FetchPartition
_READ_UNCOMMITTED = 0
_MIN_VERSION = 4  # the first with magic-2 batches, last stable offset and aborted transactions
_MAX_VERSION = 12  # the last addressing topics by name (13 uses topic ids)
_FRAME_MARGIN = 1024 * 1024  # a response's headers around its records


class Fetched(NamedTuple):
    """One partition's answer."""

    data: bytes  # record batches as stored; may end with a partial batch
    high_watermark: int
    log_start_offset: int
    error: BaseException | None = None


class BatchFetcher:
    def __init__(
        self,
        cluster: ClusterConfig,
        request_timeout: float = 10.0,
        *,
        max_wait: float = 0.1,
        min_bytes: int = 1,
        partition_max_bytes: int = 8 * 1024 * 1024,
        max_bytes: int = 64 * 1024 * 1024,
    ):
        settings = client_settings(cluster, request_timeout)
        # its default frame limit (1 MB) is below a fetch's: the consumer raises it alike
        settings["receive_message_max_bytes"] = max_bytes + _FRAME_MARGIN
        # A fetch names its topics in metadata requests: they must not create them.
        self._client = never_create_topics(KafkaNetClient(**settings))
        self._max_wait_ms = int(max_wait * 1000)
        self._min_bytes = min_bytes
        self._partition_max_bytes = partition_max_bytes
        self._max_bytes = max_bytes
        self._closed = False

    def fetch(self, positions: Mapping[TP, int], timeout: float) -> dict[TP, Fetched]:
        """One fetch per leader for `positions` (partition: fetch offset). Every partition gets
        an answer; one whose leader is unknown or unreachable carries the error."""
        deadline = time.monotonic() + timeout
        self._know_topics({topic for topic, _ in positions}, timeout)
        found: dict[TP, Fetched] = {}
        pending = []
        for node, keys in self._by_leader(positions, found).items():
            try:
                self._client.await_ready(node, timeout_ms=_ms_left(deadline))
            except kafka_errors.KafkaError as exc:
                found.update({key: _failed(exc) for key in keys})
                continue
            pending.append((self._client.send(node, self._request(positions, keys)), keys))
        for future, keys in pending:
            self._client.poll(timeout_ms=_ms_left(deadline), future=future)
            if future.succeeded():
                found.update(self._answers(future.value))
            else:
                error = future.exception if future.failed() else None
                error = error or kafka_errors.KafkaTimeoutError(f"no fetch response in {timeout}s")
                found.update({key: _failed(error) for key in keys})
        for key in positions:
            found.setdefault(key, _failed(kafka_errors.UnknownTopicOrPartitionError(str(key))))
        return found

    def _know_topics(self, topics: set[str], timeout: float) -> None:
        cluster = self._client.cluster
        if all(cluster.partitions_for_topic(topic) is not None for topic in topics):
            return
        future = cluster.set_topics(topics | set(cluster.topics()))
        self._client.poll(timeout_ms=int(timeout * 1000), future=future)

    def _by_leader(self, positions: Iterable[TP], found: dict[TP, Fetched]) -> dict[int, list[TP]]:
        by_node: dict[int, list[TP]] = defaultdict(list)
        cluster = self._client.cluster
        for key in positions:
            leader = cluster.leader_for_partition(TopicPartition(*key))
            if leader is None or leader == -1:
                cluster.request_update()
                found[key] = _failed(kafka_errors.LeaderNotAvailableError(str(key)))
            else:
                by_node[leader].append(key)
        return by_node

    def _request(self, positions: Mapping[TP, int], keys: list[TP]) -> FetchRequest:
        by_topic: dict[str, list[Any]] = defaultdict(list)
        for topic, partition in keys:
            by_topic[topic].append(
                _FetchPartition(
                    partition=partition,
                    current_leader_epoch=-1,
                    fetch_offset=positions[(topic, partition)],
                    last_fetched_epoch=-1,
                    log_start_offset=-1,
                    partition_max_bytes=self._partition_max_bytes,
                )
            )
        return FetchRequest(
            max_wait_ms=self._max_wait_ms,
            min_bytes=self._min_bytes,
            max_bytes=self._max_bytes,
            isolation_level=_READ_UNCOMMITTED,
            session_id=0,
            session_epoch=-1,
            topics=[_FetchTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
            forgotten_topics_data=[],
            rack_id="",
            min_version=_MIN_VERSION,
            max_version=_MAX_VERSION,
        )

    def _answers(self, response: Any) -> dict[TP, Fetched]:
        found = {}
        for topic in response.responses:
            for part in topic.partitions:
                key = (topic.topic, part.partition_index)
                error = None
                if part.error_code:
                    error = kafka_errors.for_code(part.error_code)(f"{key[0]}[{key[1]}]")
                    if isinstance(error, kafka_errors.InvalidMetadataError):
                        self._client.cluster.request_update()
                found[key] = Fetched(
                    part.records or b"", part.high_watermark, part.log_start_offset, error
                )
        return found

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.close()


def fetch_range(
    fetcher: BatchFetcher, key: TP, lower: int, upper: int, timeout: float
) -> list[SourceBatch]:
    """The whole batches holding the offsets in [lower, upper), in order (the first may begin
    before `lower`: a fetch starts at the batch holding its offset)."""
    out: list[SourceBatch] = []
    position = lower
    deadline = time.monotonic() + timeout
    while position < upper:
        if time.monotonic() > deadline:
            raise TimeoutError(f"reading {key[0]}[{key[1]}] {lower}..{upper} timed out")
        fetched = fetcher.fetch({key: position}, _seconds_left(deadline))[key]
        if fetched.error is not None:
            if not getattr(fetched.error, "retriable", False):
                raise fetched.error
            time.sleep(0.05)  # a leader moving or metadata refreshing; bounded by the deadline
            continue
        batches, _ = split_batches(fetched.data)
        for batch in batches:
            if batch.base_offset >= upper:
                return out
            if batch.next_offset > position:
                out.append(batch)
                position = batch.next_offset
        if not batches and position >= fetched.high_watermark:
            break  # nothing more to read (the end moved back: a truncated log)
    return out


def read_tails(
    cluster: ClusterConfig,
    tps: list[TP],
    satisfied: Callable[[TP, list[SourceBatch]], bool],
    timeout: float,
    first_window: int = 500,
    max_records: int = 200_000,
) -> dict[TP, list[SourceBatch]]:
    """The tail of each partition as record batches, read backwards in growing windows until
    `satisfied(tp, batches)` says enough, the log start is reached, or `max_records` offsets
    were read."""
    begin, end = admin.offset_bounds(cluster, tps, timeout)
    tails: dict[TP, list[SourceBatch]] = {}
    with closing(BatchFetcher(cluster, timeout)) as fetcher:
        for key in tps:
            batches: list[SourceBatch] = []
            upper, window = end[key], first_window
            while upper > begin[key]:
                lower = max(begin[key], upper - window)
                older = fetch_range(fetcher, key, lower, upper, timeout)
                if batches and older and older[-1].next_offset > batches[0].base_offset:
                    older.pop()  # the batch holding `upper` was read with the later window
                batches = older + batches
                if satisfied(key, batches) or end[key] - lower >= max_records:
                    break
                upper, window = lower, window * 4
            tails[key] = batches
    return tails


def _failed(error: BaseException) -> Fetched:
    return Fetched(b"", -1, -1, error)


def _seconds_left(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())


def _ms_left(deadline: float) -> int:
    return max(1, int((deadline - time.monotonic()) * 1000))

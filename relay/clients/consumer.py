"""Executor-side reading of a task's source partitions (kafka-python).

One `SourceReader` is cached per worker process and reused from one round to the next: it never
subscribes (no group rebalances), it is assigned the task's partitions with assign/seek (one
fetch request serves all of them), and it commits the source group's offsets only for records
the destination acknowledged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka import errors as kafka_errors
from kafka.consumer.fetcher import ConsumerRecord
from kafka.net.compat import KafkaNetClient
from kafka.structs import OffsetAndMetadata

from relay import internals
from relay.clients.seed import Seed, seeded
from relay.clients.settings import NO_CLIENT_METRICS, client_settings, never_create_topics
from relay.config import ClusterConfig
from relay.losses import Loss, diverged, out_of_range
from relay.spec import FetchTrouble

TP = tuple[str, int]

COMMIT_TIMEOUT_MS = 1000  # a dead source node must not hold a task's stop hostage


class SourceReader:
    def __init__(
        self,
        cluster: ClusterConfig,
        group_id: str,
        request_timeout: float = 10.0,
        seed: Seed | None = None,
    ):
        """`seed`: the driver's metadata of the cluster: with it the consumer skips its
        bootstrap (relay.clients.seed)."""
        self._consumer = KafkaConsumer(
            **client_settings(cluster, request_timeout),
            **NO_CLIENT_METRICS,
            kafka_client=functools.partial(_seeded_client, seed, cluster.servers),
            group_id=group_id,
            enable_auto_commit=False,
            # a position out of the log's range raises: a loss, said and counted (poll)
            auto_offset_reset="none",
            # Short fetch waits keep the loop responsive to "stop"; big fetches keep it fed.
            fetch_max_wait_ms=100,
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
            max_poll_records=5000,
            # read_committed: kafka-python drops aborted transactions' records as the Java
            # consumer does, and reads nothing past the last stable offset
            isolation_level=cluster.isolation_level,
        )
        self._committed = cluster.read_committed
        # A cached reader reconnects to a node that came back empty: it must not recreate
        # the topic it was reading there.
        never_create_topics(self._consumer)
        self._tps: dict[TP, TopicPartition] = {}
        self.losses: list[Loss] = []  # found by polls, not yet taken by the task
        # each commit's metadata, by partition: a followed topic's incarnation
        # (relay.provenance.header.commit_mark); set by whoever assigns
        self.commit_marks: dict[TP, str] = {}
        self._closed = False

    def assign(self, starts: Mapping[TP, int]) -> None:
        """Read exactly these partitions, each from its start offset."""
        self._tps = {key: TopicPartition(*key) for key in starts}
        self._consumer.assign(list(self._tps.values()))
        self._consumer.resume(*self._tps.values())  # a cached reader may have paused some
        for key, offset in starts.items():
            self._consumer.seek(self._tps[key], offset)
        self.losses = []

    def poll(self, timeout: float) -> dict[TP, list[ConsumerRecord]]:
        try:
            batch = self._consumer.poll(timeout_ms=max(1, int(timeout * 1000)))
        except kafka_errors.OffsetOutOfRangeError as exc:
            self._out_of_range(exc.args[0] if exc.args else {})
            return {}
        except kafka_errors.LogTruncationError as exc:
            self._truncated(exc)
            return {}
        return {(tp.topic, tp.partition): records for tp, records in batch.items()}

    def _truncated(self, error: kafka_errors.LogTruncationError) -> None:
        """Positions kafka-python's validation (KIP-320) found past where a new leader's log
        parts from the one read (an unclean leader election, even once the new log has grown
        past them): each a truncation (relay.losses), kept for the task to take, which halts
        the partition. A divergence the leader cannot place fails the poll, as before."""
        parts = {(tp.topic, tp.partition): found for tp, found in error.divergent_offsets.items()}
        if not parts or any(key not in self._tps or found is None for key, found in parts.items()):
            raise error
        positions = self.positions(parts)
        losses = [diverged(key, positions[key], found.offset) for key, found in parts.items()]
        if any(loss is None for loss in losses):
            raise error
        self.losses += [loss for loss in losses if loss is not None]

    def _out_of_range(self, positions: Mapping[TopicPartition, int]) -> None:
        """Positions the broker called out of the log's range: each a loss (relay.losses),
        kept for the task to take; reading goes on at the log start or end. A stale answer (the
        position is inside the range now) is fetched again."""
        tps = [tp for tp in positions if (tp.topic, tp.partition) in self._tps]
        if not tps:
            raise kafka_errors.OffsetOutOfRangeError(dict(positions))
        begins = self._consumer.beginning_offsets(tps)
        ends = self._consumer.end_offsets(tps)
        for tp in tps:
            key = (tp.topic, tp.partition)
            loss = out_of_range(key, positions[tp], begins[tp], ends[tp])
            if loss is not None:
                self.losses.append(loss)
            self._consumer.seek(tp, loss.resume if loss is not None else positions[tp])

    def take_trouble(self) -> list[FetchTrouble]:
        """kafka-python's consumer retries its brokers itself and says nothing of them."""
        return []

    def waiting(self, key: TP) -> tuple[str, float] | None:
        """A Kafka source never waits for records that must come."""
        return None

    def take_losses(self) -> list[Loss]:
        """The losses polls found since the last call (each partition's position is past it)."""
        found, self.losses = self.losses, []
        return found

    def positions(self, keys: Iterable[TP]) -> dict[TP, int]:
        """The next offset each partition will return. A fetch may move it past offsets that
        hold no record (compaction, transaction markers) without returning anything.

        Read from the subscription state: `KafkaConsumer.position()` also refreshes committed
        offsets and validates positions, a round trip per call, far too slow per poll for
        hundreds of partitions. The public call is the fallback."""
        found = {}
        for key in keys:
            tp = self._tps[key]
            try:
                position = internals.position(self._consumer, tp)
            except internals.Missing:
                position = None
            found[key] = position if position is not None else self._consumer.position(tp)
        return found

    def highwater(self, key: TP) -> int | None:
        """The high watermark its last fetch reported; None under read_committed, where the end
        is the last stable offset, which kafka-python does not keep (the driver's health checks
        report it): an open transaction's records are not lag."""
        if self._committed:
            return None
        found = self._consumer.highwater(self._tps[key])
        return None if found is None else int(found)

    def pause(self, key: TP) -> None:
        """Stop fetching a partition (it reached its stop offset)."""
        self._consumer.pause(self._tps[key])

    def commit(self, offsets: Mapping[TP, int]) -> None:
        """Commit and wait (bounded): the last commit of a task."""
        if offsets:
            self._consumer.commit(self._offsets(offsets), timeout_ms=COMMIT_TIMEOUT_MS)

    def commit_async(self, offsets: Mapping[TP, int], done: Callable[[], None]) -> None:
        """Commit without waiting, so a slow or dead source never stalls the loop; `done` is
        called once the commit succeeded."""

        def callback(_offsets: dict[TopicPartition, OffsetAndMetadata], response: object) -> None:
            if not isinstance(response, BaseException):
                done()

        if offsets:
            self._consumer.commit_async(self._offsets(offsets), callback=callback)

    def _offsets(self, offsets: Mapping[TP, int]) -> dict[TopicPartition, OffsetAndMetadata]:
        marks = self.commit_marks
        return {
            self._tps[k]: OffsetAndMetadata(o, marks.get(k, ""), -1) for k, o in offsets.items()
        }

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._consumer.close(autocommit=False, timeout_ms=2000)


def _seeded_client(seed: Seed | None, servers: tuple[str, ...], **configs: Any) -> KafkaNetClient:
    """The consumer's network client (its `kafka_client` setting), told what `seed` knows."""
    return seeded(KafkaNetClient(**configs), seed, servers)

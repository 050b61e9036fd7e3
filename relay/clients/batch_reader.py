"""Executor-side reading of a group of source partitions as record batches (the batch path).

The same interface as `GroupReader` (assign, poll, positions, highwater, pause, commits), but a
poll returns each partition's whole record batches as bytes (`relay.batches.SourceBatch`), never
a Python object per record. Fetches go through `BatchFetcher` and its own network client (a
client polled from two threads fails: kafka-python's consumer may poll its own from a heartbeat
thread); the consumer never fetches: it is there for the source group's commits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from kafka import TopicPartition
from kafka import errors as kafka_errors

from relay.batches import SourceBatch, split_batches
from relay.clients.batch_fetch import BatchFetcher, Fetched
from relay.clients.consumer import TP, GroupReader
from relay.config import ClusterConfig

log = logging.getLogger(__name__)

ASYNC_COMMIT_WAIT_MS = 300  # a commit in the loop: a dead source node stalls it this long at most
# A fetch waits until this much is there or the wait is over: at low rates a few fetches a
# second carry many records each (a fetch, rebuild and produce costs about the same for one
# record as for a hundred); at high rates it fills at once. The wait trades CPU for latency;
# measured at 5,000 records/s, 4 partitions (scripts.bench --sections latency, median of 3):
# no wait (min 1 byte) 0.20 cores, p99 128 ms (one run); 20 ms 0.21 cores, p99 137 ms; 30 ms
# 0.17 cores, p99 194 ms; 50 ms 0.13 cores, p99 221 ms. 30 ms keeps p99 under 200 ms.
FETCH_MIN_BYTES = 64 * 1024
FETCH_MAX_WAIT = 0.03  # seconds
ERROR_PAUSE = 0.1  # seconds: a poll whose every partition failed waits this long (no spinning)


class BatchReader(GroupReader):
    def __init__(self, cluster: ClusterConfig, group_id: str, request_timeout: float = 10.0):
        super().__init__(cluster, group_id, request_timeout)
        self._fetcher = BatchFetcher(
            cluster, request_timeout, max_wait=FETCH_MAX_WAIT, min_bytes=FETCH_MIN_BYTES
        )
        self._positions: dict[TP, int] = {}
        self._paused: set[TP] = set()
        self._highwater: dict[TP, int] = {}

    def assign(self, starts: Mapping[TP, int]) -> None:
        """Read exactly these partitions, each from its start offset."""
        self._tps = {key: TopicPartition(*key) for key in starts}
        self._positions = dict(starts)
        self._paused = set()
        self._highwater = {}

    def poll(self, timeout: float) -> dict[TP, list[SourceBatch]]:
        """The whole batches fetched for each partition (the first may begin before the
        partition's position: a fetch starts at the batch holding it). A partition's position
        moves past the batches returned, so the next fetch goes on after them."""
        wanted = {k: o for k, o in self._positions.items() if k not in self._paused}
        if not wanted:
            return {}
        found: dict[TP, list[SourceBatch]] = {}
        failed = 0
        for key, fetched in self._fetcher.fetch(wanted, timeout).items():
            if fetched.error is not None:
                failed += 1
                self._on_error(key, fetched)
                continue
            self._highwater[key] = fetched.high_watermark
            batches, _ = split_batches(fetched.data)
            if batches:
                found[key] = batches
                self._positions[key] = max(self._positions[key], batches[-1].next_offset)
        if failed == len(wanted):
            time.sleep(min(timeout, ERROR_PAUSE))
        return found

    def _on_error(self, key: TP, fetched: Fetched) -> None:
        """Retriable errors (a leader moving, a node down) are retried by the next poll; the
        driver's health checks decide about a node that stays down. A position before the log
        start (retention deleted records not yet relayed) moves to the log start, as the
        record path's consumer does (auto_offset_reset=earliest), with a warning naming the
        offsets lost; any other error fails the task."""
        error = fetched.error
        if isinstance(error, kafka_errors.OffsetOutOfRangeError):
            tp = self._tps[key]
            begin = self._consumer.beginning_offsets([tp])[tp]
            if self._positions[key] < begin:
                log.warning(
                    "source records deleted before they were relayed: topic=%s partition=%s "
                    "offsets=%s-%s; going on at the log start",
                    key[0],
                    key[1],
                    self._positions[key],
                    begin - 1,
                )
                self._positions[key] = begin
                return
        if error is not None and not getattr(error, "retriable", False):
            raise error

    def commit_async(self, offsets: Mapping[TP, int], done: Callable[[], None]) -> None:
        """Committed at once, waiting at most `ASYNC_COMMIT_WAIT_MS`: nothing polls the consumer's
        client between commits here, so an asynchronous commit would never be answered (and
        polling that client from this thread races the one kafka-python may run)."""
        if offsets:
            self._consumer.commit(self._offsets(offsets), timeout_ms=ASYNC_COMMIT_WAIT_MS)
            done()

    def positions(self, keys: Iterable[TP]) -> dict[TP, int]:
        return {key: self._positions[key] for key in keys}

    def highwater(self, key: TP) -> int | None:
        return self._highwater.get(key)

    def pause(self, key: TP) -> None:
        self._paused.add(key)

    def close(self) -> None:
        self._fetcher.close()
        super().close()

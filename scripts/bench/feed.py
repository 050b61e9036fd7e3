"""Live traffic for a relay that is already running: a paced producer on the source topic, and
readers of the destination topic (latency per record, record counts, first arrival)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError

from scripts.bench.contenders import has_confluent
from scripts.bench.data import high_watermark_sum, payload, reader

TIMED = ("bench", b"timed")
WARM_UP = ("bench", b"warm-up")
PROBE_FETCH_WAIT_MS = 20  # adds at most this much to each measured latency
FLUSH_TIMEOUT_S = 30.0


class Feeder:
    """Produces records into ``topic`` at a fixed rate on a thread, CreateTime = send time
    (which relays preserve, so a destination reader can time each trip). kafka-python's
    producer tops out near 30,000 records/s in the bench's process; with ``fast`` (and
    confluent-kafka installed) librdkafka's produces instead."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, size: int, fast: bool = False):
        self.topic, self.partitions, self.size = topic, partitions, size
        # linger 0: a record waiting in the feeder's own batch would count as relay latency
        self.producer: Any = (
            _FastProducer(bootstrap)
            if fast and has_confluent()
            else KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
        )
        self.sent = 0
        self.send_seconds = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def send(self, seq: int, partition: int, header: tuple[str, bytes]) -> None:
        self.producer.send(
            self.topic,
            key=b"user-%d" % (seq % 1000),
            value=payload(seq, self.size),
            headers=[header],
            partition=partition,
            timestamp_ms=int(time.time() * 1000),
        )

    def start(self, rate: float, seconds: float | None, header: tuple[str, bytes] = TIMED) -> None:
        """Feed ``rate`` records/s for ``seconds`` (None: until stop())."""
        total = None if seconds is None else int(rate * seconds)
        self._thread = threading.Thread(
            target=self._paced, args=(rate, total, header), name="feeder", daemon=True
        )
        self._thread.start()

    def _paced(self, rate: float, total: int | None, header: tuple[str, bytes]) -> None:
        began = time.monotonic()
        seq = 0
        while (total is None or seq < total) and not self._stop.is_set():
            ahead = began + seq / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            self.send(seq, seq % self.partitions, header)
            seq += 1
            self.sent = seq
        try:
            self.producer.flush(timeout=FLUSH_TIMEOUT_S)
        except KafkaError as exc:  # e.g. the broker went away on Ctrl+C: do not hang on it
            print(f"  (feeder: {exc!r})")
        self.send_seconds = time.monotonic() - began

    def finished(self) -> bool:
        """Started, and sent all it was asked to (or was stopped)."""
        return self._thread is not None and not self._thread.is_alive()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def close(self) -> None:
        """Stop feeding and close; safe twice and when never started."""
        self._stop.set()
        self.join()
        self.producer.close(timeout=10)


def warm_up(
    feeder: Feeder, consumer: KafkaConsumer, alive: Callable[[], bool], timeout: float
) -> None:
    """Send a record to each partition until every one came through the relay: after this the
    relay's tasks run, so what follows measures the relay, not its start."""
    began = time.monotonic()
    seen: set[int] = set()
    while len(seen) < feeder.partitions:
        if not alive():
            raise RuntimeError("the relay exited during warm-up")
        if time.monotonic() - began > timeout:
            raise RuntimeError(
                f"relay passed no record on partitions "
                f"{sorted(set(range(feeder.partitions)) - seen)} in {timeout:.0f} s"
            )
        for partition in set(range(feeder.partitions)) - seen:
            feeder.send(0, partition, WARM_UP)
        feeder.producer.flush()
        seen.update(tp.partition for tp in consumer.poll(timeout_ms=500))


class _FastProducer:
    """confluent-kafka's Producer behind the calls Feeder makes of kafka-python's."""

    def __init__(self, bootstrap: str):
        from confluent_kafka import Producer

        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "log_level": 3}
        )
        self._unpolled = 0

    def send(self, topic: str, *, timestamp_ms: int, **record: Any) -> None:
        while True:
            try:
                self._producer.produce(topic, timestamp=timestamp_ms, **record)
                break
            except BufferError:  # its queue is full: let deliveries drain it
                self._producer.poll(0.01)
        self._unpolled += 1
        if self._unpolled >= 256:  # delivery reports served now and then, not at each record
            self._unpolled = 0
            self._producer.poll(0)

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> None:
        left = self._producer.flush(timeout)
        if left:
            raise KafkaError(f"{left} records not acknowledged within {timeout} s")

    def close(self, timeout: float = 10) -> None:
        self._producer.flush(timeout)


def settle(feeder: Feeder, consumer: KafkaConsumer, rate: float, seconds: float) -> None:
    """Feed ``rate`` records/s for ``seconds``, untimed, the reader keeping up: the first
    seconds at a rate were slower for every contender alike (latency p50 +50%, ten times the
    spikes over 80 ms, on Apache Kafka), the brokers' and the clients' code paths warming."""
    feeder.start(rate, seconds, WARM_UP)
    while not feeder.finished():
        consumer.poll(timeout_ms=100)
    feeder.join()


def probe_reader(bootstrap: str, topic: str, partitions: int) -> KafkaConsumer:
    return reader(bootstrap, topic, partitions, fetch_max_wait_ms=PROBE_FETCH_WAIT_MS)


@dataclass
class Latencies:
    seconds: list[float] = field(default_factory=list)  # sorted after measure()
    unique: int = 0
    sent_rate: float | None = None  # what the feeder achieved, records/s
    backlog: int = 0  # most destination records the probe had yet to read: the probe was late


def measure_latency(
    feeder: Feeder, consumer: KafkaConsumer, rate: float, seconds: float
) -> Latencies:
    """Feed at ``rate``; for each timed record: the reader's clock minus its CreateTime, i.e. an
    upper bound of source timestamp -> destination ack (plus up to one fetch wait)."""
    total = int(rate * seconds)
    feeder.start(rate, seconds, TIMED)
    lat, seqs = Latencies(), set()
    deadline = time.monotonic() + seconds + 60
    while len(lat.seconds) < total and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=100).values():
            now = time.time()
            for r in records:
                if r.headers and tuple(r.headers[0]) == TIMED:
                    lat.seconds.append(now - r.timestamp / 1000)
                    seqs.add(r.value[:12])
        lat.backlog = max(lat.backlog, _backlog(consumer))
    feeder.join()
    lat.sent_rate = feeder.sent / feeder.send_seconds if feeder.send_seconds else None
    lat.seconds.sort()
    lat.unique = len(seqs)
    return lat


def _backlog(consumer: KafkaConsumer) -> int:
    behind = 0
    for tp in consumer.assignment():
        highwater = consumer.highwater(tp)
        if highwater is not None:
            behind += max(0, highwater - consumer.position(tp))
    return behind


class DestinationCount:
    """The destination's real record count: summed high watermarks from this reader's fetches.
    It reads every record (so it keeps fetching); each count is at most one fetch wait old."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        self.consumer = probe_reader(bootstrap, topic, partitions)
        self.first_seen: float | None = None  # time.monotonic() the first record arrived

    def poll(self, timeout_ms: int = 50) -> int | None:
        if self.consumer.poll(timeout_ms=timeout_ms, max_records=100_000) and not self.first_seen:
            self.first_seen = time.monotonic()
        return high_watermark_sum(self.consumer)

    def ready(self, timeout: float = 30.0) -> None:
        """Connected, and every partition answered a fetch."""
        deadline = time.monotonic() + timeout
        while self.poll(100) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"destination reader not ready within {timeout:.0f} s")

    def wait_for(self, records: int, alive: Callable[[], bool], timeout: float) -> float | None:
        """Poll until the destination holds ``records``; the time it was seen, None if not."""
        deadline = time.monotonic() + timeout
        while alive() and time.monotonic() < deadline:
            if (self.poll(100) or 0) >= records:
                return time.monotonic()
        return None

    def close(self) -> None:
        self.consumer.close()

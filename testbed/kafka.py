"""Apache Kafka brokers for the tests and the benchmarks: the broker's jars resolved from Maven
Central once per version, into a cache outside the repository, and started in KRaft mode on
loopback ports, one node or three (see "The test brokers" in docs/development.md).

Nothing is committed and nothing is downloaded by hand: `kafka_lib(version)` writes a small POM
naming `org.apache.kafka:kafka_2.13` and a logging backend, and runs `mvn
dependency:copy-dependencies` into `<cache>/<version>/lib` (the cache: `$KTM_KAFKA_CACHE`, by
default `~/.cache/ktm-testbed/kafka`). A second caller, another pytest worker say, waits on a
file lock and finds the jars there.

Each node is a combined broker and controller (`process.roles=broker,controller`) with a static
quorum of every node of its cluster; the storage is formatted before the first start. The
settings that differ from a stock broker are in `TEST_SETTINGS`, each with its reason; everything
else (group.min.session.timeout.ms, the timestamp limits, auto topic creation) is stock, since
those are what users meet. Like `testbed.tansu`, this module uses kafka-python directly, never
the code under test.

`KafkaCluster(..., secure=True)` adds SASL_PLAINTEXT, SSL (a client certificate required) and
SASL_SSL listeners beside PLAINTEXT, which inter-broker traffic and the tests' own tools keep
using: see `SECURE_LISTENERS`, `address(listener)`, `certs` and `user(mechanism, who)`.
"""

from __future__ import annotations

import base64
import ctypes
import fcntl
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from testbed.ports import free_port

if TYPE_CHECKING:
    from testbed.tls_proxy import TestCerts

VERSIONS = {"4": "4.4.0", "3.9": "3.9.2"}  # the newest 4.x and 3.9.x that resolve
CACHE_ENV = "KTM_KAFKA_CACHE"
START_TIMEOUT = 90.0  # seconds: three JVMs starting at once on two busy cores
STOP_GRACE_SECONDS = 30.0  # a controlled shutdown moves leaders away first

# What the test brokers change from a stock broker, and why. Records in the tests carry
# timestamps from 2023: a stock broker's 7-day retention would delete them at its first check.
TEST_SETTINGS = {
    "log.retention.ms": "-1",
    # the internal topics: 50 partitions each would take seconds to create on a test's first
    # group or transaction
    "offsets.topic.num.partitions": "5",
    "transaction.state.log.num.partitions": "5",
    # the log cleaner reserves its dedupe buffer (128 MiB by default) in the heap
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
    # small heaps: many brokers share one test machine
    "num.io.threads": "4",
    "num.network.threads": "2",
}
JVM_HEAP = ("-Xms128m", "-Xmx768m")
# Start-up matters more than peak speed for the tests: the client compiler alone starts sooner.
# The benchmarks start their brokers with `quick_jit=False`.
QUICK_JIT = ("-XX:TieredStopAtLevel=1",)

# The listeners a `secure` cluster adds beside PLAINTEXT (kept for inter-broker traffic and the
# tests' own tools). SSL asks for a client certificate (mutual TLS); SASL_SSL does not.
SECURE_LISTENERS = ("SASL_PLAINTEXT", "SSL", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# What each SASL listener enables: SASL_SSL leaves SCRAM-SHA-256 out, so a test can meet "a
# mechanism the listener does not enable".
LISTENER_MECHANISMS = {
    "SASL_PLAINTEXT": SASL_MECHANISMS,
    "SASL_SSL": ("PLAIN", "SCRAM-SHA-512"),
}
# Two users per mechanism: a source and a target log in with different credentials.
SECURE_USERS = ("src", "dst")

_LOG4J = """\
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={path}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.org.apache.kafka.common.utils.AppInfoParser=WARN
"""

_POM = """\
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>ktm.testbed</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-reload4j</artifactId>
      <version>1.7.36</version>
    </dependency>
  </dependencies>
</project>
"""


class KafkaUnavailable(RuntimeError):
    """Apache Kafka cannot be had on this machine (no Java or Maven, or Maven Central refused)."""


def cache_root() -> Path:
    found = os.environ.get(CACHE_ENV)
    return Path(found) if found else Path.home() / ".cache" / "ktm-testbed" / "kafka"


def kafka_lib(version: str) -> Path:
    """The folder of the broker's jars for `version`, resolved from Maven Central the first
    time (about 45 MB; seconds with a warm Maven repository). KafkaUnavailable if it cannot be."""
    home = cache_root() / version
    lib = home / "lib"
    done = home / "complete"
    if done.exists():
        return lib
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest worker may be resolving it
        if not done.exists():
            _resolve(version, home, lib)
            done.write_text(version)
    return lib


def _resolve(version: str, home: Path, lib: Path) -> None:
    for tool in ("mvn", "java"):
        if shutil.which(tool) is None:
            raise KafkaUnavailable(f"Apache Kafka {version} needs {tool} on PATH")
    shutil.rmtree(lib, ignore_errors=True)
    pom = home / "pom.xml"
    pom.write_text(_POM.format(version=version))
    run = subprocess.run(
        ["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
         f"-DoutputDirectory={lib}"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if run.returncode != 0 or not any(lib.glob(f"kafka_2.13-{version}.jar")):
        tail = "\n".join((run.stdout + run.stderr).splitlines()[-15:])
        raise KafkaUnavailable(f"Maven could not resolve Apache Kafka {version}:\n{tail}")


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the thread that started it ends: `_Spawner`'s,
    which lives as long as the process (a test run interrupted mid-way leaves no broker
    behind). Linux's PR_SET_PDEATHSIG; elsewhere nothing."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except OSError:
        pass


class _Spawner:
    """Starts processes from one thread that lives as long as this process: PR_SET_PDEATHSIG
    fires when the *thread* that forked a child ends, and a node launched from a test's helper
    thread would die with that thread."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, args: list[str], **how: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kafka-spawner", daemon=True)
                self._thread.start()
        done: Future[subprocess.Popen[bytes]] = Future()
        self._jobs.put((lambda: subprocess.Popen(args, **how), done))
        return done.result()

    def _run(self) -> None:
        while True:
            job, done = self._jobs.get()
            try:
                done.set_result(job())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.set_exception(exc)


_SPAWNER = _Spawner()


def _cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class KafkaNode:
    """One broker-and-controller process of a `KafkaCluster`."""

    def __init__(self, cluster: KafkaCluster, node_id: int):
        self.cluster = cluster
        self.node_id = node_id
        self.port = free_port()
        self.controller_port = free_port()
        self.secure_ports = (
            {name: free_port() for name in SECURE_LISTENERS} if cluster.secure else {}
        )
        self.home = cluster.home / f"node-{node_id}"
        self.data = self.home / "data"
        self.log_path = self.home / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.frozen = False

    def __repr__(self) -> str:
        return f"KafkaNode({self.cluster.name}#{self.node_id}, {self.bootstrap})"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def address(self, listener: str = "PLAINTEXT") -> str:
        """host:port of one of this node's listeners (PLAINTEXT, or one of SECURE_LISTENERS)."""
        port = self.port if listener == "PLAINTEXT" else self.secure_ports[listener]
        return f"127.0.0.1:{port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def properties(self) -> dict[str, str]:
        cluster = self.cluster
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in cluster.nodes)
        size = len(cluster.nodes)
        names = ["PLAINTEXT", *self.secure_ports]
        advertised = ",".join(f"{name}://{self.address(name)}" for name in names)
        protocols = ",".join(f"{name}:{name}" for name in names)
        return {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"{advertised},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": advertised,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": f"{protocols},CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data),
            "offsets.topic.replication.factor": str(size),
            "transaction.state.log.replication.factor": str(size),
            "transaction.state.log.min.isr": str(min(2, size)),
            "default.replication.factor": str(size),
            "min.insync.replicas": str(min(2, size)),
            **TEST_SETTINGS,
            **(cluster.security_properties() if cluster.secure else {}),
            **cluster.settings,
        }  # fmt: skip

    def _write_config(self) -> Path:
        self.home.mkdir(parents=True, exist_ok=True)
        config = self.home / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        (self.home / "log4j.properties").write_text(_LOG4J.format(path=self.log_path))
        return config

    def _java(self, main: str, *args: str, heap: Iterable[str] = ()) -> list[str]:
        classpath = str(self.cluster.lib / "*")
        log4j = f"-Dlog4j.configuration=file:{self.home / 'log4j.properties'}"
        jit = QUICK_JIT if self.cluster.quick_jit else ()
        return ["java", *heap, *jit, "-Djava.awt.headless=true", log4j, "-cp", classpath,
                main, *args]  # fmt: skip

    def format(self) -> None:
        """Format this node's storage for its cluster (its data is gone)."""
        shutil.rmtree(self.data, ignore_errors=True)
        config = self._write_config()
        run = subprocess.run(
            self._java("kafka.tools.StorageTool", "format",
                       f"--cluster-id={self.cluster.cluster_id}", f"--config={config}",
                       *self.cluster.scram_arguments()),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if run.returncode != 0:
            raise RuntimeError(f"formatting {self!r} failed:\n{run.stdout}{run.stderr}")

    def launch(self) -> None:
        """Start the process (see `KafkaCluster.wait_ready`)."""
        if self.is_running:
            return
        config = self._write_config()
        with open(self.home / "stdout.log", "ab") as out:
            self._proc = _SPAWNER.popen(
                self._java("kafka.Kafka", str(config), heap=JVM_HEAP),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent,
            )  # fmt: skip
        self.frozen = False

    def kill(self) -> None:
        """SIGKILL: no controlled shutdown, its leaders move when the controller fences it."""
        if self._proc is not None:
            if self.frozen:
                self.thaw()
            if self.is_running:
                self._proc.kill()
            self._proc.wait()

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM: a controlled shutdown (its leaders move first), SIGKILL after `grace`."""
        if not self.is_running:
            return
        assert self._proc is not None
        if self.frozen:
            self.thaw()
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()

    def freeze(self) -> None:
        """SIGSTOP: the process stays, answers nothing, and its connections stay open."""
        if self.is_running and not self.frozen:
            assert self._proc is not None
            os.kill(self._proc.pid, signal.SIGSTOP)
            self.frozen = True

    def thaw(self) -> None:
        if self._proc is not None and self.frozen:
            os.kill(self._proc.pid, signal.SIGCONT)
            self.frozen = False

    def log_tail(self, lines: int = 30) -> str:
        text = ""
        for path in (self.home / "stdout.log", self.log_path):
            try:
                text += path.read_text(errors="replace")
            except OSError:
                continue
        return "\n".join(text.splitlines()[-lines:])


class KafkaCluster:
    """An Apache Kafka cluster of `size` nodes on 127.0.0.1 (KRaft, every node a broker and a
    controller). The same face as `testbed.tansu.TansuBroker` (name, bootstrap, start, stop,
    kill, restart), so a test can ask for either; and the faults of a real cluster: a node
    killed, stopped (a controlled shutdown), frozen, restarted, every node in turn."""

    supports_kill = True

    def __init__(
        self,
        name: str,
        *,
        size: int = 1,
        version: str = VERSIONS["4"],
        log_dir: Path | None = None,
        settings: Mapping[str, str] | None = None,
        quick_jit: bool = True,
        secure: bool = False,
    ):
        self.name = name
        self.version = version
        self.lib = kafka_lib(version)
        self.home = Path(tempfile.mkdtemp(prefix=f"ktm-kafka-{name}-", dir=log_dir))
        self.settings = dict(settings or {})
        self.quick_jit = quick_jit
        self.secure = secure
        self.certs: TestCerts | None = None
        self.users: dict[str, dict[str, str]] = {}
        if secure:
            self._make_credentials()
        self.cluster_id = _cluster_id()
        self.nodes: list[KafkaNode] = []
        self.nodes = [KafkaNode(self, node_id) for node_id in range(1, size + 1)]
        self._formatted = False

    def __repr__(self) -> str:
        return f"KafkaCluster({self.name!r}, {self.version}, bootstrap={self.bootstrap!r})"

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def address(self, listener: str = "PLAINTEXT") -> str:
        """The bootstrap of one listener kind on every node (`secure` clusters: SECURE_LISTENERS
        beside PLAINTEXT)."""
        return ",".join(node.address(listener) for node in self.nodes)

    @property
    def is_running(self) -> bool:
        return any(node.is_running for node in self.nodes)

    # --- secure listeners ----------------------------------------------------------------------

    def _make_credentials(self) -> None:
        """A test CA with a server certificate for 127.0.0.1 and a client certificate, and two
        users per SASL mechanism, each with its own random password."""
        from testbed.tls_proxy import make_ca  # openssl; pytest-skips the caller without it

        self.certs = make_ca(self.home / "tls", name=f"ktm-test-ca-{self.name}")
        keystore = self.home / "tls" / "server-keystore.pem"
        keystore.write_text(self.certs.server_key.read_text() + self.certs.server_cert.read_text())
        self.keystore = keystore
        self.users = {
            mechanism: {
                f"{mechanism.lower()}-{who}": f"pw-{who}-{uuid.uuid4().hex[:16]}"
                for who in SECURE_USERS
            }
            for mechanism in SASL_MECHANISMS
        }

    def user(self, mechanism: str, who: str = "src") -> tuple[str, str]:
        """(username, password) of one of the two users (`who`: src or dst) of `mechanism`."""
        name = f"{mechanism.lower()}-{who}"
        return name, self.users[mechanism][name]

    def scram_arguments(self) -> list[str]:
        """StorageTool's --add-scram for every SCRAM user: they exist from the first start."""
        return [
            f"--add-scram={mechanism}=[name={name},password={password}]"
            for mechanism, users in self.users.items()
            if mechanism.startswith("SCRAM")
            for name, password in users.items()
        ]

    def security_properties(self) -> dict[str, str]:
        """The broker properties of the secure listeners: TLS from PEM files, SASL per
        listener (PLAIN users in the JAAS config, SCRAM users in the metadata log)."""
        assert self.certs is not None
        plain = " ".join(f'user_{name}="{pw}"' for name, pw in self.users["PLAIN"].items())
        props = {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.certs.ca_cert),
            "listener.name.ssl.ssl.client.auth": "required",
            "sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
        }
        for listener, mechanisms in LISTENER_MECHANISMS.items():
            prefix = f"listener.name.{listener.lower()}"
            props[f"{prefix}.sasl.enabled.mechanisms"] = ",".join(mechanisms)
            for mechanism in mechanisms:
                module = (
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain};"
                    if mechanism == "PLAIN"
                    else "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                )
                props[f"{prefix}.{mechanism.lower()}.sasl.jaas.config"] = module
        return props

    @property
    def pid(self) -> int | None:
        return self.nodes[0].pid

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id - 1]

    def start(self, timeout: float = START_TIMEOUT) -> KafkaCluster:
        """Format the storage (the first time) and start every node that is not running;
        returns once every node is registered and unfenced."""
        if not self._formatted:
            for node in self.nodes:
                node.format()
            self._formatted = True
        for node in self.nodes:
            node.launch()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT, nodes: int | None = None) -> None:
        """Until `nodes` (all by default) brokers are registered and unfenced."""
        wanted = len(self.nodes) if nodes is None else nodes
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            dead = [n for n in self.nodes if n._proc is not None and not n.is_running]
            if dead:
                raise RuntimeError(f"{dead[0]!r} exited at start:\n{dead[0].log_tail()}")
            try:
                live = self.live_brokers(timeout=2.0)
                if len(live) >= wanted:
                    return
                last = f"{len(live)} of {wanted} brokers up"
            except KafkaError as exc:
                last = exc
            time.sleep(0.2)
        tail = self.nodes[0].log_tail()
        raise RuntimeError(f"{self!r} not ready within {timeout}s ({last}):\n{tail}")

    def live_brokers(self, timeout: float = 5.0) -> list[int]:
        """The ids of the brokers registered and not fenced, as the cluster says."""
        running = ",".join(n.bootstrap for n in self.nodes if n.is_running and not n.frozen)
        if not running:
            return []
        admin = KafkaAdminClient(
            bootstrap_servers=running,
            request_timeout_ms=int(timeout * 1000),
            bootstrap_timeout_ms=int(timeout * 1000),
        )
        try:
            described = admin.describe_cluster()
        finally:
            admin.close()
        return sorted(b["broker_id"] for b in described["brokers"] if not b.get("is_fenced"))

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """Stop every node (SIGTERM, then SIGKILL), the last ones first; safe twice. The data
        stays until `remove`."""
        for node in reversed(self.nodes):
            node.stop(grace if len(self.nodes) > 1 else min(grace, 5.0))

    def remove(self) -> None:
        """Stop at once and delete the cluster's files."""
        for node in self.nodes:
            node.kill()
        shutil.rmtree(self.home, ignore_errors=True)

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()

    def restart(self, timeout: float = START_TIMEOUT, *, empty: bool = False) -> KafkaCluster:
        """Kill every node and start them again: the data is kept (a real broker's log is on
        disk) unless `empty`, which formats the storage anew (a broker replaced by a new one)."""
        self.kill()
        if empty:
            self.cluster_id = _cluster_id()
            self._formatted = False
        return self.start(timeout)

    def restart_node(self, node_id: int, *, kill: bool = False) -> None:
        """Stop one node (a controlled shutdown, or kill -9), start it again and wait until
        every broker is back and every replica in sync."""
        node = self.node(node_id)
        node.kill() if kill else node.stop()
        node.launch()
        self.wait_ready()
        self.wait_in_sync()

    def rolling_restart(self, pause: float = 0.0) -> None:
        """Every node in turn: a controlled shutdown, a start, every replica back in sync
        before the next, as an operator upgrades a cluster."""
        for node in self.nodes:
            self.restart_node(node.node_id)
            time.sleep(pause)

    def wait_in_sync(self, timeout: float = START_TIMEOUT) -> None:
        """Until no partition of the cluster is under-replicated."""
        deadline = time.monotonic() + timeout
        while True:
            behind = self.under_replicated()
            if not behind:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self!r}: {len(behind)} partitions under-replicated")
            time.sleep(0.2)

    def under_replicated(self) -> list[tuple[str, int]]:
        admin = self.admin()
        try:
            described = admin.describe_topics()
        finally:
            admin.close()
        return [
            (t["name"], p["partition_index"])
            for t in described
            for p in t["partitions"]
            if len(p["isr_nodes"]) < len(p["replica_nodes"])
        ]

    def admin(self, **config: Any) -> KafkaAdminClient:
        return KafkaAdminClient(bootstrap_servers=self.bootstrap, **config)

    def create_topic(
        self, name: str, partitions: int, *, led_by: int | None = None,
        configs: Mapping[str, str] | None = None, timeout: float = 30.0,
    ) -> str:  # fmt: skip
        """A topic replicated on every node; with `led_by`, that node is every partition's
        preferred leader (the first replica), so a fault of that node hits this topic alone
        among topics led elsewhere. Waits until every partition has a leader."""
        ids = [node.node_id for node in self.nodes]
        spec: dict[str, Any] = {"configs": dict(configs or {})}
        if led_by is None:
            spec.update(num_partitions=partitions, replication_factor=len(ids))
        else:
            others = [i for i in ids if i != led_by]
            spec["assignments"] = {
                p: [led_by, *others[p % len(others) :], *others[: p % len(others)]]
                for p in range(partitions)
            }
        admin = self.admin()
        try:
            admin.create_topics({name: spec})
        finally:
            admin.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                leaders = self.leaders(name)
            except (KafkaError, ValueError):
                leaders = {}
            if len(leaders) == partitions and all(lead >= 0 for lead in leaders.values()):
                return name
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} has no leader for every partition on {self!r}")
            time.sleep(0.1)

    def leaders(self, topic: str) -> dict[int, int]:
        """Partition -> the id of its leader (-1: none)."""
        admin = self.admin()
        try:
            (described,) = admin.describe_topics([topic])
        finally:
            admin.close()
        return {p["partition_index"]: p["leader_id"] for p in described["partitions"]}

    def elect_preferred_leaders(self, topic: str, timeout: float = 30.0) -> int:
        """The preferred leader election tool's work for every partition of `topic`, retried
        while a preferred leader is not back in sync yet; how many leaders moved."""
        admin = self.admin()
        deadline = time.monotonic() + timeout
        moved = 0
        try:
            (described,) = admin.describe_topics([topic])
            left = [p["partition_index"] for p in described["partitions"]]
            while left:
                response = admin.elect_leaders(0, {topic: left}, raise_errors=False)  # PREFERRED
                results = response.replica_election_results[0].partition_result
                moved += sum(1 for r in results if r.error_code == 0)
                left = [r.partition_id for r in results if r.error_code not in (0, 84)]
                if left and time.monotonic() > deadline:
                    raise TimeoutError(f"preferred leaders of {topic} {left} not available")
                if left:
                    time.sleep(0.5)
        finally:
            admin.close()
        return moved

    def log_tail(self, lines: int = 30) -> str:
        return "\n\n".join(f"{n!r}:\n{n.log_tail(lines)}" for n in self.nodes)

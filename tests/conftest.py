"""Shared fixtures: real brokers (Tansu, testbed/tansu.py; Apache Kafka, testbed/kafka.py), S3,
Spark, the ``integration`` marker.

A test runs on Tansu unless it (or its module) is marked ``brokers(...)``, which runs it once per
kind named: "tansu", "kafka" (Apache Kafka 4.x), "kafka39" (3.9.x). Its ``source_broker``,
``target_broker`` and ``broker_factory`` are then that kind's. Apache Kafka that cannot be
fetched fails the run under CI (``CI`` set, as .ci/run does) and skips its tests elsewhere.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from testbed.kafka import KafkaCluster, KafkaUnavailable
from testbed.tansu import Broker, new_broker
from tests.support.kafka_pool import KafkaLease, KafkaPool

INTEGRATION_DIR = Path(__file__).parent / "integration"
RELEASE_DIR = Path(__file__).parent / "release"

BrokerFactory = Callable[[str], Broker | KafkaLease]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/integration is marked ``integration``, under tests/release
    ``release``: -m "not integration and not release" runs the unit tests alone."""
    for item in items:
        if INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)
        elif RELEASE_DIR in item.path.parents:
            item.add_marker(pytest.mark.release)


TEARDOWN_GRACE = 0.5  # seconds a test's broker gets to exit on SIGTERM before SIGKILL


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("brokers")
    if marker is not None and "broker_kind" in metafunc.fixturenames:
        metafunc.parametrize("broker_kind", marker.args, indirect=True, scope="module")


@pytest.fixture(scope="module")
def broker_kind(request: pytest.FixtureRequest) -> str:
    """ "tansu", "kafka" or "kafka39": what `source_broker` and the others start."""
    return str(getattr(request, "param", "tansu"))


_kafka_trouble: list[str] = []  # why Apache Kafka cannot be had here, once found


@pytest.fixture(scope="session")
def kafka_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaPool]:
    pool = KafkaPool(tmp_path_factory.mktemp("kafka"))
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def kafka_trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three Apache Kafka 4.x brokers (replication factor 3, min.insync.replicas 2), stock but
    for testbed.kafka.TEST_SETTINGS, for the module: the faults only a real cluster has. A
    test that stops, kills or freezes a node brings it back before it ends."""
    if _kafka_trouble:
        _unavailable()
    try:
        cluster = KafkaCluster("trio", size=3, log_dir=tmp_path_factory.mktemp("trio"))
    except KafkaUnavailable as exc:
        _kafka_trouble.append(str(exc))
        _unavailable()
    try:
        yield cluster.start()
    finally:
        cluster.remove()


def _unavailable() -> None:
    if os.environ.get("CI"):
        pytest.fail(f"Apache Kafka is needed under CI: {_kafka_trouble[0]}")
    pytest.skip(f"Apache Kafka cannot be had here: {_kafka_trouble[0]}")


def _lease(pool: KafkaPool, kind: str, name: str) -> KafkaLease:
    if not _kafka_trouble:
        try:
            return pool.lease(kind, name)
        except KafkaUnavailable as exc:
            _kafka_trouble.append(str(exc))
    _unavailable()
    raise AssertionError("unreachable")  # pytest.skip and pytest.fail raise


def _broker_factory(
    log_dir: Path, kind: str, request: pytest.FixtureRequest
) -> Iterator[BrokerFactory]:
    with ExitStack() as started:  # stops every broker, in reverse order, even if one fails

        def start_broker(name: str) -> Broker | KafkaLease:
            if kind != "tansu":
                pool = request.getfixturevalue("kafka_pool")
                lease = _lease(pool, kind, name)
                started.callback(pool.give_back, lease)
                return lease
            broker = new_broker(name, log_dir=log_dir)
            # Thrown away (memory storage): no need to wait out Tansu's ~5 s for the clients
            # the shared Spark's workers keep connected.
            started.callback(broker.stop, TEARDOWN_GRACE)
            return broker

        yield start_broker


@pytest.fixture
def broker_factory(
    tmp_path_factory: pytest.TempPathFactory, broker_kind: str, request: pytest.FixtureRequest
) -> Iterator[BrokerFactory]:
    """``broker_factory(name)`` starts a fresh broker (one cluster); all stop at teardown."""
    yield from _broker_factory(tmp_path_factory.mktemp("brokers"), broker_kind, request)


@pytest.fixture(scope="module")
def module_brokers(
    tmp_path_factory: pytest.TempPathFactory, broker_kind: str, request: pytest.FixtureRequest
) -> Iterator[BrokerFactory]:
    """Like broker_factory, but the brokers live for the whole test module."""
    yield from _broker_factory(tmp_path_factory.mktemp("brokers"), broker_kind, request)


@pytest.fixture
def far_brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """``far_brokers(name, delay=0.12)`` starts a broker behind a `testbed.link.Link`
    (one-way delay in seconds); all stop at teardown. Needs brokers the tests start."""
    from testbed.link import FarBroker
    from testbed.tansu import brokers_are_external

    if brokers_are_external():
        pytest.skip("a link needs a broker that advertises the link's address (KTM_TEST_KAFKA)")
    log_dir = tmp_path_factory.mktemp("far-brokers")
    with ExitStack() as started:

        def start(name: str, delay: float = 0.12, **how: Any) -> FarBroker:
            far = FarBroker(name, delay=delay, log_dir=log_dir, **how)
            started.callback(far.stop, TEARDOWN_GRACE)
            return far.start()

        yield start


@pytest.fixture(scope="module")
def source_broker(module_brokers: BrokerFactory) -> Broker | KafkaLease:
    return module_brokers("source")


@pytest.fixture(scope="module")
def target_broker(module_brokers: BrokerFactory) -> Broker | KafkaLease:
    return module_brokers("target")


# --- S3 (SeaweedFS) ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One real S3 server for the whole run (SeaweedFS, or KTM_TEST_S3); tests use their own
    prefixes or buckets."""
    from testbed.seaweed import new_s3

    server = new_s3(log_dir=tmp_path_factory.mktemp("seaweed"))
    try:
        yield server
    finally:
        server.stop()


# --- Spark fixtures ----------------------------------------------------------------------------
# Reserved: the session-scoped SparkSession fixture goes here.


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One small real local SparkSession for every in-process test (ktm's Spark reuses it)."""
    from relay.config import SparkConfig
    from relay.engine.spark import Spark

    engine = Spark(
        SparkConfig(master=None, app_name="ktm-tests"),
        "local[2]",
        tmp_path_factory.mktemp("spark"),
    )
    yield engine
    engine.stop()
    # py4j logs from __del__ at interpreter exit, after pytest closed its capture streams;
    # without this, logging prints a "--- Logging error ---" block after the test summary.
    logging.raiseExceptions = False

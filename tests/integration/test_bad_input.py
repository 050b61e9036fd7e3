"""The troubleshooting table's runtime cases (README): each ends in one clear line, the right
exit code and no traceback, before anything is read from the source."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from testbed.ktm_process import assert_one_error_line, run_ktm
from testbed.ports import free_port
from testbed.topics import create_topic, topic_names, unique_topic
from tests.support.relay import topic_pair, write_config

pytestmark = [pytest.mark.timeout(120), pytest.mark.brokers("tansu", "kafka")]


def test_destination_with_fewer_partitions_is_refused(source_broker, target_broker, tmp_path):
    src = create_topic(source_broker.bootstrap, unique_topic("few-src"), partitions=4)
    dst = create_topic(target_broker.bootstrap, unique_topic("few-dst"), partitions=2)
    config = write_config(
        tmp_path / "c.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={src: dst},
    )
    run = run_ktm(tmp_path, "--config", str(config), "--stop-at-end", timeout=90)
    assert_one_error_line(run, 1, f"[topics].{src}", "has 2 partitions, fewer than the source's 4")


def test_fixed_partition_out_of_range_is_refused(source_broker, target_broker, tmp_path):
    src, dst = topic_pair(source_broker.bootstrap, target_broker.bootstrap, "fix", 2)
    config = write_config(
        tmp_path / "c.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={src: f"{dst}:5"},
    )
    run = run_ktm(tmp_path, "--config", str(config), "--stop-at-end", timeout=90)
    assert_one_error_line(run, 1, f'partition 5 of "{dst}" does not exist')


@pytest.fixture
def not_kafka() -> Iterator[str]:
    """A TCP port that accepts connections and answers garbage, like a web server would."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    server.close()


@pytest.mark.brokers("tansu")  # ktm's own behaviour, the same on any broker: a port not Kafka
def test_a_port_that_is_not_kafka_fails_naming_the_address(source_broker, not_kafka, tmp_path):
    src = create_topic(source_broker.bootstrap, unique_topic("nk-src"), partitions=1)
    config = write_config(
        tmp_path / "c.toml",
        source=source_broker.bootstrap,
        target=not_kafka,
        topics={src: "x"},
    )
    run = run_ktm(tmp_path, "--config", str(config), "--stop-at-end", timeout=90)
    assert_one_error_line(run, 1, not_kafka)


def test_metrics_addr_in_use_exits_2(source_broker, target_broker, tmp_path):
    src, dst = topic_pair(source_broker.bootstrap, target_broker.bootstrap, "m", 1)
    busy = socket.socket()
    busy.bind(("127.0.0.1", free_port()))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        config = write_config(
            tmp_path / "c.toml",
            source=source_broker.bootstrap,
            target=target_broker.bootstrap,
            topics={src: dst},
            app=f'metrics_addr = "127.0.0.1:{port}"',
        )
        run = run_ktm(tmp_path, "--config", str(config), "--stop-at-end", timeout=60)
    finally:
        busy.close()
    assert_one_error_line(run, 2, "[app].metrics_addr", f"127.0.0.1:{port}")
    assert dst in topic_names(target_broker.bootstrap)  # and nothing else was touched

"""TLS end to end: relays to and from a broker reached only through TLS (testbed/tls_proxy.py).

Tansu cannot serve TLS to kafka-python ("The test broker" in docs/development.md), so each TLS
cluster is a Tansu listening in plain TCP on 127.0.0.1:Q behind a `TlsProxy` on 127.0.0.1:P, and
Tansu advertises P: the connections kafka-python opens after bootstrap (to the partition leaders,
the group coordinator) come back through the proxy, so every byte the relay exchanges with it is
TLS.
Port Q is only used, by Tansu's own CLI, to create topics.

The checks read the clusters with kafka-python directly (through TLS where needed), never with
the code under test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from testbed.ktm_process import assert_one_error_line, run_ktm
from testbed.ports import free_port
from testbed.provenance import attributed
from testbed.records import Record, produce, read_all
from testbed.tansu import TansuBroker, cli_create_topic
from testbed.tls_proxy import TestCerts, TlsProxy, make_ca, server_context
from testbed.topics import create_topic, describe_topic, led_partitions, unique_topic, wait_until
from tests.support.inprocess import relay_once
from tests.support.relay import FAST_RETRIES, assert_exact_copy, committed_offsets

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 3
RECORDS = 450


# --- a broker behind TLS -----------------------------------------------------------------------


class TlsCluster:
    """A Tansu broker reachable through a TLS proxy; `address` is the only one clients use."""

    def __init__(self, name: str, certs: TestCerts, log_dir: Path, *, mutual: bool):
        self.name = name
        self.certs = certs
        self.mutual = mutual
        plain_port = free_port()
        context = server_context(certs, require_client_cert=mutual)
        self.proxy = TlsProxy(context, upstream_port=plain_port).start()
        self.broker = TansuBroker(
            name, port=plain_port, log_dir=log_dir, advertised_port=self.proxy.port
        )
        try:
            self.broker.start()
        except BaseException:
            self.proxy.stop()
            raise

    @property
    def address(self) -> str:
        return self.proxy.address

    def ssl_settings(self) -> dict[str, Any]:
        """kafka-python settings of a client this cluster lets in."""
        settings: dict[str, Any] = {
            "security_protocol": "SSL",
            "ssl_cafile": str(self.certs.ca_cert),
        }
        if self.mutual:
            settings |= {
                "ssl_certfile": str(self.certs.client_cert),
                "ssl_keyfile": str(self.certs.client_key),
            }
        return settings

    def toml(self) -> str:
        """The [[sources]]/[target] connection keys of a ktm config for this cluster."""
        lines = [
            f'servers = ["{self.address}"]',
            "tls = true",
            f'ca_cert_path = "{self.certs.ca_cert}"',
        ]
        if self.mutual:
            lines += [
                f'client_cert_path = "{self.certs.client_cert}"',
                f'client_key_path = "{self.certs.client_key}"',
            ]
        return "\n".join(lines)

    def create_topic(self, name: str, partitions: int, timeout: float = 10.0) -> str:
        """Create on the plain port with Tansu's CLI (kafka-python's admin client would follow
        the metadata to the TLS address), then wait until the metadata read through TLS shows
        every partition with a leader."""
        cli_create_topic(self.broker.bootstrap, name, partitions)
        wait_until(
            lambda: (
                led_partitions(describe_topic(self.address, name, **self.ssl_settings()))
                == partitions
            ),
            timeout,
            f"{name} shows {partitions} partitions with a leader through TLS",
            every=0.1,
        )
        return name

    def stop(self) -> None:
        self.proxy.stop()
        self.broker.kill()  # memory storage, nothing to keep: no ~5 s SIGTERM grace


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> TestCerts:
    return make_ca(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_cluster(certs: TestCerts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    """TLS with server authentication only (the client checks the broker's certificate)."""
    cluster = TlsCluster("tls", certs, tmp_path_factory.mktemp("brokers"), mutual=False)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def mtls_cluster(
    certs: TestCerts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsCluster]:
    """Mutual TLS: the proxy also requires a client certificate signed by the test CA."""
    cluster = TlsCluster("mtls", certs, tmp_path_factory.mktemp("brokers"), mutual=True)
    yield cluster
    cluster.stop()


# --- helpers -----------------------------------------------------------------------------------


def records(count: int) -> list[Record]:
    return [
        Record(
            key=b"k%d" % i,
            value=b"value-%06d-" % i + bytes(range(i % 64)),
            headers=[("seq", b"%d" % i)],
            partition=i % PARTITIONS,
            timestamp_ms=1_700_000_000_000 + i,
        )
        for i in range(count)
    ]


def write_config(path: Path, *, source: str, target: str, topic: str, dest: str) -> Path:
    """`source`/`target`: the connection keys of each side, including `servers`."""
    path.write_text(
        f'[app]\nmetrics_addr = ""\nsession_timeout = "2s"\n\n'
        f'[topics]\n"{topic}" = "{dest}"\n\n'
        f'[[sources]]\nname = "src"\n{source}\n\n'
        f'[source_pool]\nrequest_timeout = "500ms"\n{FAST_RETRIES}\n\n'
        f"[target]\n{target}\n{FAST_RETRIES}\n"
    )
    return path


def assert_copied(source: dict[int, list[Any]], copied: dict[int, list[Any]], topic: str) -> None:
    assert {p: len(rs) for p, rs in copied.items()} == {p: len(rs) for p, rs in source.items()}
    for partition, got in copied.items():
        assert_exact_copy({partition: source[partition]}, got, topic)
        assert {relayed.partition for relayed in attributed(got)} <= {partition}


# --- tests -------------------------------------------------------------------------------------


def test_relay_to_a_tls_target(source_broker, tls_cluster, spark, tmp_path):
    """Server-authenticated TLS on the target: every record arrives, read back through TLS."""
    src = create_topic(source_broker.bootstrap, unique_topic("tls-src"), partitions=PARTITIONS)
    dst = tls_cluster.create_topic(unique_topic("tls-dst"), PARTITIONS)
    produce(source_broker.bootstrap, src, records(RECORDS))
    handshakes = tls_cluster.proxy.handshakes
    failed = len(tls_cluster.proxy.failed_handshakes)
    config = write_config(
        tmp_path / "config.toml",
        source=f'servers = ["{source_broker.bootstrap}"]',
        target=tls_cluster.toml(),
        topic=src,
        dest=dst,
    )

    summary, _ = relay_once(config)

    assert summary.relayed == RECORDS
    copied = read_all(tls_cluster.address, dst, timeout=20, **tls_cluster.ssl_settings())
    assert_copied(read_all(source_broker.bootstrap, src), copied, src)
    # The driver's metadata/tail reads and the executors' producers all came in through TLS.
    assert tls_cluster.proxy.handshakes - handshakes >= 3
    assert tls_cluster.proxy.failed_handshakes[failed:] == []


def test_relay_from_a_mutual_tls_source(mtls_cluster, target_broker, spark, tmp_path):
    """The source requires a client certificate; reads, offsets and group commits work."""
    src = mtls_cluster.create_topic(unique_topic("mtls-src"), PARTITIONS)
    dst = create_topic(target_broker.bootstrap, unique_topic("mtls-dst"), partitions=PARTITIONS)
    produce(mtls_cluster.address, src, records(RECORDS), **mtls_cluster.ssl_settings())
    failed = len(mtls_cluster.proxy.failed_handshakes)
    config = write_config(
        tmp_path / "config.toml",
        source=mtls_cluster.toml(),
        target=f'servers = ["{target_broker.bootstrap}"]',
        topic=src,
        dest=dst,
    )

    summary, _ = relay_once(config)

    source = read_all(mtls_cluster.address, src, timeout=20, **mtls_cluster.ssl_settings())
    assert summary.relayed == RECORDS
    assert_copied(source, read_all(target_broker.bootstrap, dst), src)
    per_partition = {p: len(rs) for p, rs in source.items()}
    committed = committed_offsets(
        mtls_cluster.address, "ktm", src, PARTITIONS, **mtls_cluster.ssl_settings()
    )
    assert committed == per_partition
    assert mtls_cluster.proxy.failed_handshakes[failed:] == []


def test_mutual_tls_source_refuses_a_client_without_certificate(mtls_cluster):
    """The mutual-TLS fixture really enforces client certificates (else test (b) proves little)."""
    settings = {"security_protocol": "SSL", "ssl_cafile": str(mtls_cluster.certs.ca_cert)}
    failed = len(mtls_cluster.proxy.failed_handshakes)
    with pytest.raises(KafkaError):
        KafkaAdminClient(
            bootstrap_servers=mtls_cluster.address, bootstrap_timeout_ms=2000, **settings
        ).close()
    assert len(mtls_cluster.proxy.failed_handshakes) > failed
    assert "CERTIFICATE" in mtls_cluster.proxy.failed_handshakes[-1].upper()


@pytest.mark.parametrize("side", ["source", "target"])
def test_wrong_ca_fails_with_one_error_line_naming_the_address(
    side, source_broker, tls_cluster, tmp_path
):
    """A CA that did not sign the broker's certificate: exit 2 (the config is wrong), one
    `ktm: error:` line naming the TLS address and the key, no traceback."""
    wrong = make_ca(tmp_path / "other-ca", name="some-other-ca")
    plain = create_topic(source_broker.bootstrap, unique_topic("wrong-ca"), partitions=1)
    tls_topic = tls_cluster.create_topic(unique_topic("wrong-ca"), 1)
    tls_keys = tls_cluster.toml().replace(str(tls_cluster.certs.ca_cert), str(wrong.ca_cert))
    plain_keys = f'servers = ["{source_broker.bootstrap}"]'
    failed = len(tls_cluster.proxy.failed_handshakes)
    if side == "source":
        sides = {"source": tls_keys, "target": plain_keys, "topic": tls_topic, "dest": plain}
    else:
        sides = {"source": plain_keys, "target": tls_keys, "topic": plain, "dest": tls_topic}
    config = write_config(tmp_path / "config.toml", **sides)

    run = run_ktm(tmp_path, "--config", str(config), "--stop-at-end", timeout=60)

    key = "[[sources]][1].ca_cert_path" if side == "source" else "[target].ca_cert_path"
    error = assert_one_error_line(run, 2, tls_cluster.address, key)
    assert error.startswith(f"ktm: error: {side} "), run.stderr
    # The broker's certificate was refused by the client (it never got past the handshake).
    assert len(tls_cluster.proxy.failed_handshakes) > failed
    # ... and the line says why: the TLS handshake failed on the certificate.
    assert "TLS handshake" in error and "CERTIFICATE" in error.upper(), run.stderr

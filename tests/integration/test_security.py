"""Issue 36: SASL and TLS on real Apache Kafka 4.4 listeners (testbed.kafka, `secure=True`).

One secure cluster serves the module: beside PLAINTEXT (the tests' own tools read and write
through it) it listens with SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), SSL (a client
certificate required) and SASL_SSL (PLAIN, SCRAM-SHA-512), two users per mechanism. A source
and a target on it are two clusters to ktm: other addresses, other credentials (a source logs
in as "<mechanism>-src", a target as "<mechanism>-dst"), other topics. Failover needs two
nodes fed the same records: a second secure cluster, started only for that test, is the node
that dies.

Each pipeline logs in on each side: relay, discovery and group sync, backup and restore,
`ktm verify`, failover. Bad input (wrong password, unknown or disabled mechanism, untrusted
certificate) is one error line naming the cluster and the key, exit 2, nothing read lost. The
passwords are never in a command line, a log, the metrics, the summary or the store.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from testbed.kafka import KafkaCluster, KafkaUnavailable
from testbed.ktm_process import assert_one_error_line, ktm, run_ktm
from testbed.ports import free_port
from testbed.records import Record, produce, read_all, record_count
from testbed.tls_proxy import TestCerts, make_ca
from testbed.topics import create_topic, unique_topic, wait_until
from tests.support.inprocess import (
    Background,
    assert_verified,
    backup,
    relay_once,
    restore,
    verify_once,
)
from tests.support.kafka_pool import POOL_SETTINGS
from tests.support.relay import FAST_RETRIES, assert_exact_copy, committed_offsets

pytestmark = [pytest.mark.brokers("kafka"), pytest.mark.timeout(150)]

PARTITIONS = 3


# --- the secure clusters -----------------------------------------------------------------------


def _secure_cluster(name: str, log_dir: Path) -> KafkaCluster:
    """Like the pool's nodes, it takes the tests' 2 s group sessions."""
    try:
        cluster = KafkaCluster(name, secure=True, log_dir=log_dir, settings=POOL_SETTINGS)
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot be had here: {exc}")
        raise  # pytest.skip raises
    cluster.start()
    # The first group request creates the offsets topic; until its partitions are loaded a
    # group coordinator is "not available" (seconds, on a new cluster).
    wait_until(lambda: _coordinator_ready(cluster), 60, f"{name}'s group coordinator", every=0.2)
    return cluster


def _coordinator_ready(cluster: KafkaCluster) -> bool:
    try:
        committed_offsets(cluster.bootstrap, "ktm", "warm-up", 1)
    except KafkaError:
        return False
    return True


@pytest.fixture(scope="module")
def secure(broker_kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = _secure_cluster("secure", tmp_path_factory.mktemp("secure"))
    yield cluster
    cluster.remove()


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCerts:
    """A CA that signed nothing the brokers serve."""
    return make_ca(tmp_path_factory.mktemp("other-ca"), name="not-the-brokers-ca")


def keys(
    cluster: KafkaCluster, listener: str, mechanism: str | None = None, who: str = "src",
    *, password: str | None = None, ca: Path | None = None, client_cert: bool = True,
) -> str:  # fmt: skip
    """The connection keys of a [[sources]] entry or of [target] for one listener."""
    assert cluster.certs is not None
    lines = [f'servers = ["{cluster.address(listener)}"]']
    if mechanism:
        user, secret = cluster.user(mechanism, who)
        lines += [f'sasl_mechanism = "{mechanism}"', f'username = "{user}"',
                  f'password = "{password or secret}"']  # fmt: skip
    if listener in ("SSL", "SASL_SSL"):
        lines += ["tls = true", f'ca_cert_path = "{ca or cluster.certs.ca_cert}"']
    if listener == "SSL" and client_cert:  # the SSL listener asks for a client certificate
        lines += [f'client_cert_path = "{cluster.certs.client_cert}"',
                  f'client_key_path = "{cluster.certs.client_key}"']  # fmt: skip
    return "\n".join(lines)


def config(
    path: Path, *, sources: dict[str, str], target: str, topics: dict[str, str] | None = None,
    extra: str = "", app: str = 'metrics_addr = ""', pool: str = FAST_RETRIES,
) -> Path:  # fmt: skip
    """`sources`: name -> connection keys; `pool`: the [source_pool] keys; `extra`: TOML
    after [target]."""
    routes = "".join(f'"{src}" = "{dst}"\n' for src, dst in (topics or {}).items())
    entries = "".join(f'[[sources]]\nname = "{n}"\n{k}\n\n' for n, k in sources.items())
    path.write_text(
        f'[app]\n{app}\nsession_timeout = "2s"\n\n'
        + (f"[topics]\n{routes}\n" if routes else "")
        + f"{entries}[source_pool]\n{pool}\n\n"
        f"[target]\n{target}\n{FAST_RETRIES}\n{extra}\n"
    )
    return path


def records(count: int, first: int = 0) -> list[Record]:
    return [
        Record(key=b"k%d" % i, value=b"secure-%06d" % i, headers=[("n", b"%d" % i)],
               partition=i % PARTITIONS, timestamp_ms=1_700_000_000_000 + i)
        for i in range(first, first + count)
    ]  # fmt: skip


def topic_with(cluster: KafkaCluster, prefix: str, count: int) -> str:
    topic = create_topic(cluster.bootstrap, unique_topic(prefix), PARTITIONS)
    produce(cluster.bootstrap, topic, records(count))
    return topic


def assert_copied(cluster: KafkaCluster, src: str, dst: str) -> None:
    copied = [record for got in read_all(cluster.bootstrap, dst).values() for record in got]
    assert_exact_copy(read_all(cluster.bootstrap, src), copied, src)


# --- every pipeline logs in on each side -------------------------------------------------------


def test_relay_plain_source_to_scram_sha_512_tls_target(secure, spark, tmp_path):
    """[[sources]] SASL_PLAINTEXT PLAIN, [target] SASL_SSL SCRAM-SHA-512; ktm verify too."""
    src = topic_with(secure, "sec-relay", 300)
    dst = create_topic(secure.bootstrap, unique_topic("sec-relay-copy"), PARTITIONS)
    conf = config(tmp_path / "c.toml", topics={src: dst},
                  sources={"src": keys(secure, "SASL_PLAINTEXT", "PLAIN")},
                  target=keys(secure, "SASL_SSL", "SCRAM-SHA-512", "dst"))  # fmt: skip

    summary, _ = relay_once(conf)

    assert summary.relayed == 300
    assert_copied(secure, src, dst)
    assert_verified(verify_once(conf, spark), 300)
    assert committed_offsets(secure.bootstrap, "ktm", src, PARTITIONS) == {0: 100, 1: 100, 2: 100}


def test_discovery_and_group_sync_over_scram_sha_256_and_mutual_tls(secure, spark, tmp_path):
    """[discover] and [groups]: the source over SASL_PLAINTEXT SCRAM-SHA-256, the target over
    SSL with a client certificate; the group's source offset arrives on the copy."""
    prefix = unique_topic("sec-disc")
    src = create_topic(secure.bootstrap, f"{prefix}-a", PARTITIONS)
    produce(secure.bootstrap, src, records(150))
    group = unique_topic("sec-group")
    commit(secure.bootstrap, group, src, 20)
    conf = config(
        tmp_path / "c.toml",
        sources={"src": keys(secure, "SASL_PLAINTEXT", "SCRAM-SHA-256")},
        target=keys(secure, "SSL"),
        extra=(f'create_topics = true\n\n[discover]\ninclude = ["{prefix}-.*"]\n'
               f'rename = "copy.{{topic}}"\ninterval = "1s"\n\n'
               f'[groups]\ninclude = ["{group}"]\ninterval = "1s"\n'),
    )  # fmt: skip
    dst = f"copy.{src}"
    relay = Background(conf)
    try:
        wait_until(lambda: record_count(secure.bootstrap, dst, timeout=5) == 150, 60,
                   "the discovered topic copied", every=0.5)  # fmt: skip
        wait_until(lambda: committed_offsets(secure.bootstrap, group, dst, PARTITIONS)
                   == {0: 20, 1: 20, 2: 20}, 60, "the group synced", every=0.5)  # fmt: skip
    finally:
        relay.finish()
    assert relay.error is None
    assert_copied(secure, src, dst)
    assert_verified(verify_once(conf, spark), 150)


def commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        consumer.commit({TopicPartition(topic, p): OffsetAndMetadata(offset, "", -1)
                         for p in range(PARTITIONS)})  # fmt: skip
    finally:
        consumer.close(autocommit=False)


def test_backup_over_plain_tls_and_restore_over_scram_sha_512(secure, spark, tmp_path):
    """Backup reads over SASL_SSL PLAIN, restore writes over SASL_PLAINTEXT SCRAM-SHA-512;
    `ktm verify --store` and `--from-store` log in too. No password reaches the store."""
    src = topic_with(secure, "sec-backup", 240)
    dst = unique_topic("sec-restored")
    store = tmp_path / "store"
    conf = config(tmp_path / "c.toml", topics={src: dst},
                  sources={"src": keys(secure, "SASL_SSL", "PLAIN")},
                  target=keys(secure, "SASL_PLAINTEXT", "SCRAM-SHA-512", "dst"),
                  extra=f'\n[store]\nurl = "{store}"\nmax_segment_records = 50\n')  # fmt: skip

    assert backup(conf).relayed == 240
    assert_verified(verify_once(conf, spark, "backup"), 240)
    summary, _ = restore(conf, create_topics=True)
    assert summary.relayed == 240
    assert_verified(verify_once(conf, spark, "restore"), 240)
    assert_copied(secure, src, dst)
    assert_no_password(secure, {str(p): p.read_bytes() for p in store.rglob("*") if p.is_file()})


def test_failover_between_two_secure_nodes(secure, spark, tmp_path_factory, tmp_path, caplog):
    """Two source nodes, each with its own login: a second secure cluster over SASL_PLAINTEXT
    PLAIN (listed first: the initial node) dies; the relay goes on from the first cluster over
    SASL_SSL SCRAM-SHA-512, writing over SSL with a client certificate. Nothing lost or twice.
    A third node with a wrong password is never used, and said so once."""
    second = _secure_cluster("secure-b", tmp_path_factory.mktemp("secure-b"))
    try:
        topic = unique_topic("sec-fo")
        for node in (second, secure):
            create_topic(node.bootstrap, topic, PARTITIONS)
            produce(node.bootstrap, topic, records(200))
        dst = create_topic(secure.bootstrap, unique_topic("sec-fo-copy"), PARTITIONS)
        conf = config(
            tmp_path / "c.toml", topics={topic: dst},
            sources={"b": keys(second, "SASL_PLAINTEXT", "PLAIN"),
                     "a": keys(secure, "SASL_SSL", "SCRAM-SHA-512"),
                     "c": keys(secure, "SASL_PLAINTEXT", "SCRAM-SHA-256", password="wrong")},
            target=keys(secure, "SSL"),
            # a new cluster's group coordinator takes a few seconds to load
            pool=('healthcheck_interval = "500ms"\noffset_lag_threshold = 100\n'
                  'max_retries = 30\nbackoff_min = "200ms"\nbackoff_max = "500ms"'),
        )  # fmt: skip
        relay = Background(conf)
        try:
            wait_until(lambda: record_count(secure.bootstrap, dst, timeout=5) == 200, 60,
                       "the first records copied from node b", every=0.5)  # fmt: skip
            assert relay.active("b") == 1
            second.kill()
            produce(secure.bootstrap, topic, records(100, first=200))
            wait_until(lambda: record_count(secure.bootstrap, dst, timeout=5) == 300, 60,
                       "the rest copied from node a", every=0.5)  # fmt: skip
            assert relay.active("a") == 1
        finally:
            relay.finish()
        assert relay.error is None
        refused = [r.getMessage() for r in caplog.records if "cannot be used" in r.getMessage()]
        assert len(refused) == 1 and "[[sources]][3].password" in refused[0], refused
        assert_copied(secure, topic, dst)
        assert_verified(verify_once(conf, spark, failover=True), 300)
    finally:
        second.remove()


# --- bad input: one line naming the cluster and the key, exit 2, nothing read lost --------------


BAD = {
    # case: (side, listener, mechanism, what is wrong, the key named)
    "wrong password, source": ("source", "SASL_PLAINTEXT", "SCRAM-SHA-256", "password",
                               "[[sources]][1].password"),
    "wrong password, target": ("target", "SASL_SSL", "PLAIN", "password", "[target].password"),
    "mechanism not enabled": ("target", "SASL_SSL", "SCRAM-SHA-256", None,
                              "[target].sasl_mechanism"),
    "untrusted certificate": ("source", "SASL_SSL", "SCRAM-SHA-512", "ca",
                              "[[sources]][1].ca_cert_path"),
    "no client certificate": ("target", "SSL", None, "client", "[target].client_cert_path"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_a_refused_login_is_one_line_naming_the_key(case, secure, other_ca, tmp_path):
    side, listener, mechanism, wrong, key = BAD[case]
    src = topic_with(secure, "sec-bad", 30)
    dst = create_topic(secure.bootstrap, unique_topic("sec-bad-copy"), PARTITIONS)
    bad = keys(secure, listener, mechanism, "src" if side == "source" else "dst",
               password="not-the-password" if wrong == "password" else None,
               ca=other_ca.ca_cert if wrong == "ca" else None,
               client_cert=wrong != "client")  # fmt: skip
    good = keys(secure, "SASL_PLAINTEXT", "SCRAM-SHA-512", "dst" if side == "source" else "src")
    conf = config(tmp_path / "c.toml", topics={src: dst}, sources={"src": bad if side == "source"
                  else good}, target=bad if side == "target" else good,
                  pool=f'{FAST_RETRIES}\nrequest_timeout = "2s"')  # fmt: skip

    run = run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", timeout=90)

    who = "source src (" if side == "source" else "target ("
    error = assert_one_error_line(run, 2, who + secure.address(listener), key)
    why = {"ca": "TLS handshake", "client": "TLS handshake", "password": "refused"}
    assert why.get(wrong or "", "not enabled") in error
    assert "retrying" not in run.stderr  # a wrong password does not become right
    assert committed_offsets(secure.bootstrap, "ktm", src, PARTITIONS) == dict.fromkeys(
        range(PARTITIONS)
    )
    assert record_count(secure.bootstrap, dst) == 0


def test_an_unknown_mechanism_is_a_config_error(secure, tmp_path):
    plain = keys(secure, "SASL_PLAINTEXT", "PLAIN")
    conf = config(tmp_path / "c.toml", topics={"a": "b"}, sources={"src": plain},
                  target=plain.replace('"PLAIN"', '"GSSAPI"'))  # fmt: skip

    run = run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", timeout=60)

    assert_one_error_line(run, 2, "[target].sasl_mechanism", "GSSAPI", "SCRAM-SHA-512")


# --- secrets stay out of ps, logs, metrics and the summary -------------------------------------


def assert_no_password(cluster: KafkaCluster, places: dict[str, bytes]) -> None:
    passwords = [pw for users in cluster.users.values() for pw in users.values()]
    leaks = [(where, pw) for where, text in places.items() for pw in passwords
             if pw.encode() in text]  # fmt: skip
    assert leaks == []


def command_lines() -> dict[str, bytes]:
    found = {}
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found[str(path)] = path.read_bytes()
        except OSError:
            continue  # gone meanwhile
    return found


def test_passwords_stay_out_of_ps_logs_metrics_and_summary(secure, tmp_path):
    """`ktm relay --debug` over SCRAM-SHA-512 and PLAIN: /proc/*/cmdline of every process
    (ktm, its Spark JVM and Python workers) read while it runs, its stderr and log files, a
    /metrics scrape and --summary-json: none holds a password."""
    src = topic_with(secure, "sec-secrets", 3000)
    dst = create_topic(secure.bootstrap, unique_topic("sec-secrets-copy"), PARTITIONS)
    port = free_port()
    conf = config(tmp_path / "c.toml", topics={src: dst},
                  sources={"src": keys(secure, "SASL_PLAINTEXT", "SCRAM-SHA-512")},
                  target=keys(secure, "SASL_SSL", "PLAIN", "dst"),
                  app=f'metrics_addr = "127.0.0.1:{port}"')  # fmt: skip
    summary = tmp_path / "summary.json"
    lines: set[bytes] = set()
    metrics = b""
    with ktm(tmp_path, "--config", str(conf), "--stop-at-end", "--debug",
             "--summary-json", str(summary)) as process:  # fmt: skip
        while process.proc.poll() is None:
            lines |= set(command_lines().values())
            metrics = metrics or _scrape(port)
            time.sleep(0.2)
        run = process.wait(30)
    assert run.returncode == 0, run.stderr
    assert json.loads(summary.read_text())["relayed"] == 3000
    assert b"ktm_" in metrics, "the metrics were never scraped"
    assert any(b"org.apache.spark" in line for line in lines), "the Spark JVM was never seen"
    assert any(b"pyspark" in line for line in lines), "no Python worker was seen"
    logs = {str(p): p.read_bytes() for p in (tmp_path / "ktm-logs").rglob("*") if p.is_file()}
    commands = {f"cmdline {i}": line for i, line in enumerate(lines)}
    assert_no_password(secure, {**commands, **logs, "stderr": run.stderr.encode(),
                                "metrics": metrics, "summary": summary.read_bytes()})  # fmt: skip
    assert_copied(secure, src, dst)


def _scrape(port: int) -> bytes:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as answer:
            return bytes(answer.read())
    except OSError:
        return b""

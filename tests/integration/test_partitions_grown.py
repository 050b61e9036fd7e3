"""Issue 36: a source topic that gains partitions while ktm relays. Its destination grows too
where `[target].create_topics` allows it, and the new partitions are relayed from their start,
exactly once, within a discovery interval or so; where the destination cannot grow, the new
partitions halt (one ERROR line naming the topic, both counts and the key), never remapped.

Apache Kafka only: Tansu has no CreatePartitions. One pair of module-scoped single-node clusters
serves every test (their topics are unique); `[discover].interval` is 1 s.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewPartitions

from testbed.ktm_process import Ktm, metric_total
from testbed.ktm_process import wait_for as wait_process
from testbed.ports import free_port
from testbed.provenance import attributed
from testbed.records import Record, produce, read_all
from testbed.tansu import TansuBroker
from testbed.topics import create_topic, describe_topic, unique_topic, wait_until
from tests.support.feeder import Feeder
from tests.support.inprocess import Background, assert_verified, verify_once
from tests.support.relay import assert_exact_copy, write_config

pytestmark = [pytest.mark.brokers("kafka"), pytest.mark.timeout(120)]

DISCOVERY = '[discover]\ninterval = "1s"\n'
ASSIGNED = "ktm_assigned_partitions"
FILTER = Path(__file__).parent / "filter_files" / "drop_marked.py"


def wait_for(
    condition: Callable[[], bool], timeout: float, what: str, relay: Background | None = None
) -> None:
    """Until `condition`; a relay that ended meanwhile fails the test with its error."""

    def met() -> bool:
        if relay is not None and not relay.thread.is_alive():
            raise AssertionError(f"the relay ended waiting until {what}: {relay.error!r}")
        return condition()

    wait_until(met, timeout, what, every=0.3)


def wait_copied(
    bootstrap: str, dest: str, source: str, want: Sequence[int], timeout: float, what: str,
    relay: Background,
) -> None:  # fmt: skip
    """Until `dest` holds one copy of each of `source`'s first `want[p]` records of each
    partition; a timeout says what it held last (missing and doubled records by partition)."""
    expected, held = once_each(source, want), Counter[tuple[str, int, int]]()

    def met() -> bool:
        nonlocal held
        held = copies(bootstrap, dest)
        return held == expected

    try:
        wait_for(met, timeout, what, relay)
    except TimeoutError as exc:
        missing = Counter(p for (_, p, _), n in (expected - held).items() for _ in range(n))
        doubled = Counter(p for (_, p, _), n in (held - expected).items() for _ in range(n))
        raise TimeoutError(f"{exc}: missing by partition {dict(missing)}, "
                           f"more than once {dict(doubled)}") from None  # fmt: skip


def grow(bootstrap: str, counts: dict[str, int]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_partitions({t: NewPartitions(total_count=n) for t, n in counts.items()})
    finally:
        admin.close()


def partitions(bootstrap: str, topic: str) -> int:
    described = describe_topic(bootstrap, topic)
    return len(described["partitions"]) if described else 0


def numbered(start: int, count: int, parts: int, tag: str) -> list[Record]:
    """Deterministic records, round-robin over `parts` partitions (two failover nodes fed the
    same range hold the same data)."""
    return [
        Record(key=f"{tag}{n}", value=f"{tag}-{n}", partition=n % parts,
               timestamp_ms=1_700_000_000_000 + n)
        for n in range(start, start + count)
    ]  # fmt: skip


def copies(bootstrap: str, topic: str) -> Counter[tuple[str, int, int]]:
    """How often each source record (topic, partition, offset) has a copy in `topic`."""
    records = [r for rs in read_all(bootstrap, topic).values() for r in rs]
    return Counter((c.topic, c.partition, c.offset) for c in attributed(records))


def once_each(topic: str, per_partition: Sequence[int]) -> Counter[tuple[str, int, int]]:
    return Counter({(topic, p, o): 1 for p, n in enumerate(per_partition) for o in range(n)})


def config(path: Path, sources: Sequence[Any], target: str, topics: dict[str, str],
           extra: str = "", discover: str = "", group: str = "",
           metrics: str = "") -> Path:  # fmt: skip
    """A relay of `topics` from `sources` (failover mode: more than one, named node1, node2..)
    with a discovery interval of 1 s; `extra` goes into [target], `discover` into [discover]."""
    app = f'metrics_addr = "{metrics}"\ngroup_id = "{group or unique_topic("grow")}"'
    text = write_config(path, source=sources[0].bootstrap, target=target, topics=topics,
                        source_name="node1", app=app,
                        extra=f"{extra}\n\n{DISCOVERY}{discover}").read_text()  # fmt: skip
    more = "".join(
        f'[[sources]]\nname = "node{n}"\nservers = ["{node.bootstrap}"]\n\n'
        for n, node in enumerate(sources[1:], start=2)
    )
    # failover: nodes checked twice a second (the default, 3 s, would slow the failover down)
    health = 'healthcheck_interval = "500ms"\nrequest_timeout = "500ms"\n' if more else ""
    # a broker's first group request creates __consumer_offsets: seconds, not the 0.3 s that
    # one retry of the shared test config waits
    text = text.replace("max_retries = 1\n", "max_retries = 20\n")
    path.write_text(text.replace("[source_pool]\n", f"{more}[source_pool]\n{health}"))
    return path


def test_named_and_discovered_topics_that_grow_are_relayed_from_their_start(
    source_broker, target_broker, spark, tmp_path
):
    """Single mode: a `[topics]` route and a `[discover]` one, both 2 -> 4 partitions, through
    a filter (the record path)."""
    src, dst = source_broker.bootstrap, target_broker.bootstrap
    named, found = unique_topic("grow-named"), unique_topic("grow-found")
    dest = create_topic(dst, unique_topic("grow-named-copy"), 2)
    for topic in (named, found):
        create_topic(src, topic, 2)
        produce(src, topic, numbered(0, 20, 2, "a"))
    # a filter that keeps every record: the record path (the other tests: the batch path)
    keep = f'\n[filters.keep]\npath = "{FILTER}"\nconfig = {{ id = "keep", marker = "never" }}\n'
    path = config(tmp_path / "c.toml", [source_broker], dst, {named: dest}, "create_topics = true",
                  f'include = ["{found}"]\nrename = "copy.{{topic}}"\n{keep}')  # fmt: skip
    relay = Background(path, failover=False)
    try:
        wait_copied(dst, dest, named, [10, 10], 60, "relayed", relay)
        wait_copied(dst, f"copy.{found}", found, [10, 10], 30, "found", relay)
        grown_at = time.monotonic()
        grow(src, {named: 4, found: 4})
        for topic in (named, found):
            produce(src, topic, numbered(20, 40, 4, "b"))
        want = [20, 20, 10, 10]
        wait_copied(dst, dest, named, want, 30, "new partitions", relay)
        wait_copied(dst, f"copy.{found}", found, want, 30, "found", relay)
        took = time.monotonic() - grown_at
    finally:
        relay.finish()
    assert relay.error is None, relay.error
    assert partitions(dst, dest) == 4 and partitions(dst, f"copy.{found}") == 4
    assert_verified(verify_once(path, spark), 120)
    print(f"\npartitions grown -> every new record relayed: {took:.1f}s (interval 1s)")


@pytest.fixture(params=["may not grow", "cannot grow"])
def short_target(request, target_broker, tmp_path) -> Iterator[tuple[str, str]]:
    """A target whose topics do not grow, and the [target] keys of the relay: Apache Kafka with
    `create_topics = false`, or Tansu (no CreatePartitions) with `create_topics = true`."""
    if request.param == "may not grow":
        yield target_broker.bootstrap, ""
        return
    tansu = TansuBroker("grow-tansu", log_dir=tmp_path).start()
    try:
        yield tansu.bootstrap, "create_topics = true"
    finally:
        tansu.stop(0.5)


def test_a_destination_that_cannot_grow_halts_the_new_partitions_only(
    source_broker, short_target, tmp_path, caplog
):
    """The destination keeps 2 partitions (ktm may not grow it, or the broker cannot): the
    source's new partition halts at its start with one ERROR line naming the topic, both counts
    and the key, and is never written elsewhere; the other partitions go on."""
    src, (dst, keys) = source_broker.bootstrap, short_target
    topic = create_topic(src, unique_topic("grow-short"), 2)
    dest = create_topic(dst, unique_topic("grow-short-copy"), 2)
    produce(src, topic, numbered(0, 20, 2, "a"))
    relay = Background(config(tmp_path / "c.toml", [source_broker], dst, {topic: dest}, keys),
                       failover=False)  # fmt: skip
    try:
        wait_copied(dst, dest, topic, [10, 10], 60, "relayed", relay)
        grow(src, {topic: 3})
        produce(src, topic, numbered(20, 30, 3, "b"))
        wait_for(
            lambda: bool(relay.relay.status.halts.all()), 15, "the new partition halted", relay
        )
        produce(src, topic, [Record(value=f"c{n}", partition=n % 2) for n in range(10)])
        wait_copied(dst, dest, topic, [25, 25], 30, "the others", relay)
        time.sleep(1.5)  # another discovery interval: nothing more halts, nothing is remapped
        assert copies(dst, dest) == once_each(topic, [25, 25])
    finally:
        relay.finish()
    assert relay.error is None, relay.error
    assert partitions(dst, dest) == 2
    (halt,) = relay.relay.status.halts.all()
    assert (halt.route.key, halt.offset) == ((topic, 2), 0)
    said = [r for r in caplog.records if r.name.startswith("relay.") and dest in r.getMessage()]
    lines = [r.getMessage() for r in said if r.levelname == "ERROR"]
    assert len(lines) == 1, lines
    assert f"halted source partition {topic}[2] at offset 0" in lines[0]
    assert f"destination '{dest}' has 2 partitions, fewer than the source's 3" in lines[0]
    assert "[target].create_topics = true" in lines[0]
    refused = [r.getMessage() for r in said if "CreatePartitions" in r.getMessage()]
    if keys:  # Tansu: the grow refused, said once
        said_once = f"destination {dest} keeps 2 partitions, fewer than the 3 its source has: "
        assert len(refused) == 1 and refused[0].startswith(said_once), refused
        assert "the broker does not implement CreatePartitions" in refused[0]
    else:
        assert refused == []


def test_two_processes_share_the_partitions_a_topic_gains_while_relaying_it(
    source_broker, target_broker, tmp_path
):
    """Two `ktm relay` processes on one config, a feeder writing all along: each finds the
    new partitions and rejoins the group with them (until both have, the leader's plan holds);
    they end up sharing 4 partitions 2/2, and every record of every partition arrives once."""
    src, dst = source_broker.bootstrap, target_broker.bootstrap
    topic = create_topic(src, unique_topic("grow-many"), 2)
    dest = create_topic(dst, unique_topic("grow-many-copy"), 2)
    feeder = Feeder(src, topic, 2, per_batch=20, pause=0.1)
    group, processes = unique_topic("grow-many"), []
    for _ in range(2):
        port = free_port()
        path = config(tmp_path / f"c-{port}.toml", [source_broker], dst, {topic: dest},
                      "create_topics = true", group=group, metrics=f"127.0.0.1:{port}")  # fmt: skip
        processes.append((Ktm(tmp_path, "--config", str(path), "--no-progress"), port))
    (a, port_a), (b, port_b) = processes

    def owned() -> tuple[float | None, float | None]:
        return metric_total(port_a, ASSIGNED), metric_total(port_b, ASSIGNED)

    try:
        wait_process(lambda: owned() == (1, 1), 120, "a 1/1 share", a, b)
        wait_process(lambda: copies(dst, dest).total() > 200, 60, "records flowing", a)
        before = feeder.stop()
        grown_at = time.monotonic()
        grow(src, {topic: 4})
        feeder = Feeder(src, topic, 4, per_batch=20, pause=0.1)
        wait_process(lambda: owned() == (2, 2), 60, "a 2/2 share of 4 partitions", a, b)
        shared = time.monotonic() - grown_at
        time.sleep(1.0)  # records flow to the new partitions under the new share
        sent = before + feeder.stop()
        wait_for(lambda: copies(dst, dest).total() >= sent, 60, "every record")
        for process, _ in processes:
            process.proc.send_signal(signal.SIGTERM)
        for process, _ in processes:
            run = process.wait(timeout=30)
            assert run.returncode == 0, run.stderr
    finally:
        feeder.stop()
        for process, _ in processes:
            process.kill()
    copied = [r for rs in read_all(dst, dest).values() for r in rs]
    assert_exact_copy(read_all(src, topic), copied, topic)
    assert partitions(dst, dest) == 4
    print(f"\npartitions grown -> shared 2/2 by two processes: {shared:.1f}s (interval 1s)")


def test_failover_nodes_relay_a_new_partition_once_every_node_has_it(
    source_broker, target_broker, module_brokers, spark, tmp_path
):
    """Two identical nodes; node1 (active) gains the partitions first: they wait until node2
    has them too (relayed from node1 alone, a failover to node2 could not continue them).
    Then node1 dies: node2 continues every partition, each record once."""
    node1, node2, dst = module_brokers("spare"), source_broker, target_broker.bootstrap
    topic, dest = unique_topic("grow-fo"), unique_topic("grow-fo-copy")
    for node in (node1, node2):
        create_topic(node.bootstrap, topic, 2)
        produce(node.bootstrap, topic, numbered(0, 20, 2, "a"))
    create_topic(dst, dest, 2)
    path = config(tmp_path / "c.toml", [node1, node2], dst, {topic: dest}, "create_topics = true")
    relay = Background(path)
    try:
        wait_copied(dst, dest, topic, [10, 10], 60, "relayed", relay)
        grow(node1.bootstrap, {topic: 4})
        produce(node1.bootstrap, topic, numbered(20, 40, 4, "b"))
        wait_copied(dst, dest, topic, [20, 20], 30, "the old ones", relay)
        time.sleep(2.5)  # two discovery intervals: node2 lacks partitions 2 and 3, they wait
        assert copies(dst, dest) == once_each(topic, [20, 20]) and partitions(dst, dest) == 2
        grow(node2.bootstrap, {topic: 4})
        produce(node2.bootstrap, topic, numbered(20, 40, 4, "b"))
        want = once_each(topic, [20, 20, 10, 10])
        wait_for(lambda: copies(dst, dest) == want, 60, "the new partitions", relay)
        node1.kill()
        produce(node2.bootstrap, topic, numbered(60, 40, 4, "c"))
        want = once_each(topic, [30, 30, 20, 20])
        wait_for(lambda: copies(dst, dest) == want, 60, "every partition after the failover", relay)
    finally:
        relay.finish()
    assert relay.error is None, relay.error
    assert relay.failovers("down") == 1 and relay.active("node2") == 1
    assert partitions(dst, dest) == 4
    assert_verified(verify_once(path, spark, failover=True), 100)

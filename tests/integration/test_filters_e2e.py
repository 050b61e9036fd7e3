"""Filters end to end, on real brokers and real Spark.

The sample filters through `[filters.<id>]` sections, `--filter PATH`, resumption after dropped
tails, load-time errors (exit 2), run-time errors (stop or skip), where and how often filters are
loaded, and filters in failover mode. Relays run in-process on the shared SparkSession, wired like
relay/cli.py does; where the exit code or stderr matters, as the real `ktm` command. Checks use
kafka-python only (testbed and tests/support/relay.py) and expectations computed here, never the
filter code itself.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from relay.config import load_config
from relay.engine.driver.runner import Runner
from relay.engine.metrics import Metrics
from relay.filters import load_filters
from relay.pipelines.jobs import relay_job
from testbed.ktm_process import assert_one_error_line, run_ktm
from testbed.ports import free_port
from testbed.provenance import attributed
from testbed.records import Record, produce, read_all, record_count
from testbed.tansu import NO_KILL_REASON, brokers_are_external
from testbed.topics import create_topic, unique_topic
from tests.support.inprocess import relay_once
from tests.support.relay import assert_exact_copy, committed_offsets, topic_pair, write_config

pytestmark = [pytest.mark.timeout(150), pytest.mark.brokers("tansu", "kafka")]

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "filters"
FILES = Path(__file__).parent / "filter_files"
SOURCE_NAME = "dc1"
BASE_TIMESTAMP_MS = 1_700_000_000_000


# --- config and wiring ----------------------------------------------------------------------------


def toml_value(value: Any) -> str:
    """Strings, numbers, booleans and lists of them: JSON spells these as TOML does."""
    return json.dumps(value)


def filter_section(
    name: str, path: Path | str, config: Mapping[str, Any] | None = None, **keys: Any
) -> str:
    """A `[filters.<name>]` section; ``config`` becomes its `config` inline table."""
    lines = [f"[filters.{name}]", f"path = {toml_value(str(path))}"]
    lines += [f"{key} = {toml_value(value)}" for key, value in keys.items()]
    if config is not None:
        table = ", ".join(f"{key} = {toml_value(value)}" for key, value in config.items())
        lines.append(f"config = {{ {table} }}")
    return "\n".join(lines) + "\n"


def relay_config(
    path: Path, *, source: str, target: str, topic: str, dest: str, group: str, filters: str
) -> Path:
    """write_config's relay of ``topic`` to ``dest``, with its own group and ``filters``."""
    write_config(
        path,
        source=source,
        target=target,
        topics={topic: dest},
        source_name=SOURCE_NAME,
        app=f'metrics_addr = ""\ngroup_id = "{group}"',
    )
    with path.open("a") as file:
        file.write("\n" + filters)
    return path


def config_between(
    tmp_path: Path, source: Any, target: Any, route: tuple[str, str], group: str, filters: str
) -> Path:
    """relay_config in ``tmp_path``/c.toml, relaying ``route`` from broker ``source`` to
    broker ``target``."""
    topic, dest = route
    return relay_config(
        tmp_path / "c.toml", source=source.bootstrap, target=target.bootstrap, topic=topic,
        dest=dest, group=group, filters=filters,
    )  # fmt: skip


def new_relay(config: Path, failover: bool = False) -> Runner:
    """A continuous relay with the config's filters (relay_job loads and validates them on the
    driver, as relay/cli.py does, before Spark)."""
    return relay_job(
        load_config(config),
        stop_at_end=False,
        stop_event=threading.Event(),
        metrics=Metrics(),
        failover=failover,
    )


def run_alongside(relay: Runner, script: Callable[[], None]) -> None:
    """Run a continuous relay in this thread while ``script`` (feeding, killing, waiting) runs
    on another; the relay stops when the script returns. Re-raises the script's failure.

    The relay runs here, not on a thread of its own: the Spark looks for the shared session with
    SparkSession.getActiveSession(), which is per thread (see the report on relay/engine/spark.py).
    """
    failures: list[BaseException] = []

    def drive() -> None:
        try:
            script()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the test's thread
            failures.append(exc)
        finally:
            relay.stop_event.set()

    relay.prepare()
    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    try:
        relay.run()
    finally:
        relay.stop_event.set()  # the script's waits give up at once if the relay failed
        relay.close()
        thread.join(30)
    assert not thread.is_alive(), "the script did not stop within 30s of the relay"
    if failures:
        raise failures[0]


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, abort: threading.Event
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert not abort.is_set(), f"the relay stopped before {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.2)


def metric(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def rounds_run(relay: Runner) -> int:
    return int(metric(relay.metrics, "ktm_round_duration_seconds_count") or 0)


# --- data -----------------------------------------------------------------------------------------


def allowed(source: Mapping[int, list[Any]], keep: Callable[[Any], bool]) -> dict[int, list[Any]]:
    return {p: [r for r in records if keep(r)] for p, records in source.items()}


def unmarked(marker: bytes) -> Callable[[Any], bool]:
    """What drop_marked.py with this marker relays."""
    return lambda record: not (record.value or b"").startswith(marker)


def dropped_count(source: Mapping[int, list[Any]], keep: Callable[[Any], bool]) -> int:
    return sum(1 for records in source.values() for r in records if not keep(r))


def assert_holds_exactly(
    copied: Mapping[int, list[Any]], expected: Mapping[int, list[Any]], topic: str
) -> None:
    """Each destination partition holds the expected records of the same source partition,
    once, in order, unchanged, each with the provenance of this relay's source."""
    assert set(copied) == set(expected)
    for partition, records in copied.items():
        assert_exact_copy({partition: expected[partition]}, records, topic)
        assert all(relayed.source == SOURCE_NAME for relayed in attributed(records))


KEYS = (b"eu-%d", b"uk-%d", b"us-%d", None, b"EU-%d")
HEADERS: tuple[list[tuple[str, bytes]], ...] = (
    [("region", b"eu")],
    [("region", b"us")],
    [],
    [("region", b"us"), ("region", b"uk")],  # any value may match
    [("Region", b"eu")],  # names are case-sensitive: this record lacks the header
    [("other", b"eu"), ("trace", b"t")],
)
VALUES: tuple[dict[str, Any] | None, ...] = (
    {"user": {"tier": "gold"}},
    {"user": {"tier": "silver"}},
    {"user": {"tier": 1}},
    {"user": {"tier": "1"}},  # a string: not the number 1
    {"user": {}},
    None,  # not JSON at all
    {"user": {"tier": 1.0}},  # the same JSON number as 1
)
# One last record per partition that every sample below drops: the partitions end in dropped
# records, so only counting them as done brings the committed offsets to the end.
DROPPED_BY_ALL = Record(key=None, value=b'{"user": {"tier": "gold"}}', headers=[("trace", b"x")])


def sample_records(count: int, partitions: int) -> list[Record]:
    """Keys, headers and JSON values cycling with periods 5, 6 and 7, so each partition holds a
    mix of matching, non-matching and missing cases for every sample."""
    records = []
    for i in range(count):
        key = KEYS[i % 5]
        value = VALUES[i % 7]
        records.append(
            Record(
                key=None if key is None else key % i,
                value=b"plain text %d" % i if value is None else json.dumps(value).encode(),
                headers=HEADERS[i % 6],
                partition=i % partitions,
                timestamp_ms=BASE_TIMESTAMP_MS + i,
            )
        )
    for p in range(partitions):
        records.append(DROPPED_BY_ALL._replace(partition=p, timestamp_ms=BASE_TIMESTAMP_MS - p))
    return records


def by_key_prefix(record: Any) -> bool:
    return record.key is not None and record.key.startswith((b"eu-", b"uk-"))


def by_region_header(record: Any) -> bool:
    return any(name == "region" and value in (b"eu", b"uk") for name, value in record.headers)


def not_gold_nor_one(record: Any) -> bool:
    try:
        tier = json.loads(record.value)["user"]["tier"]
    except (ValueError, KeyError):
        return True  # missing: relayed in deny mode
    return not (tier == "gold" or (type(tier) in (int, float) and tier == 1))


# --- 1. the samples through [filters.<id>] sections -----------------------------------------------


SAMPLE_CASES = {
    # A section named otherwise than the file: the sample's id key makes them agree.
    "key_prefix": (
        "eu_keys",
        "key_prefix.py",
        {"id": "eu_keys", "prefixes": ["eu-", "uk-"]},
        by_key_prefix,
    ),
    "header_match": (
        "region",
        "header_match.py",
        {"id": "region", "header": "region", "values": ["eu", "uk"], "mode": "allow"},
        by_region_header,
    ),
    # Named like the file: the default id.
    "json_field": (
        "json_field",
        "json_field.py",
        {"field": "user.tier", "values": ["gold", 1], "mode": "deny"},
        not_gold_nor_one,
    ),
}


@pytest.mark.parametrize("case", sorted(SAMPLE_CASES))
def test_sample_filter_relays_exactly_the_allowed_records(
    case, source_broker, target_broker, spark, tmp_path
):
    section, file, config, keep = SAMPLE_CASES[case]
    src = create_topic(source_broker.bootstrap, unique_topic(f"{case}-src"), partitions=4)
    dst = create_topic(target_broker.bootstrap, unique_topic(f"{case}-dst"), partitions=4)
    produce(source_broker.bootstrap, src, sample_records(420, partitions=4))
    group = unique_topic("group")
    filters = filter_section(section, SAMPLES / file, config) + filter_section(
        # Disabled: never loaded. Were it loaded, it would drop every record.
        "off",
        FILES / "drop_marked.py",
        {"id": "off", "marker": ""},
        enabled=False,
    )
    conf = config_between(tmp_path, source_broker, target_broker, (src, dst), group, filters)

    summary, metrics = relay_once(conf)

    source = read_all(source_broker.bootstrap, src)
    expected = allowed(source, keep)
    dropped = dropped_count(source, keep)
    assert 0 < dropped < 424
    assert_holds_exactly(read_all(target_broker.bootstrap, dst), expected, src)
    assert (summary.relayed, summary.filtered) == (424 - dropped, dropped)
    labels = {"filter": section, "source_topic": src}
    assert metric(metrics, "ktm_messages_filtered_total", **labels) == dropped
    assert metric(metrics, "ktm_filter_errors_total", **labels) in (None, 0.0)
    ends = {p: len(records) for p, records in source.items()}
    assert ends == {p: 106 for p in range(4)}
    assert committed_offsets(source_broker.bootstrap, group, src, 4) == ends


# --- 2. --filter PATH only ------------------------------------------------------------------------


@pytest.mark.brokers("tansu")  # ktm's own behaviour, the same on any broker: a command-line flag
@pytest.mark.timeout(200)  # a whole `ktm` run, Spark start-up included
def test_filter_given_only_on_the_command_line(source_broker, target_broker, tmp_path):
    """key_prefix.py requires `prefixes`, so `--filter ./filters/key_prefix.py` (empty config)
    is refused (test_sample_given_with_an_empty_config_exits_2_naming_the_flag); a tiny filter
    that needs no config works."""
    src, dst = topic_pair(source_broker.bootstrap, target_broker.bootstrap, "flag", 2)
    values = [b"drop %d" % i if i % 4 == 1 else b"keep %d" % i for i in range(200)]
    produce(
        source_broker.bootstrap,
        src,
        [Record(value=v, partition=i % 2) for i, v in enumerate(values)],
    )
    group = unique_topic("group")
    conf = config_between(tmp_path, source_broker, target_broker, (src, dst), group, "")
    flag = "./" + str((FILES / "drop_marked.py").relative_to(REPO))

    run = run_ktm(
        tmp_path, "--config", str(conf), "--stop-at-end", "--filter", flag, timeout=170, cwd=REPO
    )

    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert "150 records relayed, 50 filtered" in run.stderr
    source = read_all(source_broker.bootstrap, src)
    keep = unmarked(b"drop")
    assert_holds_exactly(read_all(target_broker.bootstrap, dst), allowed(source, keep), src)
    assert committed_offsets(source_broker.bootstrap, group, src, 2) == {0: 100, 1: 100}


# --- 3. resumption after dropped tails ------------------------------------------------------------


def tail_records(start: int, count: int, tail: int, partitions: int) -> list[Record]:
    """``count`` records per partition whose last ``tail`` ones (per partition) are marked."""
    records = []
    for n in range(count):
        for p in range(partitions):
            marked = n >= count - tail or n % 7 == 3
            value = b"%s %d/%d" % (b"tail" if marked else b"keep", p, start + n)
            records.append(
                Record(key=b"k%d" % n, value=value, partition=p, timestamp_ms=BASE_TIMESTAMP_MS + n)
            )
    return records


def test_dropped_last_records_are_not_read_again(source_broker, target_broker, spark, tmp_path):
    src, dst = topic_pair(source_broker.bootstrap, target_broker.bootstrap, "tail", 2)
    produce(source_broker.bootstrap, src, tail_records(0, 40, tail=5, partitions=2))
    group = unique_topic("group")
    tails = filter_section("tails", FILES / "drop_marked.py", {"id": "tails", "marker": "tail"})
    conf = config_between(tmp_path, source_broker, target_broker, (src, dst), group, tails)
    keep = unmarked(b"tail")

    first, _ = relay_once(conf)
    second, second_metrics = relay_once(conf)

    source = read_all(source_broker.bootstrap, src)
    assert_holds_exactly(read_all(target_broker.bootstrap, dst), allowed(source, keep), src)
    assert (first.relayed, first.filtered) == (2 * 30, 2 * 10)
    # Nothing was read again: the dropped tail counts as done.
    assert (second.relayed, second.filtered, second.rounds) == (0, 0, 0)
    assert committed_offsets(source_broker.bootstrap, group, src, 2) == {0: 40, 1: 40}
    consumed = [
        metric(second_metrics, "ktm_messages_consumed_total", source_topic=src,
               source_partition=str(p), target_topic=dst, target_partition=str(p))
        for p in range(2)
    ]  # fmt: skip
    assert consumed in ([None, None], [0.0, 0.0])

    produce(source_broker.bootstrap, src, tail_records(40, 15, tail=3, partitions=2))
    third, third_metrics = relay_once(conf)

    source = read_all(source_broker.bootstrap, src)
    assert_holds_exactly(read_all(target_broker.bootstrap, dst), allowed(source, keep), src)
    assert (third.relayed, third.filtered) == (2 * 10, 2 * 5)
    assert (
        metric(third_metrics, "ktm_messages_filtered_total", filter="tails", source_topic=src) == 10
    )
    assert committed_offsets(source_broker.bootstrap, group, src, 2) == {0: 55, 1: 55}


# --- 4. load-time errors --------------------------------------------------------------------------

OK_CLASS = (
    "class F:\n"
    "    def __init__(self, id):\n"
    "        self.id = id\n"
    "    def is_allowed(self, record):\n"
    "        return True\n"
)
BAD_FILTERS = {
    "syntax error": ("def new(config)\n    return None\n", ["syntax error", "line 1"]),
    "no new": (OK_CLASS + "def make(config):\n    return F('bad')\n", ["no new(config)"]),
    "new raises": (
        "def new(config):\n    raise ValueError('threshold must be > 0, got -3')\n",
        ["new(config) raised ValueError: threshold must be > 0, got -3"],
    ),
    "no is_allowed": (
        "class F:\n    id = 'bad'\ndef new(config):\n    return F()\n",
        ["no is_allowed"],
    ),
    "no id": (
        "class F:\n    def is_allowed(self, record):\n        return True\n"
        "def new(config):\n    return F()\n",
        ["id is not a str"],
    ),
    "other id": (
        OK_CLASS + "def new(config):\n    return F('other')\n",
        ["filter reports id 'other' but the section is named 'bad'"],
    ),
}


def unreachable_config(path: Path, filters: str) -> Path:
    """A config whose clusters do not exist: a filter error must stop ktm before it gets to
    them (if it did not, the run would fail later with exit 1, not 2)."""
    nowhere = f"127.0.0.1:{free_port()}"
    return relay_config(
        path, source=nowhere, target=nowhere, topic="t", dest="t", group="g", filters=filters
    )


@pytest.mark.parametrize("case", ["missing file", *BAD_FILTERS])
def test_bad_filter_in_a_section_exits_2_with_one_line(case, tmp_path):
    path = tmp_path / "bad_filter.py"
    if case == "missing file":
        mentions = ["file not found", str(path)]
    else:
        source, mentions = BAD_FILTERS[case]
        path.write_text(source)
        mentions = [*mentions, str(path)] if case == "syntax error" else mentions
    conf = unreachable_config(tmp_path / "c.toml", filter_section("bad", path, {"x": 1}))

    run = run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", timeout=60, cwd=REPO)

    assert_one_error_line(run, 2, "[filters.bad]", *mentions)


def test_sample_given_with_an_empty_config_exits_2_naming_the_flag(tmp_path):
    conf = unreachable_config(tmp_path / "c.toml", "")

    run = run_ktm(
        tmp_path, "--config", str(conf), "--filter", "./filters/key_prefix.py", timeout=60, cwd=REPO
    )

    assert_one_error_line(
        run, 2, "--filter", "key_prefix.py", '"prefixes" must be a non-empty list'
    )


def test_missing_filter_flag_file_exits_2_naming_it(tmp_path):
    conf = unreachable_config(tmp_path / "c.toml", "")

    run = run_ktm(
        tmp_path, "--config", str(conf), "--filter", "./no_such_filter.py", timeout=60, cwd=REPO
    )

    assert_one_error_line(run, 2, "--filter", "no_such_filter.py")


# --- 5. run-time errors ---------------------------------------------------------------------------

FAIL_AT = (0, 57)  # (partition, offset)


def not_the_failing_record(record: Any) -> bool:
    return (record.partition, record.offset) != FAIL_AT


def failing_setup(source_broker, target_broker, tmp_path, on_error: str | None):
    src, dst = topic_pair(source_broker.bootstrap, target_broker.bootstrap, "boom", 2)
    produce(
        source_broker.bootstrap,
        src,
        [Record(key=b"k%d" % i, value=b"v%d" % i, partition=i % 2) for i in range(200)],
    )
    group = unique_topic("group")
    options = {} if on_error is None else {"on_error": on_error}
    at = {"id": "boom", "partition": FAIL_AT[0], "offset": FAIL_AT[1]}
    boom = filter_section("boom", FILES / "fail_on.py", at, **options)
    conf = config_between(tmp_path, source_broker, target_broker, (src, dst), group, boom)
    return src, dst, group, conf


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
@pytest.mark.timeout(200)  # a whole `ktm` run, Spark start-up included
def test_filter_error_stops_the_relay_at_that_record(source_broker, target_broker, tmp_path):
    src, dst, group, conf = failing_setup(source_broker, target_broker, tmp_path, None)

    run = run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", timeout=170, cwd=REPO)

    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    errors = run.error_lines()
    assert len(errors) == 1, run.stderr
    for mention in ("'boom'", src, "partition=0", "offset=57", "cannot judge"):
        assert mention in errors[0], errors[0]
    source = read_all(source_broker.bootstrap, src)
    copied = read_all(target_broker.bootstrap, dst)
    # Partition 0: every record before the failing one, nothing after it, nothing skipped.
    assert_holds_exactly({0: copied[0]}, {0: source[0][:57]}, src)
    # Partition 1 ran beside it: an in-order prefix, no duplicates.
    assert_holds_exactly({1: copied[1]}, {1: source[1][: len(copied[1])]}, src)
    committed = committed_offsets(source_broker.bootstrap, group, src, 2)[0]
    assert committed is None or committed <= 57


def test_filter_error_with_on_error_skip_drops_and_counts_the_record(
    source_broker, target_broker, spark, tmp_path
):
    src, dst, group, conf = failing_setup(source_broker, target_broker, tmp_path, "skip")

    summary, metrics = relay_once(conf)

    source = read_all(source_broker.bootstrap, src)
    keep = not_the_failing_record
    assert_holds_exactly(read_all(target_broker.bootstrap, dst), allowed(source, keep), src)
    assert (summary.relayed, summary.filtered) == (199, 1)
    labels = {"filter": "boom", "source_topic": src}
    assert metric(metrics, "ktm_filter_errors_total", **labels) == 1
    assert metric(metrics, "ktm_messages_filtered_total", **labels) == 1
    assert committed_offsets(source_broker.bootstrap, group, src, 2) == {0: 100, 1: 100}


# --- 6. where filters are loaded ------------------------------------------------------------------


@pytest.mark.brokers("tansu")  # ktm's own behaviour, the same on any broker: Spark's workers
def test_filter_is_loaded_once_per_worker_process_never_per_round(
    source_broker, target_broker, spark, tmp_path
):
    src, dst = topic_pair(source_broker.bootstrap, target_broker.bootstrap, "pid", 2)
    pid_file = tmp_path / "pids.log"
    filter_file = tmp_path / "pid_log.py"
    shutil.copy(FILES / "pid_log.py", filter_file)
    pids = filter_section("pids", filter_file, {"id": "pids", "path": str(pid_file)})
    group = unique_topic("group")
    conf = config_between(tmp_path, source_broker, target_broker, (src, dst), group, pids)
    cfg = load_config(conf)
    specs = load_filters(cfg)  # validated in this, the driver
    # Executors compile the text the driver read: they never open the file.
    filter_file.unlink()

    rounds = 0
    for run in range(3):  # three runs on the same workers, each with rounds of 2 tasks
        records = [Record(value=b"v%d-%d" % (run, i), partition=i % 2) for i in range(40)]
        produce(source_broker.bootstrap, src, records)
        relay = relay_job(
            cfg, stop_at_end=True, stop_event=threading.Event(), metrics=Metrics(), filters=specs
        )
        relay.prepare()
        relay.run()
        rounds += rounds_run(relay)

    lines = [line.split() for line in pid_file.read_text().splitlines()]
    loads = Counter(int(pid) for what, pid in lines if what == "new")
    judged = Counter(int(pid) for what, pid in lines if what == "first")
    driver = os.getpid()
    assert loads[driver] == 1  # validation at start-up, and nothing more
    workers = loads - Counter({driver: 1})
    assert judged and all(pid != driver for pid in judged)
    assert set(judged) <= set(workers)
    # Every worker loaded it once, however many of the rounds' tasks it ran.
    assert all(n == 1 for n in workers.values()) and all(n == 1 for n in judged.values())
    assert rounds >= 3 and sum(workers.values()) < 2 * rounds
    assert len(read_all(target_broker.bootstrap, dst)[0]) == 60


# --- 7. failover mode -----------------------------------------------------------------------------


def failover_records(start: int, count: int) -> list[Record]:
    """Deterministic records (identical on every node); each third one is marked "drop"."""
    return [
        Record(
            key=b"k%d" % i,
            value=(b"drop" if i % 3 == 0 else b"keep") + b"-%08d" % i,
            partition=i % 2,
            timestamp_ms=BASE_TIMESTAMP_MS + i,
        )
        for i in range(start, start + count)
    ]


def feed(nodes: list[Any], topic: str, records: list[Record]) -> None:
    for node in nodes:
        produce(node.bootstrap, topic, records)


@pytest.mark.timeout(240)
@pytest.mark.skipif(brokers_are_external(), reason=NO_KILL_REASON)
def test_failover_after_kill_9_relays_the_allowed_records_once(
    broker_factory, target_broker, spark, tmp_path
):
    node1, node2, target = broker_factory("node1"), broker_factory("node2"), target_broker
    topic, dest = unique_topic("fo"), unique_topic("fo-copy")
    for node in (node1, node2):
        create_topic(node.bootstrap, topic, 2)
    create_topic(target.bootstrap, dest, 2)
    conf = tmp_path / "c.toml"
    conf.write_text(
        f'[app]\nmetrics_addr = ""\nsession_timeout = "2s"\n\n'
        f'[topics]\n"{topic}" = "{dest}"\n\n'
        f'[[sources]]\nname = "node1"\nservers = ["{node1.bootstrap}"]\n\n'
        f'[[sources]]\nname = "node2"\nservers = ["{node2.bootstrap}"]\n\n'
        f'[source_pool]\nhealthcheck_interval = "500ms"\nrequest_timeout = "500ms"\n'
        f'max_retries = 30\nbackoff_min = "200ms"\nbackoff_max = "500ms"\n\n'
        f'[target]\nservers = ["{target.bootstrap}"]\nmax_retries = 2\nbackoff_min = "100ms"\n'
        f'backoff_max = "200ms"\n\n'
        + filter_section("no_drop", FILES / "drop_marked.py", {"id": "no_drop"})
    )
    feed([node1, node2], topic, failover_records(0, 1200))
    relay = new_relay(conf, failover=True)
    stop = relay.stop_event

    def stream_and_kill() -> None:
        wait_for(lambda: record_count(target.bootstrap, dest) >= 800, 90, "records", stop)
        sent = 1200
        for chunk in range(6):  # the stream goes on; node1 dies in the middle of it
            feed([node2] if chunk >= 2 else [node1, node2], topic, failover_records(sent, 200))
            sent += 200
            if chunk == 1:
                node1.kill()
            time.sleep(0.2)
        wait_for(
            lambda: record_count(target.bootstrap, dest) >= 1600,
            90,
            "every allowed record",
            stop,
        )
        time.sleep(1.5)  # a while more: anything duplicated would show now

    run_alongside(relay, stream_and_kill)

    source = read_all(node2.bootstrap, topic)
    keep = unmarked(b"drop")
    copied = read_all(target.bootstrap, dest)
    assert sum(len(rs) for rs in allowed(source, keep).values()) == 1600  # of 2400
    for partition, records in copied.items():
        assert_exact_copy({partition: allowed(source, keep)[partition]}, records, topic)
    every = [r for rs in copied.values() for r in rs]
    assert {relayed.source for relayed in attributed(every)} == {"node1", "node2"}
    active = metric(relay.metrics, "ktm_active_node", node="node2")
    assert active == 1

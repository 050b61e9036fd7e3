"""ktm verify on real brokers and real Spark: a relay's copy verifies exact (also filtered and
renamed); a destination that differs from its source by one fault is reported with that fault,
its kind and its offsets, and nothing else; bad input is one line and exit 2."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from relay.config import load_config
from relay.engine.metrics import Metrics
from relay.pipelines.verify.driver import VerifyPipeline
from relay.pipelines.verify.follow import Follower
from relay.pipelines.verify.plan import plan_verify
from relay.pipelines.verify.spec import PartitionReport
from testbed.ktm_process import assert_one_error_line, run_ktm
from testbed.records import Record, produce, read_all
from testbed.topics import create_topic, unique_topic
from tests.support.feeder import Feeder
from tests.support.inprocess import Background, assert_verified, backup, relay_once, verify_once
from tests.support.relay import write_config

pytestmark = [pytest.mark.timeout(180), pytest.mark.brokers("tansu", "kafka")]

RECORDS = 200  # over 2 partitions
KEY_PREFIX = Path(__file__).resolve().parents[2] / "filters" / "key_prefix.py"


def own_group() -> str:
    """A relay's [app] with a group of its own: relays of other configs before it on the same
    target must not be taken for members of its group."""
    return f'metrics_addr = ""\ngroup_id = "{unique_topic("verify-group")}"'


def source_records() -> list[Record]:
    return [Record(key=b"%s-%d" % (b"keep" if i % 4 else b"drop", i), value=b"v%d" % i,
                   headers=[("h", b"%d" % i)], partition=i % 2, timestamp_ms=1_600_000_000_000 + i)
            for i in range(RECORDS)]  # fmt: skip


@pytest.fixture(scope="module")
def source_topic(source_broker) -> str:
    topic = create_topic(source_broker.bootstrap, unique_topic("verify-src"), partitions=2)
    produce(source_broker.bootstrap, topic, source_records())
    return topic


def verify(config: Path, spark, partitions: tuple[str, ...] = ()) -> list[PartitionReport]:
    return verify_once(config, spark, "relay", partitions)


def faults(reports: list[PartitionReport]) -> dict[object, dict[str, tuple[int, int, int]]]:
    """Per partition that is not exact: kind -> (records, first source, first dest offset)."""
    out: dict[object, dict[str, tuple[int, int, int]]] = {}
    for r in reports:
        if not r.exact:
            first = {f.kind: f for f in r.first}
            out[r.key] = {k: (n, first[k].source_offset, first[k].dest_offset)
                          for k, n in r.counts}  # fmt: skip
    return out


def test_a_relayed_copy_verifies_exact_also_filtered_and_only_then(
    source_broker, target_broker, source_topic, spark, tmp_path
):
    dest = create_topic(target_broker.bootstrap, unique_topic("verify-copy"), partitions=2)
    filtered = (f'[filters.key_prefix]\npath = "{KEY_PREFIX}"\n'
                'config = { prefixes = ["keep"] }\n')  # fmt: skip
    config = write_config(tmp_path / "c.toml", source=source_broker.bootstrap,
                          target=target_broker.bootstrap, topics={source_topic: dest},
                          extra="\n" + filtered, app=own_group())  # fmt: skip
    relay_once(config)
    reports = verify(config, spark)
    assert [r.key for r in reports] == [(source_topic, 0), (source_topic, 1)]
    assert all(r.exact for r in reports), reports
    assert sum(r.equal for r in reports) == RECORDS * 3 // 4  # every 4th record was filtered
    # Without the filter, the records it dropped are missing: the check is not a count.
    unfiltered = write_config(
        tmp_path / "u.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={source_topic: dest},
    )
    found = faults(verify(unfiltered, spark))
    assert found == {(source_topic, 0): {"missing": (50, 0, -1)}}  # even keys only
    # --partitions narrows the check to what it names.
    assert [r.key for r in verify(config, spark, (f"{source_topic}:1",))] == [(source_topic, 1)]


def copy_with(source: list[Record], topic: str, order: list[int], change=None) -> list[Record]:
    """Partition 0's records at the given source offsets, each with a record-form provenance
    header (as ktm's record path writes it); `change` (index, function) alters one copy, and
    an index of -1 in `order` is a record naming no source."""
    records = [r for r in source if r.partition == 0]
    out = []
    for i in order:
        if i < 0:
            out.append(Record(value=b"from nowhere", partition=0))
            continue
        r = records[i]
        copy = Record(
            key=r.key,
            value=r.value,
            partition=0,
            timestamp_ms=r.timestamp_ms,
            headers=[*r.headers, ("ktm.src", b"src/%s/0/%d" % (topic.encode(), i))],
        )
        out.append(change[1](copy) if change and change[0] == i else copy)
    return out


LAST = RECORDS // 2 - 1  # partition 0 holds source offsets 0..LAST
FAULTS = {  # order of the copy, a change to one record, what verify must report (and only it)
    "missing at the head": (lambda o: o[1:], None, {"missing": (1, 0, -1)}),
    "missing in the middle": (lambda o: o[:40] + o[41:], None, {"missing": (1, 40, -1)}),
    "missing at the tail": (lambda o: o[:-1], None, {"missing": (1, LAST, -1)}),
    "one duplicated": (lambda o: o[:41] + [40] + o[41:], None, {"duplicated": (1, 40, 41)}),
    "a batch twice": (lambda o: o[:50] + o[40:50] + o[50:], None, {"duplicated": (10, 40, 50)}),
    "two swapped": (lambda o: o[:40] + [41, 40] + o[42:], None, {"out_of_order": (1, 40, 41)}),
    "a value changed": (lambda o: o, (30, lambda r: r._replace(value=b"x")),
                        {"different:value": (1, 30, 30)}),
    "a key changed": (lambda o: o, (30, lambda r: r._replace(key=b"x")),
                      {"different:key": (1, 30, 30)}),
    "a header changed": (lambda o: o, (30, lambda r: r._replace(headers=[("h", b"x"),
                         *r.headers[1:]])), {"different:headers": (1, 30, 30)}),
    "a timestamp changed": (lambda o: o, (30, lambda r: r._replace(timestamp_ms=1)),
                            {"different:timestamp": (1, 30, 30)}),
}  # fmt: skip


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_one_fault_in_a_destination_is_found_named_and_located(
    source_broker, target_broker, source_topic, spark, tmp_path, fault
):
    reorder, change, expected = FAULTS[fault]
    order = reorder(list(range(RECORDS // 2)))
    reports = verify_made_copy(source_broker, target_broker, source_topic, spark, tmp_path,
                               order, change)  # fmt: skip
    assert faults(reports) == {(source_topic, 0): expected}


def verify_made_copy(
    source_broker, target_broker, source_topic, spark, tmp_path, order, change=None
) -> list[PartitionReport]:
    """Source partition 0 copied by hand (`copy_with`) into a fresh destination, verified."""
    dest = create_topic(target_broker.bootstrap, unique_topic("verify-made"), partitions=1)
    produce(target_broker.bootstrap, dest, copy_with(source_records(), source_topic, order, change))
    config = write_config(
        tmp_path / "c.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={source_topic: f"{dest}:0"},
    )
    return verify(config, spark, (f"{source_topic}:0",))


def test_two_source_partitions_in_one_destination_partition_verify_exact(
    source_broker, target_broker, source_topic, spark, tmp_path
):
    dest = create_topic(target_broker.bootstrap, unique_topic("verify-fan-in"), partitions=2)
    config = write_config(
        tmp_path / "n.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={source_topic: f"{dest}:1"},
        app=own_group(),
    )
    relay_once(config)  # "dest:1": both source partitions into destination partition 1
    reports = verify(config, spark)
    assert [(r.key, r.dest, r.exact) for r in reports] == [
        ((source_topic, 0), (dest, 1), True), ((source_topic, 1), (dest, 1), True)
    ]  # fmt: skip
    assert sum(r.equal for r in reports) == RECORDS


def test_a_store_that_holds_nothing_of_a_topic_is_one_line_and_exit_2(
    source_broker, source_topic, tmp_path
):
    empty = tmp_path / "empty-store"
    empty.mkdir()
    config = write_config(tmp_path / "e.toml", source=source_broker.bootstrap,
                          target="127.0.0.1:9", topics={source_topic: source_topic},
                          extra=f'\n[store]\nurl = "{empty}"\n')  # fmt: skip
    run = run_ktm(tmp_path, "--config", str(config), "--store", command="verify", timeout=60)
    assert_one_error_line(run, 2, "[store].url", "holds no segment", source_topic)


def test_a_record_no_source_explains_is_reported_under_its_destination(
    source_broker, target_broker, source_topic, spark, tmp_path
):
    order = [*range(60), -1, *range(60, RECORDS // 2)]
    reports = verify_made_copy(source_broker, target_broker, source_topic, spark, tmp_path, order)
    assert faults(reports) == {None: {"unexpected": (1, -1, 60)}}
    assert [r.equal for r in reports if r.key is not None] == [RECORDS // 2]


def test_a_backup_verifies_exact_and_a_lost_segment_is_named(
    source_broker, source_topic, spark, tmp_path
):
    store = tmp_path / "store"
    config = write_config(
        tmp_path / "b.toml",
        source=source_broker.bootstrap,
        target="127.0.0.1:9",
        topics={source_topic: source_topic},
        extra=f'\n[store]\nurl = "{store}"\nmax_segment_records = 20\n',
    )
    backup(config)
    assert_verified(verify_once(config, spark, "backup"), RECORDS)
    segments = sorted((store / "src" / source_topic / "0" / "0").glob("*.parquet"))
    assert len(segments) == 5  # 100 records of partition 0 in segments of 20
    segments[2].unlink()  # offsets 40..59
    reports = verify_once(config, spark, "backup", (f"{source_topic}:0",))
    assert faults(reports) == {(source_topic, 0): {"missing": (20, 40, -1)}}
    (lost,) = reports
    assert lost.notes == (f"offsets 40-59 are missing between {_key(segments[1], store)} and "
                          f"{_key(segments[3], store)}",)  # fmt: skip


def _key(segment: Path, store: Path) -> str:
    return segment.relative_to(store).as_posix()


@pytest.mark.brokers("tansu")  # ktm's own behaviour, the same on any broker: exit codes
def test_the_cli_exits_0_exact_1_naming_the_fault_and_2_on_bad_input(
    source_broker, target_broker, source_topic, tmp_path
):
    dest = create_topic(target_broker.bootstrap, unique_topic("verify-cli"), partitions=1)
    records = copy_with(source_records(), source_topic, list(range(RECORDS // 2)))
    records[10] = records[10]._replace(value=b"changed")
    produce(target_broker.bootstrap, dest, records)
    produce(target_broker.bootstrap, dest, [Record(value=b"stray", partition=0)])
    config = write_config(
        tmp_path / "c.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={source_topic: f"{dest}:0"},
    )
    report = tmp_path / "report.json"
    run = run_ktm(tmp_path, "--config", str(config), "--partitions", f"{source_topic}:0",
                  "--report", str(report), command="verify", timeout=120)  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert run.error_lines() == [
        f"ktm: verify: {source_topic}[0] -> {dest}[0] differs: different:value at source "
        "offset 10, destination offset 10"
    ]
    assert "1 differ" in run.stdout and "1 destination records name no source" in run.stdout
    written = json.loads(report.read_text())
    assert written["exact"] is False
    assert [p["faults"] for p in written["partitions"]] == [{"different:value": 1},
                                                            {"unexpected": 1}]  # fmt: skip
    # Bad input: a partition the relay does not carry, a destination topic that does not exist.
    run = run_ktm(tmp_path, "--config", str(config), "--partitions", f"{source_topic}:7",
                  command="verify", timeout=60)  # fmt: skip
    assert_one_error_line(run, 2, "--partitions", "no partition 7")
    gone = write_config(
        tmp_path / "g.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={source_topic: "no-such-topic"},
    )
    run = run_ktm(tmp_path, "--config", str(gone), command="verify", timeout=60)
    assert_one_error_line(run, 2, "no-such-topic")
    assert read_all(target_broker.bootstrap, dest)[0][-1].value == b"stray"  # nothing written


def test_following_a_running_relay_proves_what_it_copied_and_finds_a_fault_behind_it(
    source_broker, target_broker, spark, tmp_path
):
    topic = create_topic(source_broker.bootstrap, unique_topic("verify-follow"), partitions=1)
    dest = create_topic(target_broker.bootstrap, unique_topic("verify-follow-dst"), partitions=1)
    config = write_config(
        tmp_path / "f.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={topic: dest},
        app=own_group(),
    )
    feeder = Feeder(source_broker.bootstrap, topic, 1, per_batch=20, pause=0.05)
    relay = Background(config, failover=False)
    plan = plan_verify(load_config(config), "relay", False, None, follow=True)
    follower = Follower(VerifyPipeline(plan, 30.0, follow=True), metrics := Metrics())
    labels = {"source_topic": topic, "source_partition": "0"}

    def verified() -> float:
        return metrics.registry.get_sample_value("ktm_verified_next_offset", labels) or 0

    try:
        deadline = time.monotonic() + 90
        while verified() < 300:  # passes behind the running relay
            assert time.monotonic() < deadline and relay.error is None, relay.error
            follower.one_pass(spark)
        assert follower.mismatches == 0
        # A fault behind the relay: offset 5 written again, as a second copy would be.
        fifth = read_all(source_broker.bootstrap, topic)[0][5]
        header = ("ktm.src", b"src/%s/0/5" % topic.encode())
        again = [Record(key=fifth.key, value=fifth.value, headers=[*fifth.headers, header],
                        partition=0, timestamp_ms=fifth.timestamp)]  # fmt: skip
        produce(target_broker.bootstrap, dest, again)
        while not follower.mismatches:
            assert time.monotonic() < deadline, "the duplicate was not found"
            follower.one_pass(spark)
        duplicated = {**labels, "kind": "duplicated"}
        assert metrics.registry.get_sample_value("ktm_verify_mismatches_total", duplicated) == 1
    finally:
        sent = feeder.stop()
        relay.finish()
    while verified() < sent:  # the relay copied everything: the follower proves it all
        assert time.monotonic() < deadline + 60, (verified(), sent)
        follower.one_pass(spark)
    assert follower.mismatches == 1 and verified() == sent


def test_a_relay_with_verify_follow_proves_its_own_copy_on_a_slot_of_its_spark(
    source_broker, target_broker, tmp_path
):
    topic = create_topic(source_broker.bootstrap, unique_topic("verify-inside"), partitions=2)
    dest = create_topic(target_broker.bootstrap, unique_topic("verify-inside-dst"), partitions=2)
    config = write_config(tmp_path / "i.toml", source=source_broker.bootstrap,
                          target=target_broker.bootstrap, topics={topic: dest}, app=own_group(),
                          extra='\n[verify]\nfollow = true\ninterval = "300ms"\n')  # fmt: skip
    feeder = Feeder(source_broker.bootstrap, topic, 2, per_batch=20, pause=0.05)
    relay = Background(config, failover=False)
    sample = relay.metrics.registry.get_sample_value

    def verified() -> float:
        return sum(sample("ktm_verified_next_offset", {"source_topic": topic,
                                                       "source_partition": str(p)}) or 0
                   for p in range(2))  # fmt: skip

    try:
        deadline = time.monotonic() + 120
        while verified() < 400:
            assert time.monotonic() < deadline and relay.error is None, (verified(), relay.error)
            time.sleep(0.2)
    finally:
        sent = feeder.stop()
    while verified() < sent:  # what the relay copies after the feed, it proves too
        assert time.monotonic() < deadline + 60 and relay.error is None, (verified(), sent)
        time.sleep(0.2)
    relay.finish()
    found = [sample for metric in relay.metrics.registry.collect()
             if metric.name == "ktm_verify_mismatches" for sample in metric.samples]  # fmt: skip
    assert found == []  # not a single mismatch series: nothing differed

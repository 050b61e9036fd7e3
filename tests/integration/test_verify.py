"""ktm verify on real brokers and real Spark: a relay's copy verifies exact (also filtered and
renamed); a destination that differs from its source by one fault is reported with that fault,
its kind and its offsets, and nothing else; bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relay.config import load_config
from relay.engine.batch import run_on
from relay.pipelines.verify.driver import VerifyPipeline, parse_partitions, plan_verify
from relay.pipelines.verify.spec import PartitionReport
from testbed.ktm_process import assert_one_error_line, run_ktm
from testbed.records import Record, produce, read_all
from testbed.topics import create_topic, unique_topic
from tests.support.inprocess import relay_once
from tests.support.relay import write_config

pytestmark = pytest.mark.timeout(180)

RECORDS = 200  # over 2 partitions
KEY_PREFIX = Path(__file__).resolve().parents[2] / "filters" / "key_prefix.py"


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
    cfg = load_config(config)
    plan = plan_verify(cfg, False, parse_partitions(partitions))
    return run_on(VerifyPipeline(plan, 30.0), spark)


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
                          extra="\n" + filtered)  # fmt: skip
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


def copy_with(source: list[Record], topic: str, order: list[int]) -> list[Record]:
    """Partition 0's records at the given source offsets, each with a record-form provenance
    header (as ktm's record path writes it)."""
    records = [r for r in source if r.partition == 0]
    return [Record(key=records[i].key, value=records[i].value,
                   headers=[*records[i].headers, ("ktm.src", b"src/%s/0/%d" % (topic.encode(), i))],
                   partition=0, timestamp_ms=records[i].timestamp_ms)
            for i in order]  # fmt: skip


FAULTS = {
    "missing": (lambda o: o[:40] + o[41:], {"missing": (1, 40, -1)}),
    "duplicated": (lambda o: o[:41] + [40] + o[41:], {"duplicated": (1, 40, 41)}),
    "swapped": (lambda o: o[:40] + [41, 40] + o[42:], {"out_of_order": (1, 40, 41)}),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_one_fault_in_a_destination_is_found_named_and_located(
    source_broker, target_broker, source_topic, spark, tmp_path, fault
):
    reorder, expected = FAULTS[fault]
    dest = create_topic(target_broker.bootstrap, unique_topic(f"verify-{fault}"), partitions=1)
    produce(
        target_broker.bootstrap,
        dest,
        copy_with(source_records(), source_topic, reorder(list(range(RECORDS // 2)))),
    )
    config = write_config(
        tmp_path / "c.toml",
        source=source_broker.bootstrap,
        target=target_broker.bootstrap,
        topics={source_topic: f"{dest}:0"},
    )
    reports = verify(config, spark, (f"{source_topic}:0",))
    assert faults(reports) == {(source_topic, 0): expected}


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

"""`ktm backup`, `restore`, `compact` and `check` as real subprocesses: kill -9 and restart,
and bad input (one line, the right exit code, nothing written twice)."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest

from testbed.ktm_process import Ktm, assert_one_error_line, run_ktm, wait_for
from testbed.ports import free_port
from testbed.records import produce, read_all, record_count
from testbed.tansu import NO_KILL_REASON, brokers_are_external
from testbed.topics import create_topic, unique_topic
from tests.integration.test_backup_restore import assert_same, config, records

pytestmark = [pytest.mark.timeout(300), pytest.mark.brokers("tansu", "kafka")]


def stored_records(store: Path) -> int:
    """Records in the store's segments (from their names: first-last, no gaps in this data)."""
    total = 0
    for segment in store.rglob("*.parquet"):
        if segment.name.startswith("."):
            continue  # a segment being written
        first, last = segment.stem.split("-")
        total += int(last) - int(first) + 1
    return total


TOTAL = 20_000  # records of the kill -9 test: 4,000 at first, the rest fed while it runs


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
@pytest.mark.skipif(brokers_are_external(), reason=NO_KILL_REASON)
def test_kill_9_mid_backup_and_mid_restore_then_restart_gives_every_record_once(
    source_broker, target_broker, tmp_path
):
    src = create_topic(source_broker.bootstrap, unique_topic("kb"), 4)
    dst = unique_topic("kr")
    store = tmp_path / "store"
    conf = config(tmp_path / "c.toml", source=source_broker.bootstrap,
                  target=target_broker.bootstrap, topics={src: dst}, store=str(store),
                  store_keys="max_segment_records = 500")  # fmt: skip
    produce(source_broker.bootstrap, src, records(4_000, 4))

    # The rest is fed at a pace once the backup runs, so records still flow when it is killed
    # (a backlog is backed up within a second: on a fast machine it would finish first).
    def feed() -> None:
        for first in range(4_000, TOTAL, 2_000):
            produce(source_broker.bootstrap, src, records(2_000, 4, first=first))
            time.sleep(0.2)

    feeding = threading.Thread(target=feed)
    with Ktm(tmp_path, "--config", str(conf), command="backup") as first:
        wait_for(lambda: stored_records(store) >= 2_000, 120, "segments written", first)
        feeding.start()
        wait_for(lambda: stored_records(store) >= 8_000, 120, "segments written", first)
        first.kill()  # ktm, its JVM and its workers: nothing gets to finish
    feeding.join(120)
    assert stored_records(store) < TOTAL, "the kill must come mid-way"
    last = run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", command="backup", timeout=200)
    assert last.returncode == 0, last.stderr
    assert stored_records(store) == TOTAL  # no overlap, no hole: every offset once

    # Small, unbatched produce requests make the first restore slow enough to kill mid-way.
    slow = conf.with_name("slow.toml")
    slow.write_text(
        conf.read_text().replace("[target]\n", '[target]\nbatch_size = 1024\nlinger = "0ms"\n')
    )
    with Ktm(tmp_path, "--config", str(slow), "--create-topics", command="restore") as first:
        wait_for(
            lambda: record_count(target_broker.bootstrap, dst) >= 2_000,
            120,
            "records restored",
            first,
        )
        first.kill()
    assert record_count(target_broker.bootstrap, dst) < TOTAL, "the kill must come mid-way"
    last = run_ktm(tmp_path, "--config", str(conf), command="restore", timeout=200)
    assert last.returncode == 0, last.stderr

    assert_same(read_all(source_broker.bootstrap, src), read_all(target_broker.bootstrap, dst))


@pytest.mark.brokers("tansu")  # ktm's own behaviour, the same on any broker: the store's files
def test_compact_and_check_on_the_command_line(source_broker, target_broker, tmp_path):
    src = create_topic(source_broker.bootstrap, unique_topic("cc"), 2)
    dst = create_topic(target_broker.bootstrap, unique_topic("cd"), 2)
    store = tmp_path / "store"
    conf = config(tmp_path / "c.toml", source=source_broker.bootstrap,
                  target=target_broker.bootstrap, topics={src: dst},
                  store=str(store), store_keys="max_segment_records = 50")  # fmt: skip
    produce(source_broker.bootstrap, src, records(400, 2))
    assert run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", command="backup",
                   timeout=200).returncode == 0  # fmt: skip

    run = run_ktm(tmp_path, "--config", str(conf), "--min-age", "0s", "--delete",
                  command="compact", timeout=200)  # fmt: skip

    assert run.returncode == 0, run.stderr
    assert "compacted 8 level-0 segments into 2 level-1 ones (400 records); 8 segments " \
           "deleted" in run.stdout  # fmt: skip
    check = run_ktm(tmp_path, "--config", str(conf), command="check", timeout=120)
    assert check.returncode == 0, check.stderr
    assert f"store {store}: ok (reachable, writable)" in check.stdout
    assert f"{src}[0]: 1 segments, 200 records, offsets 0-199, no gaps" in check.stdout


# --- bad input: one line, the right exit code ---------------------------------------------------


def store_conf(
    tmp_path: Path, source_broker, target_broker, store: str, keys: str = ""
) -> tuple[Path, str]:
    src = create_topic(source_broker.bootstrap, unique_topic("bad"), 2)
    conf = config(tmp_path / f"c-{uuid.uuid4().hex[:6]}.toml", source=source_broker.bootstrap,
                  target=target_broker.bootstrap, topics={src: src + "-copy"}, store=store,
                  store_keys=keys)  # fmt: skip
    return conf, src


def s3_keys(s3, endpoint: str | None = None, secret: str | None = None) -> str:
    return (f's3_endpoint = "{endpoint or s3.endpoint}"\ns3_access_key = "{s3.access_key}"\n'
            f's3_secret_key = "{secret or s3.secret_key}"')  # fmt: skip


@pytest.mark.parametrize(
    ("case", "mentions"),
    [
        ("unreachable", ("cannot use store", "s3://")),
        ("credentials", ("cannot use store", "access denied")),
        ("bucket", ("cannot use store", "does not exist")),
    ],
)
def test_a_store_that_cannot_be_used_fails_with_one_line(
    case, mentions, source_broker, target_broker, tmp_path, s3
):
    bucket = s3.bucket if case != "bucket" else "no-such-bucket-" + uuid.uuid4().hex[:6]
    keys = {
        "unreachable": s3_keys(s3, endpoint=f"http://127.0.0.1:{free_port()}"),
        "credentials": s3_keys(s3, secret="wrong-secret"),
        "bucket": s3_keys(s3),
    }[case]
    conf, _ = store_conf(tmp_path, source_broker, target_broker, f"s3://{bucket}/x", keys)

    run = run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", command="backup", timeout=120)

    line = assert_one_error_line(run, 1, *mentions)
    assert "wrong-secret" not in run.stderr and s3.secret_key not in line


@pytest.mark.brokers("tansu")  # ktm's own behaviour, the same on any broker: the store's files
def test_damaged_or_foreign_segments_stop_the_restore_naming_the_file(
    source_broker, target_broker, tmp_path
):
    store = tmp_path / "store"
    conf, src = store_conf(
        tmp_path, source_broker, target_broker, str(store), "max_segment_records = 50"
    )
    produce(source_broker.bootstrap, src, records(200, 2))
    assert run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", command="backup",
                   timeout=200).returncode == 0  # fmt: skip
    segments = sorted(store.rglob("*.parquet"))
    damaged = segments[1]
    damaged.write_bytes(damaged.read_bytes()[:200])  # truncated

    run = run_ktm(
        tmp_path, "--config", str(conf), "--create-topics", command="restore", timeout=120
    )
    assert_one_error_line(run, 1, damaged.name)

    damaged.unlink()
    foreign = segments[1].parent.parent.parent / "1" / "0" / segments[1].name
    shutil.copy(segments[0], foreign)  # partition 0's segment under partition 1's name
    run = run_ktm(
        tmp_path, "--config", str(conf), "--create-topics", command="restore", timeout=120
    )
    assert_one_error_line(run, 1, foreign.name)


@pytest.mark.brokers("tansu")  # ktm's own behaviour, the same on any broker: a partition count
def test_a_destination_with_fewer_partitions_is_refused(source_broker, target_broker, tmp_path):
    store = tmp_path / "store"
    conf, src = store_conf(tmp_path, source_broker, target_broker, str(store))
    produce(source_broker.bootstrap, src, records(20, 2))
    assert run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", command="backup",
                   timeout=200).returncode == 0  # fmt: skip
    create_topic(target_broker.bootstrap, src + "-copy", 1)

    run = run_ktm(tmp_path, "--config", str(conf), command="restore", timeout=120)

    assert_one_error_line(run, 1, "has 1 partitions, fewer than the source's 2")


def test_missing_store_section_is_a_config_error(source_broker, target_broker, tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text(f'[topics]\n"a" = "b"\n\n[[sources]]\nname = "x"\nservers = '
                    f'["{source_broker.bootstrap}"]\n')  # fmt: skip
    run = run_ktm(tmp_path, "--config", str(conf), command="backup", timeout=60)
    assert_one_error_line(run, 2, "[store]: missing section")

"""ktm installed from its wheel into a clean virtualenv and run as a user runs it: from a
directory of their own, the config elsewhere and named by a relative path, relative paths
inside it. Every command, every copy checked record by record against the source."""

from __future__ import annotations

import os
import signal
import zipfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import relay
from testbed.ktm_process import Finished, Ktm, run_ktm, wait_for
from testbed.records import Record, produce, read_all
from testbed.topics import create_topic, unique_topic
from tests.release.conftest import Venv, sh
from tests.support.relay import assert_exact_copy, write_config

pytestmark = [pytest.mark.timeout(600)]

RECORDS = 6_000
PARTITIONS = 3


def source_records(count: int = RECORDS) -> list[Record]:
    return [
        Record(
            key=b"k%d" % i,
            value=b"v%06d" % i + b"." * 50,
            headers=[("n", b"%d" % i)],
            partition=i % PARTITIONS,
            timestamp_ms=1_700_000_000_000 + i,
        )  # fmt: skip
        for i in range(count)
    ]


def user_run(user_env: Venv, tmp_path: Path, cwd: Path, *args: str, command: str,
             timeout: float = 240, env: dict[str, str] | None = None) -> Finished:  # fmt: skip
    """`ktm COMMAND ARGS` of the user's install, from `cwd`; it must succeed."""
    run = run_ktm(tmp_path, *args, command=command, ktm=user_env.ktm, cwd=cwd, env=env,
                  timeout=timeout)  # fmt: skip
    assert run.returncode == 0, f"ktm {command} exited {run.returncode}:\n{run.stderr[-3000:]}"
    return run


def test_version_names_ktm_python_pyspark_kafka_python_and_java(user_env: Venv, workdir):
    lines = sh(user_env.ktm, "--version", cwd=workdir).splitlines()
    assert lines[0] == f"ktm {relay.__version__}"
    assert [line.split()[0] for line in lines[1:]] == ["Python", "PySpark", "kafka-python", "Java"]
    assert str(user_env.root) in lines[1]  # the user's interpreter, not the test runner's
    assert lines[4].startswith("Java 17"), lines[4]


def test_check_relay_backup_compact_and_restore_from_a_user_directory(
    user_env: Venv, source_broker, target_broker, workdir: Path, conf_dir: Path, tmp_path: Path
):
    src = create_topic(source_broker.bootstrap, unique_topic("rel"), PARTITIONS)
    produce(source_broker.bootstrap, src, source_records())
    copy, restored = unique_topic("rel-copy"), unique_topic("rel-restored")
    create_topic(target_broker.bootstrap, copy, PARTITIONS)
    brokers = {"source": source_broker.bootstrap, "target": target_broker.bootstrap}
    write_config(conf_dir / "relay.toml", topics={src: copy}, **brokers)
    # the store's url is relative to the config file, wherever ktm runs from
    store = '\n[store]\nurl = "store"\nmax_segment_records = 500\n'
    write_config(conf_dir / "store.toml", topics={src: restored}, extra=store, **brokers)
    relay_conf, store_conf = "../etc/relay.toml", "../etc/store.toml"  # relative to workdir

    checked = user_run(user_env, tmp_path, workdir, "--config", relay_conf, command="check")
    assert f"{RECORDS} records to relay; nothing was relayed" in checked.stdout

    relayed = user_run(user_env, tmp_path, workdir, "--config", relay_conf, "--stop-at-end",
                       "--debug", command="relay")  # fmt: skip
    assert_ships_bytecode(tmp_path)
    # the workers' daemon came from the wheel: PySpark imported compiled, not from Spark's zip
    assert "spark python daemon: relay.engine.local_daemon" in relayed.stderr
    source = read_all(source_broker.bootstrap, src)
    assert_exact_copy(source, flat(read_all(target_broker.bootstrap, copy)), src)
    assert_verified(user_run(user_env, tmp_path, workdir, "--config", relay_conf,
                             command="verify"))  # fmt: skip

    user_run(user_env, tmp_path, workdir, "--config", store_conf, "--stop-at-end",
             command="backup")  # fmt: skip
    assert_store_holds(conf_dir / "store" / "src" / src, source, level=0)
    assert not (workdir / "store").exists()

    compacted = user_run(user_env, tmp_path, workdir, "--config", store_conf, "--min-age", "0s",
                         "--delete", command="compact")  # fmt: skip
    assert f"level-1 ones ({RECORDS} records)" in compacted.stdout, compacted.stdout
    assert_store_holds(conf_dir / "store" / "src" / src, source, level=1)
    assert_verified(user_run(user_env, tmp_path, workdir, "--config", store_conf, "--store",
                             command="verify"))  # fmt: skip

    user_run(user_env, tmp_path, workdir, "--config", store_conf, "--stop-at-end",
             "--create-topics", command="restore")  # fmt: skip
    assert_exact_copy(source, flat(read_all(target_broker.bootstrap, restored)), src)
    assert_verified(user_run(user_env, tmp_path, workdir, "--config", store_conf, "--from-store",
                             command="verify"))  # fmt: skip


def assert_ships_bytecode(tmp_path: Path) -> None:
    """The package the driver shipped holds the bytecode pip compiled for every module, so
    that the workers import it without compiling (relay.engine.shipping)."""
    shipped = max((tmp_path / "ktm-logs").glob("ktm/run-*/ktm-relay.zip"), key=os.path.getmtime)
    names = set(zipfile.ZipFile(shipped).namelist())
    sources = {n for n in names if n.endswith(".py")}
    assert "relay/engine/executor/task.py" in sources
    assert {n for n in names if n.endswith(".pyc")} == {n + "c" for n in sources}


def assert_verified(run: Finished, records: int = RECORDS) -> None:
    """`ktm verify` said every partition is exact, every record compared."""
    assert f"{PARTITIONS} exact, 0 differ, 0 not verified; {records} records compared" in (
        run.stdout
    ), run.stdout


def test_restore_follow_from_a_user_directory_stops_cleanly_on_sigterm(
    user_env: Venv, source_broker, target_broker, workdir: Path, conf_dir: Path, tmp_path: Path
):
    src = create_topic(source_broker.bootstrap, unique_topic("fol"), PARTITIONS)
    produce(source_broker.bootstrap, src, source_records(1_500))
    followed = unique_topic("fol-restored")
    brokers = {"source": source_broker.bootstrap, "target": target_broker.bootstrap}
    store = '\n[store]\nurl = "store"\nmax_segment_records = 200\nfollow_interval = "1s"\n'
    write_config(conf_dir / "store.toml", topics={src: followed}, extra=store, **brokers)
    user_run(user_env, tmp_path, workdir, "--config", "../etc/store.toml", "--stop-at-end",
             command="backup")  # fmt: skip

    with Ktm(tmp_path, "--config", "../etc/store.toml", "--follow", "--create-topics",
             command="restore", ktm=user_env.ktm, cwd=workdir) as follower:  # fmt: skip
        wait_for(lambda: count(target_broker.bootstrap, followed) >= 1_500, 180,
                 "every stored record restored", follower)  # fmt: skip
        follower.proc.send_signal(signal.SIGTERM)
        ended = follower.wait(60)
    assert ended.returncode == 0, ended.stderr[-3000:]
    source = read_all(source_broker.bootstrap, src)
    assert_exact_copy(source, flat(read_all(target_broker.bootstrap, followed)), src)


def flat(by_partition: dict[int, list[Any]]) -> list[Any]:
    return [record for records in by_partition.values() for record in records]


def count(bootstrap: str, topic: str) -> int:
    try:
        return len(flat(read_all(bootstrap, topic)))
    except LookupError:
        return 0


def assert_store_holds(topic_dir: Path, source: dict[int, list[Any]], level: int) -> None:
    """The segments of every partition, read with pyarrow alone, hold exactly the source's
    records in order: offset, key, value, headers, timestamp."""
    for partition, records in source.items():
        segments = sorted((topic_dir / str(partition)).glob("*/*.parquet"))
        assert segments, f"no segment of partition {partition} in {topic_dir}"
        assert {int(s.parent.name) for s in segments} == {level}, segments
        stored = []
        for segment in segments:
            for row in pq.read_table(segment).to_pylist():
                headers = [(h["key"], h["value"]) for h in row["headers"]]
                stored.append((row["offset"], row["key"], row["value"], headers, row["timestamp"]))
        expected = [(r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in records]
        assert stored == expected, f"partition {partition}: the store differs from the source"

"""The docs' "Scaling out" deployment as written: the wheel's ktm drives a standalone Spark
cluster whose workers have no ktm; the driver ships the package. The workers' Python is
either the packed virtualenv (`scripts/pack_venv.sh`, passed with spark.archives) or a
virtualenv holding exactly what the docs list for executors, and nothing else."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from testbed.provenance import attributed
from testbed.records import produce, read_all
from testbed.topics import create_topic, unique_topic
from tests.release.conftest import REPO, Venv, new_venv, sh
from tests.release.test_installed import (
    PARTITIONS,
    assert_store_holds,
    assert_verified,
    flat,
    source_records,
    user_run,
)
from tests.support.relay import assert_exact_copy, copy_view, write_config

pytestmark = [pytest.mark.timeout(600), pytest.mark.cluster]

RECORDS = 4_000
# The docs mark the command that installs what a worker's Python needs with this comment.
EXECUTOR_NEEDS_MARK = "<!-- executor-requirements -->"
SPARK_ENV = {"SPARK_LOCAL_IP": "127.0.0.1"}


def documented_executor_requirements() -> list[str]:
    """The `pip install ...` line of the code block after the mark, in README.md or docs/."""
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text()
        if EXECUTOR_NEEDS_MARK in text:
            block = text.split(EXECUTOR_NEEDS_MARK, 1)[1].split("```", 2)[1]
            line = next(ln for ln in block.splitlines() if ln.startswith("pip install "))
            return shlex.split(line)[2:]
    raise AssertionError(f"no {EXECUTOR_NEEDS_MARK} in README.md or docs/")


@pytest.fixture(scope="session")
def documented_worker(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    wanted = documented_executor_requirements()
    venv = new_venv(tmp_path_factory.mktemp("worker") / "venv", *wanted)
    probe = "import importlib.util as u; print(u.find_spec('relay'))"
    shown = sh(venv.python, "-c", probe, cwd=venv.root)  # not from the checkout's directory
    assert shown.strip() == "None", "the worker's Python must not have ktm"
    return venv


def cluster_conf(conf_dir: Path, name: str, spark_conf: dict[str, str], **keys: Any) -> Path:
    lines = "\n".join(f'"{key}" = "{value}"' for key, value in spark_conf.items())
    return write_config(conf_dir / name, spark=f"\n[spark.conf]\n{lines}\n", **keys)


def executors_launched(cluster: Any) -> int:
    logs = Path(cluster.log_dir).glob("worker-*.log")
    return sum(log.read_text(errors="replace").count("Asked to launch executor") for log in logs)


def test_relay_and_backup_on_workers_with_only_the_packed_venv(
    user_env: Venv, packed_env: Path, standalone, source_broker, target_broker,
    workdir: Path, conf_dir: Path, tmp_path: Path,
):  # fmt: skip
    src = create_topic(source_broker.bootstrap, unique_topic("pk"), PARTITIONS)
    produce(source_broker.bootstrap, src, source_records(RECORDS))
    copy = create_topic(target_broker.bootstrap, unique_topic("pk-copy"), PARTITIONS)
    spark = {"spark.archives": f"{packed_env}#environment",
             "spark.pyspark.python": "./environment/bin/python"}  # fmt: skip
    keys = {"source": source_broker.bootstrap, "target": target_broker.bootstrap}
    relay_conf = cluster_conf(conf_dir, "relay.toml", spark, topics={src: copy}, **keys)
    store = '\n[store]\nurl = "store"\nmax_segment_records = 1000\n'
    store_conf = cluster_conf(conf_dir, "store.toml", spark, topics={src: "x"}, extra=store,
                              **keys)  # fmt: skip
    launched = executors_launched(standalone)

    for command, conf in (("relay", relay_conf), ("backup", store_conf)):
        user_run(user_env, tmp_path, workdir, "--config", str(conf), "--stop-at-end",
                 "--master", standalone.master_url, command=command,
                 env=SPARK_ENV)  # fmt: skip

    assert executors_launched(standalone) >= launched + 2  # the tasks ran on the cluster
    source = read_all(source_broker.bootstrap, src)
    assert_exact_copy(source, flat(read_all(target_broker.bootstrap, copy)), src)
    assert_store_holds(conf_dir / "store" / "src" / src, source, level=0)
    # ktm verify of the store there too (a copy's verify on workers: the test below).
    verified = user_run(user_env, tmp_path, workdir, "--config", str(store_conf), "--store",
                        "--master", standalone.master_url, command="verify",
                        env=SPARK_ENV)  # fmt: skip
    assert_verified(verified, RECORDS)


FILTER = """
def new(config):
    return Drop(config.get("id", "{name}"), int(config.get("every", {every})))


class Drop:
    def __init__(self, filter_id, every):
        self.id, self.every = filter_id, every

    def is_allowed(self, record):
        return int(record.key[1:]) % self.every != 0
"""


def test_relay_with_filters_and_backup_on_workers_with_only_what_the_docs_list(
    user_env: Venv, documented_worker: Venv, standalone, source_broker, target_broker,
    workdir: Path, conf_dir: Path, tmp_path: Path,
):  # fmt: skip
    """Filters are read on the driver and travel in the task specs: one named in the config
    (relative to it), one with --filter (relative to the current directory); the workers have
    neither file."""
    src = create_topic(source_broker.bootstrap, unique_topic("doc"), PARTITIONS)
    produce(source_broker.bootstrap, src, source_records(RECORDS))
    copy = create_topic(target_broker.bootstrap, unique_topic("doc-copy"), PARTITIONS)
    (conf_dir / "no_fives.py").write_text(FILTER.format(name="no_fives", every=5))
    (workdir / "no_sevens.py").write_text(FILTER.format(name="no_sevens", every=7))
    spark = {"spark.pyspark.python": str(documented_worker.python)}
    keys = {"source": source_broker.bootstrap, "target": target_broker.bootstrap}
    filters = '\n[filters.no_fives]\npath = "no_fives.py"\n'
    relay_conf = cluster_conf(conf_dir, "relay.toml", spark, topics={src: copy}, extra=filters,
                              **keys)  # fmt: skip
    store = '\n[store]\nurl = "store"\nmax_segment_records = 1000\n'
    store_conf = cluster_conf(conf_dir, "store.toml", spark, topics={src: "x"}, extra=store,
                              **keys)  # fmt: skip

    user_run(user_env, tmp_path, workdir, "--config", str(relay_conf), "--filter", "no_sevens.py",
             "--stop-at-end", "--master", standalone.master_url, command="relay",
             env=SPARK_ENV)  # fmt: skip
    user_run(user_env, tmp_path, workdir, "--config", str(store_conf), "--stop-at-end",
             "--master", standalone.master_url, command="backup", env=SPARK_ENV)  # fmt: skip

    source = read_all(source_broker.bootstrap, src)
    kept = {
        p: [copy_view(r) for r in records if int(r.key[1:]) % 5 and int(r.key[1:]) % 7]
        for p, records in source.items()
    }
    got: dict[int, list[Any]] = {p: [] for p in source}
    for relayed in attributed(flat(read_all(target_broker.bootstrap, copy))):
        got[relayed.partition].append(copy_view(relayed.record, relayed.offset))
    assert got == kept
    assert_store_holds(conf_dir / "store" / "src" / src, source, level=0)
    # ktm verify on the same workers: the filters run there too, so the copy verifies exact.
    verified = user_run(user_env, tmp_path, workdir, "--config", str(relay_conf), "--filter",
                        "no_sevens.py", "--master", standalone.master_url, command="verify",
                        env=SPARK_ENV)  # fmt: skip
    assert_verified(verified, sum(len(records) for records in kept.values()))

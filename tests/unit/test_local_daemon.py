"""Local workers import PySpark from the installed package, not from Spark's zip of it
(relay.engine.local_daemon), and only where they would find this very ktm (relay.engine.jvm)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from relay.engine import jvm
from relay.engine.local_daemon import without_spark_zips


def _package(site: Path, name: str) -> None:
    (site / name).mkdir(parents=True, exist_ok=True)
    (site / name / "__init__.py").write_text("")


def _spark_lib(site: Path) -> Path:
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    for name in ("pyspark.zip", "py4j-0.10.9.9-src.zip"):
        (lib / name).write_bytes(b"")
    return lib


def test_the_zips_of_installed_packages_leave_the_path(tmp_path: Path):
    site = tmp_path / "site-packages"
    _package(site, "pyspark")
    _package(site, "py4j")
    lib = _spark_lib(site)
    other = str(tmp_path / "ktm-relay.zip")
    path = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), other, str(site)]

    assert without_spark_zips(path) == [other, str(site)]


def test_a_zip_whose_package_is_not_installed_stays(tmp_path: Path):
    site = tmp_path / "site-packages"
    _package(site, "pyspark")  # py4j only in Spark's zip
    lib = _spark_lib(site)
    path = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), str(site)]

    assert without_spark_zips(path) == [str(lib / "py4j-0.10.9.9-src.zip"), str(site)]


def test_another_sparks_zips_stay(tmp_path: Path):
    """A SPARK_HOME of its own (a cluster's) may hold another PySpark than the installed one."""
    site, spark_home = tmp_path / "site-packages", tmp_path / "spark"
    _package(site, "pyspark")
    _package(site, "py4j")
    lib = _spark_lib(spark_home)
    path = [str(lib / "pyspark.zip"), str(site)]

    assert without_spark_zips(path) == path


def test_without_pyspark_installed_nothing_changes(tmp_path: Path):
    lib = _spark_lib(tmp_path / "spark")
    path = [str(lib / "pyspark.zip"), str(tmp_path)]

    assert without_spark_zips(path) == path


def test_a_relay_package_in_the_working_directory_keeps_sparks_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`python -m` looks in the working directory first: a `relay` there is not ktm."""
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.chdir(tmp_path)
    assert jvm._workers_find_local_daemon()
    _package(tmp_path, "relay")
    assert not jvm._workers_find_local_daemon()


def test_workers_of_another_interpreter_keep_sparks_daemon(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYSPARK_PYTHON", os.path.join(os.sep, "opt", "other", "python3"))
    assert not jvm._workers_find_local_daemon()


def test_the_daemon_preloads_the_task_code_and_leaves_what_fails_to_the_workers():
    from relay.engine.local_daemon import PRELOAD, preload

    assert preload() == list(PRELOAD)
    assert preload(("relay.engine.executor.task", "relay.no_such_module")) == [
        "relay.engine.executor.task"
    ]

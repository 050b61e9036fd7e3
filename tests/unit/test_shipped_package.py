"""What the driver ships to Spark executors: the whole installed `relay` package and nothing
else, and an executor side that imports only what the docs say a worker needs.

The release tests (tests/release) run the same on a real cluster whose workers have no ktm;
these catch the fault in a second, without a cluster."""

from __future__ import annotations

import compileall
import py_compile
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import relay
from relay.engine.shipping import _bytecode, check_whole, package_zip
from relay.errors import RelayError

PACKAGE = Path(relay.__file__).resolve().parent

# What a worker's Python needs (docs: "Scaling out"), beside the standard library and the
# pyspark that Spark puts on its executors' path itself.
WORKER_NEEDS = {"kafka", "crc32c"}
STORE_NEEDS = {"pyarrow"}
# Imported by kafka-python when present (its optional codecs); never needed.
OPTIONAL = {"lz4", "snappy", "cramjam", "zstandard"}


def test_the_archive_holds_the_whole_package_under_its_name(tmp_path):
    compileall.compile_dir(PACKAGE, quiet=1)  # as pip does at install
    archive = package_zip(tmp_path)
    names = set(zipfile.ZipFile(archive).namelist())
    expected = {
        "relay/" + p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert {n for n in names if n.endswith(".py")} == expected
    assert {n for n in names if not n.endswith(".py")} == {n + "c" for n in expected}
    assert "relay/engine/executor/task.py" in names
    assert "relay/pipelines/relay/executor.py" in names


def test_the_archive_alone_imports_as_ktm(tmp_path):
    """-S: no site-packages, so no installed (or editable) ktm: only the archive, and its
    bytecode rather than its sources (no compiling in every new worker)."""
    compileall.compile_dir(PACKAGE, quiet=1)
    archive = package_zip(tmp_path)
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(archive)!r})
        import relay, relay.errors, relay.engine.executor
        assert relay.errors.__file__.endswith(".pyc"), relay.errors.__file__
        print(relay.__version__, relay.__file__)
        """
    )
    run = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    version, where = run.stdout.split()
    assert version == relay.__version__
    assert where.startswith(str(archive))


def test_bytecode_is_shipped_only_when_it_is_the_sources(tmp_path):
    """A cache older than its source is left out; a pyc in the zip that is not its source's
    (however it got there) is passed over by zipimport, which then compiles the source."""
    module = tmp_path / "shipped_mod.py"
    module.write_text("VALUE = 1\n")
    py_compile.compile(str(module), doraise=True)
    assert _bytecode(module, module.read_bytes()) is not None
    module.write_text("VALUE = 22\n")  # edited after it was compiled
    assert _bytecode(module, module.read_bytes()) is None

    module.write_text("VALUE = 1\n")
    py_compile.compile(str(module), doraise=True)
    other = _bytecode(module, module.read_bytes())
    assert other is not None
    archive = tmp_path / "mixed.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("shipped_mod.py", "VALUE = 2\n")
        zf.writestr("shipped_mod.pyc", other)  # compiled from VALUE = 1
    code = f"import sys; sys.path[:0] = [{str(archive)!r}]; import shipped_mod as m; print(m.VALUE)"
    run = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "2"


def test_an_incomplete_package_is_refused_naming_the_missing_file(tmp_path):
    package = tmp_path / "relay"
    (package / "engine" / "executor").mkdir(parents=True)
    for name in ("__init__.py", "spec.py", "engine/__init__.py", "engine/spark.py"):
        (package / name).write_text("")
    (package / "engine" / "executor" / "task.py").write_text("")  # its folder lacks __init__
    files = sorted(package.rglob("*.py"))
    with pytest.raises(RelayError, match=r"engine/executor/__init__\.py not found"):
        check_whole(package, files)
    (package / "engine" / "executor" / "task.py").unlink()
    with pytest.raises(RelayError, match=r"engine/executor/task\.py not found"):
        check_whole(package, sorted(package.rglob("*.py")))


@pytest.mark.parametrize(
    ("modules", "allowed"),
    [
        (
            [
                "relay.engine.spark",
                "relay.pipelines.relay.executor",
                "relay.pipelines.verify.executor",
            ],
            WORKER_NEEDS,
        ),  # fmt: skip
        (
            [
                "relay.engine.spark",
                "relay.pipelines.backup.executor",
                "relay.pipelines.restore.executor",
                "relay.pipelines.compact.executor",
            ],
            WORKER_NEEDS | STORE_NEEDS,
        ),
    ],
    ids=["relay and verify", "store pipelines"],
)
def test_the_executor_side_imports_only_what_a_worker_needs(modules, allowed):
    """An executor imports the task entry point (relay.engine.spark) and its pipeline's
    executor side: no config parser, CLI, metrics server or Spark driver code."""
    code = textwrap.dedent(
        f"""
        import importlib, sys
        before = set(sys.modules)
        for name in {modules!r}:
            importlib.import_module(name)
        tops = {{n.split(".")[0] for n in set(sys.modules) - before}}
        print(" ".join(sorted(t for t in tops if t not in sys.stdlib_module_names)))
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    # compiled helpers of the packages themselves (Cython's, mypyc's) are not packages
    imported = {
        name
        for name in run.stdout.split()
        if name != "relay" and not name.startswith("_") and not name.endswith(("runtime", "mypyc"))
    }
    assert imported - OPTIONAL <= allowed, f"executors import {sorted(imported - OPTIONAL)}"
    assert WORKER_NEEDS <= imported

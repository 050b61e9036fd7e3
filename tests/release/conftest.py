"""The release layer: ktm as users get it, not as the checkout holds it.

- `dist`: the sdist and the wheel, built by `python -m build` (the standard frontend, with
  build isolation) and checked by `twine check`.
- `user_env`: a fresh virtualenv outside the checkout with the wheel installed; its `ktm` runs
  from a temporary directory (`workdir`), never from the checkout.
- `standalone`: a standalone Spark cluster from the pip package (testbed/cluster.py).
  Its workers get their Python from the config (`spark.pyspark.python`): a packed virtualenv
  (`scripts/pack_venv.sh`) or a virtualenv holding exactly what the docs say executors need.

Every virtualenv installs from the pip cache the test environment's own install filled, so
the layer costs a minute or two, not downloads. Builds run on a private copy of the working
tree (`source_copy`), never in the checkout: setuptools writes its staging folders beside the
sources, and two pytest workers building in one tree at once removed each other's files.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.cluster import start_standalone

REPO = Path(__file__).resolve().parents[2]
PIP_TIMEOUT = 600.0


@dataclass(frozen=True)
class Dist:
    sdist: Path
    wheel: Path


@dataclass(frozen=True)
class Venv:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def ktm(self) -> str:
        return str(self.root / "bin" / "ktm")


def sh(*args: str | Path, cwd: Path | None = None, timeout: float = PIP_TIMEOUT,
       env: dict[str, str] | None = None) -> str:  # fmt: skip
    """Run a command; its output on success, a test failure naming it and its output tail
    otherwise."""
    command = [str(arg) for arg in args]
    started = time.monotonic()
    try:
        run = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
            check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{shlex.join(command)} did not end within {timeout}s: {exc.output!r}")
    if run.returncode != 0:
        tail = "\n".join((run.stdout + run.stderr).splitlines()[-40:])
        pytest.fail(f"{shlex.join(command)} exited {run.returncode}:\n{tail}")
    elapsed = time.monotonic() - started
    print(f"release: {shlex.join(command)[:120]} took {elapsed:.1f}s")  # shown with -s / on failure
    return run.stdout


def new_venv(path: Path, *requirements: str | Path) -> Venv:
    """A virtualenv of the interpreter running the tests (not the test venv's packages), with
    `requirements` installed by pip."""
    base = getattr(sys, "_base_executable", sys.executable)
    sh(base, "-m", "venv", path)
    venv = Venv(path)
    if requirements:
        sh(venv.python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           *requirements)  # fmt: skip
    return venv


def fresh_copy(dest: Path) -> Path:
    """What a clone of the working tree would hold: the files git tracks or would add (so an
    uncommitted change is tried too), without .venv, caches or state."""
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: nothing to clone")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="session")
def source_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This worker's own copy of the working tree, to build and pack from."""
    return fresh_copy(tmp_path_factory.mktemp("source") / "ktm")


@pytest.fixture(scope="session")
def dist(source_copy: Path, tmp_path_factory: pytest.TempPathFactory) -> Dist:
    out = tmp_path_factory.mktemp("dist")
    sh(sys.executable, "-m", "build", "--outdir", out, source_copy)
    sdists, wheels = sorted(out.glob("ktm-*.tar.gz")), sorted(out.glob("ktm-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(out.iterdir())
    return Dist(sdists[0], wheels[0])


@pytest.fixture(scope="session")
def user_env(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """What `pip install ktm-X.whl` gives a user: ktm and its dependencies, nothing of the
    checkout (no editable install, no tests/, no scripts/)."""
    return new_venv(tmp_path_factory.mktemp("user") / "venv", dist.wheel)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """The user's own directory, where ktm is started (configs live elsewhere: `conf_dir`)."""
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    path = tmp_path / "etc"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A master and one worker with 2 cores, from the pip package's spark-class."""
    cluster = start_standalone(tmp_path_factory.mktemp("spark-cluster"), workers=1)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def packed_env(source_copy: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs' "Scaling out" archive, made as they say: scripts/pack_venv.sh."""
    out = tmp_path_factory.mktemp("packed") / "ktm-env.tar.gz"
    env = {**os.environ, "PYTHON": getattr(sys, "_base_executable", sys.executable)}
    env.pop("VIRTUAL_ENV", None)
    sh("bash", source_copy / "scripts" / "pack_venv.sh", out, env=env)
    return out

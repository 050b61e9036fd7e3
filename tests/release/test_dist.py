"""The sdist and the wheel: built by the standard frontend, checked by twine, holding what a
user needs and nothing of the checkout's tooling."""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

import relay
from tests.release.conftest import REPO, Dist, sh

PACKAGE = Path(relay.__file__).resolve().parent


def test_twine_checks_the_metadata_and_the_readme_rendering(dist: Dist):
    out = sh(sys.executable, "-m", "twine", "check", "--strict", dist.sdist, dist.wheel)
    assert out.count("PASSED") == 2, out


def test_the_wheel_holds_the_whole_relay_package_and_nothing_else(dist: Dist):
    assert dist.wheel.name == f"ktm-{relay.__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(dist.wheel).namelist()
    modules = {name for name in names if not name.startswith(f"ktm-{relay.__version__}.dist-info")}
    expected = {
        "relay/" + p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert modules == expected
    entry_points = zipfile.ZipFile(dist.wheel).read(
        f"ktm-{relay.__version__}.dist-info/entry_points.txt"
    )
    assert b"ktm = relay.cli:main" in entry_points


def test_the_sdist_carries_the_docs_samples_and_deploy_files(dist: Dist):
    with tarfile.open(dist.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for wanted in ("README.md", "CHANGELOG.md", "LICENSE", "config.sample.toml",
                   "filters/README.md", "filters/key_prefix.py", "scripts/pack_venv.sh",
                   "scripts/local_brokers.py", "scripts/spark_cluster.py",
                   "deploy/prometheus/ktm-rules.yml", "deploy/systemd/ktm.service",
                   "relay/engine/executor/task.py"):  # fmt: skip
        assert wanted in names, f"{wanted} missing from {dist.sdist.name}"
    docs = sorted((REPO / "docs").glob("*.md"))
    assert all(f"docs/{doc.name}" in names for doc in docs)
    # The scripts start their brokers and clusters with the testbed package: all of it.
    testbed = sorted((REPO / "testbed").glob("*.py"))
    assert testbed and all(f"testbed/{module.name}" in names for module in testbed)


def test_the_sdist_scripts_run_from_any_directory(dist: Dist, tmp_path: Path):
    """scripts/local_brokers.py and scripts/spark_cluster.py of an unpacked sdist find the
    testbed package beside them (it is not installed: the wheel holds relay alone), wherever
    they are started from."""
    with tarfile.open(dist.sdist) as sdist:
        sdist.extractall(tmp_path / "unpacked", filter="data")
    (root,) = (tmp_path / "unpacked").iterdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for script in ("local_brokers.py", "spark_cluster.py"):
        out = sh(sys.executable, root / "scripts" / script, "--help", cwd=elsewhere)
        assert out.startswith(f"usage: {script}"), out

"""A standalone Spark cluster for the tests: scripts/spark_cluster.py, the same script an operator
uses to try `--master spark://...` locally (a master and workers from the pip package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cluster_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "spark_cluster", ROOT / "scripts" / "spark_cluster.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def start_standalone(log_dir: Path, workers: int, cores: int = 2, memory: str = "1g") -> Any:
    """A started cluster (its `master_url`, `log_dir`, `kill_worker`, `stop`); the calling test
    is skipped, saying why, on a machine where one cannot start."""
    try:
        return _cluster_module().start_cluster(log_dir, workers=workers, cores=cores, memory=memory)
    except RuntimeError as exc:
        pytest.skip(f"a standalone Spark cluster cannot start on this machine: {exc}")

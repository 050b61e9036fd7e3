"""Spark's Python daemon (`pyspark.daemon`) for local masters, importing PySpark from this
interpreter's own installation.

Spark puts its `python/lib/pyspark.zip` (and py4j's source zip) first on the Python workers'
path. The zip holds no compiled modules, so the daemon and each worker it forks compile
PySpark's modules from source at every start: ~0.9 s of the first job on the 2-core machine
against ~0.2 s from the installed package (docs/performance.md, "Spark's start"). In local mode
the zip and the package are the same PySpark (the zip lives inside the installed package), so
the daemon drops the zips from its path before it imports anything of PySpark; the workers it
forks inherit that path. Set by relay.engine.jvm as `spark.python.daemon.module`; a cluster
keeps Spark's own daemon (its workers may have no PySpark but the zip).

The daemon also imports the task code (kafka-python and ktm's executor side) before it forks
anything: every worker then starts with it, instead of each importing it after its fork
(~0.2 s of CPU each, while the driver still starts up beside them on a small machine).

Nothing here may import PySpark before the path is set, nor print: the daemon's stdout carries
its port to Spark.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import runpy
import sys

# Spark's zips under the installed package's python/lib, and the package each one holds
_ZIPPED = {"pyspark.zip": "pyspark", "py4j-": "py4j"}


def without_spark_zips(path: list[str]) -> list[str]:
    """`path` less Spark's zips of packages this interpreter has installed itself."""
    plain = [entry for entry in path if not entry.endswith(".zip")]
    pyspark = importlib.machinery.PathFinder.find_spec("pyspark", plain)
    if pyspark is None or pyspark.origin is None:
        return path
    lib = os.path.join(os.path.dirname(pyspark.origin), "python", "lib")
    kept = []
    for entry in path:
        name = os.path.basename(entry)
        package = next((p for prefix, p in _ZIPPED.items() if name.startswith(prefix)), None)
        installed = package is not None and (
            importlib.machinery.PathFinder.find_spec(package, plain) is not None
        )
        if not (installed and os.path.dirname(entry) == lib and name.endswith(".zip")):
            kept.append(entry)
    return kept


# what every relay task imports; the other pipelines' executors (pyarrow's for backup) are left
# to the workers that run them
PRELOAD = ("relay.engine.executor.task", "relay.pipelines.relay.executor")


def preload(modules: tuple[str, ...] = PRELOAD) -> list[str]:
    """Import `modules` here, once, before any fork; those that fail are left to the workers
    (they import them again and report what is wrong). Returns the ones imported."""
    done = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a worker's own import says what is wrong
            continue
        done.append(name)
    return done


if __name__ == "__main__":
    sys.path[:] = without_spark_zips(sys.path)
    preload()
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)

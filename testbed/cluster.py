"""A standalone Spark cluster on 127.0.0.1: a master and N workers, from the `spark-class`
launcher inside the pyspark pip package (nothing beyond `pip install -e .` is needed).

Each process gets its own session (process group), so stopping or killing a worker also ends
its executors and their Python workers, as losing a machine would. The tests start one with
`start_standalone`; an operator trying `--master spark://...` locally, with
scripts/spark_cluster.py, which keeps the cluster's pids in a state file to stop it later.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.ports import free_port

START_TIMEOUT = 60.0
STOP_GRACE_SECONDS = 10.0


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


@dataclass
class Cluster:
    """A started cluster; its fields are plain data (a state file keeps them as JSON)."""

    master_url: str
    master_pid: int
    worker_pids: list[int] = field(default_factory=list)
    log_dir: str = ""

    def kill_worker(self, index: int) -> None:
        """SIGKILL a worker with its executors and their Python workers (its process group)."""
        _signal_group(self.worker_pids[index], signal.SIGKILL)

    def stop(self) -> None:
        pids = [*self.worker_pids, self.master_pid]
        for pid in pids:
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for pid in pids:
            while is_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            _signal_group(pid, signal.SIGKILL)


def start_cluster(
    log_dir: Path, workers: int = 2, cores: int = 2, memory: str = "1g", port: int | None = None
) -> Cluster:
    """Start a master and `workers` workers; returns once every worker has registered.
    RuntimeError, with the log's tail, when one does not come up."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    master_log = log_dir / "master.log"
    master = _launch(
        ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(free_port())],
        master_log, env,
    )  # fmt: skip
    cluster = Cluster(f"spark://127.0.0.1:{port}", master.pid, log_dir=str(log_dir))
    try:
        _wait_for(master_log, "Starting Spark master", master)
        for index in range(workers):
            _start_worker(cluster, index, cores, memory, env)
    except Exception:
        cluster.stop()
        raise
    return cluster


def _start_worker(
    cluster: Cluster, index: int, cores: int, memory: str, env: dict[str, str]
) -> None:
    log_dir = Path(cluster.log_dir)
    worker_log = log_dir / f"worker-{index}.log"
    worker = _launch(
        ["org.apache.spark.deploy.worker.Worker", cluster.master_url, "--host", "127.0.0.1",
         "--cores", str(cores), "--memory", memory, "--webui-port", str(free_port()),
         "--work-dir", str(log_dir / f"work-{index}")],
        worker_log, env,
    )  # fmt: skip
    cluster.worker_pids.append(worker.pid)
    _wait_for(worker_log, "Successfully registered with master", worker)


def start_standalone(log_dir: Path, workers: int, cores: int = 2, memory: str = "1g") -> Any:
    """For the tests: a started cluster, or the calling test skipped, saying why, on a machine
    where one cannot start (pytest is imported only here: the scripts do without it)."""
    import pytest

    try:
        return start_cluster(log_dir, workers=workers, cores=cores, memory=memory)
    except RuntimeError as exc:
        pytest.skip(f"a standalone Spark cluster cannot start on this machine: {exc}")


def _launch(args: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as sink:
        return subprocess.Popen(
            [spark_class(), *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _wait_for(
    log_path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = START_TIMEOUT
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log_path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
    raise RuntimeError(f"spark process did not report {text!r} within {timeout}s:\n{tail}")


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

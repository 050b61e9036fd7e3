"""Start or stop a local standalone Spark cluster (a master and N workers on 127.0.0.1).

It uses the `spark-class` launcher shipped inside the pyspark pip package, so nothing beyond
`pip install -e .` is needed. Each process gets its own session (process group), so stopping or
killing a worker also ends its executors and their Python workers, as losing a machine would.

    python scripts/spark_cluster.py start [--workers 2] [--cores 2] [--memory 1g] [--port 7077]
    python scripts/spark_cluster.py stop
    python scripts/spark_cluster.py status

Then: ktm relay --config config.toml --master spark://127.0.0.1:7077
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

STATE_DIR = Path(__file__).resolve().parent.parent / ".ktm" / "spark"


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Cluster:
    master_url: str
    master_pid: int
    worker_pids: list[int] = field(default_factory=list)
    log_dir: str = ""

    def kill_worker(self, index: int) -> None:
        """SIGKILL a worker with its executors and their Python workers (its process group)."""
        _signal_group(self.worker_pids[index], signal.SIGKILL)

    def stop(self) -> None:
        for pid in [*self.worker_pids, self.master_pid]:
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for pid in [*self.worker_pids, self.master_pid]:
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            _signal_group(pid, signal.SIGKILL)


def start_cluster(
    log_dir: Path, workers: int = 2, cores: int = 2, memory: str = "1g", port: int | None = None
) -> Cluster:
    """Start a master and `workers` workers; returns once every worker has registered."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    master_log = log_dir / "master.log"
    master = _launch(
        [
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(free_port()),
        ],
        master_log,
        env,
    )
    cluster = Cluster(f"spark://127.0.0.1:{port}", master.pid, log_dir=str(log_dir))
    try:
        _wait_for(master_log, "Starting Spark master", 60, master)
        for index in range(workers):
            worker_log = log_dir / f"worker-{index}.log"
            worker = _launch(
                [
                    "org.apache.spark.deploy.worker.Worker",
                    cluster.master_url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(cores),
                    "--memory",
                    memory,
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(log_dir / f"work-{index}"),
                ],
                worker_log,
                env,
            )
            cluster.worker_pids.append(worker.pid)
            _wait_for(worker_log, "Successfully registered with master", 60, worker)
    except Exception:
        cluster.stop()
        raise
    return cluster


def _launch(args: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as sink:
        return subprocess.Popen(
            [spark_class(), *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _wait_for(log_path: Path, text: str, timeout: float, proc: subprocess.Popen[bytes]) -> None:
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("start", "stop", "status"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--memory", default="1g")
    parser.add_argument("--port", type=int, default=7077)
    args = parser.parse_args(argv)
    state = STATE_DIR / "cluster.json"
    if args.command == "start":
        if state.exists() and _alive(json.loads(state.read_text())["master_pid"]):
            print(f"already running: {json.loads(state.read_text())['master_url']}")
            return 0
        cluster = start_cluster(STATE_DIR, args.workers, args.cores, args.memory, args.port)
        state.write_text(json.dumps(cluster.__dict__))
        print(f"master {cluster.master_url} ({args.workers} workers); logs in {STATE_DIR}")
    elif args.command == "stop":
        if state.exists():
            Cluster(**json.loads(state.read_text())).stop()
            state.unlink()
        print("stopped")
    else:
        up = state.exists() and _alive(json.loads(state.read_text())["master_pid"])
        print(f"running: {json.loads(state.read_text())['master_url']}" if up else "not running")
    return 0


if __name__ == "__main__":
    sys.exit(main())

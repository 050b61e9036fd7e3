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
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file, the testbed package beside scripts/ is not found
    sys.path.insert(0, str(ROOT))

from testbed.cluster import Cluster, is_alive, start_cluster  # noqa: E402

STATE_DIR = ROOT / ".ktm" / "spark"
STATE_FILE = STATE_DIR / "cluster.json"


def running() -> Cluster | None:
    """The cluster the state file names, if its master is still alive."""
    if not STATE_FILE.exists():
        return None
    cluster = Cluster(**json.loads(STATE_FILE.read_text()))
    return cluster if is_alive(cluster.master_pid) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("start", "stop", "status"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--memory", default="1g")
    parser.add_argument("--port", type=int, default=7077)
    args = parser.parse_args(argv)
    cluster = running()
    if args.command == "start":
        if cluster is not None:
            print(f"already running: {cluster.master_url}")
            return 0
        cluster = start_cluster(STATE_DIR, args.workers, args.cores, args.memory, args.port)
        STATE_FILE.write_text(json.dumps(cluster.__dict__))
        print(f"master {cluster.master_url} ({args.workers} workers); logs in {STATE_DIR}")
    elif args.command == "stop":
        if STATE_FILE.exists():
            Cluster(**json.loads(STATE_FILE.read_text())).stop()
            STATE_FILE.unlink()
        print("stopped")
    else:
        print(f"running: {cluster.master_url}" if cluster else "not running")
    return 0


if __name__ == "__main__":
    sys.exit(main())

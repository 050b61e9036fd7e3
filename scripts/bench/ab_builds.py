"""Two ktm builds against each other across a long link: one far/near broker pair, each build's
`ktm relay --stop-at-end` run in turn on the same backlog, whole process timed, every copy
counted. A build is a source tree put first on PYTHONPATH (a `git worktree` of another commit),
run by the ktm of this venv; its Spark workers get the package of that tree.

    python -m scripts.bench.ab_builds --build old=/tmp/old --build new=. --records 40000 --runs 5

Prints each run and the median (min-max) per build. Tansu brokers; the far one sits behind
testbed/link.py's proxy, its delay off while the data is produced and the copies counted
(`--far neither`: no proxy, both brokers on loopback, for changes to a local copy).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
import uuid
from pathlib import Path

from scripts.bench.contenders import ktm_executable
from testbed.link import FarBroker
from testbed.records import Record, produce, record_count
from testbed.tansu import TansuBroker
from testbed.topics import create_topic

PARTITIONS = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="append", required=True, help="name=source tree")
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--far", choices=("source", "target", "neither"), default="source",
        help="the side behind the delayed link; neither: two plain brokers",
    )  # fmt: skip
    parser.add_argument("--one-way", type=float, default=0.12, help="seconds of delay each way")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/ktm-ab"))
    parser.add_argument(
        "--ktm-arg", action="append", default=[],
        help="an extra argument for every ktm run, e.g. --ktm-arg=--debug (its log in WORKDIR)",
    )  # fmt: skip
    args = parser.parse_args()
    builds = dict(spec.split("=", 1) for spec in args.build)
    args.workdir.mkdir(parents=True, exist_ok=True)
    broker = TansuBroker if args.far == "neither" else FarBroker
    far = broker("ab-far", log_dir=args.workdir).start()
    near = TansuBroker("ab-near", log_dir=args.workdir).start()
    try:
        times = compare(args, builds, far, near)
    finally:
        far.stop()
        near.stop()
    for name, took in times.items():
        print(f"{name}: median {statistics.median(took):.2f} s ({min(took):.2f}-{max(took):.2f})")


def compare(
    args: argparse.Namespace,
    builds: dict[str, str],
    far: FarBroker | TansuBroker,
    near: TansuBroker,
) -> dict[str, list[float]]:
    delay = far.link.set_delay if isinstance(far, FarBroker) else lambda seconds: None
    source, target = (far.bootstrap, near.bootstrap)
    if args.far == "target":
        source, target = target, source
    topic = create_topic(source, f"ab-src-{uuid.uuid4().hex[:8]}", PARTITIONS)
    backlog = [
        Record(b"k", b"%08d" % i + b"." * 92, partition=i % PARTITIONS) for i in range(args.records)
    ]
    produce(source, topic, backlog)
    times: dict[str, list[float]] = {name: [] for name in builds}
    for run in range(args.runs):
        for name, tree in builds.items():
            copy = create_topic(target, f"ab-copy-{uuid.uuid4().hex[:8]}", PARTITIONS)
            delay(args.one_way)
            stem = args.workdir / f"{name}-{run}"
            took, rc = relay_once(stem, tree, (source, target, topic, copy), args.ktm_arg)
            delay(0)
            count = record_count(target, copy, timeout=30 + args.records / 20_000)
            print(f"{name} run {run}: exit {rc}, {took:.2f} s, {count:,} records", flush=True)
            if rc != 0 or count != args.records:
                raise SystemExit(f"{name} run {run} failed: see {args.workdir}/{name}-{run}.log")
            times[name].append(took)
    return times


def relay_once(
    stem: Path, tree: str, pair: tuple[str, str, str, str], extra: list[str]
) -> tuple[float, int]:
    source, target, topic, copy = pair
    config = stem.with_suffix(".toml")
    config.write_text(
        f'[app]\nmetrics_addr = ""\ngroup_id = "ab-{uuid.uuid4().hex[:8]}"\n'
        f'[topics]\n"{topic}" = "{copy}"\n'
        f'[[sources]]\nname = "source"\nservers = ["{source}"]\n'
        f'[target]\nservers = ["{target}"]\n'
    )
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), "KTM_LOG_DIR": str(stem.parent)}
    command = [ktm_executable(), "relay", "--config", str(config), "--stop-at-end", "--no-progress"]
    command += extra
    with stem.with_suffix(".log").open("w") as log:
        began = time.monotonic()
        rc = subprocess.run(command, env=env, stdout=log, stderr=log, cwd=stem.parent).returncode
    return time.monotonic() - began, rc


if __name__ == "__main__":
    main()

"""What a relay of thousands of partitions costs with nothing to relay: ktm builds (and the
latency-tuned confluent-kafka loop) each started in turn on the same topics, a record passed on
every partition, then the CPU of each process of the tree counted while idle.

    python -m scripts.bench.idle_scale --brokers kafka --topics 2000 --runs 3 \\
        --build new=. [--build old=/tmp/old] [--loop]

One source and one destination broker (Tansu, or single-node Apache Kafka 4.4), `--topics`
topics of 5 partitions on each. Each ktm run copies into the same destination topics under a
fresh group: it resumes from what the destination holds, so it starts idle once the new
record of each partition is through. The loop copies into a broker of its own (one broker of
20,000 partitions ran out of file descriptors here). Prints each run
(cores of the whole tree, the driver, the workers) and the median (min-max) per contender.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import psutil
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from scripts.bench.brokers import KAFKA_VERSION
from scripts.bench.contenders import ktm_executable
from testbed.kafka import KafkaCluster
from testbed.tansu import TansuBroker

PARTITIONS = 5
SETTLE_S = 10.0  # after the records came through: the last reports and acks settle
COPY_TIMEOUT_S = 600.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", choices=("tansu", "kafka"), default="tansu")
    parser.add_argument("--topics", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="the idle window counted")
    parser.add_argument("--build", action="append", default=[], help="name=source tree")
    parser.add_argument("--loop", action="store_true", help="the latency-tuned loop too")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/ktm-idle-scale"))
    args = parser.parse_args()
    builds = dict(spec.split("=", 1) for spec in args.build or ["ktm=."])
    args.workdir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        sides = ("src", "dst", "loop") if args.loop else ("src", "dst")
        brokers = [stack.enter_context(_broker(args, side)) for side in sides]
        runs = measure(args, builds, *brokers)
    for name, cores in runs.items():
        print(f"{name}: {_spread([c['tree'] for c in cores])} cores, driver "
              f"{_spread([c['driver'] for c in cores])}, workers "
              f"{_spread([c['workers'] for c in cores])}")  # fmt: skip


def measure(
    args: argparse.Namespace, builds: dict[str, str], src: str, dst: str, loop_dst: str = ""
) -> dict[str, list[dict[str, float]]]:
    names = [f"idle-{i:05d}-{uuid.uuid4().hex[:4]}" for i in range(args.topics)]
    for bootstrap in (src, dst, loop_dst):
        if bootstrap:
            _create(bootstrap, names)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in builds}
    if args.loop:
        runs["loop"] = []
    sent, loop_group = 0, f"loop-{uuid.uuid4().hex[:8]}"
    for run in range(args.runs):
        for name, tree in builds.items():
            sent += _one_each(src, names)
            command, env = _ktm(args.workdir / f"{name}-{run}", tree, src, dst, names)
            runs[name].append(_idle(args, command, env, partial(_holds, dst, names, sent)))
            print(f"{name} run {run}: {runs[name][-1]}", flush=True)
        if args.loop:
            command, env = _loop(args.workdir / f"loop-{run}", src, loop_dst, names, loop_group)
            # One group for every run: each copies what came since (one run began measuring
            # while it still copied the earlier runs' records). Tansu lists a partition's end
            # as its last batch's base + 1 and the loop's batches hold several records: the
            # last batch begun on every partition is what can be seen there.
            each = sent // (args.topics * PARTITIONS)
            through = partial(_holds, loop_dst, names, each - len(builds) + 1, per_partition=True)
            runs["loop"].append(_idle(args, command, env, through))
            print(f"loop run {run}: {runs['loop'][-1]}", flush=True)
    return runs


def _idle(
    args: argparse.Namespace,
    command: list[str],
    env: dict[str, str],
    through: Callable[[], bool],
) -> dict[str, float]:
    """Start `command`, wait until `through()`, settle, count each process's CPU while idle."""
    with open(args.workdir / "contender.log", "a") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=log, cwd=args.workdir)
    try:
        began = time.monotonic()
        while not through():
            if proc.poll() is not None or time.monotonic() - began > COPY_TIMEOUT_S:
                raise SystemExit(f"{command[0]} copied nothing: see {args.workdir}/contender.log")
            time.sleep(1.0)
        time.sleep(SETTLE_S)
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]
        before = {p.pid: _cpu(p) for p in tree}
        time.sleep(args.seconds)
        spent = {p.pid: _cpu(p) - before[p.pid] for p in tree}
        workers = sum(spent[p.pid] for p in tree if _worker(p))
        cores = {k: round(v / args.seconds, 4) for k, v in spent.items()}
        return {"tree": round(sum(cores.values()), 3), "driver": cores[root.pid],
                "workers": round(workers / args.seconds, 3)}  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(60)


def _cpu(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
        return times.user + times.system
    except psutil.Error:
        return 0.0


def _worker(proc: psutil.Process) -> bool:
    try:
        return "pyspark.worker" in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def _ktm(stem: Path, tree: str, src: str, dst: str, names: list[str]) -> tuple[list[str], dict]:
    config = stem.with_suffix(".toml")
    topics = "".join(f'"{n}" = "{n}"\n' for n in names)
    config.write_text(
        f'[app]\nmetrics_addr = ""\ngroup_id = "idle-{uuid.uuid4().hex[:8]}"\n[topics]\n{topics}'
        f'[[sources]]\nname = "source"\nservers = ["{src}"]\n[target]\nservers = ["{dst}"]\n'
    )
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), "KTM_LOG_DIR": str(stem.parent)}
    return [ktm_executable(), "relay", "--config", str(config), "--no-progress"], env


def _loop(stem: Path, src: str, dst: str, names: list[str], group: str) -> tuple[list[str], dict]:
    pairs = stem.with_suffix(".json")
    pairs.write_text(json.dumps([[n, n, PARTITIONS] for n in names]))
    command = [sys.executable, "-m", "scripts.bench.loops", "tuned", "--src", src, "--dst", dst,
               "--pairs", str(pairs), "--group", group, "--follow"]  # fmt: skip
    return command, {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def _create(bootstrap: str, names: list[str]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=120_000)
    try:
        for i in range(0, len(names), 200):  # Kafka refuses 10,000 partitions in one request
            chunk = [NewTopic(n, PARTITIONS, 1) for n in names[i : i + 200]]
            admin.create_topics(chunk, timeout_ms=120_000)
    finally:
        admin.close()


def _one_each(bootstrap: str, names: list[str]) -> int:
    """A record on every partition; how many were sent."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=50, acks="all")
    for name in names:
        for partition in range(PARTITIONS):
            producer.send(name, key=b"k", value=b"v" * 100, partition=partition)
    producer.flush()
    producer.close()
    return len(names) * PARTITIONS


def _holds(bootstrap: str, names: list[str], records: int, per_partition: bool = False) -> bool:
    """Whether the topics hold `records` (listed ends: exact for batches of one record), or
    with `per_partition` that many on every partition."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tps = [TopicPartition(n, p) for n in names for p in range(PARTITIONS)]
        ends = consumer.end_offsets(tps).values()
    finally:
        consumer.close()
    return min(ends) >= records if per_partition else sum(ends) >= records


@contextmanager
def _broker(args: argparse.Namespace, side: str) -> Iterator[str]:
    """One broker, started and stopped; its bootstrap address."""
    broker: Any
    if args.brokers == "kafka":
        broker = KafkaCluster(f"idle-{side}", size=1, version=KAFKA_VERSION,
                              log_dir=args.workdir, quick_jit=False)  # fmt: skip
    else:
        broker = TansuBroker(f"idle-{side}", log_dir=args.workdir)
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


if __name__ == "__main__":
    main()

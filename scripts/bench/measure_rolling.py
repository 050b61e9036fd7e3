"""The rolling section: ktm copies a backlog from the bench's source broker into a three-node
Apache Kafka 4.4 cluster started here (replication factor 3, min.insync.replicas 2: the
testbed's settings for three nodes; full JIT, warmed like the bench's brokers), once undisturbed
and once while that cluster is restarted node by node as an operator upgrades it: a controlled
shutdown, a start, every replica back in sync before the next node (`KafkaCluster.
restart_node`, one node at a time, timed). The restart begins once the first
copied record is in the destination. Both copies are checked record by record."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from scripts.bench import report
from scripts.bench.brokers import bench_kafka, nodes_pids, warm
from scripts.bench.contenders import Bench, Ktm
from scripts.bench.data import (
    Brokers,
    Dataset,
    EndOffsets,
    dataset,
    topic_on,
    verify_copy,
    verify_prefix,
)
from scripts.bench.machine import load_average
from scripts.bench.measure_copy import run_timeout
from scripts.bench.options import Options
from scripts.bench.processes import Finished
from scripts.bench.report import Table
from testbed.kafka import KafkaCluster

UNDER_WAY_TIMEOUT_S = 300.0
UNDER_WAY_EVERY_S = 0.05
CASES = ("undisturbed", "rolling restart")


class ThreeNodes:
    """The bench's source broker and the three-node destination, as `Brokers`."""

    kind = "kafka"

    def __init__(self, source: Brokers, destination: KafkaCluster):
        self.source, self.destination = source, destination

    @property
    def src(self) -> str:
        return self.source.src

    @property
    def dst(self) -> str:
        return self.destination.bootstrap

    def broker_pids(self) -> dict[str, list[int]]:
        return {
            "source": self.source.broker_pids()["source"],
            "destination": nodes_pids(self.destination),
        }


@dataclass
class RollingRun:
    case: str
    finished: Finished | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    check: str = "ok"
    restart_at: float | None = None  # from ktm's launch to the first node's shutdown
    restart_seconds: float | None = None  # the whole rolling restart
    restarted_during: int = 0  # nodes whose shutdown began before ktm exited


def copy_through(bench: Bench, trio: KafkaCluster, data: Dataset, case: str) -> RollingRun:
    """ktm --stop-at-end copies `data` into a fresh topic of `trio`; with the rolling restart
    after its first record arrived. ktm is waited for on a thread (its wall clock ends when it
    exits); the nodes are restarted from this one: testbed.kafka ties a node's life to the
    thread that launched it (PR_SET_PDEATHSIG)."""
    run = RollingRun(case)
    print(f"  ktm, {case} (load average {load_average()}) ...", flush=True)
    with topic_on(bench.cluster.dst, "bench-rolling", data.partitions) as target:
        with Ktm(bench, data.topic, target, stop_at_end=True) as ktm:

            def wait() -> None:
                run.finished = ktm.wait(run_timeout(data.records))

            waiter = threading.Thread(target=wait, name="ktm-waiter", daemon=True)
            waiter.start()
            try:
                if case == "rolling restart":
                    roll(trio, target, data, ktm, run)
            except BaseException:
                ktm.reap()  # the waiter returns at once
                raise
            finally:
                waiter.join()
        run.summary = ktm.summary() or {}
        run.check = judge(bench, data, target, run)
    return run


def roll(trio: KafkaCluster, target: str, data: Dataset, ktm: Ktm, run: RollingRun) -> None:
    """Once the destination holds a record (or ktm is done), restart every node in turn."""
    ends = EndOffsets(trio.bootstrap, target, data.partitions)
    try:
        deadline = time.monotonic() + UNDER_WAY_TIMEOUT_S
        while ends() < 1 and ktm.alive():
            if time.monotonic() > deadline:
                raise RuntimeError("the copy never got under way: no record in the destination")
            time.sleep(UNDER_WAY_EVERY_S)
    finally:
        ends.close()
    began = time.monotonic()
    run.restart_at = began - ktm.started
    for node in trio.nodes:
        run.restarted_during += ktm.alive()
        trio.restart_node(node.node_id)
    run.restart_seconds = time.monotonic() - began


def judge(bench: Bench, data: Dataset, target: str, run: RollingRun) -> str:
    """The copy check; after a failed run, whether the destination was left a prefix of the
    source (what a rerun resumes from) and how many records it holds."""
    fin = run.finished
    if fin is not None and fin.returncode == 0:
        return verify_copy(bench.cluster, data, target)
    code = "none" if fin is None else fin.returncode
    print(f"  ktm exited {code}; its stderr ends:\n    {fin.tail() if fin else ''}")
    left, held = verify_prefix(bench.cluster, data.topic, target, data.partitions)
    return f"FAILED: exit {code}; the destination ({held:,} records): {left}"


HEADERS = [
    "case",
    "records",
    "partitions",
    "seconds whole",
    "records/s",
    "vs undisturbed",
    "rounds",
    "restart began s",
    "nodes restarted while ktm ran",
    "rolling restart s",
    "copy check",
]


def add_row(table: Table, data: Dataset, run: RollingRun, calm: float | None) -> None:
    fin = run.finished
    wall = fin.wall if fin and run.check == "ok" else None
    rolled = run.case != "undisturbed"
    table.add(
        run.case,
        f"{data.records:,}",
        data.partitions,
        report.seconds(wall),
        report.rate(data.records, wall),
        report.ratio(wall, calm) if rolled else report.NA,
        run.summary.get("rounds", report.NA),
        report.seconds(run.restart_at),
        f"{run.restarted_during} of 3" if rolled else report.NA,
        report.seconds(run.restart_seconds),
        run.check,
    )


def rolling(bench: Bench, opts: Options) -> Table:
    records = opts.rolling_records
    table = Table(
        f"ROLLING RESTART: ktm --stop-at-end copies {records:,} records of {opts.size} B into a "
        "three-node Apache Kafka 4.4 cluster (RF 3, min.insync.replicas 2)",
        list(HEADERS),
        notes=[
            "source: the bench's source broker; destination: a three-node cluster started for "
            "this run (full JIT, warmed), a fresh topic of RF 3 for each copy. rolling restart: "
            "each node in turn gets a controlled shutdown (SIGTERM), is started again, and every "
            "replica is back in sync before the next; it begins once the destination holds a "
            "copied record (restart began s: from ktm's launch) and runs to its end even when "
            "ktm exits first.",
            "seconds whole: ktm's launch to its exit; vs undisturbed: this time / the "
            "undisturbed copy's (> 1: slower); rounds: ktm's --summary-json. copy check ok: "
            "every record once, in order, unchanged (read back after the restart ended).",
        ],
    )
    trio = bench_kafka("bench-rolling", bench.workdir, size=3)
    try:
        print(f"\n[rolling] starting a three-node Apache Kafka cluster, {records:,} records")
        trio.start()
        warm(trio.bootstrap)
        three = Bench(ThreeNodes(bench.cluster, trio), bench.workdir, bench.ktm_settings)
        with dataset(bench.cluster, opts.partitions, records, opts.size) as data:
            calm: float | None = None
            for case in CASES:
                run = copy_through(three, trio, data, case)
                if case == "undisturbed" and run.finished and run.check == "ok":
                    calm = run.finished.wall
                add_row(table, data, run, calm)
    finally:
        trio.stop()
        trio.remove()
    return table

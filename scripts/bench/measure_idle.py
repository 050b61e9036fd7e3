"""What a running relay costs with nothing to relay: each contender is started on an empty
topic pair, passes one warm-up record per partition (so its tasks run), then sits idle while
the CPU of its process tree (and of each broker, apart) is counted."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from scripts.bench import report
from scripts.bench.brokers import SIDES
from scripts.bench.contenders import LABELS, Bench, runnable
from scripts.bench.feed import warm_up
from scripts.bench.machine import load_average
from scripts.bench.measure_live import WARM_UP_TIMEOUT_S, CpuWindow, exit_note, live, stop
from scripts.bench.options import Options
from scripts.bench.processes import Finished
from scripts.bench.report import Table

SETTLE_S = 5.0  # after the warm-up: the first fetches and reports of an idle relay settle
IDLE_S = 30.0  # the idle window measured


@dataclass
class IdleRun:
    kind: str
    cores: float | None = None  # CPU seconds of the tree per second, idle
    broker_cores: dict[str, float] | None = None
    finished: Finished | None = None
    check: str = "ok"


def idle_once(bench: Bench, kind: str, opts: Options) -> IdleRun:
    run = IdleRun(kind)
    with live(bench, kind, opts, f"bench-idle-{kind}") as it:
        try:
            warm_up(it.feeder, it.probe, it.proc.alive, WARM_UP_TIMEOUT_S)
            time.sleep(SETTLE_S)
            window = CpuWindow(it.proc, bench)
            time.sleep(IDLE_S)
            took, cpu, run.broker_cores = window.end()
            run.cores = cpu / took
        except RuntimeError as exc:
            run.check = f"FAILED: {exc}"
        run.finished = stop(it.proc)
    if run.check == "ok" and run.finished is not None and run.finished.returncode != 0:
        run.check = exit_note(run.finished)
    return run


def idle(bench: Bench, opts: Options) -> Table:
    table = Table(
        f"IDLE: a running relay with nothing to relay for {IDLE_S:.0f} s, {opts.partitions} "
        "partitions",
        ["contender", "CPU cores busy", *(f"{side} broker cores" for side in SIDES), "check"],
    )
    table.notes += [
        f"CPU cores busy = CPU seconds of the relay's process tree per second (of "
        f"{os.cpu_count()}), counted from {SETTLE_S:.0f} s after a warm-up record came through "
        "on every partition. src/dst broker cores: each broker's own, apart.",
    ]
    for kind in runnable(opts.contenders):
        print(f"\n[idle] {LABELS[kind]} (load average {load_average()}) ...", flush=True)
        run = idle_once(bench, kind, opts)
        table.add(
            LABELS[kind],
            report.seconds(run.cores, 3),
            *(report.seconds((run.broker_cores or {}).get(side), 3) for side in SIDES),
            run.check,
        )
    return table

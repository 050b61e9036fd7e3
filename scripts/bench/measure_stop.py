"""Stopping ktm while records flow: SIGTERM to ktm alone (what a service manager sends), then
SIGINT to its whole process group (what Ctrl+C in a terminal does). How long it takes, the exit
code, what it logged, whether any process of its tree survived, and whether the copy is exact."""

from __future__ import annotations

import signal
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from scripts.bench import report
from scripts.bench.contenders import Bench, Ktm
from scripts.bench.data import topic_pair, verify_prefix
from scripts.bench.feed import DestinationCount, Feeder
from scripts.bench.machine import load_average
from scripts.bench.options import Options
from scripts.bench.processes import Finished, log_lines, unformatted_lines
from scripts.bench.report import Table

FLOW_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 120.0  # ktm's own bound is far lower; past this it is killed and says so
SHOWN_LINES = 5

WAYS = {
    "SIGTERM to ktm only": (signal.SIGTERM, False),
    "SIGINT to its process group": (signal.SIGINT, True),
}


@dataclass
class StopRun:
    how: str
    took: float | None = None  # signal -> exit
    signal_at: int = 0  # characters of stderr written before the signal
    finished: Finished | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    destination: int | None = None
    processes: int = 0  # in ktm's tree while it ran
    check: str = "ok"


def stop_once(bench: Bench, opts: Options, how: str) -> StopRun:
    signum, group = WAYS[how]
    run = StopRun(how)
    with topic_pair(bench.cluster, "bench-stop", opts.partitions) as topics, ExitStack() as s:
        feeder = Feeder(bench.cluster.src, topics[0], opts.partitions, opts.size)
        s.callback(feeder.close)
        counter = DestinationCount(bench.cluster.dst, topics[1], opts.partitions)
        s.callback(counter.close)
        ktm = s.enter_context(Ktm(bench, *topics, stop_at_end=False))
        feeder.start(opts.rate, None)
        if counter.wait_for(1, ktm.alive, FLOW_TIMEOUT_S) is None:
            run.check = "FAILED: no record reached the destination"
        else:
            time.sleep(opts.stop_after)  # records flow meanwhile: ktm is stopped mid-stream
        signal_and_wait(ktm, run, signum, group)
        feeder.close()  # only now: ktm stops with records still arriving, as in production
        if run.check == "ok":
            run.check, run.destination = verify_prefix(bench.cluster, *topics, opts.partitions)
    return run


def signal_and_wait(ktm: Ktm, run: StopRun, signum: int, group: bool) -> None:
    run.processes = len(ktm.monitor.seen)
    run.signal_at = ktm.stderr_size()
    was_running = ktm.alive()
    signalled = time.monotonic()
    ktm.signal(signum, group=group)
    run.finished = ktm.wait(STOP_TIMEOUT_S)
    run.summary = ktm.summary() or {}
    if was_running:
        run.took = time.monotonic() - signalled
    elif run.check == "ok":
        run.check = "FAILED: ktm exited before the signal"
    if run.finished.returncode != 0:
        print(
            f"  ktm exited {run.finished.returncode}; its stderr ends:\n    {run.finished.tail()}"
        )


def summary_note(run: StopRun) -> str:
    """What ktm's --summary-json says, against what the destination holds."""
    if not run.summary:
        return "none written"
    relayed = run.summary.get("relayed")
    flag = "stopped_by_signal" if run.summary.get("stopped_by_signal") else "NOT stopped_by_signal"
    if run.destination is None or relayed == run.destination:
        return f"{flag}, relayed {relayed:,}"
    return f"{flag}, relayed {relayed:,} but destination holds {run.destination:,}"


STOP_HEADERS = [
    "how",
    "signal -> exit s",
    "exit code",
    "WARNING lines (after signal)",
    "ERROR lines (after signal)",
    "other stderr lines",
    "tree processes",
    "left running",
    "summary",
    "copy check",
]


def add_row(table: Table, run: StopRun) -> None:
    fin = run.finished
    if fin is None:
        table.add(run.how, *[report.NA] * 8, run.check)
        return
    after = fin.stderr[run.signal_at :]

    def count(*levels: str) -> str:
        return f"{len(log_lines(fin.stderr, *levels))} ({len(log_lines(after, *levels))})"

    other = unformatted_lines(fin.stderr)
    table.add(
        run.how,
        report.seconds(run.took),
        fin.returncode,
        count("WARNING"),
        count("ERROR", "CRITICAL"),
        len(other),
        run.processes,
        ", ".join(fin.leftovers) or "none",
        summary_note(run),
        run.check,
    )
    shown = log_lines(fin.stderr, "WARNING", "ERROR", "CRITICAL") + other
    for line in shown[:SHOWN_LINES]:
        table.notes.append(f"{run.how}: {line[:160]}")
    if len(shown) > SHOWN_LINES:
        table.notes.append(f"{run.how}: ... {len(shown) - SHOWN_LINES} more in {fin.name}.stderr")


def stop(bench: Bench, opts: Options) -> Table:
    table = Table(
        f"STOP: ktm continuous, fed {opts.rate:,.0f} records/s, signalled after records flowed "
        f"for {opts.stop_after:.0f} s",
        list(STOP_HEADERS),
    )
    for how in WAYS:
        print(f"\n[stop] {how} (load average {load_average()}) ...", flush=True)
        add_row(table, stop_once(bench, opts, how))
    table.notes.insert(
        0,
        "exit code 0 and no WARNING/ERROR expected (README: a signal flushes, commits, exits 0). "
        "left running: processes of ktm's tree (seen while it ran, or carrying its environment "
        "tag) still alive 2 s after it exited (killed afterwards). copy check: the destination "
        "must be exactly the first records of the source, per partition.",
    )
    return table

"""Copy-and-exit measurements: a source topic already holds the data, each contender copies it
into a fresh destination topic and exits (ktm with --stop-at-end), and every copy is checked
record by record. Sections: throughput, partitions, steady, scaling."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from scripts.bench import report
from scripts.bench.brokers import BROKER_NAMES, SIDES, BrokerCpu, used_since
from scripts.bench.ceiling import RECORD_BYTES, produce_ceiling
from scripts.bench.contenders import (
    LABELS,
    NEEDS_CONFLUENT,
    Bench,
    Ktm,
    has_confluent,
    launch,
    runnable,
)
from scripts.bench.data import Dataset, EndOffsets, dataset, topic_on, verify_copy
from scripts.bench.machine import load_average
from scripts.bench.options import Options
from scripts.bench.processes import SAMPLE_EVERY_S, Finished, Launched
from scripts.bench.report import Table
from scripts.bench.sampling import Sample, Sampler, growth_per_second, in_window, slope
from scripts.bench.wire import Wire, topic_wire

DEST_EVERY_S = 0.05  # ListOffsets on the destination: ~1 ms each; ktm's window is ~1 s
STEADY_WINDOW = (0.2, 0.8)  # share of the records: past start-up, before the tail
CEILING_RECORDS = (1_000_000, 200_000)  # records for the produce ceiling: full run, --quick


def run_timeout(records: int) -> float:
    return 300 + records / 2000  # far beyond any sane rate: only a hung run hits it


@dataclass
class CopyRun:
    kind: str
    finished: Finished | None
    check: str
    summary: dict[str, Any] | None = None
    wire: Wire | None = None  # the destination topic's batches (copy sections)
    rate: float | None = None  # steady state records/s
    window_samples: int = 0  # destination samples the steady rate was fitted on
    window_seconds: float | None = None
    # launch to the first destination sample holding a record: the same yardstick for every
    # contender (ktm's own figure, --summary-json's first_record, is not the loop's)
    first_seen: float | None = None
    cpu_cores: float | None = None  # CPU seconds of the tree per second over the same window
    # the brokers' own CPU ("source", "destination"): seconds from launch to exit (copy
    # sections), CPU seconds per second over the steady window (steady sections)
    broker_cpu: dict[str, float | None] | None = None


def _finish(
    kind: str, proc: Launched, finished: Finished, bench: Bench, data: Dataset, target: str
) -> CopyRun:
    summary = proc.summary() if isinstance(proc, Ktm) else None
    if finished.returncode != 0:
        print(
            f"  {kind} exited {finished.returncode}; last lines of stderr:\n    {finished.tail()}"
        )
        return CopyRun(kind, finished, f"FAILED: exit {finished.returncode}", summary)
    return CopyRun(kind, finished, verify_copy(bench.cluster, data, target), summary)


def copy_once(bench: Bench, kind: str, data: Dataset) -> CopyRun:
    """One contender copies ``data`` whole; wall clock from launch to exit. A good copy's
    batches are then fetched to weigh them (not timed)."""
    if kind in NEEDS_CONFLUENT and not has_confluent():
        return CopyRun(kind, None, "skipped: pip install confluent-kafka")
    print(f"  {LABELS[kind]}: copying (load average {load_average()}) ...", flush=True)
    with topic_on(bench.cluster.dst, f"bench-{kind}", data.partitions) as target:
        brokers = BrokerCpu(bench.cluster)
        before = brokers.seconds()
        with launch(kind, bench, (data.topic, target), data.partitions, continuous=False) as proc:
            finished = proc.wait(run_timeout(data.records))
        used = used_since(before, brokers.seconds())
        run = _finish(kind, proc, finished, bench, data, target)
        run.broker_cpu = dict(used)
        if run.check == "ok":
            run.wire = topic_wire(bench.cluster.dst, target, data.partitions)
    return run


def watched_copy(
    bench: Bench, kind: str, data: Dataset, target: str
) -> tuple[Launched, Finished, list[Sample], dict[str, list[Sample]]]:
    """A copy with the destination's end offsets sampled while it runs: the same yardstick for
    every contender. (process, how it ended, (time, records in the destination), per side
    (time, CPU ms of its broker))."""
    ends = EndOffsets(bench.cluster.dst, target, data.partitions)
    brokers = BrokerCpu(bench.cluster)
    cpu = {side: Sampler(functools.partial(brokers.millis, side), SAMPLE_EVERY_S) for side in SIDES}
    try:
        with launch(kind, bench, (data.topic, target), data.partitions, continuous=False) as proc:
            with Sampler(ends, DEST_EVERY_S) as written, ExitStack() as stack:
                for sampler in cpu.values():
                    stack.enter_context(sampler)
                finished = proc.wait(run_timeout(data.records))
    finally:
        ends.close()
    return proc, finished, written.samples, {side: cpu[side].samples for side in SIDES}


def steady_once(
    bench: Bench, kind: str, data: Dataset, before_check: Callable[[], None] | None = None
) -> CopyRun:
    """A contender copies ``data``; the rate is the slope of the destination's records between
    20% and 80% of them (start-up and the last stragglers excluded), the CPU is the tree's over
    the same stretch of time. `before_check` runs after the copy, before it is checked."""
    print(
        f"  {LABELS[kind]}: copying {data.records:,} records, sampling the destination every "
        f"{DEST_EVERY_S} s (load average {load_average()}) ...",
        flush=True,
    )
    with topic_on(bench.cluster.dst, f"bench-steady-{kind}", data.partitions) as target:
        proc, finished, written, broker_ms = watched_copy(bench, kind, data, target)
        if before_check is not None:
            before_check()
        run = _finish(kind, proc, finished, bench, data, target)
    low, high = (share * data.records for share in STEADY_WINDOW)
    seen = [at for at, records in written if records > 0]
    run.first_seen = seen[0] - proc.started if seen else None
    run.rate, run.window_samples, span = slope(written, low, high)
    if run.rate is not None:
        window = in_window(written, low, high)
        run.window_seconds = span
        span_at = window[0][0], window[-1][0]
        cpu_ms = growth_per_second(proc.monitor.cpu_history, *span_at)
        run.cpu_cores = None if cpu_ms is None else cpu_ms / 1000
        run.broker_cpu = {side: cores(broker_ms[side], span_at) for side in SIDES}
    return run


def cores(cpu_ms: list[Sample], span: tuple[float, float]) -> float | None:
    """CPU seconds per second over ``span`` from (time, CPU ms) samples."""
    grew = growth_per_second(cpu_ms, *span)
    return None if grew is None else grew / 1000


COPY_HEADERS = [
    "records",
    "partitions",
    "contender",
    "seconds",
    "records/s",
    "naive s / this s",
    "peak RSS MB",
    "peak PSS MB",
    "CPU s",
    "CPU µs/record",
    "src broker CPU s",
    "dst broker CPU s",
    "bytes/record src",
    "bytes/record dst",
    "dst/src bytes",
    "spark start s",
    "first record s",
    "rounds",
    "copy check",
]


def copy_rows(table: Table, data: Dataset, runs: list[CopyRun], source: Wire) -> None:
    naive = next((r.finished.wall for r in runs if r.kind == "naive" and r.finished), None)
    for run in runs:
        fin, summary = run.finished, run.summary or {}
        wall = fin.wall if fin and run.check == "ok" else None
        dst = run.wire.per_record if run.wire else None
        table.add(
            f"{data.records:,}",
            data.partitions,
            LABELS[run.kind],
            report.seconds(wall),
            report.rate(data.records, wall),
            report.ratio(naive, wall),
            report.megabytes(fin.peak_rss if fin else None),
            report.megabytes(fin.peak_pss if fin else None),
            report.seconds(fin.cpu_seconds if fin else None),
            report.per_record_us(fin.cpu_seconds if fin else None, data.records),
            *broker_cells(run, report.seconds),
            report.decimal(source.per_record),
            report.decimal(dst),
            report.ratio(dst, source.per_record),
            report.seconds(summary.get("spark_start")),
            report.seconds(summary.get("first_record")),
            summary.get("rounds", report.NA),
            run.check,
        )


def broker_cells(run: CopyRun, show: Callable[[float | None], str]) -> list[str]:
    """The source's and the destination's broker CPU of a run, formatted by `show`."""
    cpu = run.broker_cpu or {}
    return [show(cpu.get(side)) for side in SIDES]


def brokers_total(run: CopyRun) -> float | None:
    cpu = run.broker_cpu or {}
    values = [cpu.get(side) for side in SIDES]
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def copy_table(title: str) -> Table:
    return Table(
        title,
        list(COPY_HEADERS),
        notes=[
            "seconds = wall clock from launch to exit (ktm: interpreter, JVM and Spark start "
            "included). naive s / this s > 1: faster than the naive loop.",
            "RSS/PSS summed over the process tree (sampled every 0.25 s); CPU s = user+system "
            "of the tree, whole process (ktm: JVM and Spark start included); CPU µs/record = "
            "CPU s / records. spark start, first record, rounds: from ktm's --summary-json.",
            "src/dst broker CPU s: the source's / the destination's broker processes (psutil on "
            "their pids), from the contender's launch to its exit; CPU s above is the "
            "contender's own tree only.",
            "bytes/record = summed sizes of the topic's record batches as the broker serves "
            "them (fetched raw after the copy) / records: batch headers, framing, headers a "
            "relay adds (ktm: ktm.src) and compression included.",
        ],
    )


def ceiling_rows(table: Table, bench: Bench, opts: Options) -> None:
    """What the destination broker can take at all, as two last rows: the fastest producer at
    hand, and the broker's own CPU meanwhile."""
    records = CEILING_RECORDS[opts.quick]
    print(f"\n[throughput] produce ceiling: {records:,} records ...", flush=True)
    kind = bench.cluster.kind
    ceiling = produce_ceiling(bench.workdir, records, kind)
    broker = BROKER_NAMES[kind]
    for label, rate, cpu in [
        ("produce ceiling (confluent-kafka producer)", ceiling.rate, ceiling.producer_cpu),
        (f"  its broker ({broker}) meanwhile", None, ceiling.broker_cpu),
    ]:
        cells: dict[str, object] = dict.fromkeys(COPY_HEADERS, report.NA)
        cells |= {
            "records": f"{records:,}",
            "partitions": 1,
            "contender": label,
            "seconds": report.seconds(ceiling.seconds),
            "records/s": report.count(rate),
            "CPU s": report.seconds(cpu),
            "CPU µs/record": report.per_record_us(cpu, records),
            "dst broker CPU s": report.seconds(ceiling.broker_cpu),
            "copy check": ceiling.check,
        }
        table.add(*cells.values())
    table.notes.append(
        f"produce ceiling: confluent-kafka (in the benchmark's process) produces {records:,} "
        f"records of {RECORD_BYTES} B, no key or headers, into one partition of a fresh {broker} "
        "broker (acks=all, linger 5 ms, 1 MB batches); seconds: first produce() to the end of "
        "flush(). CPU s: the producer's process, then the broker's, over that time. A producer "
        "far above the broker in CPU µs/record means the producer set this ceiling, not the "
        "broker."
    )


def throughput(bench: Bench, opts: Options) -> Table:
    table = copy_table(
        f"THROUGHPUT: {opts.partitions} partitions, {opts.size} B values + key + 2 headers"
    )
    for records in opts.records:
        print(f"\n[throughput] {records:,} records, {opts.partitions} partitions")
        with dataset(bench.cluster, opts.partitions, records, opts.size) as data:
            source = topic_wire(bench.cluster.src, data.topic, data.partitions)
            # A user's first run on a machine also writes Spark's class archive (see
            # docs/performance.md); later runs, the other ktm rows, find it.
            kinds = [*opts.contenders, *(["ktm-first"] if "ktm" in opts.contenders else [])]
            runs = [copy_once(bench, k, data) for k in kinds]
            copy_rows(table, data, runs, source)
    ceiling_rows(table, bench, opts)
    return table


def partitions(bench: Bench, opts: Options) -> Table:
    table = copy_table(f"MANY PARTITIONS: {opts.size} B values + key + 2 headers")
    for count, records in opts.many:
        print(f"\n[partitions] {count} partitions, {records:,} records")
        with dataset(bench.cluster, count, records, opts.size) as data:
            source = topic_wire(bench.cluster.src, data.topic, data.partitions)
            runs = [copy_once(bench, k, data) for k in opts.contenders]
            copy_rows(table, data, runs, source)
    return table


STEADY_HEADERS = [
    "records",
    "partitions",
    "contender",
    "slots",
    "steady records/s",
    "vs first row",
    "window samples",
    "window s",
    "steady CPU cores",
    "steady CPU µs/record",
    "steady src broker cores",
    "steady dst broker cores",
    "brokers µs/record",
    "whole process s",
    "first record s",
    "peak RSS MB",
    "peak PSS MB",
    "CPU s",
    "CPU µs/record",
    "rounds",
    "copy check",
]


def steady_notes(table: Table) -> None:
    low, high = STEADY_WINDOW
    table.notes += [
        f"steady records/s = least-squares slope of the destination's summed end offsets "
        f"(ListOffsets every {DEST_EVERY_S} s, the same for every contender) while between "
        f"{low:.0%} and {high:.0%} of the records were there (window: samples, seconds). A "
        "window under ~2 s makes the steady numbers coarse: give more --steady-records.",
        "steady CPU cores = CPU seconds of the process tree per second over that window (tree "
        f"sampled every {SAMPLE_EVERY_S} s); steady CPU µs/record = cores / steady records/s. "
        "whole process s, CPU s and CPU µs/record cover launch to exit (ktm: JVM and Spark "
        "start included). vs first row: steady records/s / the first row's. first record s: "
        f"launch to the first destination sample (every {DEST_EVERY_S} s) holding a record.",
        "steady src/dst broker cores: the source's / the destination's broker processes (psutil "
        "on their pids) over the same window, apart from the contender's; brokers µs/record = "
        "both / steady records/s. The destination's includes answering the ListOffsets "
        "sampling.",
    ]


def steady_table(
    section: str, title: str, cases: list[tuple[int, int]], bench: Bench, opts: Options
) -> Table:
    table = Table(title, list(STEADY_HEADERS))
    steady_notes(table)
    first: float | None = None
    for count, records in cases:
        print(f"\n[{section}] {count} partitions, {records:,} records")
        with dataset(bench.cluster, count, records, opts.size) as data:
            for kind in runnable(opts.contenders):
                run = steady_once(bench, kind, data)
                first = first or run.rate
                steady_row(table, data, run, first)
    return table


def steady_row(table: Table, data: Dataset, run: CopyRun, first: float | None) -> None:
    fin, summary = run.finished, run.summary or {}
    table.add(
        f"{data.records:,}",
        data.partitions,
        LABELS[run.kind],
        summary.get("slots", report.NA),
        report.count(run.rate),
        report.ratio(run.rate, first),
        run.window_samples,
        report.seconds(run.window_seconds),
        report.seconds(run.cpu_cores, 2),
        report.per_record_us(run.cpu_cores, run.rate),
        *broker_cells(run, lambda cores: report.seconds(cores, 2)),
        report.per_record_us(brokers_total(run), run.rate),
        report.seconds(fin.wall if fin else None),
        report.seconds(run.first_seen, 2),
        report.megabytes(fin.peak_rss if fin else None),
        report.megabytes(fin.peak_pss if fin else None),
        report.seconds(fin.cpu_seconds if fin else None),
        report.per_record_us(fin.cpu_seconds if fin else None, data.records),
        summary.get("rounds", report.NA),
        run.check,
    )


def steady(bench: Bench, opts: Options) -> Table:
    title = f"STEADY STATE: relays on a backlog, {opts.size} B values + key + 2 headers"
    return steady_table("steady", title, [(opts.partitions, opts.steady_records)], bench, opts)


def scaling(bench: Bench, opts: Options) -> Table:
    cases = [(count, opts.scaling_records) for count in opts.scaling]
    title = f"SCALING: steady rate by partitions, {opts.size} B"
    return steady_table("scaling", title, cases, bench, opts)

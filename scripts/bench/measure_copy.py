"""Copy-and-exit measurements: a source topic already holds the data, each contender copies it
into a fresh destination topic and exits (ktm with --stop-at-end), and every copy is checked
record by record. Sections: throughput, partitions, steady, scaling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scripts.bench import report
from scripts.bench.contenders import LABELS, Bench, Ktm, has_confluent, launch
from scripts.bench.data import Dataset, dataset, topic_on, verify_copy
from scripts.bench.machine import load_average
from scripts.bench.options import Options
from scripts.bench.processes import Finished, Launched
from scripts.bench.report import Table
from scripts.bench.sampling import Sampler, slope

SCRAPE_EVERY_S = 0.5
STEADY_WINDOW = (0.2, 0.8)  # share of the records: past start-up, before the tail


def run_timeout(records: int) -> float:
    return 300 + records / 2000  # far beyond any sane rate: only a hung run hits it


@dataclass
class CopyRun:
    kind: str
    finished: Finished | None
    check: str
    summary: dict[str, Any] | None = None
    rate: float | None = None  # steady state, from /metrics (ktm only)
    rate_note: str = ""


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
    """One contender copies ``data`` whole; wall clock from launch to exit."""
    if kind == "confluent" and not has_confluent():
        return CopyRun(kind, None, "skipped: pip install confluent-kafka")
    print(f"  {LABELS[kind]}: copying (load average {load_average()}) ...", flush=True)
    with topic_on(bench.cluster.dst, f"bench-{kind}", data.partitions) as target:
        with launch(kind, bench, (data.topic, target), data.partitions, continuous=False) as proc:
            finished = proc.wait(run_timeout(data.records))
        return _finish(kind, proc, finished, bench, data, target)


def steady_once(bench: Bench, data: Dataset) -> CopyRun:
    """ktm copies ``data`` while /metrics is scraped; the rate is the slope of the acknowledged
    count between 20% and 80% of the records (Spark start and the last stragglers excluded)."""
    print(
        f"  ktm: copying {data.records:,} records, scraping /metrics every "
        f"{SCRAPE_EVERY_S} s (load average {load_average()}) ...",
        flush=True,
    )
    with topic_on(bench.cluster.dst, "bench-steady", data.partitions) as target:
        with Ktm(bench, data.topic, target, stop_at_end=True) as ktm:
            with Sampler(ktm.produced, SCRAPE_EVERY_S) as scrapes:
                finished = ktm.wait(run_timeout(data.records))
        run = _finish("ktm", ktm, finished, bench, data, target)
    low, high = (share * data.records for share in STEADY_WINDOW)
    run.rate, used, span = slope(scrapes.samples, low, high)
    run.rate_note = f"{used} samples over {span:.1f} s"
    if run.rate is None:
        run.rate_note = f"n/a: {used} samples in the window (use more records)"
    return run


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
    "spark start s",
    "first record s",
    "rounds",
    "copy check",
]


def copy_rows(table: Table, data: Dataset, runs: list[CopyRun]) -> None:
    naive = next((r.finished.wall for r in runs if r.kind == "naive" and r.finished), None)
    for run in runs:
        fin, summary = run.finished, run.summary or {}
        wall = fin.wall if fin and run.check == "ok" else None
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
            report.seconds(summary.get("spark_start")),
            report.seconds(summary.get("first_record")),
            summary.get("rounds", report.NA),
            run.check,
        )


def copy_table(title: str) -> Table:
    return Table(
        title,
        list(COPY_HEADERS),
        notes=[
            "seconds = wall clock from launch to exit (ktm: interpreter, JVM and Spark start "
            "included). naive s / this s > 1: faster than the naive loop.",
            "RSS/PSS summed over the process tree (sampled every 0.25 s); CPU s = user+system "
            "of the tree. spark start, first record, rounds: from ktm's --summary-json.",
        ],
    )


def throughput(bench: Bench, opts: Options) -> Table:
    table = copy_table(
        f"THROUGHPUT: {opts.partitions} partitions, {opts.size} B values + key + 2 headers"
    )
    for records in opts.records:
        print(f"\n[throughput] {records:,} records, {opts.partitions} partitions")
        with dataset(bench.cluster, opts.partitions, records, opts.size) as data:
            copy_rows(table, data, [copy_once(bench, k, data) for k in opts.contenders])
    return table


def partitions(bench: Bench, opts: Options) -> Table:
    table = copy_table(f"MANY PARTITIONS: {opts.size} B values + key + 2 headers")
    for count, records in opts.many:
        print(f"\n[partitions] {count} partitions, {records:,} records")
        with dataset(bench.cluster, count, records, opts.size) as data:
            copy_rows(table, data, [copy_once(bench, k, data) for k in opts.contenders])
    return table


STEADY_HEADERS = [
    "records",
    "partitions",
    "slots",
    "steady records/s",
    "vs first row",
    "measured on",
    "whole process s",
    "peak RSS MB",
    "peak PSS MB",
    "CPU s",
    "rounds",
    "copy check",
]


def steady_table(
    section: str, title: str, cases: list[tuple[int, int]], bench: Bench, opts: Options
) -> Table:
    table = Table(title, list(STEADY_HEADERS))
    table.notes.append(
        "steady records/s = least-squares slope of summed ktm_messages_produced_total (scraped "
        f"every {SCRAPE_EVERY_S} s) while between {STEADY_WINDOW[0]:.0%} and "
        f"{STEADY_WINDOW[1]:.0%} of the records were acknowledged"
    )
    first: float | None = None
    for count, records in cases:
        print(f"\n[{section}] {count} partitions, {records:,} records")
        with dataset(bench.cluster, count, records, opts.size) as data:
            run = steady_once(bench, data)
        first = first or run.rate
        fin, summary = run.finished, run.summary or {}
        table.add(
            f"{records:,}",
            count,
            summary.get("slots", report.NA),
            report.count(run.rate),
            report.ratio(run.rate, first),
            run.rate_note,
            report.seconds(fin.wall if fin else None),
            report.megabytes(fin.peak_rss if fin else None),
            report.megabytes(fin.peak_pss if fin else None),
            report.seconds(fin.cpu_seconds if fin else None),
            summary.get("rounds", report.NA),
            run.check,
        )
    return table


def steady(bench: Bench, opts: Options) -> Table:
    title = f"STEADY STATE: ktm on a backlog, {opts.size} B values"
    return steady_table("steady", title, [(opts.partitions, opts.steady_records)], bench, opts)


def scaling(bench: Bench, opts: Options) -> Table:
    cases = [(count, opts.scaling_records) for count in opts.scaling]
    title = f"SCALING: ktm steady rate by partitions, {opts.size} B"
    return steady_table("scaling", title, cases, bench, opts)

"""The store section: `ktm backup --stop-at-end` of a source topic into a store (a directory, or
S3 with --store s3), then `ktm restore --create-topics` of that store into a fresh topic, next to
`ktm relay` of the same data in the same run. Every backup is listed and `ktm check`ed, every
restore is compared record by record with the source."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scripts.bench import report
from scripts.bench.contenders import Bench, unique
from scripts.bench.data import Dataset, dataset, delete_topic, record_fields, verify_copy
from scripts.bench.machine import load_average
from scripts.bench.measure_copy import copy_once, run_timeout
from scripts.bench.options import Options
from scripts.bench.processes import Finished
from scripts.bench.report import Table
from scripts.bench.store_runs import (
    SESSION_TIMEOUT,
    Contents,
    KtmCommand,
    Places,
    StoreJob,
    complaints,
    contents,
    kept_on_failure,
    ktm_check,
)


@dataclass
class Run:
    """One process of a case and what came of it."""

    label: str  # "ktm relay", "ktm backup -> dir", ...
    finished: Finished | None = None
    check: str = "ok"
    summary: dict[str, Any] = field(default_factory=dict)
    held: Contents | None = None  # the store after a backup


def finish(run: Run, proc: KtmCommand, timeout: float) -> bool:
    """Wait for ``proc``; False (and the check says so) unless it exited 0."""
    run.finished = proc.wait(timeout)
    run.summary = proc.summary()
    if run.finished.returncode == 0:
        return True
    run.check = f"FAILED: exit {run.finished.returncode}"
    print(f"  {proc.name} exited {run.finished.returncode}; stderr:\n    {run.finished.tail()}")
    return False


def backup(job: StoreJob, data: Dataset) -> Run:
    """`ktm backup --stop-at-end` into an empty store; listed and `ktm check`ed after."""
    run = Run(f"ktm backup -> {job.place.kind}")
    print(f"  {run.label}: backing up (load average {load_average()}) ...", flush=True)
    with KtmCommand(job, "backup", job.config("backup"), "--stop-at-end") as proc:
        if not finish(run, proc, run_timeout(data.records)):
            return run
    run.held = contents(job.place, job.topic)
    run.check = ktm_check(job, data.partitions, data.records)
    return run


def restore(job: StoreJob, data: Dataset) -> Run:
    """`ktm restore --create-topics` of the whole store into a topic that does not exist yet,
    then every record compared with the source (partition, order, key, value, headers but
    ktm.src, timestamp); the topic is deleted after."""
    run = Run(f"ktm restore <- {job.place.kind}")
    target = unique("bench-restored")
    print(f"  {run.label}: restoring into {target} (load average {load_average()}) ...")
    try:
        with KtmCommand(job, "restore", job.config("restore", target), "--create-topics") as proc:
            if finish(run, proc, run_timeout(data.records)):
                run.check = verified(job.bench, data, target)
    finally:
        delete_topic(job.bench.cluster.dst, target)
    return run


def verified(bench: Bench, data: Dataset, target: str) -> str:
    try:
        return verify_copy(bench.cluster, data, target)
    except Exception as exc:  # noqa: BLE001 - e.g. a partition the restore did not create
        return f"WRONG: reading {target} back failed: {exc!r}"


def relay_bench(bench: Bench) -> Bench:
    """The relay runs with the group settings backup and restore get (store_runs)."""
    given = any(item.startswith("app.session_timeout") for item in bench.ktm_settings)
    if given or bench.cluster.kind != "tansu":
        return bench
    extra = (f"app.session_timeout={SESSION_TIMEOUT}", *bench.ktm_settings)
    return Bench(bench.cluster, bench.workdir, extra)


def relay(bench: Bench, data: Dataset) -> Run:
    copied = copy_once(relay_bench(bench), "ktm", data)
    return Run("ktm relay", copied.finished, copied.check, copied.summary or {})


def raw_bytes(records: int, size: int, partitions: int) -> int:
    """Key + value + header keys and values of every record of the dataset, summed."""
    total = 0
    for seq in range(records):
        fields = record_fields(seq, size, partitions)
        total += len(fields["key"]) + len(fields["value"])
        total += sum(len(k.encode()) + len(v) for k, v in fields["headers"])
    return total


def store_case(places: Places, bench: Bench, data: Dataset, kinds: tuple[str, ...]) -> list[Run]:
    runs = [relay(bench, data)]
    for kind in kinds:
        place = places.new(kind)
        job = StoreJob(bench, place, data.topic)
        verdicts: list[str] = []
        with kept_on_failure(place, verdicts):
            runs.append(backup(job, data))
            verdicts.append(runs[-1].check)
            if runs[-1].finished is None or runs[-1].finished.returncode != 0:
                runs.append(Run(f"ktm restore <- {kind}", check="skipped: the backup failed"))
                continue
            runs.append(restore(job, data))
            verdicts.append(runs[-1].check)
    return runs


STORE_HEADERS = [
    "records",
    "partitions",
    "run",
    "seconds",
    "records/s",
    "vs relay",
    "peak RSS MB",
    "CPU s",
    "spark start s",
    "segments",
    "store B/record",
    "raw B/record",
    "left running",
    "WARN/ERR lines",
    "check",
]


def add_rows(table: Table, data: Dataset, runs: list[Run], raw: int) -> None:
    relays = [r.finished.wall for r in runs if r.label == "ktm relay" and r.finished]
    relay_wall = relays[0] if relays and runs[0].check == "ok" else None
    for run in runs:
        fin, held = run.finished, run.held
        wall = fin.wall if fin and run.check.startswith("ok") else None
        table.add(
            f"{data.records:,}",
            data.partitions,
            run.label,
            report.seconds(wall),
            report.rate(data.records, wall),
            report.ratio(relay_wall, wall) if run.label != "ktm relay" else report.NA,
            report.megabytes(fin.peak_rss if fin else None),
            report.seconds(fin.cpu_seconds if fin else None),
            report.seconds(run.summary.get("spark_start")),
            held.describe_levels() if held else report.NA,
            f"{held.bytes / data.records:.1f}" if held else report.NA,
            f"{raw / data.records:.1f}" if held else report.NA,
            (", ".join(fin.leftovers) or "none") if fin else report.NA,
            complaints(fin),
            run.check,
        )


def store_table(opts: Options) -> Table:
    return Table(
        f"STORE: ktm backup --stop-at-end and ktm restore --create-topics vs ktm relay, "
        f"{opts.size} B values + key + 2 headers; store: {', '.join(opts.stores)}",
        list(STORE_HEADERS),
        notes=[
            "seconds = wall clock from launch to exit of the whole process (JVM and Spark start "
            "included); vs relay = records/s of this run / records/s of ktm relay on the same "
            "data (> 1: faster than the relay). On Tansu all three run with "
            f"[app].session_timeout = {SESSION_TIMEOUT} (joining the group waits half of it "
            "there); on Apache Kafka with ktm's default.",
            "peak RSS summed over the process tree; CPU s = user+system of the tree; spark start "
            "from --summary-json. segments: in the store after the backup, by level (L0 = "
            "written by backup), default segment limits.",
            "store B/record = bytes of all segment files / records; raw B/record = key + value + "
            "header keys and values (the values are repetitive filler: they compress far better "
            "than real data). left running: processes of the tree alive 2 s after exit. "
            "WARN/ERR lines: WARNING and ERROR lines in ktm's log (the logs are in the work dir).",
            "check: relay and restore = the destination compared record by record with the "
            "source (partition, order, key, value, headers but ktm.src, timestamp); backup = "
            "`ktm check` says 'no gaps' on every partition and counts every record.",
        ],
    )


def store(bench: Bench, opts: Options) -> Table:
    table = store_table(opts)
    with Places(opts.stores, bench.workdir) as places:
        for count, records in opts.store_cases:
            print(f"\n[store] {count} partitions, {records:,} records")
            with dataset(bench.cluster, count, records, opts.size) as data:
                runs = store_case(places, bench, data, opts.stores)
            add_rows(table, data, runs, raw_bytes(records, opts.size, count))
    return table

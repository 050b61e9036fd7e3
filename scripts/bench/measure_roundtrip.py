"""The roundtrip section: a backup that crashes twice and completes, compaction, a restore, and
every record checked once.

`ktm backup` (no --stop-at-end) is killed with SIGKILL, its whole process tree at once, when
the store holds about 30% of the records, and again, restarted, at about 60% (random points
around those); `ktm backup --stop-at-end` then completes the store; `ktm compact --level 0
--min-age 0s --delete` merges the level-0 segments; `ktm restore --create-topics` writes the
store into a fresh topic, compared record by record with the source. After every phase the store
is listed and `ktm check`ed: no hole, no overlap, the records it should hold."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from scripts.bench import report
from scripts.bench.contenders import Bench
from scripts.bench.data import Dataset, dataset
from scripts.bench.machine import load_average
from scripts.bench.measure_copy import run_timeout
from scripts.bench.measure_store import Run, finish, restore
from scripts.bench.options import Options
from scripts.bench.processes import Finished
from scripts.bench.report import MB, Table
from scripts.bench.store_runs import (
    Contents,
    KtmCommand,
    Places,
    StoreJob,
    complaints,
    contents,
    kept_on_failure,
    ktm_check,
)

KILL_AROUND = (0.30, 0.60)  # shares of the records in the store at the two kills
KILL_SPREAD = 0.05  # each kill point is drawn uniformly within +- this
SEGMENTS_PER_PARTITION = 20  # max_segment_records: the backup closes segments as it goes
WATCH_EVERY_S = 0.1


@dataclass
class Phase:
    label: str
    finished: Finished | None = None
    held: Contents | None = None  # the store after the phase
    note: str = ""
    check: str = "ok"


def segment_records(data: Dataset) -> int:
    return max(1000, data.records // (data.partitions * SEGMENTS_PER_PARTITION))


def watch_store(job: StoreJob, proc: KtmCommand, goal: int, timeout: float) -> int | None:
    """Records in the store (from the segment names) once at least ``goal``; None if the
    backup exited or ``timeout`` passed first."""
    deadline = time.monotonic() + timeout
    while proc.alive() and time.monotonic() < deadline:
        held = contents(job.place, job.topic).records
        if held >= goal:
            return held
        time.sleep(WATCH_EVERY_S)
    return None


def crashed_backup(job: StoreJob, data: Dataset, share: float) -> Phase:
    """`ktm backup` killed (SIGKILL, the whole tree) once the store holds ``share``."""
    goal = int(share * data.records)
    phase = Phase(f"backup, SIGKILL at >= {share:.0%} stored")
    print(f"  {phase.label} (load average {load_average()}) ...", flush=True)
    with KtmCommand(job, "backup", job.config("backup")) as proc:
        seen = watch_store(job, proc, goal, run_timeout(data.records))
        killed = proc.kill_tree()
        phase.finished = proc.wait(30)
    phase.held = contents(job.place, job.topic)
    if seen is None:
        phase.check = f"FAILED: exited or timed out before {goal:,} records were stored"
        print(f"  {proc.name}: {phase.check}; stderr ends:\n    {phase.finished.tail()}")
        return phase
    phase.note = f"SIGKILL to {killed} processes once {seen:,} ({seen / data.records:.0%}) stored"
    phase.check = ktm_check(job, None, phase.held.records)
    return phase


def to_the_end(job: StoreJob, data: Dataset, command: str, *flags: str) -> tuple[Phase, Run]:
    """`ktm <command> <flags>` until it exits by itself; then the store is `ktm check`ed."""
    phase = Phase(" ".join((command, *flags)))
    print(f"  {phase.label} (load average {load_average()}) ...", flush=True)
    run = Run(phase.label)
    with KtmCommand(job, command, job.config(command), *flags) as proc:
        finish(run, proc, run_timeout(data.records))
    phase.finished, phase.check = run.finished, run.check
    phase.held = contents(job.place, job.topic)
    if phase.check == "ok":
        phase.check = ktm_check(job, data.partitions, data.records)
    return phase, run


def final_backup(job: StoreJob, data: Dataset, before: int) -> Phase:
    """The backup that completes the store: it must write exactly what was missing."""
    phase, run = to_the_end(job, data, "backup", "--stop-at-end")
    wrote, missing = run.summary.get("relayed"), data.records - before
    phase.note = f"wrote {report.count(wrote)} (store held {before:,} before)"
    if phase.check.startswith("ok") and wrote != missing:
        phase.check = f"WRONG: wrote {wrote} records, {missing} were missing"
    return phase


def compaction(job: StoreJob, data: Dataset) -> Phase:
    phase, _ = to_the_end(job, data, "compact", "--level", "0", "--min-age", "0s", "--delete")
    said = phase.finished.stdout.strip().splitlines() if phase.finished else []
    phase.note = said[-1] if said else "(printed nothing)"
    return phase


def restoration(job: StoreJob, data: Dataset) -> Phase:
    run = restore(job, data)
    phase = Phase("restore --create-topics", run.finished, None, check=run.check)
    phase.note = f"restored {report.count(run.summary.get('relayed'))}"
    if phase.check == "ok":
        phase.check = "ok: every record once, in order, unchanged"
    return phase


def roundtrip_once(job: StoreJob, data: Dataset, rng: random.Random) -> list[Phase]:
    phases = []
    for around in KILL_AROUND:
        share = rng.uniform(around - KILL_SPREAD, around + KILL_SPREAD)
        phases.append(crashed_backup(job, data, share))
    stored = phases[-1].held.records if phases[-1].held else 0
    phases.append(final_backup(job, data, stored))
    phases.append(compaction(job, data))
    phases.append(restoration(job, data))
    return phases


ROUNDTRIP_HEADERS = [
    "store",
    "phase",
    "seconds",
    "exit",
    "stored records",
    "segments",
    "store MB",
    ".tmp files",
    "peak RSS MB",
    "left running",
    "WARN/ERR lines",
    "note",
    "check",
]


def add_rows(table: Table, kind: str, phases: list[Phase]) -> None:
    for phase in phases:
        fin, held = phase.finished, phase.held
        table.add(
            kind,
            phase.label,
            report.seconds(fin.wall if fin else None),
            fin.returncode if fin else report.NA,
            report.count(held.records) if held else report.NA,
            held.describe_levels() if held else report.NA,
            f"{held.bytes / MB:,.1f}" if held else report.NA,
            held.temp_files if held else report.NA,
            report.megabytes(fin.peak_rss if fin else None),
            (", ".join(fin.leftovers) or "none") if fin else report.NA,
            complaints(fin),
            phase.note,
            phase.check,
        )


def roundtrip_table(opts: Options, data: Dataset, segment: int) -> Table:
    return Table(
        f"ROUND TRIP: {data.records:,} records, {data.partitions} partitions, {opts.size} B "
        f"values; backup killed twice, completed, compacted, restored; "
        f"max_segment_records = {segment:,}",
        list(ROUNDTRIP_HEADERS),
        notes=[
            "seconds: launch to exit (the killed runs: to the SIGKILL, sent to the process group "
            "and every process of the tree, orphans included, until none was left). exit -9: "
            "killed.",
            "stored records, segments (by level), store MB, .tmp files: listing of the store "
            "after the phase (records from the segment names: last - first + 1).",
            "check: `ktm check` after every backup and the compaction ('no gaps' on every "
            "partition: no hole, no overlap; and the records expected); after the restore, the "
            "topic compared record by record with the source (partition, order, key, value, "
            "headers but ktm.src, timestamp).",
        ],
    )


def roundtrip(bench: Bench, opts: Options) -> Table:
    rng = random.Random()
    records = opts.roundtrip_records
    print(f"\n[roundtrip] {opts.partitions} partitions, {records:,} records")
    with (
        Places(opts.stores, bench.workdir) as places,
        dataset(bench.cluster, opts.partitions, records, opts.size) as data,
    ):
        segment = segment_records(data)
        table = roundtrip_table(opts, data, segment)
        for kind in opts.stores:
            keys = (f"max_segment_records = {segment}",)
            job = StoreJob(bench, places.new(kind), data.topic, keys)
            verdicts: list[str] = []
            with kept_on_failure(job.place, verdicts):
                phases = roundtrip_once(job, data, rng)
                verdicts += [phase.check for phase in phases]
            add_rows(table, kind, phases)
            temp_note(table, kind, phases)
    return table


def temp_note(table: Table, kind: str, phases: list[Phase]) -> None:
    """Say so when the temporary files of crashed writes outlive the phases that follow."""
    last = next((p for p in reversed(phases) if p.held is not None), None)
    if last is not None and last.held is not None and last.held.temp_files:
        table.notes.append(
            f"{kind}: {last.held.temp_files} .tmp file(s) of writes cut by SIGKILL still in the "
            f"store after '{last.label}' (ktm ignores them; nothing removed them)"
        )

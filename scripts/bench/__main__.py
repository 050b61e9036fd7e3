"""`python -m scripts.bench [--quick] [--sections a,b] [--brokers tansu|kafka] ...`: run the
chosen measurements on two local brokers started here (Tansu, or single-node Apache Kafka
clusters), print each table as it is done and all of them at the end."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from scripts.bench import (
    brokers,
    measure_channel,
    measure_copy,
    measure_groups,
    measure_idle,
    measure_links,
    measure_live,
    measure_rates,
    measure_rolling,
    measure_roundtrip,
    measure_scale,
    measure_stop,
    measure_store,
    measure_verify,
)
from scripts.bench.contenders import Bench, has_confluent, ktm_version
from scripts.bench.machine import header, load_average
from scripts.bench.options import Options, parse_args
from scripts.bench.processes import kill_all
from scripts.bench.report import Table, aggregate

MEASURES: dict[str, Callable[[Bench, Options], Table]] = {
    "throughput": measure_copy.throughput,
    "steady": measure_copy.steady,
    "partitions": measure_copy.partitions,
    "latency": measure_live.latency,
    "rates": measure_rates.rates,
    "idle": measure_idle.idle,
    "metrics_lag": measure_live.metrics_lag,
    "stop": measure_stop.stop,
    "first_record": measure_live.first_record,
    "scaling": measure_copy.scaling,
    "store": measure_store.store,
    "roundtrip": measure_roundtrip.roundtrip,
    "channel": measure_channel.channel,
    "groups": measure_groups.groups,
    "links": measure_links.links,
    "scale": measure_scale.scale,
    "verify": measure_verify.verify,
    "verify_follow": measure_verify.verify_follow,
    "rolling": measure_rolling.rolling,
}
BAD_CHECKS = ("WRONG", "FAILED")


class Interrupts:
    """SIGINT/SIGTERM: the first one unwinds (every with/finally reaps processes and stops the
    brokers); the next ones must not cut that clean-up short, except a third: the way out if the
    clean-up hangs (contenders are still killed)."""

    def __init__(self) -> None:
        self.count = 0
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)

    def handle(self, _signum: int, _frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            raise KeyboardInterrupt
        if self.count == 2:
            print("\nstill cleaning up (brokers, contenders); once more to abandon", flush=True)
            return
        kill_all()
        os._exit(130)


def describe(opts: Options) -> str:
    mode = "QUICK smoke run (numbers are not comparable)" if opts.quick else "full sizes"
    extra = f"; ktm config extras {list(opts.ktm_set)}" if opts.ktm_set else ""
    missing = "" if has_confluent() else " (confluent-kafka not installed: its rows skipped)"
    repeat = f"; each section {opts.repeat} times" if opts.repeat > 1 else ""
    return (
        f"{mode}; sections {','.join(opts.sections)}; contenders {','.join(opts.contenders)}"
        f"{missing}; {opts.size} B values + key + 2 headers{repeat}{extra}"
    )


def run_section(name: str, bench: Bench, opts: Options) -> tuple[list[Table], bool]:
    """The section's tables, one per run that did not fail, and whether all went well."""
    tables, ok = [], True
    for run in range(1, opts.repeat + 1):
        label = f"{name} run {run}/{opts.repeat}" if opts.repeat > 1 else name
        try:
            table = MEASURES[name](bench, opts)
        except Exception:  # noqa: BLE001 - one broken run must not hide the others
            print(f"\n[{label}] FAILED:\n{traceback.format_exc()}", flush=True)
            ok = False
            continue
        finally:
            kill_all()  # nothing started by one run lives on into the next
        print(f"\n({label})\n" if opts.repeat > 1 else "\n", table.render(), sep="", flush=True)
        tables.append(table)
        ok &= not any(cell.startswith(BAD_CHECKS) for row in table.rows for cell in row)
    return tables, ok


def run_sections(bench: Bench, opts: Options) -> tuple[list[Table], bool]:
    """Every chosen section; with --repeat, its runs merged into one table (median, range)."""
    tables, ok = [], True
    for name in opts.sections:
        runs, section_ok = run_section(name, bench, opts)
        ok &= section_ok
        if runs:
            merged = aggregate(runs)
            if len(runs) > 1:
                print("\n" + merged.render(), flush=True)
            tables.append(merged)
    return tables, ok


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    about = brokers.describe(opts.brokers)
    print(header(describe(opts), ktm_version(), about), flush=True)  # no ktm: fails here
    workdir = Path(tempfile.mkdtemp(prefix="ktm-bench-"))
    Interrupts()
    try:
        with brokers.open_brokers(opts.brokers, workdir) as cluster:
            tables, ok = run_sections(Bench(cluster, workdir, opts.ktm_set), opts)
    except KeyboardInterrupt:
        print(f"\ninterrupted: contenders and brokers stopped; logs in {workdir}", flush=True)
        return 130
    finally:
        kill_all()
    print("\n" + "=" * 100 + "\nALL RESULTS\n")
    print("\n\n".join(table.render() for table in tables))
    print(f"\nload average at the end: {load_average()}; logs and configs: {workdir}")
    if not ok:
        print("SOME RUNS FAILED OR COPIED WRONG DATA: see the check columns and the log above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

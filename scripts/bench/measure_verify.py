"""`ktm verify` beside the relay whose copy it proves.

- verify: `ktm relay --stop-at-end` copies a source topic (checked record by record, as every
  copy here), then `ktm verify` proves the copy; both whole processes, in the same run. The
  verify's own rate is its records compared over the time its passes took (from its --report:
  Spark's start and the plan excluded), the "steady" figure.
- verify_follow: `ktm relay` runs while a feeder writes at --rate; `ktm verify --follow` runs
  beside it. How far the follower's ktm_verified_next_offset trails the destination (seconds),
  and the follower's CPU while the feed lasts.
"""

from __future__ import annotations

import json
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from scripts.bench import report
from scripts.bench.contenders import Bench, Ktm, ktm_executable, launch, unique
from scripts.bench.data import Dataset, dataset, topic_on, topic_pair, verify_copy
from scripts.bench.feed import DestinationCount, Feeder, warm_up
from scripts.bench.machine import load_average
from scripts.bench.measure_copy import run_timeout
from scripts.bench.measure_live import WARM_UP_TIMEOUT_S, sample_destination, stop
from scripts.bench.options import Options
from scripts.bench.processes import Finished, Launched
from scripts.bench.report import Table
from scripts.bench.sampling import Sample, Sampler, trailing_lags
from testbed.ports import free_port

SCRAPE_EVERY_S = 0.25
VERIFIED = "ktm_verified_next_offset"


def verifier(bench: Bench, config: Path, *flags: str) -> Launched:
    """`ktm verify` on a relay's config, its report beside the benchmark's logs."""
    name = unique("verify")
    cmd = [ktm_executable(), "verify", "--config", str(config), *flags]
    return Launched(name, cmd, bench.workdir, env={"KTM_LOG_DIR": str(bench.workdir)})


def _report(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def verify_once(bench: Bench, data: Dataset) -> tuple[Finished, str, Finished, dict[str, Any]]:
    """Relay the data, then verify the copy: the relay's run and check, the verify's run and
    report."""
    with topic_on(bench.cluster.dst, "bench-verify", data.partitions) as target:
        print(f"  ktm relay: copying (load average {load_average()}) ...", flush=True)
        with launch("ktm", bench, (data.topic, target), data.partitions, continuous=False) as relay:
            relayed = relay.wait(run_timeout(data.records))
        check = verify_copy(bench.cluster, data, target) if relayed.returncode == 0 else "FAILED"
        assert isinstance(relay, Ktm)
        out = bench.workdir / f"{relay.name}.verify.json"
        print(f"  ktm verify: proving the copy (load average {load_average()}) ...", flush=True)
        with verifier(bench, bench.workdir / f"{relay.name}.toml", "--report", str(out)) as proc:
            verified = proc.wait(run_timeout(data.records))
    return relayed, check, verified, _report(out)


VERIFY_HEADERS = ["records", "partitions", "run", "whole process s", "records/s",
                  "compared/s (passes)", "passes s", "peak RSS MB", "CPU s", "check"]  # fmt: skip


def verify(bench: Bench, opts: Options) -> Table:
    table = Table(
        f"VERIFY: ktm verify proving a ktm relay's copy, {opts.partitions} partitions, "
        f"{opts.size} B values",
        list(VERIFY_HEADERS),
    )
    table.notes += [
        "whole process s: launch to exit (Spark's start included); compared/s (passes): "
        "records compared / the time the comparison passes took (ktm verify --report).",
        "check: the relay's copy read back record by record (the benchmark's own check), and "
        "ktm verify's verdict (exit 0: exact).",
    ]
    for records in opts.verify_records:
        print(f"\n[verify] {records:,} records (load average {load_average()}) ...", flush=True)
        with dataset(bench.cluster, opts.partitions, records, opts.size) as data:
            relayed, check, verified, found = verify_once(bench, data)
        _rows(table, records, opts.partitions, relayed, check, verified, found)
    return table


def _rows(
    table: Table, records: int, partitions: int, relayed: Finished, check: str,
    verified: Finished, found: dict[str, Any],
) -> None:  # fmt: skip
    passes = (found.get("seconds") or {}).get("passes")
    compared = sum(p.get("compared", 0) for p in found.get("partitions", []))
    verdict = "exact" if verified.returncode == 0 and found.get("exact") else (
        f"WRONG: exit {verified.returncode}: {verified.tail(3)}")  # fmt: skip
    for name, run, rate, took, note in (
        ("ktm relay", relayed, None, None, check),
        ("ktm verify", verified, compared, passes, verdict),
    ):
        table.add(f"{records:,}", partitions, name, report.seconds(run.wall),
                  report.rate(records, run.wall), report.rate(rate, took) if rate else report.NA,
                  report.seconds(took), report.megabytes(run.peak_rss),
                  report.seconds(run.cpu_seconds), note)  # fmt: skip


# ---- following a running relay ------------------------------------------------------------------


def verified_sum(url: str) -> int | None:
    """Summed ktm_verified_next_offset of a follower; None while it exports none."""
    try:
        with urllib.request.urlopen(url, timeout=2.0) as answer:
            text = answer.read().decode()
        values = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                  if s.name == VERIFIED]  # fmt: skip
    except (OSError, ValueError):
        return None
    return int(sum(values)) if values else None


def verify_follow(bench: Bench, opts: Options) -> Table:
    print(f"\n[verify_follow] relay + follower, fed {opts.rate:,.0f}/s for {opts.seconds:.0f} s",
          flush=True)  # fmt: skip
    with topic_pair(bench.cluster, "bench-vf", opts.partitions) as topics, ExitStack() as s:
        feeder = Feeder(bench.cluster.src, topics[0], opts.partitions, opts.size)
        s.callback(feeder.close)
        counter = DestinationCount(bench.cluster.dst, topics[1], opts.partitions)
        s.callback(counter.close)
        relay = s.enter_context(Ktm(bench, *topics, stop_at_end=False))
        warm_up(feeder, counter.consumer, relay.alive, WARM_UP_TIMEOUT_S)
        port = free_port()
        config = bench.workdir / f"{relay.name}.toml"
        config.write_text(config.read_text() + f'\n[verify]\nmetrics_addr = "127.0.0.1:{port}"\n')
        follower = s.enter_context(verifier(bench, config, "--follow"))
        url = f"http://127.0.0.1:{port}/metrics"
        warm_up_follower(url, follower)
        with Sampler(lambda: verified_sum(url), SCRAPE_EVERY_S) as metric:
            cpu_before, began = follower.monitor.cpu_seconds, time.monotonic()
            feeder.start(opts.rate, opts.seconds)
            truth = sample_destination(counter, feeder, metric)
            used = follower.monitor.cpu_seconds - cpu_before
            cores = used / max(time.monotonic() - began, 1e-9)
        followed, relayed = stop(follower), stop(relay)
    return _follow_table(opts, truth, metric, cores, followed, relayed)


def warm_up_follower(url: str, follower: Launched) -> None:
    deadline = time.monotonic() + WARM_UP_TIMEOUT_S
    while verified_sum(url) is None:
        if not follower.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the follower never exported {VERIFIED}")
        time.sleep(SCRAPE_EVERY_S)


def _follow_table(opts: Options, truth: list[Sample], metric: Sampler, cores: float,
                  followed: Finished, relayed: Finished) -> Table:  # fmt: skip
    lags, never = trailing_lags(truth, metric.samples)
    table = Table(
        f"VERIFY --follow beside a relay fed {opts.rate:,.0f} records/s for {opts.seconds:.0f} s,"
        f" {opts.partitions} partitions: ktm_verified_next_offset vs the destination",
        ["max trail s", "p95 trail s", "p50 trail s", "samples never reached",
         "follower CPU cores", "follower peak RSS MB", "follower exit", "relay exit"],
    )  # fmt: skip
    table.add(
        report.seconds(lags[-1] if lags else None, 2),
        report.seconds(report.percentile(lags, 0.95), 2),
        report.seconds(report.percentile(lags, 0.5), 2),
        never,
        report.seconds(cores, 3),
        report.megabytes(followed.peak_rss),
        "ok (nothing differed)" if followed.returncode == 0 else f"exit {followed.returncode}",
        "ok" if relayed.returncode == 0 else f"exit {relayed.returncode}",
    )
    table.notes.append(
        "trail: for each sample of the destination's records, how long until the follower's "
        "verified offsets (summed) reached it. CPU: the follower's process tree while fed."
    )
    return table

"""ktm's store commands for the store and roundtrip sections: where backups go (a directory, or
a bucket on a SeaweedFS S3 server started here), their configs, the `ktm backup|restore|compact|
check` processes, and what a store holds, read from its listing (segment names and sizes).

Segment keys: <url>/<cluster>/<topic>/<partition>/<level>/<first:020d>-<last:020d>.<ext>; a
crashed write may leave a `.tmp-*` file beside them, which ktm ignores and counts here.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from scripts.bench.contenders import Bench, ktm_executable, servers, settings_by_section, unique
from scripts.bench.processes import Finished, Launched, adopt, disown, log_lines
from scripts.bench.report import NA
from testbed.ports import free_port
from testbed.seaweed import SeaweedS3, s3_filesystem

CLUSTER = "bench-source"  # [[sources]] name in every bench config, and [store].cluster
# [app], on Tansu only: joining the group waits half of it there; Apache Kafka refuses sessions
# under its group.min.session.timeout.ms (6 s) and delays a new group by its own setting
SESSION_TIMEOUT = '"2s"'
SEGMENT = re.compile(r"(\d+)/(\d+)/(\d{20})-(\d{20})\.(parquet|jsonl)")
CHECK_TIMEOUT_S = 120.0
# `ktm check`, per partition: "  topic[3]: 2 segments, 75000 records, offsets 0-74999, no gaps"
CHECK_LINE = re.compile(
    r"^\s+(?P<topic>[^\s\[]+)\[(?P<partition>\d+)\]: (?P<segments>\d+) segments, "
    r"(?P<records>\d+) records, (?:offsets \d+-\d+|empty), (?P<problems>.*)$"
)


@dataclass(frozen=True)
class Place:
    """Where one backup goes: ``url`` for [store], the same place for pyarrow (``fs``,
    ``root``), and the [store] keys to reach it."""

    kind: str  # "dir" or "s3"
    url: str
    fs: pafs.FileSystem
    root: str
    keys: tuple[str, ...] = ()

    def remove(self) -> None:
        try:
            self.fs.delete_dir(self.root)
        except (OSError, FileNotFoundError):
            pass


class Places:
    """Fresh store places of the kinds asked for; a SeaweedFS server when S3 is among them,
    stopped on exit (and known to kill_all(), should the benchmark be cut short)."""

    def __init__(self, kinds: tuple[str, ...], workdir: Path):
        self.kinds, self.workdir = kinds, workdir
        self.s3: SeaweedS3 | None = None
        self._weed = 0
        self._exit = ExitStack()

    def __enter__(self) -> Places:
        if "s3" in self.kinds:
            self.s3 = SeaweedS3(bucket="ktm-bench", log_dir=self.workdir)
            self._exit.callback(self._stop_s3)
            self.s3.start()
            self._weed = self.s3.pid or 0
            adopt(self._weed, "weed")
            print(f"  S3: SeaweedFS at {self.s3.endpoint}, bucket {self.s3.bucket}", flush=True)
        return self

    def __exit__(self, *_exc: object) -> None:
        self._exit.close()

    def _stop_s3(self) -> None:
        if self.s3 is not None:
            self.s3.stop()
            disown(self._weed)

    def new(self, kind: str) -> Place:
        name = unique("store")
        if kind == "dir":
            path = self.workdir / name
            return Place(kind, str(path), pafs.LocalFileSystem(), str(path))
        assert self.s3 is not None, "S3 place asked for without --store s3"
        s3 = self.s3
        fs = s3_filesystem(s3.endpoint, s3.access_key, s3.secret_key)
        keys = (
            f's3_endpoint = "{s3.endpoint}"',
            f's3_access_key = "{s3.access_key}"',
            f's3_secret_key = "{s3.secret_key}"',
        )
        return Place(kind, f"s3://{s3.bucket}/{name}", fs, f"{s3.bucket}/{name}", keys)


# ---- what a store holds ---------------------------------------------------------------------


@dataclass
class Contents:
    """A store's listing: segments per level, their bytes, the records their names cover
    (last - first + 1: exact for sources without offset gaps, as here), `.tmp-` files."""

    levels: Counter[int] = field(default_factory=Counter)
    bytes: int = 0
    records: int = 0
    temp_files: int = 0

    @property
    def segments(self) -> int:
        return sum(self.levels.values())

    def describe_levels(self) -> str:
        return " + ".join(f"{n} L{level}" for level, n in sorted(self.levels.items())) or "none"


def contents(place: Place, topic: str) -> Contents:
    """What ``place`` holds for ``topic`` (one LIST; no segment is read)."""
    found = Contents()
    base = f"{place.root}/{CLUSTER}/{topic}/"
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    for info in place.fs.get_file_info(selector):
        if info.type != pafs.FileType.File:
            continue
        name = info.path[len(base) :] if info.path.startswith(base) else info.path
        if name.rsplit("/", 1)[-1].startswith(".tmp-"):
            found.temp_files += 1
        elif match := SEGMENT.fullmatch(name):
            found.levels[int(match[2])] += 1
            found.bytes += info.size or 0
            found.records += int(match[4]) - int(match[3]) + 1
    return found


# ---- configs and processes ------------------------------------------------------------------


@dataclass(frozen=True)
class StoreJob:
    """One store: its place, the source topic backed up, and the [store] keys and group id
    every command on it shares (restarts rejoin the same group, as in production)."""

    bench: Bench
    place: Place
    topic: str  # the source topic: the store's name for it
    store_keys: tuple[str, ...] = ()
    group: str = field(default_factory=lambda: unique("bench-store"))

    def config(self, what: str, target: str | None = None) -> Path:
        """Write a config for ``what`` (a file name part): for `ktm backup|compact|check`
        ([[sources]], no [target]), or with ``target`` (the topic to restore into) for `ktm
        restore` ([target], no [[sources]]). --ktm-set lines go to [app], [spark], [store] and
        [target] (restore only); [app] gets a fresh metrics port each time."""
        path = self.bench.workdir / f"{unique(what)}.toml"
        path.write_text(self._text(target))
        return path

    def _text(self, target: str | None) -> str:
        bench = self.bench
        sections = settings_by_section(bench.ktm_settings)
        app = sections.pop("app")
        app_keys = [("group_id", f'"{self.group}"')]
        if bench.cluster.kind == "tansu":
            app_keys.append(("session_timeout", SESSION_TIMEOUT))
        for key, value in app_keys:
            if not any(line.startswith(f"{key} ") for line in app):
                app.append(f"{key} = {value}")
        app.insert(0, f'metrics_addr = "127.0.0.1:{free_port()}"')
        target_lines = sections.pop("target")
        if target is not None:
            sections["target"] = [f"servers = {servers(bench.cluster.dst)}", *target_lines]
        place = self.place
        store = [f"url = {json.dumps(place.url)}", f'cluster = "{CLUSTER}"', *place.keys]
        user = sections.get("store", [])
        given = {line.split()[0] for line in user}  # --ktm-set store.* wins over our limits
        ours = [line for line in self.store_keys if line.split()[0] not in given]
        sections["store"] = [*store, *ours, *user]
        lines = [f'[topics]\n"{self.topic}" = "{target or self.topic}"\n']
        if target is None:
            lines.append(
                f'[[sources]]\nname = "{CLUSTER}"\nservers = {servers(bench.cluster.src)}\n'
            )
        for section, body in {"app": app, **sections}.items():
            if body:
                lines.append(f"[{section}]\n" + "\n".join(body) + "\n")
        return "\n".join(lines)


class KtmCommand(Launched):
    """`ktm <command> --config <config> <flags>`, with --summary-json when the command has it;
    its logs are ktm-<config name>.stderr/.stdout."""

    def __init__(self, job: StoreJob, command: str, config: Path, *flags: str):
        name = f"ktm-{config.stem}"  # its logs beside its config: backup-1a2b3c.toml
        self.summary_path = job.bench.workdir / f"{name}.summary.json"
        cmd = [ktm_executable(), command, "--config", str(config), *flags]
        if command in ("backup", "restore"):
            cmd += ["--no-progress", "--summary-json", str(self.summary_path)]
        env = {"KTM_LOG_DIR": str(job.bench.workdir)}  # Spark's log beside the others
        super().__init__(name, cmd, job.bench.workdir, env=env)

    def summary(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.summary_path.read_text()))
        except (OSError, ValueError):
            return {}


def complaints(finished: Finished | None) -> str:
    """WARNING and ERROR/CRITICAL lines ktm logged: "warnings/errors"."""
    if finished is None:
        return NA
    errors = log_lines(finished.stderr, "ERROR", "CRITICAL")
    return f"{len(log_lines(finished.stderr, 'WARNING'))}/{len(errors)}"


def ktm_check(job: StoreJob, partitions: int | None, records: int) -> str:
    """`ktm check` on the store: "ok: ..." if it exits 0, says "no gaps" (no hole, no overlap)
    on every partition it lists, counts ``records`` records in all and lists every one of
    ``partitions`` (None: after a crash, where partitions not reached yet have no segments);
    else "WRONG: ..." or "FAILED: ..."."""
    config = job.config("check")
    try:
        done = subprocess.run([ktm_executable(), "check", "--config", str(config)],
                              capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"FAILED: ktm check --config {config} ran over {CHECK_TIMEOUT_S:.0f} s"
    lines = [m for ln in done.stdout.splitlines() if (m := CHECK_LINE.match(ln))]
    counted = sum(int(m["records"]) for m in lines)
    bad = [m[0].strip() for m in lines if m["problems"] != "no gaps"]
    listed = len(lines) if partitions is None else partitions
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return f"FAILED: ktm check --config {config} exited {done.returncode}: {tail}"
    if bad:
        return f"WRONG: ktm check: {bad[0]}" + (f" (+{len(bad) - 1} more)" if bad[1:] else "")
    if len(lines) != listed or counted != records:
        return (
            f"WRONG: ktm check lists {len(lines)} partitions, {counted} records "
            f"(expected {listed}, {records})"
        )
    return f"ok: no gaps, {counted:,} records in {len(lines)} partitions"


@contextmanager
def kept_on_failure(place: Place, verdicts: list[str]) -> Iterator[Place]:
    """Remove the store at the end unless a check failed (then say where it is); the caller
    appends its checks' verdicts to ``verdicts`` meanwhile."""
    try:
        yield place
    finally:
        if any(v.startswith(("WRONG", "FAILED")) for v in verdicts):
            print(f"  store kept for a look: {place.url}")
        else:
            place.remove()

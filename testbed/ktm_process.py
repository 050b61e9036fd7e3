"""`ktm` as a real subprocess, for the end-to-end tests: start, wait, signal, kill, scrape.

Every process runs in its own session, gets a time limit, and is killed at the end of the test
whatever happened, together with everything else in its session. ktm's Spark JVM runs in a
session of its own (the driver decides when it stops); it exits when ktm's pipe to it closes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

KTM = str(Path(sys.executable).parent / "ktm")
# What a successful run may print on stderr: ktm's own log lines and nothing else (no Spark or
# JVM chatter such as "WARN NativeCodeLoader", "log4j", "Using Spark's default ...").
LOG_LINE = re.compile(r"\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) +[\w.]+: ")
SPARK_NOISE = ("NativeCodeLoader", "log4j", "Using Spark's default", "WARN ", "SparkContext")


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    elapsed: float

    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("ktm: ")]


class Ktm:
    """One `ktm <command>` process in a session of its own, output captured in files.

    It runs from `cwd` (default: the test's own directory, never the checkout: users run ktm
    from theirs), with `ktm` the executable (default: this environment's; the release tests
    pass a wheel's, installed in a virtualenv of its own)."""

    def __init__(
        self,
        tmp_path: Path,
        *args: str,
        command: str = "relay",
        ktm: str = KTM,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ):
        self.out_path = tmp_path / f"ktm-{time.monotonic_ns()}.out"
        self.err_path = self.out_path.with_suffix(".err")
        # Not the workers' interpreter the test process's own Spark chose (relay.engine.jvm
        # sets it in os.environ): ktm picks its own as a user's run does, or a test says.
        inherited = {k: v for k, v in os.environ.items() if k not in _SPARK_PYTHON}
        env = {**inherited, "KTM_LOG_DIR": str(tmp_path / "ktm-logs"), **(env or {})}
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.started = time.monotonic()
            self.proc = subprocess.Popen(
                [ktm, command, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                cwd=cwd or tmp_path,
                start_new_session=True,  # its own group: the JVM and workers can be killed too
            )

    def __enter__(self) -> Ktm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def wait(self, timeout: float) -> Finished:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"ktm did not exit within {timeout}s; stderr:\n{self.stderr()}")
        return Finished(
            code, self.out_path.read_text(), self.stderr(), time.monotonic() - self.started
        )

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def signal_group(self, signum: int) -> None:
        """Like Ctrl+C in a terminal: ktm and its JVM (PySpark's worker daemon has its own
        process group, in ktm's session)."""
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL to ktm and everything it started (its JVM and the Python workers run in
        sessions of their own); safe twice. Returns once none of them is left."""
        sessions = {self.proc.pid} | {session_of(pid) for pid in descendants(self.proc.pid)}
        sessions -= {-1, 0, 1, os.getsid(0)}  # never the test runner's own session
        deadline = time.monotonic() + 30
        while members := [m for sid in sessions for m in live_session_members(sid)]:
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.poll()  # reaps ktm itself; the others are reparented and reaped
            assert time.monotonic() < deadline, f"processes {members} survive SIGKILL"
            time.sleep(0.05)
        self.proc.wait(timeout=30)


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: state, ppid, pgrp, session, ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def session_of(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[3]) if fields else -1


def descendants(pid: int) -> list[int]:
    """Live processes below `pid` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat(int(stat.parent.name))
        if fields:
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


# Spark's Python daemon, or ktm's for local masters (relay.engine.local_daemon)
_DAEMONS = (b"pyspark.daemon", b"relay.engine.local_daemon")
_SPARK_PYTHON = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")


def spark_workers(pid: int) -> list[int]:
    """The Python workers running Spark tasks below `pid` (ktm's process): the children of
    the Python daemon (Linux /proc)."""
    daemons = [p for p in descendants(pid) if any(d in _cmdline(p) for d in _DAEMONS)]
    return [child for daemon in daemons for child in descendants(daemon)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def live_session_members(sid: int) -> list[int]:
    """Processes of session ``sid`` that are not zombies (Linux /proc)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, _pgrp, session = stat.read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(session) == sid and state != "Z":
            members.append(int(stat.parent.name))
    return members


@contextmanager
def ktm(tmp_path: Path, *args: str, command: str = "relay", **how: Any) -> Iterator[Ktm]:
    """`Ktm(...)` killed at the end, whatever happened; `how`: Ktm's ktm, cwd and env."""
    process = Ktm(tmp_path, *args, command=command, **how)
    try:
        yield process
    finally:
        process.kill()


def run_ktm(
    tmp_path: Path, *args: str, timeout: float, command: str = "relay", **how: Any
) -> Finished:
    with ktm(tmp_path, *args, command=command, **how) as process:
        return process.wait(timeout)


def wait_for(
    condition: Callable[[], bool], timeout: float, what: str, process: Ktm, *others: Ktm
) -> None:
    """Until `condition`, failing with the logs of `process` (and of `others`, the other
    processes of a group: why a share never came may be in theirs) if it exits or times out."""
    deadline = time.monotonic() + timeout
    while not condition():
        code = process.proc.poll()
        if code is not None:
            pytest.fail(f"ktm exited ({code}) before {what}:\n{_logs(process, *others)}")
        if time.monotonic() > deadline:
            logs = _logs(process, *others)
            pytest.fail(f"timed out after {timeout}s waiting until {what}:\n{logs}")
        time.sleep(0.2)


def _logs(*processes: Ktm) -> str:
    return "\n--- the next process:\n".join(p.stderr() for p in processes)


def assert_only_log_lines(stderr: str) -> None:
    """No Spark/Java output and no traceback: every line is one of ktm's log lines."""
    assert "Traceback" not in stderr
    strays = [line for line in stderr.splitlines() if not LOG_LINE.match(line)]
    assert strays == [], f"not ktm log lines on stderr: {strays}"


def assert_one_error_line(run: Finished, code: int, *mentions: str) -> str:
    """Exit ``code``, no traceback, exactly one `ktm: error:` line naming ``mentions``; any
    other line is one of ktm's log lines (a logged retry, for instance)."""
    assert run.returncode == code, run.stderr
    assert "Traceback" not in run.stderr
    errors = run.error_lines()
    assert len(errors) == 1, run.stderr
    assert errors[0].startswith("ktm: error: "), run.stderr
    for mention in mentions:
        assert mention in errors[0]
    others = [line for line in run.stderr.splitlines() if line not in errors]
    assert all(LOG_LINE.match(line) for line in others), run.stderr
    return errors[0]


def scrape(port: int) -> dict[tuple[str, ...], float]:
    """ktm_messages_produced_total samples by (source_topic, source_partition, target_topic,
    target_partition); {} while the server is not up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return {}
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ktm_messages_produced_total":
                labels = sample.labels
                assert set(labels) == {
                    "source_topic",
                    "source_partition",
                    "target_topic",
                    "target_partition",
                }
                key = tuple(labels[k] for k in sorted(labels))
                samples[key] = sample.value
    return samples


def metric_total(port: int, name: str) -> float | None:
    """The sum of a metric's samples on a running ktm's /metrics; None while it is not up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    total = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                total = (total or 0.0) + sample.value
    return total


def spark_sessions(tmp_path: Path) -> list[int]:
    """Session ids of this test's Spark JVMs (each runs in a session of its own, led by the
    JVM; its Python workers are in it too), found by the log directory on their command line."""
    marker = str(tmp_path / "ktm-logs").encode()
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes():
                stat = (cmdline.parent / "stat").read_text()
                found.append(int(stat.rsplit(")", 1)[1].split()[3]))
        except (OSError, IndexError):
            continue
    return sorted(set(found))


# --- output -----------------------------------------------------------------------------------

"""Contender processes: started in their own session, watched as a whole tree (peak RSS/PSS,
CPU seconds, every descendant ever seen), and always reaped, even on Ctrl+C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import psutil

from scripts.bench.machine import REPO
from scripts.bench.sampling import Sample

SAMPLE_EVERY_S = 0.25
FAST_SAMPLE_EVERY_S, FAST_SAMPLING_S = 0.05, 2.0
LEFTOVER_GRACE_S = 2.0
KILL_PASSES_S = 5.0  # kill_tree: how long to keep killing what is still there
TREE_TAG = "KTM_BENCH_TREE"  # in a contender's environment, inherited by its whole tree
# ktm's text log format: "HH:MM:SS LEVEL   logger: message" (relay/logs.py)
LOG_LEVEL_RE = re.compile(r"^\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL)\s")
_RUNNING: set[Launched] = set()  # what kill_all() reaps when the benchmark is interrupted
_ADOPTED: dict[int, tuple[str, float]] = {}  # servers other code started: pid -> (name, start)


class TreeMonitor:
    """Samples a process and all its descendants on a thread: peak summed RSS and PSS, CPU
    seconds (and their history, for CPU over part of a run), and every descendant seen
    (pid -> (name, create time)), to find leftovers."""

    def __init__(self, pid: int):
        self.peak_rss = self.peak_pss = 0
        self.seen: dict[int, tuple[str, float]] = {}
        self._cpu: dict[int, float] = {}  # pid -> last user+system seconds seen
        self.cpu_history: list[Sample] = []  # (time, CPU ms of the tree) at each sample
        self._stop = threading.Event()
        self._root = psutil.Process(pid)
        self._thread = threading.Thread(target=self._run, name="tree-monitor", daemon=True)
        self._thread.start()

    @property
    def cpu_seconds(self) -> float:
        return sum(self._cpu.values())

    def _run(self) -> None:
        began = time.monotonic()
        while True:
            self._sample()
            # faster at first: a loop that copies a small topic lives well under a second
            fast = time.monotonic() - began < FAST_SAMPLING_S
            if self._stop.wait(FAST_SAMPLE_EVERY_S if fast else SAMPLE_EVERY_S):
                return

    def _sample(self) -> None:
        try:
            procs = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            return
        rss = pss = 0
        for proc in procs:
            try:
                with proc.oneshot():
                    mem, cpu = proc.memory_full_info(), proc.cpu_times()
                    self.seen.setdefault(proc.pid, (proc.name(), proc.create_time()))
            except psutil.Error:
                continue
            rss += mem.rss
            pss += getattr(mem, "pss", mem.rss)
            self._cpu[proc.pid] = cpu.user + cpu.system
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
        self.cpu_history.append((time.monotonic(), int(self.cpu_seconds * 1000)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def alive_descendants(self) -> list[psutil.Process]:
        """Descendants seen while it ran that still exist (same pid and start time)."""
        alive = []
        for pid, (_name, created) in self.seen.items():
            if pid == self._root.pid:
                continue
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.Error:
                continue
        return alive


def log_lines(text: str, *levels: str) -> list[str]:
    """The lines of ktm's log in ``text`` at one of ``levels``."""
    return [ln for ln in text.splitlines() if (m := LOG_LEVEL_RE.match(ln)) and m[1] in levels]


def unformatted_lines(text: str) -> list[str]:
    """Non-empty lines not in ktm's log format: tracebacks, a library's or the JVM's output."""
    return [ln for ln in text.splitlines() if ln.strip() and not LOG_LEVEL_RE.match(ln)]


@dataclass
class Finished:
    """How a contender's process ended and what it left."""

    name: str
    returncode: int
    wall: float  # from launch to exit
    stderr: str
    stdout: str
    peak_rss: int
    peak_pss: int
    cpu_seconds: float
    leftovers: list[str] = field(default_factory=list)  # "java(1234)" still alive after exit

    def tail(self, lines: int = 15) -> str:
        return "\n    ".join(self.stderr.strip().splitlines()[-lines:])


class Launched:
    """One contender process. Its own session (so Ctrl+C on the benchmark does not reach it
    and its group can be signalled as a whole); stdout/stderr to files in the work dir."""

    def __init__(self, name: str, cmd: list[str], workdir: Path, env: dict[str, str] | None = None):
        self.name = name
        self.tag = f"{name}-{uuid.uuid4().hex[:8]}"
        self._out = workdir / f"{name}.stdout"
        self._err = workdir / f"{name}.stderr"
        self.started = time.monotonic()
        with self._out.open("wb") as out, self._err.open("wb") as err:
            self.proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env={**os.environ, **(env or {}), TREE_TAG: self.tag},
                start_new_session=True,
            )
        _RUNNING.add(self)
        self.monitor = TreeMonitor(self.proc.pid)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.reap()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, signum: int, *, group: bool = False) -> None:
        """Signal the process, or (group=True) its whole process group."""
        if not self.alive():
            return
        if group:
            os.killpg(self.proc.pid, signum)  # its pgid is its pid: start_new_session
        else:
            self.proc.send_signal(signum)

    def tagged(self) -> list[psutil.Process]:
        """Live processes that carry this launch's TREE_TAG in their environment: the whole
        tree, orphans included (a child whose parent died is re-parented out of it)."""
        found = []
        for proc in psutil.process_iter(["environ", "status"]):
            info = proc.info
            env = info.get("environ") or {}
            if env.get(TREE_TAG) == self.tag and info.get("status") != psutil.STATUS_ZOMBIE:
                found.append(proc)
        return found

    def kill_tree(self) -> int:
        """SIGKILL the whole tree as a crash would: its group, every process seen in it or
        carrying its tag (a JVM in a session of its own escapes killpg), in passes until none
        is left (a fork in flight at the first pass is caught by the next). Returns how many
        processes were killed."""
        killed: set[int] = set()
        deadline = time.monotonic() + KILL_PASSES_S
        while True:
            doomed = {p.pid: p for p in self._tree()}
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            for proc in doomed.values():
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            killed |= doomed.keys()
            if not doomed or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        self.reap()
        return len(killed | {self.proc.pid})

    def stderr_text(self) -> str:
        return self._err.read_text(errors="replace")

    def stderr_size(self) -> int:
        """Characters written to stderr so far: to tell what was logged after a given moment."""
        return len(self.stderr_text())

    def wait(self, timeout: float) -> Finished:
        """Wait for the exit (SIGKILL to the tree after ``timeout``), then collect the run."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            print(f"  {self.name}: still running after {timeout:.0f} s: killed")
            self.reap()
            code = self.proc.wait()
        wall = time.monotonic() - self.started
        self.monitor.stop()
        leftovers = self._leftovers()
        self.reap()
        mon = self.monitor
        return Finished(
            self.name,
            code,
            wall,
            self.stderr_text(),
            self._out.read_text(errors="replace"),
            mon.peak_rss,
            mon.peak_pss,
            mon.cpu_seconds,
            leftovers,
        )

    def _tree(self) -> list[psutil.Process]:
        """What is left of the tree: descendants seen by the monitor or carrying the tag."""
        found = {p.pid: p for p in self.monitor.alive_descendants()}
        found.update((p.pid, p) for p in self.tagged() if p.pid not in found)
        return list(found.values())

    def _leftovers(self) -> list[str]:
        """Descendants still alive LEFTOVER_GRACE_S after the exit: a JVM or worker that takes a
        moment to go is not left behind, one that stays is."""
        _gone, alive = psutil.wait_procs(self._tree(), LEFTOVER_GRACE_S)
        names = self.monitor.seen
        return [f"{names.get(p.pid, (_name(p), 0))[0]}({p.pid})" for p in alive]

    def reap(self) -> None:
        """SIGKILL the process, its group and every descendant it ever had; safe twice. The
        descendants matter: a JVM in a session of its own would escape killpg."""
        strays = self._tree()
        for kill in (lambda: os.killpg(self.proc.pid, signal.SIGKILL), self.proc.kill):
            try:
                kill()
            except (ProcessLookupError, PermissionError):
                pass
        for proc in strays:
            try:
                proc.kill()
            except psutil.Error:
                pass
        self.proc.wait()
        _RUNNING.discard(self)


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return "?"


def adopt(pid: int, name: str) -> None:
    """Have kill_all() SIGKILL ``pid`` (and its descendants) too: a server started by code that
    is not ours (SeaweedFS in testbed/seaweed.py), normally stopped by that code; see disown()."""
    try:
        _ADOPTED[pid] = (name, psutil.Process(pid).create_time())
    except psutil.Error:
        pass


def disown(pid: int) -> None:
    _ADOPTED.pop(pid, None)


def _kill_adopted() -> None:
    for pid, (name, created) in list(_ADOPTED.items()):
        disown(pid)
        try:
            root = psutil.Process(pid)
            if root.create_time() != created:  # the pid was reused: not ours any more
                continue
            procs = [*root.children(recursive=True), root]
        except psutil.Error:
            continue
        print(f"  killing {name}({pid}), left running")
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass


def kill_all() -> None:
    """Reap every contender still running, and adopted servers: the benchmark's last line of
    defence."""
    for launched in list(_RUNNING):
        launched.reap()
    _kill_adopted()

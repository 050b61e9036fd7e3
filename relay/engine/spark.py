"""Spark: starting the context, shipping ktm's code to executors, running rounds as jobs.

Only this module and relay.engine.jvm (the JVM's launch and end) import pyspark, and only when
work starts (`ktm --help` stays fast).

- A plain SparkContext, no SparkSession: ktm uses no SQL, and the session's start-up costs
  about two seconds more (measured: 2.5 s against 4.4 s on the 2-core test machine).
- A round is one job with at most one task per slot, each serving its partitions, run on a
  thread so the driver keeps watching live progress while it runs. Cancelling the job is a
  last resort (it kills Python tasks without their `finally`); the normal stop is
  cooperative, through relay.engine.channel.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from relay import internals
from relay.config import SparkConfig
from relay.engine import class_archive
from relay.engine.jvm import (
    JVM_EXIT_TIMEOUT,
    Launched,
    _end_jvm,
    end_launched,
    launch,
    start_context,
)
from relay.engine.shipping import package_zip
from relay.errors import RelayError
from relay.spec import TaskResult, TaskSpec

if TYPE_CHECKING:  # the executor side imports kafka-python: not at the driver's start
    from py4j.java_gateway import JavaGateway
    from pyspark import SparkContext

    from relay.engine.executor.sides import Sides

    # what makes a task's Sides from its spec: a class of an importable module
    MakeSides = Callable[..., Sides]

log = logging.getLogger(__name__)

T = TypeVar("T")  # a batch job's task spec
R = TypeVar("R")  # and its result

SUBMIT_WAIT = 2.0  # seconds a warm job is waited for to reach Spark's scheduler
SUBMIT_POLL = 0.01
_LOCAL = re.compile(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?")


def default_master(partitions: int) -> str:
    """Local mode with one slot per core, never more slots than partitions: every Python worker
    costs memory and start-up time, and a slot without a partition would idle."""
    return f"local[{max(1, min(os.cpu_count() or 1, partitions))}]"


class Spark:
    """The Spark this process runs its jobs on (wrapped by relay.engine.driver.backend.SparkBackend,
    which starts it in the background for the runner): owns the SparkContext, unless an
    embedding program already runs one."""

    def __init__(
        self,
        spark_cfg: SparkConfig,
        master: str,
        log_dir: Path,
        launched: Launched | None = None,
    ):
        from pyspark import SparkContext

        self.master = master
        self.log_dir = log_dir
        self.log_path = log_dir / "spark.log"
        self._configured_slots = spark_cfg.slots
        self._gateway: JavaGateway | None = None
        self._archive = class_archive.ArchivePlan("")
        self._stopped = False
        # An embedding program (or the test suite) may own a running context already: use it,
        # and leave stopping it to its owner (a JVM launched ahead is not used then).
        self._owned = internals.active_spark_context() is None
        if self._owned:
            launched = launched or launch(spark_cfg, master, log_dir)
            self.log_dir, self.log_path = launched.log_dir, launched.log_path
            self._archive, self._gateway = launched.archive, launched.gateway
            try:
                self._context = start_context(launched, master)
            except BaseException:
                end_launched(launched)
                raise
            self._context.addPyFile(str(package_zip(self.log_dir)))
        else:
            if launched is not None:
                end_launched(launched)
            self._context = SparkContext.getOrCreate()
            self.master = self._context.master or master
        self.slots = self._count_slots()

    @property
    def driver_host(self) -> str:
        """The address executors reach the driver at (where the control channel listens)."""
        if self.master.startswith("local"):
            return "127.0.0.1"
        return str(self._context.getConf().get("spark.driver.host") or "0.0.0.0")

    def _count_slots(self) -> int:
        """Task slots: the configured number, else local[K]'s K, else what the cluster has."""
        if self._configured_slots:
            return self._configured_slots
        match = self._local_match()
        if match:
            given = match.group(1)
            return os.cpu_count() or 1 if given == "*" else int(given or 1)
        cores_max = self._context.getConf().get("spark.cores.max")
        parallelism = int(self._context.defaultParallelism)
        return min(int(cores_max), parallelism) if cores_max else parallelism

    def refresh_slots(self) -> None:
        """On a cluster, executors come and go: count the slots again before planning."""
        slots = self._count_slots()
        if slots != self.slots:
            log.info("task slots: %d (were %d)", slots, self.slots)
            self.slots = slots

    def warm_up(self) -> None:
        """Start every slot's Python worker and import the task code, while the driver still
        reads the clusters; on a cluster, the executors have registered afterwards."""
        rdd = self._context.parallelize(range(self.slots), self.slots)
        pids = set(rdd.map(_warm).collect())
        self.slots = self._count_slots()
        log.debug("spark workers ready: %d processes, %d slots", len(pids), self.slots)

    def submit(self, round_id: int, tasks: Sequence[TaskSpec], sides: MakeSides) -> RoundJob:
        """Run a round: each task moves its partitions with the pipeline's `sides` (a class of
        an importable module: Spark ships it by reference)."""
        return RoundJob(self._context, round_id, list(tasks), sides)

    @property
    def local(self) -> bool:
        """One JVM whose slots the master names (local, local[K], local[*]); not
        local-cluster, whose executors register like a cluster's."""
        return self._local_match() is not None

    def _local_match(self) -> re.Match[str] | None:
        return _LOCAL.fullmatch(self.master.replace(" ", ""))

    def warm(self, spec: TaskSpec, sides: MakeSides) -> RoundJob:
        """Each slot's worker opens the clients the first round's tasks will use (`Sides.warm`),
        as a job of its own while the driver waits for its group; the round's tasks queue
        behind it on the slots, and would open the same clients first anyway. Returns once
        Spark has the job: a round submitted before it took the slots, and the clients were
        opened twice (seen across a 240 ms link: the round's tasks bootstrapped themselves,
        then the warm job ran after them, 0.7-1.3 s later than in order)."""
        job = RoundJob(self._context, 0, [spec] * self.slots, sides, _open_clients)
        job.await_submitted(SUBMIT_WAIT)
        return job

    def run_batch(self, tasks: Sequence[T], run: Callable[[T], R]) -> list[R]:
        """A batch job (ktm compact): `run` on one task per spec, results collected at the
        end; `run` is a function of an importable module (Spark ships it by reference)."""
        if not tasks:
            return []
        self._context.setJobGroup("ktm-batch", f"ktm: {len(tasks)} tasks", True)
        try:
            rdd = self._context.parallelize(list(tasks), len(tasks))
            return list(rdd.map(run).collect())
        except Exception as exc:
            raise RelayError(f"Spark job failed: {_first_line(exc)}") from exc

    def close_workers(self) -> None:
        """Close the Kafka clients cached in every worker (one task per slot, at once)."""
        try:
            rdd = self._context.parallelize(range(self.slots), self.slots)
            rdd.map(_close_clients).collect()
        except Exception as exc:  # noqa: BLE001 - shutting down anyway
            log.debug("closing worker clients: %s", exc)

    def stop(self, write_archive: bool = True) -> None:
        """Stop Spark and wait until its JVM is gone; safe twice. A JVM asked to write the class
        archive at exit is killed instead when `write_archive` is False (a stop on a signal
        must stay prompt: the archive is written by a later run)."""
        if self._stopped:
            return
        self._stopped, context = True, self._context
        if not self._owned:
            return
        # PySpark's accumulator server polls its JVM connection once a second and its accept
        # loop every half second: shut it down on the side, after the JVM is gone.
        accumulators = internals.detach_accumulator_server(context)
        try:
            context.cancelAllJobs()
            context.stop()
        except Exception as exc:  # noqa: BLE001 - shutting down anyway
            log.debug("spark stop: %s", exc)
        writing = self._archive.writing is not None
        if writing and not write_archive:
            _end_jvm(self._gateway, 0.0)  # Spark has stopped: nothing is lost with the JVM
            class_archive.publish(self._archive, False)
        else:
            if writing:  # it holds the JVM's exit for a few seconds, once per machine
                log.info(
                    "writing the Spark JVM's class archive for faster starts: %s",
                    self._archive.final,
                )
            timeout = JVM_EXIT_TIMEOUT * (3 if writing else 1)
            class_archive.publish(self._archive, _end_jvm(self._gateway, timeout))
        if accumulators is not None:
            threading.Thread(target=accumulators.shutdown, daemon=True).start()


class RoundJob:
    """One round running as a Spark job on its own thread."""

    def __init__(
        self,
        context: SparkContext,
        round_id: int,
        tasks: list[TaskSpec],
        sides: MakeSides,
        entry: Callable[[MakeSides, TaskSpec], TaskResult | int] | None = None,
    ):
        self._context = context
        self._sides = sides
        self._entry = entry or _run_attempt
        self.group = f"ktm-round-{round_id}"
        self._tasks = tasks
        self._results: list[TaskResult | int] = []
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.group, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._context.setJobGroup(self.group, f"ktm: {len(self._tasks)} tasks", True)
            rdd = self._context.parallelize(self._tasks, len(self._tasks))
            run = functools.partial(self._entry, self._sides)
            self._results = list(rdd.map(run).collect())
        except BaseException as exc:  # noqa: BLE001 - handed to the driver's thread
            self._error = exc
        finally:
            self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def await_submitted(self, timeout: float) -> None:
        """Until Spark's scheduler has the job (its status tracker lists it), it ended, or
        `timeout`: jobs submitted later take the slots after its tasks (FIFO)."""
        tracker = self._context.statusTracker()
        deadline = time.monotonic() + timeout
        while not self._done.is_set() and time.monotonic() < deadline:
            if tracker.getJobIdsForGroup(self.group):
                return
            self._done.wait(SUBMIT_POLL)

    def cancel(self) -> None:
        self._context.cancelJobGroup(self.group)

    def results(self) -> list[TaskResult]:
        self._done.wait()
        if self._error is not None:  # Py4J wraps a lost worker or executor as a job failure
            raise RelayError(f"Spark job failed: {_first_line(self._error)}") from self._error
        return [r for r in self._results if isinstance(r, TaskResult)]  # a warm job's: pids


def _run_attempt(sides: MakeSides, task: TaskSpec) -> TaskResult:
    """Executor entry point: tells the task whether Spark is retrying it (a lost executor)."""
    from pyspark import TaskContext

    from relay.engine.executor.task import run_task

    _tune_gc()
    context = TaskContext.get()
    return run_task(task, sides, attempt=context.attemptNumber() if context else 0)


def _warm(_: int) -> int:
    # the import is the point: kafka-python and ours, loaded before the first round
    import relay.engine.executor.task  # noqa: F401

    _tune_gc()
    return os.getpid()


# A task allocates an object or two per source batch and per record re-framed, nearly all freed
# by their reference counts; the collector's default pace (a young collection every 700
# allocations) spent ~17% of the batch path's CPU on tiny batches (scripts/bench/batch_codec).
# What the worker holds by then (modules, clients) is frozen out of every collection.
_GC_THRESHOLDS = (50_000, 20, 100)


def _tune_gc() -> None:
    """Once per Python worker (Spark reuses them from task to task)."""
    if gc.get_threshold() != _GC_THRESHOLDS:
        gc.freeze()
        gc.set_threshold(*_GC_THRESHOLDS)


def _open_clients(sides: MakeSides, task: TaskSpec) -> int:
    _tune_gc()
    try:
        sides(task).warm()
    except Exception:  # noqa: BLE001 - a head start only: the round's tasks open them again
        pass
    return os.getpid()


def _close_clients(_: int) -> int:
    from relay.clients.worker_cache import close_clients

    return close_clients()


def make_log_dir() -> Path:
    base = Path(os.environ.get("KTM_LOG_DIR") or tempfile.gettempdir()) / "ktm"
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=base))


def _first_line(exc: BaseException) -> str:
    """The line that says what went wrong: a Python worker's traceback ends with it (Spark
    wraps it as "An exception was thrown from the Python worker: Traceback ..."), a JVM error
    starts with it."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if any(line.startswith("Traceback") or "Traceback (most recent" in line for line in lines):
        for line in reversed(lines):
            if not line.startswith(("at ", "File ", "...", "^")) and ":" in line:
                return line[:300]
    for line in lines:
        if "Error" in line or "Exception" in line:
            return line[:300]
    return (lines[0] if lines else type(exc).__name__)[:300]

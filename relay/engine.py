"""Spark: session start-up, shipping ktm's code to executors, and running one epoch as a job.

Only this module imports pyspark, and only when a relay starts (`ktm --help` stays fast).
Spark's own output goes to a log file, never to the operator's terminal.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from relay.config import SparkConfig
from relay.errors import RelayError
from relay.plan import PartitionTask, TaskResult

log = logging.getLogger(__name__)

_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{HH:mm:ss.SSS}} %p %c{{1}}: %m%n
"""

_DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
    "spark.sql.shuffle.partitions": "2",
    # Tasks run for a whole epoch: locality waits would only delay their start.
    "spark.locality.wait": "0s",
}


def default_master(task_slots: int) -> str:
    """One slot per source partition plus one: every partition's task runs at once."""
    return f"local[{max(2, task_slots + 1)}]"


class Engine:
    """Owns the SparkSession; `run_epoch` runs one task per partition and collects results."""

    def __init__(self, spark_cfg: SparkConfig, master: str, log_dir: Path):
        self.master = master
        self.log_dir = log_dir
        self.log_path = log_dir / "spark.log"
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        # An embedding program (or the test suite) may own a running context already: use it,
        # and leave stopping it to its owner. (getActiveSession() would only see a session of
        # this thread; the context is process-wide.)
        self._owned = SparkContext._active_spark_context is None
        if self._owned:
            self._session = _start_session(spark_cfg, master, log_dir, self.log_path)
        else:
            self._session = SparkSession.builder.getOrCreate()
        self._context = self._session.sparkContext
        if self._owned:  # the owner of a shared session ships the code once, for everyone
            self._context.addPyFile(str(_package_zip(log_dir)))

    def run_epoch(self, tasks: Sequence[PartitionTask]) -> list[TaskResult]:
        if not tasks:
            return []
        self._context.setJobGroup("ktm-epoch", f"ktm epoch: {len(tasks)} partitions", True)
        try:
            rdd = self._context.parallelize(list(tasks), len(tasks))
            return list(rdd.map(_run_attempt).collect())
        except Exception as exc:  # Py4J wraps a lost worker or executor as a job failure
            raise RelayError(f"Spark job failed: {_first_line(exc)}") from exc

    def stop(self) -> None:
        """Cancel anything still running and stop Spark; safe twice."""
        if self._session is None:
            return
        session, self._session = self._session, None
        try:
            self._context.cancelJobGroup("ktm-epoch")
            if self._owned:
                with _redirect_std_fds(self.log_path):
                    session.stop()
        except Exception as exc:  # noqa: BLE001 - shutting down anyway
            log.debug("spark stop: %s", exc)


def _run_attempt(task: PartitionTask) -> TaskResult:
    """Executor entry point: tells the task whether Spark is retrying it (a lost executor)."""
    from pyspark import TaskContext

    from relay.task import run_task

    context = TaskContext.get()
    return run_task(task, attempt=context.attemptNumber() if context else 0)


def _start_session(spark_cfg: SparkConfig, master: str, log_dir: Path, log_path: Path) -> Any:
    # PySpark takes the executors' interpreter only from PYSPARK_PYTHON when it is started
    # from Python (spark.pyspark.python is read by spark-submit alone): honour the config's
    # choice on a cluster (e.g. "./environment/bin/python" from a packed venv in
    # spark.archives); otherwise run this interpreter, the one with ktm installed.
    configured = dict(spark_cfg.conf).get("spark.pyspark.python")
    if configured and not master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", configured)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log4j = log_dir / "log4j2.properties"
    log4j.write_text(_LOG4J2.format(path=log_path))
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(spark_cfg.app_name)
    conf = dict(_DEFAULT_CONF)
    conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j}"
    if master.startswith("local"):
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    conf.update(dict(spark_cfg.conf))
    for key, value in conf.items():
        builder = builder.config(key, value)
    # PySpark replaces the SIGINT handler with its own (cancel every job, raise
    # KeyboardInterrupt mid-epoch); the program's handler (ktm's clean stop) must stay.
    sigint = signal.getsignal(signal.SIGINT)
    # The JVM inherits these descriptors: its start-up chatter and every later line land in
    # the log file instead of the operator's terminal.
    with _redirect_std_fds(log_path):
        session = builder.getOrCreate()
    if sigint is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, sigint)
    session.sparkContext.setLogLevel("WARN")
    _quiet_accumulator_server(session.sparkContext)
    return session


def _quiet_accumulator_server(context: Any) -> None:
    """PySpark's accumulator server prints a traceback to the terminal when the JVM goes away
    (a stop signal sent to the whole process group): send it to the debug log instead."""
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = lambda _request, address: log.debug(
            "spark accumulator connection from %s ended", address, exc_info=True
        )


@contextmanager
def _redirect_std_fds(path: Path) -> Iterator[None]:
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _package_zip(log_dir: Path) -> Path:
    """Zip the `relay` package so executors on a real cluster can import it (addPyFile)."""
    package = Path(__file__).resolve().parent
    target = log_dir / "ktm-relay.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(package.rglob("*.py")):
            zf.write(path, Path("relay") / path.relative_to(package))
    return target


def make_log_dir() -> Path:
    base = Path(os.environ.get("KTM_LOG_DIR") or tempfile.gettempdir()) / "ktm"
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=base))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    for line in text:
        if "Error" in line or "Exception" in line:
            return line.strip()[:300]
    return (text[0] if text else type(exc).__name__)[:300]

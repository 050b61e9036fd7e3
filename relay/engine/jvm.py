"""The Spark JVM of a driver that owns its SparkContext: its launch and its end.

- The JVM runs in its own session (process group), with its output in a log file: a stop signal
  sent to ktm's process group (Ctrl+C in a terminal, systemd's KillMode=control-group) reaches
  the driver only, and the driver decides when Spark stops. The JVM still dies with the driver:
  it exits when its stdin pipe from the driver closes.
- The driver's JVM compiles with C1 only, and PySpark's accumulator server logs to the debug
  log instead of the terminal.
"""

from __future__ import annotations

import importlib.machinery
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from relay import internals
from relay.config import SparkConfig
from relay.engine import class_archive

if TYPE_CHECKING:
    from py4j.java_gateway import JavaGateway
    from pyspark import SparkConf, SparkContext

log = logging.getLogger(__name__)

JVM_EXIT_TIMEOUT = 10.0
LOCAL_DAEMON = "relay.engine.local_daemon"  # Spark's Python daemon, PySpark not from its zip

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
    # Tasks run for a whole round: locality waits would only delay their start.
    "spark.locality.wait": "0s",
}


@dataclass
class Launched:
    """A driver JVM launched before its SparkContext: the default local master's slot count
    waits for the partitions, the JVM need not (it starts in ~1.5 s of Spark's ~2.6)."""

    conf: SparkConf
    gateway: JavaGateway
    archive: class_archive.ArchivePlan
    log_dir: Path
    log_path: Path


def launch(spark_cfg: SparkConfig, master: str, log_dir: Path) -> Launched:
    """The JVM and its gateway, for a context on `master` or (local masters) any local one."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    archive = class_archive.plan(spark_cfg.class_cache)
    log.debug("spark class archive: %s", archive.option or "off")
    _python_for_workers(spark_cfg, master)
    log_path = log_dir / "spark.log"
    log4j = log_dir / "log4j2.properties"
    log4j.write_text(_LOG4J2.format(path=log_path))
    conf = SparkConf().setMaster(master).setAppName(spark_cfg.app_name)
    settings = dict(_DEFAULT_CONF)
    # C1 only: the driver's JVM schedules tasks and moves no records, and C2's compiler threads
    # burnt ~3.5 CPU seconds of a 1M-record run and slowed Spark's start by ~0.6 s (measured;
    # scripts/bench). Set spark.driver.extraJavaOptions in [spark].conf to override both.
    settings["spark.driver.extraJavaOptions"] = (
        f"-Dlog4j2.configurationFile=file:{log4j} -XX:TieredStopAtLevel=1 {archive.option}"
    ).strip()
    if master.startswith("local"):
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        if _workers_find_local_daemon():
            settings["spark.python.daemon.module"] = LOCAL_DAEMON
    settings.update(dict(spark_cfg.conf))
    log.debug("spark python daemon: %s", settings.get("spark.python.daemon.module", "pyspark's"))
    for key, value in settings.items():
        conf.set(key, value)
    with open(log_path, "ab") as sink:
        gateway = launch_gateway(
            conf, popen_kwargs={"stdout": sink, "stderr": sink, "start_new_session": True}
        )
    return Launched(conf, gateway, archive, log_dir, log_path)


def start_context(launched: Launched, master: str) -> SparkContext:
    """The SparkContext on a launched JVM (`master` overrides the one it was launched for)."""
    from pyspark import SparkContext

    # PySpark replaces the SIGINT handler with its own (cancel every job, raise
    # KeyboardInterrupt); the program's handler (ktm's clean stop) must stay.
    sigint = signal.getsignal(signal.SIGINT)
    context = SparkContext(master=master, conf=launched.conf, gateway=launched.gateway)
    if sigint is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, sigint)
    context.setLogLevel("WARN")
    _quiet_accumulator_server(context)
    return context


def end_launched(launched: Launched) -> None:
    """A JVM launched for a context that never came (the run ended before Spark was needed)."""
    _end_jvm(launched.gateway, 0.0)


def _python_for_workers(spark_cfg: SparkConfig, master: str) -> None:
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


def _workers_find_local_daemon() -> bool:
    """Whether local workers, started as `PYSPARK_PYTHON -m <module>` in this directory, import
    relay.engine.local_daemon from the same ktm as this process: this interpreter, and no other
    `relay` first on their path (`-m` puts the working directory first)."""
    if os.environ.get("PYSPARK_PYTHON") != sys.executable:
        return False
    import relay

    # not the zips on this process's path: PySpark adds those a context ships (addPyFile)
    here = [p for p in sys.path[1:] if not p.endswith(".zip")]
    path = [os.getcwd(), *os.environ.get("PYTHONPATH", "").split(os.pathsep), *here]
    for finder in sys.meta_path:  # as the import system looks (an editable install's finder)
        find = getattr(finder, "find_spec", None)
        plain = finder is importlib.machinery.PathFinder
        spec = find("relay", [p for p in path if p] if plain else None) if find else None
        if spec is not None:
            return bool(spec.origin == relay.__file__)
    return False


def _end_jvm(gateway: JavaGateway | None, timeout: float = JVM_EXIT_TIMEOUT) -> bool:
    """Shut the gateway and wait for the JVM (and the Python workers it started) to exit;
    True if it exited by itself with status 0. A timeout of 0 kills it at once."""
    proc = internals.gateway_process(gateway)
    try:
        if gateway is not None:
            gateway.shutdown()
    except Exception as exc:  # noqa: BLE001
        log.debug("gateway shutdown: %s", exc)
    internals.forget_gateway()
    if proc is None:
        return False
    if timeout <= 0:  # not waited for: killed at once
        proc.kill()
        proc.wait(timeout=JVM_EXIT_TIMEOUT)
        return False
    try:
        assert proc.stdin is not None  # launch_gateway always gives the JVM a stdin pipe
        proc.stdin.close()  # the JVM exits when this pipe closes
        return bool(proc.wait(timeout=timeout) == 0)
    except Exception as exc:  # noqa: BLE001 - a JVM that will not go is killed
        log.debug("spark JVM did not exit in %ss (%s); killing it", timeout, exc)
        proc.kill()
        proc.wait(timeout=JVM_EXIT_TIMEOUT)
        return False


def _quiet_accumulator_server(context: SparkContext) -> None:
    """PySpark's accumulator server prints a traceback to the terminal when the JVM goes away
    under it: send it to the debug log instead."""
    internals.quiet_accumulator_server(
        context,
        lambda _request, address: log.debug(
            "spark accumulator connection from %s ended: %r", address, sys.exc_info()[1]
        ),
    )

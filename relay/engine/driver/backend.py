"""Spark as the driver uses it: started on a thread while the clusters are checked, with the
control channel its tasks report to, and stopped (workers' clients closed first) at the end."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from relay import internals
from relay.config import SparkConfig
from relay.engine.channel import ControlServer, Report
from relay.engine.driver.seams import WarmSpec
from relay.engine.jvm import Launched, end_launched, launch
from relay.engine.metrics import Metrics
from relay.engine.spark import RoundJob, Spark, default_master, make_log_dir

log = logging.getLogger(__name__)


class SparkBackend:
    """The runner's Backend (relay.engine.driver.seams) on Spark."""

    def __init__(
        self,
        spark: SparkConfig,
        master: str | None,
        metrics: Metrics,
        lease_for: Callable[[int], float | None],
        on_report: Callable[[Report], None],
        renew_every: float = 0.5,
        stopping: threading.Event | None = None,
        hold_for: Callable[[int], float | None] = lambda _: None,
    ):
        self.spark, self.master, self.metrics = spark, master, metrics
        self.renew_every = renew_every
        self._stopping = stopping  # set by a stop signal: Spark must then stop promptly
        self._lease_for, self._on_report, self._hold_for = lease_for, on_report, hold_for
        self.start_seconds = 0.0
        self.log_path: str | None = None
        self.engine: Spark | None = None
        self.channel: ControlServer | None = None
        self.used = False  # a round ran: the workers hold clients worth closing
        self._start: Future[Spark] | None = None
        self._launch: Future[Launched | None] | None = None
        self._began: float | None = None  # when the JVM's launch began
        self._warming: RoundJob | None = None

    def launch(self) -> None:
        """Launch the JVM on a thread now, before the partitions are known: the default local
        master's slot count waits for them, the JVM need not. With a source 240 ms away the
        partition counts take ~1 s (a bootstrap), which Spark's start no longer waits for."""
        if self._launch is None and self._start is None:
            self._began = time.monotonic()
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ktm-spark-launch")
            self._launch = executor.submit(self._launch_jvm)
            executor.shutdown(wait=False)

    def _launch_jvm(self) -> Launched | None:
        if internals.active_spark_context() is not None:
            return None  # an embedding program's (or the test suite's) Spark is used
        return launch(self.spark, self.master or self.spark.master or "local[*]", make_log_dir())

    def begin(self, partitions: int, warm: WarmSpec | None = None) -> None:
        """Start Spark (and its Python workers) on a thread; safe to call twice. `warm(channel
        address, slots)`: the spec whose clients the workers open as soon as Spark is up
        (Spark.warm), while the driver still reads the clusters and waits for its group."""
        if self._start is None:
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ktm-spark-start")
            self._start = executor.submit(self._start_engine, partitions, warm)
            executor.shutdown(wait=False)

    def ready(self, partitions: int) -> tuple[Spark, ControlServer]:
        """The engine and the channel, waiting for the start if it is still going on."""
        if self.engine is None:
            self.begin(partitions)
            assert self._start is not None
            self.engine = self._start.result()
            self.metrics.task_slots.set(self.engine.slots)
        assert self.channel is not None
        return self.engine, self.channel

    def _warm(self, engine: Spark, channel: ControlServer, warm: WarmSpec) -> bool:
        try:
            spec, sides = warm(channel.address, engine.slots)
            self._warming = engine.warm(spec, sides)
        except Exception as exc:  # noqa: BLE001 - a head start only: the first round opens them
            log.debug("warming the workers' clients: %s", exc)
            return False
        self.used = True  # the workers hold clients worth closing
        return True

    def engine_slots(self) -> int:
        return self.engine.slots if self.engine is not None else 0

    def _end_launch(self) -> None:
        """A JVM launched for a Spark that never started (the run ended before it began)."""
        launching, self._launch = self._launch, None
        if launching is not None:
            try:
                launched = launching.result()
                if launched is not None:
                    end_launched(launched)
            except Exception as exc:  # noqa: BLE001 - it failed to launch: nothing to end
                log.debug("spark launch failed: %s", exc)

    def _start_engine(self, partitions: int, warm: WarmSpec | None) -> Spark:
        master = self.master or self.spark.master or default_master(partitions)
        began = self._began or time.monotonic()
        launched = self._launch.result() if self._launch is not None else None
        log_dir = make_log_dir() if launched is None else launched.log_dir
        engine = Spark(self.spark, master, log_dir, launched)
        try:
            self.channel = ControlServer(
                engine.driver_host,
                self.spark.control_port,
                secrets.token_urlsafe(24),
                self._lease_for,
                self._on_report,
                self.renew_every,
                self._hold_for,
            )
        except BaseException:  # the error reaches the caller of ready(); Spark must not stay
            engine.stop(write_archive=False)
            raise
        # A local master's slots are known: the warm job starts the workers itself, and they
        # open their clients as soon as they are up (a warm-up job first, then the warm job,
        # cost ~0.2 s more). A cluster's executors register during the warm-up job.
        if warm is not None and engine.local:
            if not self._warm(engine, self.channel, warm):
                engine.warm_up()
        else:
            engine.warm_up()
            if warm is not None:
                self._warm(engine, self.channel, warm)
        self.start_seconds = time.monotonic() - began
        self.log_path = str(engine.log_path)
        log.info(
            "spark started master=%s slots=%d in %.1fs",
            engine.master,
            engine.slots,
            self.start_seconds,
        )
        log.debug("spark log: %s", engine.log_path)
        return engine

    def stop(self) -> None:
        """Close the channel and stop Spark (waiting for a start still going on); safe twice."""
        if self.channel is not None:
            self.channel.close()
        if self._start is None:
            self._end_launch()
            return
        start, self._start = self._start, None
        try:
            engine = start.result()
        except Exception as exc:  # noqa: BLE001 - it failed to start: nothing to stop
            log.debug("spark start failed: %s", exc)
            return
        if self.channel is not None:  # made by the start, maybe after the first close above
            self.channel.close()
        if self._warming is not None:
            self._warming.cancel()  # not to hold closing the clients up behind a slow bootstrap
        if self.used:
            engine.close_workers()
        engine.stop(write_archive=not (self._stopping is not None and self._stopping.is_set()))

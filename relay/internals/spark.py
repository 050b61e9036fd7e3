"""PySpark's context, gateway and accumulator server (relay.internals)."""

from __future__ import annotations

import socketserver
import subprocess
from collections.abc import Callable
from typing import TYPE_CHECKING

from relay.internals.missing import Missing

if TYPE_CHECKING:
    from py4j.java_gateway import JavaGateway
    from pyspark import SparkContext


def active_spark_context() -> SparkContext | None:
    """The SparkContext this process already runs (an embedding program's), or None."""
    from pyspark import SparkContext

    if not hasattr(SparkContext, "_active_spark_context"):
        raise Missing("SparkContext._active_spark_context", "pyspark")
    return SparkContext._active_spark_context


def detach_accumulator_server(context: SparkContext) -> socketserver.BaseServer | None:
    """Take the context's accumulator server away from it (None if it has none): ktm shuts it
    down on the side, after the JVM is gone, and sends its errors to the debug log."""
    server: socketserver.BaseServer | None = getattr(context, "_accumulatorServer", None)
    if server is not None:
        # Its declared type says never None, yet PySpark's stop() sets None too (and skips a
        # None): setattr says so without an ignored type error.
        setattr(context, "_accumulatorServer", None)  # noqa: B010
    return server


def quiet_accumulator_server(
    context: SparkContext, handle_error: Callable[[object, object], None]
) -> None:
    """Send the errors of the context's accumulator server to `handle_error(request, address)`
    instead of its own traceback on stderr."""
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = handle_error


def forget_gateway() -> None:
    """After the JVM is gone: the next SparkContext of this process starts a new gateway."""
    from pyspark import SparkContext

    SparkContext._gateway = None
    SparkContext._jvm = None


def gateway_process(gateway: JavaGateway | None) -> subprocess.Popen[bytes] | None:
    """The JVM's process (its stdin pipe ends it), or None."""
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    return proc

"""PySpark's context, gateway and accumulator server (relay.internals)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relay.internals.missing import Missing


def active_spark_context() -> Any:
    """The SparkContext this process already runs (an embedding program's), or None."""
    from pyspark import SparkContext

    if not hasattr(SparkContext, "_active_spark_context"):
        raise Missing("SparkContext._active_spark_context", "pyspark")
    return SparkContext._active_spark_context


def detach_accumulator_server(context: Any) -> Any:
    """Take the context's accumulator server away from it (None if it has none): ktm shuts it
    down on the side, after the JVM is gone, and sends its errors to the debug log."""
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        context._accumulatorServer = None
    return server


def quiet_accumulator_server(context: Any, handle_error: Callable[[Any, Any], None]) -> None:
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = handle_error


def forget_gateway() -> None:
    """After the JVM is gone: the next SparkContext of this process starts a new gateway."""
    from pyspark import SparkContext

    SparkContext._gateway = None
    SparkContext._jvm = None


def gateway_process(gateway: Any) -> Any:
    """The JVM's process (its stdin pipe ends it), or None."""
    return getattr(gateway, "proc", None)

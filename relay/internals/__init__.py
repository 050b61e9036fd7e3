"""Every use of a library's private parts, each behind a small named function.

ktm's speed rests on a few internals of kafka-python 3.0 (its producer's accumulator and sender,
its coordinator, its admin client's requests) and of PySpark 4.3 (the context's gateway and
accumulator server). They live here, and only here, with one policy:

- at start-up `check()` looks for every one that can be seen on the classes; one without a
  public fallback missing stops ktm with one line naming the library and the version ktm
  needs; one with a fallback missing is said in one warning, and the fallback runs;
- each function below either does its job or raises `Missing` (never an AttributeError from
  deep inside), so a caller with a fallback catches it and the others fail with that line;
- tests/integration/test_internals.py lists each internal on real objects: an upgrade that
  moves one fails it. setup.cfg pins both libraries to the versions that test passed on.

The modules of relay.clients call the kafka-python ones; relay.engine.spark and
relay.engine.jvm the PySpark ones. The functions live in `relay.internals.producer`,
`relay.internals.clients` and `relay.internals.spark`, and are called through this package
(`internals.accumulator(...)`); the list the start-up check reads is here.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass

from relay.internals.clients import (  # noqa: F401 - the package is where callers find them
    LogEnds,
    api_versions,
    await_join,
    client_cluster,
    find_coordinator_soon,
    group_member_count,
    join_dropped,
    joining,
    know_api_versions,
    last_heartbeat,
    log_ends_soon,
    metadata_config,
    position,
    request_rejoin,
)
from relay.internals.missing import KAFKA_PYTHON, PYSPARK, Missing  # noqa: F401
from relay.internals.producer import (  # noqa: F401
    METADATA_PAUSE,
    accumulator,
    accumulator_closed,
    appending,
    batches_in_flight,
    drop_in_flight,
    forget_drained_queues,
    is_transactional,
    know_topics,
    known_partitions,
    muted_partitions,
    on_answered,
    on_batch_error,
    on_batch_failure,
    on_batch_split,
    on_drain,
    on_reenqueue,
    partition_lock,
    partition_queue,
    sender,
    sending_ended,
    several_batches_in_flight,
    still_incomplete,
    stop_sending,
    track,
    wake_sender,
)
from relay.internals.spark import (  # noqa: F401
    active_spark_context,
    detach_accumulator_server,
    forget_gateway,
    gateway_process,
    quiet_accumulator_server,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Internal:
    what: str  # as the message names it
    library: str
    present: Callable[[], bool]  # seen on the classes, without an instance
    fallback: str | None  # what ktm does without it; None: it cannot run without it


def check() -> None:
    """At start-up: raise Missing for the first required internal that is gone; warn once for
    each missing one that has a fallback."""
    for internal in INTERNALS:
        if internal.present():
            continue
        if internal.fallback is None:
            raise Missing(internal.what, internal.library)
        log.warning("%s; %s", Missing(internal.what, internal.library), internal.fallback)


# ---- the list -----------------------------------------------------------------------------------


def _has(module: str, owner: str, *names: str) -> Callable[[], bool]:
    def present() -> bool:
        try:
            found = __import__(module, fromlist=[owner])
            cls = getattr(found, owner)
        except (ImportError, AttributeError):
            return False
        return all(hasattr(cls, name) for name in names)

    return present


def _all(*checks: Callable[[], bool]) -> Callable[[], bool]:
    return lambda: all(check() for check in checks)


def _takes_popen_kwargs() -> bool:
    try:
        from pyspark.java_gateway import launch_gateway
    except ImportError:
        return False
    return "popen_kwargs" in inspect.signature(launch_gateway).parameters


INTERNALS = (
    Internal(
        "RecordAccumulator._tp_lock and split_and_reenqueue", "kafka-python",
        _has("kafka.producer.record_accumulator", "RecordAccumulator", "_tp_lock",
             "split_and_reenqueue", "deallocate"),
        "producing one record at a time (several times the CPU)",
    ),
    Internal(
        "Sender._dispatch_error, force_close and add_topic", "kafka-python",
        _has("kafka.producer.sender", "Sender", "_dispatch_error", "force_close", "wakeup",
             "add_topic"),
        None,
    ),
    Internal(
        "RecordAccumulator.reenqueue and drain, Sender._maybe_remove_from_inflight_batches",
        "kafka-python",
        _all(_has("kafka.producer.record_accumulator", "RecordAccumulator", "reenqueue", "drain"),
             _has("kafka.producer.sender", "Sender", "_maybe_remove_from_inflight_batches")),
        "one produce request per partition at a time (slower across long links)",
    ),
    Internal(
        "KafkaProducer._wait_on_metadata", "kafka-python",
        _has("kafka.producer.kafka", "KafkaProducer", "_wait_on_metadata"),
        "producing one record at a time (several times the CPU)",
    ),
    Internal(
        "ConsumerCoordinator.request_rejoin, ensure_active_group, ensure_coordinator_ready_async",
        "kafka-python",
        _has("kafka.coordinator.consumer", "ConsumerCoordinator", "request_rejoin", "stable",
             "ensure_active_group", "ensure_coordinator_ready_async", "coordinator"),
        None,
    ),
    Internal(
        "KafkaAdminClient._find_coordinator_ids and _describe_groups_request", "kafka-python",
        _has("kafka.admin.client", "KafkaAdminClient", "_find_coordinator_ids",
             "_describe_groups_request"),
        None,
    ),
    Internal(
        "KafkaNetClient.connection_delay", "kafka-python",
        _has("kafka.net.compat", "KafkaNetClient", "connection_delay", "connected", "is_ready"),
        "one produce request per partition at a time (slower across long links)",
    ),
    Internal(
        "KafkaConnectionManager.send, call_soon, run and wait_for", "kafka-python",
        _all(_has("kafka.net.manager", "KafkaConnectionManager", "send", "call_soon", "run",
                  "wait_for"),
             _has("kafka.cluster", "ClusterMetadata", "leader_for_partition",
                  "leader_epoch_for_partition")),
        "a destination's tail is read without waiting for records its leader appended and "
        "has not committed (a round ended during a follower's stall may copy them twice)",
    ),
    Internal(
        "KafkaConnectionManager.broker_version_data", "kafka-python",
        _has("kafka.net.manager", "KafkaConnectionManager", "broker_version", "bootstrap_async"),
        "workers' clients bootstrap themselves (two round trips more at each start)",
    ),
    Internal(
        "SparkContext._active_spark_context", "pyspark",
        _has("pyspark", "SparkContext", "_active_spark_context", "_gateway", "_jvm"),
        None,
    ),
    Internal("launch_gateway(popen_kwargs=...)", "pyspark", _takes_popen_kwargs, None),
)  # fmt: skip

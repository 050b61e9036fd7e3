"""How ktm's config maps onto kafka-python client settings, and how errors name a cluster."""

from __future__ import annotations

import logging
from typing import TypeVar

from kafka.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
)

from relay import internals
from relay.config import ClusterConfig

log = logging.getLogger(__name__)

# Keyword arguments of a kafka-python client's constructor (untyped there: values of any kind)
ClientSettings = dict[str, object]

Client = TypeVar("Client")

# kafka-python's names for the SASL mechanisms ktm accepts (the same strings Kafka uses).
_SECURITY_PROTOCOL = {(False, False): "PLAINTEXT", (False, True): "SSL"}
_SECURITY_PROTOCOL.update({(True, False): "SASL_PLAINTEXT", (True, True): "SASL_SSL"})


# For KafkaConsumer and KafkaProducer (the admin client takes no such key): kafka-python's own
# metrics, which ktm never reads, cost a sensor update per batch, request and response.
NO_CLIENT_METRICS: ClientSettings = {"metrics_enabled": False}


def client_settings(cluster: ClusterConfig, request_timeout: float = 10.0) -> ClientSettings:
    """Map a cluster's auth/TLS keys onto kafka-python client settings."""
    settings: ClientSettings = {
        "bootstrap_servers": list(cluster.servers),
        "client_id": "ktm",
        "request_timeout_ms": int(request_timeout * 1000) + 500,
        "bootstrap_timeout_ms": int(request_timeout * 1000),
        "reconnect_backoff_max_ms": 2000,
    }
    sasl = cluster.sasl_mechanism is not None
    settings["security_protocol"] = _SECURITY_PROTOCOL[(sasl, cluster.tls)]
    if sasl:
        settings["sasl_mechanism"] = cluster.sasl_mechanism
        settings["sasl_plain_username"] = cluster.username
        settings["sasl_plain_password"] = cluster.password.value if cluster.password else None
    if cluster.tls:
        settings["ssl_cafile"] = cluster.ca_cert_path
        settings["ssl_certfile"] = cluster.client_cert_path
        settings["ssl_keyfile"] = cluster.client_key_path
    return settings


def never_create_topics(client: Client) -> Client:
    """Make every metadata request of a kafka-python client (consumer, producer, admin) ask the
    broker not to create the topics it names, and return the client.

    A broker with auto.create.topics.enable (Apache Kafka's default; Tansu always) creates any
    topic a metadata request names unless the request says not to. kafka-python 3.0.12 accepts
    `allow_auto_create_topics` but never hands it to the metadata it builds, so ktm's own
    probes and readers created topics: a failover node that came back empty got the relayed
    topic back from ktm's health checks. The flag is set where kafka-python reads it."""
    try:
        internals.metadata_config(client)["allow_auto_create_topics"] = False
    except internals.Missing as exc:
        log.warning("%s: cannot stop topic auto-creation", exc)
    return client


def describe(cluster: ClusterConfig) -> str:
    """How errors name a cluster: its name and its addresses (never its credentials)."""
    return f"{cluster.name} ({','.join(cluster.servers)})"


def is_retriable(exc: BaseException) -> bool:
    """Retry connection trouble, and errors that say they are retriable (Kafka's, the
    store's); nothing else."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return getattr(exc, "retriable", False) is True


_NOT_READY = (CoordinatorLoadInProgressError, CoordinatorNotAvailableError, NotCoordinatorError)


def not_ready(exc: BaseException) -> bool:
    """The cluster answered that its group coordinator is loading or moving (a broker just
    started or restarted): seconds of "not now", not a sign of a wrong address."""
    return isinstance(exc, _NOT_READY)

"""The /metrics and /healthz endpoints over real HTTP (port chosen by the OS)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from relay.engine.metrics import Metrics
from relay.engine.metrics_server import MetricsServer
from relay.errors import ConfigError


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_metrics_and_health_endpoints() -> None:
    metrics = Metrics()
    metrics.produced.labels("t", "0", "u", "0").inc(7)
    health = {"ok": True}
    server = MetricsServer(
        metrics, ("127.0.0.1", 0), lambda: (health["ok"], {"lag": 3, "reason": "stuck"})
    )
    try:
        status, body = get(server.port, "/metrics")
        assert status == 200
        assert 'ktm_messages_produced_total{source_partition="0",source_topic="t",' in body
        status, body = get(server.port, "/healthz")
        assert status == 200 and json.loads(body)["status"] == "ok"
        health["ok"] = False
        status, body = get(server.port, "/healthz")
        assert status == 503 and json.loads(body) == {
            "status": "unhealthy",
            "lag": 3,
            "reason": "stuck",
        }
        assert get(server.port, "/nope")[0] == 404
    finally:
        server.close()


def test_an_address_in_use_is_a_config_error_naming_the_key() -> None:
    first = MetricsServer(Metrics(), ("127.0.0.1", 0), lambda: (True, {}))
    try:
        with pytest.raises(
            ConfigError, match=rf"\[app\].metrics_addr: cannot listen on 127.0.0.1:{first.port}"
        ):
            MetricsServer(Metrics(), ("127.0.0.1", first.port), lambda: (True, {}))
    finally:
        first.close()

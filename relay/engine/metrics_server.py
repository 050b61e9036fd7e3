"""The small HTTP server for /metrics (Prometheus text) and /healthz (JSON) of a ktm process."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_client.exposition import generate_latest

from relay.errors import ConfigError

if TYPE_CHECKING:
    from relay.engine.metrics import Metrics

log = logging.getLogger(__name__)


class MetricsServer:
    """Serves /metrics (Prometheus text) and /healthz (JSON) on a background thread."""

    def __init__(
        self,
        metrics: Metrics,
        addr: tuple[str, int],
        health: Callable[[], tuple[bool, dict[str, object]]],
    ):
        handler = _handler(metrics.registry, health)
        try:
            self._server = ThreadingHTTPServer(addr, handler)
        except OSError as exc:
            raise ConfigError(
                f"[app].metrics_addr: cannot listen on {addr[0]}:{addr[1]}: {exc.strerror}"
            ) from exc
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        # A short poll interval: close() waits for the serving loop to notice.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(
    registry: CollectorRegistry, health: Callable[[], tuple[bool, dict[str, object]]]
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name BaseHTTPRequestHandler calls
            if self.path.split("?")[0] == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif self.path.split("?")[0] == "/healthz":
                ok, detail = health()
                body = json.dumps({"status": "ok" if ok else "unhealthy", **detail}).encode()
                self._send(200 if ok else 503, "application/json", body)
            else:
                self._send(404, "text/plain", b"not found: try /metrics or /healthz\n")

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("http: " + format, *args)

    return Handler

"""A real Prometheus server for the tests, and promtool (Debian's `prometheus` package).

The server listens on 127.0.0.1 on a free port, keeps its data in a directory of the test, and
reads a config the test writes (scrape and evaluation every second, so a test waits seconds,
not minutes). Tests that need it are skipped when the binaries are absent (`.ci/run` installs
them).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from testbed.ports import free_port

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
MISSING_REASON = "needs prometheus and promtool on PATH (Debian package `prometheus`)"
START_TIMEOUT = 30.0
STOP_GRACE_SECONDS = 10.0


def missing() -> bool:
    """True when the binaries are not installed: the tests that need them are skipped."""
    return PROMETHEUS is None or PROMTOOL is None


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None, MISSING_REASON
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def scrape_config(targets: Sequence[str], rule_files: Sequence[Path] = (), job: str = "ktm") -> str:
    """A prometheus.yml scraping ``targets`` (host:port) every second as ``job``."""
    return json.dumps(  # JSON is YAML: no YAML writer needed
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {
                    "job_name": job,
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "static_configs": [{"targets": list(targets)}],
                }
            ],
        },
        indent=2,
    )


class Prometheus:
    """One `prometheus` process; ``query`` and ``alerts`` read its HTTP API."""

    def __init__(self, workdir: Path, config: str):
        assert PROMETHEUS is not None, MISSING_REASON
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(config)
        self.log_path = workdir / "prometheus.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited ({self.proc.returncode}):\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready within {START_TIMEOUT}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def _get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now (its series; [] when none)."""
        try:
            data = self._get("/api/v1/query", query=expr)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{expr!r}: {exc.read().decode()}") from exc
        assert data["resultType"] == "vector", f"{expr!r} gave a {data['resultType']}"
        return list(data["result"])

    def alerts(self, name: str, state: str | None = None) -> list[dict[str, Any]]:
        """Active alerts called ``name`` (pending or firing), or only those in ``state``."""
        found = [
            a for a in self._get("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == name
        ]
        return [a for a in found if state is None or a["state"] == state]

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``condition`` every half second (queries are cheap); fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited before {what}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting until {what}")
            time.sleep(0.5)

    def stop(self) -> None:
        """SIGTERM (Prometheus flushes and exits), SIGKILL after a grace period; safe twice."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

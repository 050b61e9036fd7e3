"""Where a store keeps its files: a local directory or an S3 bucket, through pyarrow.fs.

Both backends offer the same few operations on keys relative to the store's root, and turn
pyarrow's OSErrors into one human cause (see describe_error). The one that differs is put():
- Directory: write a temporary file in the same folder (layout.temp_name), fsync it, rename it
  over the final name, fsync the folder. A crash leaves at most a temporary file, never a
  partial segment; SegmentStore.clean_leftovers() removes those.
- S3: there is no rename, but a PUT (or a completed multipart upload) appears whole or not at
  all, so the object is written straight to its final key. The whole object is encoded in
  memory first, because pyarrow's S3 output stream *completes* the upload when it is closed or
  garbage-collected after an error: a writer failing halfway through would publish a partial
  object. allow_delayed_open makes small objects a single PutObject. The size is checked after
  the upload as a last guard. An interrupted multipart upload stays invisible but billed: give
  the bucket an AbortIncompleteMultipartUpload lifecycle rule.

put_stream() writes a file too big to encode in memory (a compaction's merged segment): on a
directory exactly like put(); on S3 to a temporary key in the same folder, then moved to the
final key (a server-side copy, which appears whole or not at all) and the temporary key deleted.
A writer failing halfway publishes its partial temporary object, which is deleted at once; a
crash can leave one behind, and clean_leftovers() finds it by its name like a local one.

SeaweedFS and AWS answer HeadBucket/HeadObject with a body-less 403 for wrong credentials,
whether or not the bucket exists, so a missing bucket can only be told apart with good ones.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TypeAlias
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from relay.errors import ConfigError
from relay.store.checks import one_line
from relay.store.layout import temp_name

DEFAULT_REGION = "us-east-1"
_AWS_ERROR = re.compile(r"AWS Error (\w+) during \w+ operation:? ?(.*)", re.DOTALL)
_CREDENTIAL_ERRORS = {
    "ACCESS_DENIED",
    "SIGNATURE_DOES_NOT_MATCH",
    "INVALID_ACCESS_KEY_ID",
    "UNRECOGNIZED_CLIENT",
    "MISSING_AUTHENTICATION_TOKEN",
    "INVALID_CLIENT_TOKEN_ID",
    "EXPIRED_TOKEN",
}
_TRANSIENT_ERRORS = {
    "SLOW_DOWN",
    "SERVICE_UNAVAILABLE",
    "INTERNAL_FAILURE",
    "REQUEST_TIMEOUT",
    "REQUEST_TIME_TOO_SKEWED",
    "THROTTLING",
}


@dataclass(frozen=True)
class Cause:
    """Why an operation failed, short enough for one line, and whether a retry may help."""

    text: str
    retriable: bool = False


@dataclass(frozen=True)
class S3Settings:
    endpoint: str | None
    region: str
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)


# A writable binary file a segment is written to: a local file, or pyarrow's stream (S3, memory)
Sink: TypeAlias = BinaryIO | pa.NativeFile


class Backend:
    """Keys relative to ``root`` on ``fs``; subclasses say how to put a file atomically."""

    def __init__(self, url: str, fs: pafs.FileSystem, root: str):
        self.url = url  # what describe() shows: never credentials
        self.fs = fs
        self.root = root

    def full_path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def relative(self, path: str) -> str:
        return path[len(self.root) + 1 :] if path.startswith(self.root + "/") else path

    def put(self, key: str, data: bytes | memoryview) -> None:
        raise NotImplementedError

    def put_stream(self, key: str, write: Callable[[Sink], object]) -> None:
        """Call ``write`` with a writable binary file; ``key`` appears, whole, only if it
        returns (see the module docstring)."""
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        with self.fs.open_input_stream(self.full_path(key)) as stream:
            return bytes(stream.read())

    def open(self, key: str) -> pa.NativeFile:
        """A random-access file for reading ``key`` (close it when done)."""
        return self.fs.open_input_file(self.full_path(key))

    def delete(self, key: str) -> None:
        self.fs.delete_file(self.full_path(key))

    def list(self, key: str, *, recursive: bool) -> list[pafs.FileInfo]:
        """What lies under ``key``; an empty list if nothing does."""
        selector = pafs.FileSelector(self.full_path(key), recursive=recursive, allow_not_found=True)
        return list(self.fs.get_file_info(selector))

    def check_root(self) -> Cause | None:
        """None if the root exists (or could be made), else why not."""
        raise NotImplementedError

    def describe_error(self, exc: OSError) -> Cause:
        # pyarrow's errors with an errno (a missing file...) carry a long strerror and no
        # filename; the caller's message already names the path.
        if exc.errno is None:
            return Cause(one_line(exc))
        cause = os.strerror(exc.errno).lower()
        return Cause(f"{cause}: {exc.filename}" if exc.filename else cause)


class LocalBackend(Backend):
    def __init__(self, directory: str):
        super().__init__(directory, pafs.LocalFileSystem(), directory)

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.put_stream(key, lambda file: file.write(data))

    def put_stream(self, key: str, write: Callable[[Sink], object]) -> None:
        final = Path(self.full_path(key))
        final.parent.mkdir(parents=True, exist_ok=True)
        temp = final.with_name(temp_name(final.name))
        try:
            with temp.open("wb") as file:
                write(file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, final)
        except BaseException:
            temp.unlink(missing_ok=True)  # a failed write leaves nothing; only a crash does
            raise
        _fsync_directory(final.parent)  # makes the rename itself durable

    def check_root(self) -> Cause | None:
        Path(self.root).mkdir(parents=True, exist_ok=True)  # like mkdir -p
        return None


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class S3Backend(Backend):
    def __init__(self, bucket: str, prefix: str, settings: S3Settings):
        url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        super().__init__(url, _s3_filesystem(settings), f"{bucket}/{prefix}".rstrip("/"))
        self.bucket = bucket
        self.endpoint = settings.endpoint or f"https://s3.{settings.region}.amazonaws.com"

    def put(self, key: str, data: bytes | memoryview) -> None:
        path = self.full_path(key)
        with self.fs.open_output_stream(path) as stream:
            stream.write(data)
        size = self.fs.get_file_info(path).size
        if size != len(data):
            self.fs.delete_file(path)
            raise OSError(f"uploaded {len(data)} bytes but the object holds {size}")

    def put_stream(self, key: str, write: Callable[[Sink], object]) -> None:
        final = self.full_path(key)
        folder, name = final.rsplit("/", 1)
        temp = f"{folder}/{temp_name(name)}"
        try:
            with self.fs.open_output_stream(temp) as stream:
                write(stream)
                written = stream.tell()
            size = self.fs.get_file_info(temp).size
            if size != written:
                raise OSError(f"uploaded {written} bytes but the object holds {size}")
            self.fs.move(temp, final)
        except BaseException:
            self._delete_quietly(temp)
            raise

    def _delete_quietly(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except OSError:
            pass  # gone already, or the store is unreachable: clean_leftovers() gets it later

    def check_root(self) -> Cause | None:
        if self.fs.get_file_info(self.bucket).type == pafs.FileType.NotFound:
            return Cause(f"bucket {self.bucket!r} does not exist")
        return None

    def describe_error(self, exc: OSError) -> Cause:
        match = _AWS_ERROR.search(str(exc))
        if match is None:
            return super().describe_error(exc)
        code, detail = match[1], one_line(Exception(match[2]))
        if code in _CREDENTIAL_ERRORS:
            return Cause("access denied (check s3_access_key/s3_secret_key)")
        if code == "NO_SUCH_BUCKET":
            return Cause(f"bucket {self.bucket!r} does not exist")
        if code == "NETWORK_CONNECTION":
            return Cause(self._network_cause(detail), retriable=True)
        return Cause(f"S3 error {code}: {detail}", retriable=code in _TRANSIENT_ERRORS)

    def _network_cause(self, detail: str) -> str:
        # curl's codes: 6 cannot resolve, 7 cannot connect, 28 timed out.
        if "curlCode: 6," in detail:
            return f"cannot resolve the host of {self.endpoint}"
        if "curlCode: 7," in detail:
            return f"cannot connect to {self.endpoint}"
        if "curlCode: 28," in detail:
            return f"timed out talking to {self.endpoint}"
        return f"network error talking to {self.endpoint}: {detail}"


def _s3_filesystem(settings: S3Settings) -> pafs.S3FileSystem:
    options: dict[str, str | bool | None] = {
        "region": settings.region,
        "allow_delayed_open": True,
    }
    if settings.endpoint:
        parsed = urlparse(settings.endpoint)
        options["scheme"] = parsed.scheme
        options["endpoint_override"] = parsed.netloc
    if settings.access_key is not None:
        options["access_key"] = settings.access_key
        options["secret_key"] = settings.secret_key
    return pafs.S3FileSystem(**options)


def open_backend(
    url: str,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
) -> Backend:
    """The backend for a store URL; ConfigError naming the URL if it cannot be one."""
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        bucket, prefix = parsed.netloc, parsed.path.strip("/")
        if not bucket:
            raise ConfigError(f"store URL {url!r}: no bucket (expected s3://bucket/prefix)")
        _check_s3_settings(url, endpoint, access_key, secret_key)
        settings = S3Settings(endpoint, region or DEFAULT_REGION, access_key, secret_key)
        return S3Backend(bucket, prefix, settings)
    if any(v is not None for v in (endpoint, region, access_key, secret_key)):
        raise ConfigError(f"store URL {url!r}: endpoint, region and keys apply to s3:// only")
    if parsed.scheme == "file":
        return LocalBackend(os.path.abspath(unquote(parsed.path)))
    if len(parsed.scheme) > 1 or not url:  # one letter is a Windows drive, not a scheme
        raise ConfigError(f"store URL {url!r}: expected a directory, file:// or s3:// URL")
    return LocalBackend(os.path.abspath(os.path.expanduser(url)))


def _check_s3_settings(
    url: str, endpoint: str | None, access_key: str | None, secret_key: str | None
) -> None:
    if (access_key is None) != (secret_key is None):
        raise ConfigError(f"store {url}: give both the access key and the secret key, or neither")
    if endpoint is not None:
        parsed = urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.path.strip("/"):
            raise ConfigError(
                f"store {url}: endpoint {endpoint!r} must look like http://host:port "
                "or https://host"
            )

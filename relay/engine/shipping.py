"""What the driver ships to Spark executors: the installed `relay` package as one zip, which
`addPyFile` puts first on every executor's path (workers need no copy of ktm).

Beside each module's source the zip holds its bytecode when the driver has it fresh (pip
compiles the package at install): without it every new Python worker compiled ~100 modules
from the zip before its first task (~0.5 CPU s each, seen in a profile at 2,000 partitions).
The bytecode is written as a *checked hash-based* pyc (PEP 552): zipimport takes it only if it
hashes the source in the zip to the same value, so a stale file can never run; a worker of
another Python version finds a magic number it does not know and compiles the source instead.
"""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

from relay.errors import RelayError

# What an executor imports first (the task entry point and its loop), relative to the package.
_EXECUTOR_ENTRY = ("__init__.py", "engine/spark.py", "engine/executor/task.py", "spec.py")
_CHECKED_HASH = (0b11).to_bytes(4, "little")  # PEP 552 flags: hash-based, check the source
_HEADER = 16  # magic, flags, mtime and size (or an 8-byte hash)


def package_zip(log_dir: Path) -> Path:
    """Zip the installed `relay` package, whole and nothing else.

    The package is found from `relay` itself, not from this file's folder: zipping the folder
    of the module doing the zipping under the name `relay` once shipped the engine as the
    package (every executor then failed to import ktm)."""
    import relay

    package = Path(relay.__file__).resolve().parent
    files = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    check_whole(package, files)
    target = log_dir / "ktm-relay.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in files:
            name = (Path("relay") / path.relative_to(package)).as_posix()
            source = path.read_bytes()
            zf.writestr(_entry(name, path), source)
            compiled = _bytecode(path, source)
            if compiled is not None:
                zf.writestr(_entry(name[:-3] + ".pyc", path), compiled)
    return target


def _entry(name: str, path: Path) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo.from_file(path, name)
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def _bytecode(path: Path, source: bytes) -> bytes | None:
    """The module's cached bytecode as a checked hash-based pyc, or None when the cache is
    missing or not the source's (an edited checkout): the executor then compiles the source."""
    try:
        cached = Path(importlib.util.cache_from_source(str(path))).read_bytes()
        stat = path.stat()
    except (OSError, NotImplementedError):
        return None
    fresh = (
        len(cached) > _HEADER
        and cached[:4] == importlib.util.MAGIC_NUMBER
        and cached[4:8] == bytes(4)  # timestamp-based, as the import system writes them
        and int.from_bytes(cached[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
        and int.from_bytes(cached[12:16], "little") == len(source) & 0xFFFFFFFF
    )
    if not fresh:
        return None
    source_hash = importlib.util.source_hash(source)
    return importlib.util.MAGIC_NUMBER + _CHECKED_HASH + source_hash + cached[_HEADER:]


def check_whole(package: Path, files: list[Path]) -> None:
    """The package to ship must hold what executors import, and every folder of it must be a
    package; otherwise executors would fail later with an ImportError far from the cause."""
    present = {path.relative_to(package).as_posix() for path in files}
    missing = [name for name in _EXECUTOR_ENTRY if name not in present]
    folders = {path.parent for path in files if path.parent != package}
    missing += sorted(
        (folder / "__init__.py").relative_to(package).as_posix()
        for folder in folders
        if not (folder / "__init__.py").is_file()
    )
    if missing:
        raise RelayError(
            f"cannot ship ktm to Spark executors: {package / missing[0]} not found (the relay "
            f"package at {package} is incomplete; reinstall ktm)"
        )

"""`ktm --version`: ktm's version and what it runs on, the lines a bug report needs.

Read without starting anything: package versions from their installed metadata (importing
pyspark would cost a second), Java's from `java -version`, found where PySpark looks for it
(JAVA_HOME, then PATH).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata

from relay import __version__

JAVA_TIMEOUT = 10.0  # seconds; `java -version` takes ~0.1 s


def version_lines() -> list[str]:
    return [
        f"ktm {__version__}",
        f"Python {platform.python_version()} ({sys.executable})",
        f"PySpark {_installed('pyspark')}",
        f"kafka-python {_installed('kafka-python')}",
        f"Java {_java()}",
    ]


def _installed(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return "not found (PySpark needs Java 17: set JAVA_HOME or put java on PATH)"
    try:
        run = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=JAVA_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({java}: {exc})"
    # e.g. 'openjdk version "17.0.15" 2025-04-15' (java -version writes to stderr)
    match = re.search(r'^(\S+) version "([^"]+)"', run.stderr, re.MULTILINE)
    if match is None:
        return f"unknown ({java} printed no version)"
    return f"{match.group(2)} ({match.group(1)}, {java})"

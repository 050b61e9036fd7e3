"""What the numbers were measured on: machine, load and code version, printed first."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout


def code_version() -> str:
    """HEAD plus what is uncommitted in relay/: numbers from a dirty tree must say so."""
    head = _git("rev-parse", "--short", "HEAD").strip() or "?"
    dirty = [line[3:] for line in _git("status", "--porcelain", "--", "relay").splitlines()]
    return f"git {head}; uncommitted in relay/: {', '.join(dirty) or 'none'}"


def header(settings: str, ktm: str, brokers: str) -> str:
    rule = "=" * 100
    return "\n".join(
        [
            rule,
            f"ktm benchmark  {time.strftime('%Y-%m-%d %H:%M:%S')}",
            f"machine: {os.cpu_count()} CPUs ({cpu_model()}), {ram_gib():.1f} GiB RAM, "
            f"Python {platform.python_version()}, load average {load_average()} at start",
            f"code:    {code_version()}",
            f"ktm:     {ktm}",
            f"runs:    {settings}",
            f"brokers: {brokers}",
            rule,
        ]
    )

"""The README's try-it command, read from README.md (never copied here), run in a fresh virtualenv
from a fresh copy of the repository: it must exit 0 and print the count it promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.release.conftest import REPO, fresh_copy

pytestmark = [pytest.mark.timeout(900)]

README = REPO / "README.md"


def try_it() -> tuple[str, int]:
    """The first bash block after "**Try it**", and the record count its paragraph promises."""
    after = README.read_text().split("**Try it**", 1)[1]
    promise = re.search(r"([\d,]+) demo records", after.split("```", 1)[0])
    assert promise is not None, "the try-it paragraph names no record count"
    command = after.split("```bash\n", 1)[1].split("```", 1)[0].strip()
    return command, int(promise.group(1).replace(",", ""))


def test_the_readme_try_it_command_runs_and_prints_the_promised_count(tmp_path: Path):
    command, promised = try_it()
    clone = fresh_copy(tmp_path / "ktm")
    # A fresh shell: not inside the test runner's virtualenv.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    here = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != here)
    try:
        run = subprocess.run(
            ["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True,
            timeout=840, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:  # the brokers must not outlive the test, whatever happened
        stopper = clone / ".venv" / "bin" / "python"
        if stopper.exists():
            subprocess.run([stopper, "scripts/local_brokers.py", "stop"], cwd=clone,
                           capture_output=True, timeout=60)  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert f"total: {promised}" in run.stdout, output[-4000:]

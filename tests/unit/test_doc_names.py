"""Every `relay.x.y` that the docs or relay's own docstrings and comments name exists: a moved
or renamed module leaves no reader following a dead name."""

from __future__ import annotations

import importlib
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOTTED = re.compile(r"\brelay(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
FILE_NAMES = (".py", ".toml", ".zip", ".md", ".json")  # relay.py, relay.toml: files, not modules


def texts(path: Path) -> Iterator[str]:
    """A document whole; of a module, only its strings and comments."""
    source = path.read_text()
    if path.suffix == ".md":
        yield source
        return
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.STRING, tokenize.COMMENT):
            yield token.string


def resolves(dotted: str) -> bool:
    """The longest importable prefix, then attributes for the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(found, attr):
                return False
            found = getattr(found, attr)
        return True
    return False


def named() -> Iterator[tuple[str, str]]:
    files = [*sorted((ROOT / "relay").rglob("*.py")), *sorted((ROOT / "docs").glob("*.md"))]
    for path in [*files, ROOT / "README.md"]:
        for text in texts(path):
            for match in DOTTED.finditer(text):
                name = match.group(0)
                if not name.endswith(FILE_NAMES):
                    yield str(path.relative_to(ROOT)), name


def test_every_named_module_exists() -> None:
    names = list(named())
    assert len(names) > 50  # the scan found the names it is there to check
    dead = sorted({(where, name) for where, name in names if not resolves(name)})
    assert dead == [], f"names of nothing: {dead}"


def test_a_dead_name_is_caught() -> None:
    assert resolves("relay.spec.PROVENANCE_HEADER")
    assert not resolves("relay.engine.executor.writers")
    assert not resolves("relay.spec.NO_SUCH_NAME")

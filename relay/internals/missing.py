"""`Missing`: what a library internal that is not where it was raises (relay.internals)."""

from __future__ import annotations

from importlib import metadata
from typing import Any

from relay.errors import KtmError

KAFKA_PYTHON = "3.0"  # the versions these were read from, and tested on
PYSPARK = "4.3"


class Missing(KtmError):
    """A library internal ktm uses is not where it was: the library changed (exit 1)."""

    def __init__(self, what: str, library: str = "kafka-python"):
        wanted = KAFKA_PYTHON if library == "kafka-python" else PYSPARK
        super().__init__(
            f"{library} {wanted} is needed (found {_installed(library)}): {what} is missing"
        )


def attr(owner: object, name: str, what: str) -> Any:
    """`owner.name`, or Missing naming `what`."""
    try:
        return getattr(owner, name)
    except AttributeError:
        raise Missing(what, "pyspark" if "Spark" in what else "kafka-python") from None


def _installed(library: str) -> str:
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return "none"

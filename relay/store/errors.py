"""Errors of the segment store. Both are KtmErrors: the CLI prints them as one line."""

from __future__ import annotations

from relay.errors import KtmError


class StoreError(KtmError):
    """The store (a directory or an S3 bucket) cannot be used: names the URL and a short cause.

    ``retriable`` is True for causes that may go away by themselves (a network error, a timeout),
    False for the ones an operator must fix (missing bucket, wrong credentials, permissions).
    """

    def __init__(self, message: str, *, retriable: bool = False):
        super().__init__(message)
        self.retriable = retriable


class SegmentError(KtmError):
    """A segment file is corrupt, truncated, or does not match its name: names the file."""

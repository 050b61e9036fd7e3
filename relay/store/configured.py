"""The store a `[store]` section names, opened with its settings (and, on executors, cached per
worker process, since opening an S3 filesystem costs a round of credential and region set-up)."""

from __future__ import annotations

from relay.config import StoreConfig
from relay.store.store import SegmentStore, open_store

_cache: dict[StoreConfig, SegmentStore] = {}


def store_of(cfg: StoreConfig) -> SegmentStore:
    if not cfg.url.startswith("s3://"):
        return open_store(cfg.url)
    return open_store(
        cfg.url,
        endpoint=cfg.s3_endpoint,
        region=cfg.s3_region,
        access_key=cfg.s3_access_key.value if cfg.s3_access_key else None,
        secret_key=cfg.s3_secret_key.value if cfg.s3_secret_key else None,
    )


def cached_store(cfg: StoreConfig) -> SegmentStore:
    if cfg not in _cache:
        _cache[cfg] = store_of(cfg)
    return _cache[cfg]

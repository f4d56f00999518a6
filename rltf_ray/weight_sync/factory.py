"""Builds the configured WeightSync; apart from the interface, which the implementations import."""
from __future__ import annotations

import torch

from rltf_ray.errors import ConfigError
from rltf_ray.weight_sync.interfaces import WeightSync


def make_weight_sync(kind: str, dtype: torch.dtype, keep: tuple[str, str] | None = None,
                     tensor_parallel_size: int = 1) -> WeightSync:
    if kind == "object_store":
        from rltf_ray.weight_sync.object_store import ObjectStoreSync

        return ObjectStoreSync(dtype, keep)
    if kind in ("nccl", "gloo"):
        from rltf_ray.weight_sync.collective import CollectiveSync

        return CollectiveSync(dtype, kind, tensor_parallel_size)
    raise ConfigError(f"trainer.weight_sync: expected 'object_store', 'nccl' or 'gloo', got {kind!r}")

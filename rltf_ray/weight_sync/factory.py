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
    if kind == "nccl":
        from rltf_ray.weight_sync.nccl import NcclSync

        return NcclSync(dtype, tensor_parallel_size)
    raise ConfigError(f"trainer.weight_sync: expected 'object_store' or 'nccl', got {kind!r}")

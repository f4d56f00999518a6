"""Who owns what in a weight sync.

The trainer owns the authoritative weights; rank 0 gathers the full state (ZeRO-3 shards
are gathered on every rank first) and is the only sender. Each engine owns its copy and a
policy version; after `push` returns, every engine serves `version`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterable

import torch


class WeightSync(ABC):
    @abstractmethod
    def connect(self, engines: list) -> None:
        """Called once on trainer rank 0 before the first push; opens any channel."""

    @abstractmethod
    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Send the full weights; returns once every engine serves `version`."""

    @abstractmethod
    def engine_versions(self) -> list[int]:
        """The policy version each engine serves now."""

    @abstractmethod
    def close(self) -> None:
        """Release channels; the engines keep their weights."""


def make_weight_sync(kind: str, dtype: torch.dtype, keep: tuple[str, str] | None = None) -> WeightSync:
    from rltf_ray.config import ConfigError

    if kind == "object_store":
        from rltf_ray.weight_sync.object_store import ObjectStoreSync

        return ObjectStoreSync(dtype, keep)
    if kind == "nccl":
        from rltf_ray.weight_sync.nccl import NcclSync

        return NcclSync(dtype)
    raise ConfigError(f"trainer.weight_sync: expected 'object_store' or 'nccl', got {kind!r}")

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
    def close(self) -> None:
        """Release channels; the engines keep their weights."""

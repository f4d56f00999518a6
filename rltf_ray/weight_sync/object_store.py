"""CPU path: one copy of the weights in the Ray object store, read by every engine."""
from __future__ import annotations

import ray
import torch

from rltf_ray.weight_sync.interfaces import WeightSync


class ObjectStoreSync(WeightSync):
    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.engines: list = []

    def connect(self, engines: list) -> None:
        self.engines = list(engines)

    def push(self, named_tensors, version: int) -> None:
        payload = [(n, t.detach().to("cpu", self.dtype).contiguous()) for n, t in named_tensors]
        ref = ray.put(payload)
        ray.get([e.load_weights.remote(ref, version) for e in self.engines])
        del ref

    def engine_versions(self) -> list[int]:
        return ray.get([e.ready.remote() for e in self.engines])

    def close(self) -> None:
        self.engines = []

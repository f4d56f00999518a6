"""CPU path: one copy of the weights in the Ray object store, read by every engine."""
from __future__ import annotations

import ray
import torch

from rltf_ray.weight_sync.interfaces import WeightSync


class ObjectStoreSync(WeightSync):
    """`keep` = (broker name, slot): after each push the broker holds a reference to the
    weights, which an engine that Ray restarts loads before serving (see PolicyEngine)."""

    def __init__(self, dtype: torch.dtype, keep: tuple[str, str] | None = None):
        self.dtype = dtype
        self.keep = keep
        self.engines: list = []

    def connect(self, engines: list) -> None:
        self.engines = list(engines)

    def push(self, named_tensors, version: int) -> None:
        # copy=True: DeepSpeed's parameters are views into one flat buffer, and pickling a
        # view pickles its whole storage -- once per parameter (measured: GBs per sync).
        payload = [(n, t.detach().to(device="cpu", dtype=self.dtype, copy=True))
                   for n, t in named_tensors]
        ref = ray.put(payload)
        ray.get([e.load_weights.remote(ref, version) for e in self.engines])
        if self.keep:
            broker, slot = self.keep
            ray.get(ray.get_actor(broker).keep_weights.remote(slot, [ref], version))
        del ref

    def engine_versions(self) -> list[int]:
        return ray.get([e.ready.remote() for e in self.engines])

    def close(self) -> None:
        self.engines = []

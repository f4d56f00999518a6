"""CPU path: one copy of the weights in the Ray object store, read by every engine."""
from __future__ import annotations

import warnings

import numpy as np
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
        ref = ray.put(pack(named_tensors, self.dtype))
        calls = [e.load_weights.remote(ref, version) for e in self.engines]
        if self.keep:
            # kept while the engines load rather than after them: the broker's fetch of the
            # payload (0.01-0.13 s for SmolLM2, measured 2026-12-03) overlaps the load
            broker, slot = self.keep
            calls.append(ray.get_actor(broker).keep_weights.remote(slot, [ref], version))
        ray.get(calls)
        del ref


    def close(self) -> None:
        self.engines = []


def pack(named_tensors, dtype: torch.dtype) -> list[tuple[str, str, np.ndarray | str]]:
    """(name, torch dtype, array) triples for `ray.put`. A torch tensor pickles its bytes in
    band (through torch.save: 1.5 s out and 0.7 s back for SmolLM2's 0.65 GB,
    benchmarks/bench_weight_payload.py); a numpy array goes out of band, written once into
    the object store and read there without a copy, and a view (DeepSpeed's parameters are
    views into one flat buffer) carries only its own bytes. numpy has no bfloat16, so
    16-bit weights travel as int16 bit patterns. A tensor that is the same memory as an
    earlier one (a tied embedding and LM head: 17% of SmolLM2's payload) travels once, as
    (name, ALIAS, the earlier name)."""
    out, seen = [], {}
    for name, t in named_tensors:
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key in seen:
            out.append((name, ALIAS, seen[key]))
            continue
        seen[key] = name
        t = t.detach().to(device="cpu", dtype=dtype).contiguous()
        out.append((name, str(dtype).split(".")[-1],
                    t.view(torch.int16).numpy() if t.element_size() == 2 else t.numpy()))
    return out


ALIAS = "alias"  # pack's dtype field for a tensor sent once under an earlier name


def unpack(payload) -> list[tuple[str, torch.Tensor]]:
    """The tensors of `pack`'s triples, as read-only views of the object store's memory:
    vLLM's weight loaders copy each one into the model's own parameter."""
    got: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, dtype, a in payload:
            got[name] = got[a] if dtype == ALIAS else torch.from_numpy(a).view(getattr(torch, dtype))
    return list(got.items())

"""Collective weight sync: trainer rank 0 broadcasts every parameter into every engine
worker, the OpenRLHF / vLLM-RLHF-example pattern, over a transport (weight_sync/transports.py):
`nccl` between GPUs, `gloo` between CPU processes.

Rank layout: trainer rank 0 is rank 0 of a group that also holds each engine's workers
(with T workers per engine, engine i's worker r is rank 1 + i*T + r). The engines join
first, through the worker extension below (`worker_extension_cls`), then rank 0 opens the
group. A push sends the names, dtype and shapes to every worker, then broadcasts the full
tensors in that order; each worker receives them into fresh buffers and reloads them in
place (vLLM's `reload_weights`), whose weight loaders keep the worker's tensor-parallel shard.

Run here (CPU, gloo, the tiny model, tests/test_weight_sync.py): the whole protocol,
including Bi-NAC's held reference copies. Never run here: the NCCL transport and
tensor-parallel engines (no GPU on the build machine).
"""
from __future__ import annotations

import socket

import ray
import torch

from rltf_ray.weight_sync.interfaces import WeightSync
from rltf_ray.weight_sync.transports import TRANSPORTS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class CollectiveSync(WeightSync):
    def __init__(self, dtype: torch.dtype, transport: str, tensor_parallel_size: int = 1):
        self.dtype = dtype
        self.transport = TRANSPORTS[transport]()
        self.tp = tensor_parallel_size
        self.engines: list = []
        self.group = None

    def connect(self, engines: list) -> None:
        self.engines = list(engines)
        host = ray.util.get_node_ip_address()
        port = _free_port()
        world = 1 + len(engines) * self.tp
        # Engines join first (their calls block until rank 0 opens the group); collective_rpc
        # reaches every worker of an engine, which adds its own rank within the engine.
        joins = [e.collective_rpc.remote("init_weight_group",
                                         {"host": host, "port": port, "rank_offset": 1 + i * self.tp,
                                          "world_size": world, "transport": self.transport.name})
                 for i, e in enumerate(engines)]
        self.group = self.transport.group(host, port, 0, world)
        ray.get(joins)

    def push(self, named_tensors, version: int) -> None:
        device = self.transport.device()
        items = [(n, t.detach().to(self.dtype)) for n, t in named_tensors]
        meta = {"names": [n for n, _ in items], "dtype": str(self.dtype).split(".")[-1],
                "shapes": [list(t.shape) for _, t in items]}
        done = [e.collective_rpc.remote("receive_weights", meta, version) for e in self.engines]
        for _, t in items:
            self.transport.broadcast(self.group, t.to(device).contiguous())
        self.transport.synchronize()
        ray.get(done)

    def close(self) -> None:
        self.group = None
        self.engines = []


class EngineWorkerExtension:
    """Mixed into each vLLM worker (`worker_extension_cls`) of an engine that receives
    weights collectively."""

    def init_weight_group(self, host: str, port: int, rank_offset: int, world_size: int,
                          transport: str = "nccl") -> None:
        # self.rank: this worker's rank within its engine (0 with one worker per engine)
        self.weight_transport = TRANSPORTS[transport]()
        self.weight_group = self.weight_transport.group(host, port, rank_offset + self.rank, world_size,
                                                        self.device)

    def receive_weights(self, names: list[str], dtype: str, shapes: list[list[int]]) -> None:
        t = self.weight_transport
        device = t.device(self.device)
        weights = []
        for name, shape in zip(names, shapes):
            buf = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
            t.broadcast(self.weight_group, buf)
            weights.append((name, buf))
        t.synchronize()
        # vLLM's in-place reload: it re-runs the loaders on weights already processed after
        # loading (the model's own load_weights fails on those: found over gloo on CPU)
        self.reload_weights(weights_iterator=iter(weights))
        if getattr(self, "rltf_hold", False):  # Bi-NAC's reference actor needs a host copy
            self.rltf_held["current"] = [(n, w.to("cpu")) for n, w in weights]

    # Bi-NAC's reference actor (PolicyEngine with reference_every): the current and the
    # reference weights are held in host memory, so that a GPU engine's memory stays the
    # KV cache's.

    def hold_weights(self, on: bool) -> None:
        self.rltf_hold = on
        self.rltf_held = {"current": None, "reference": None}  # None: the model on disk

    def hold_reference(self) -> None:
        self.rltf_held["reference"] = self.rltf_held["current"]

    def load_held(self, which: str) -> None:
        held = self.rltf_held[which]
        if held is None:
            self.reload_weights()  # from the checkpoint the engine started with
        else:
            # one tensor on the device at a time, not a second copy of the model
            self.reload_weights(weights_iterator=((n, w.to(self.device)) for n, w in held))

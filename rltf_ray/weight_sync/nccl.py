"""GPU path (NOT verified: the build machine has no GPU): NCCL broadcast from trainer
rank 0 into every engine worker, the OpenRLHF / vLLM-RLHF-example pattern.

Trainer rank 0 is rank 0 of a StatelessProcessGroup that also holds each engine's worker
(with T GPUs per engine, engine i's worker r is rank 1 + i*T + r). For every parameter,
rank 0 broadcasts the full tensor; every engine worker receives it into a fresh buffer and
calls the model's load_weights, whose weight loaders keep the worker's tensor-parallel shard.
"""
from __future__ import annotations

import socket

import ray
import torch

from rltf_ray.weight_sync.interfaces import WeightSync


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class NcclSync(WeightSync):
    def __init__(self, dtype: torch.dtype, tensor_parallel_size: int = 1):
        self.dtype = dtype
        self.tp = tensor_parallel_size
        self.engines: list = []
        self.comm = None

    def connect(self, engines: list) -> None:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        self.engines = list(engines)
        host = ray.util.get_node_ip_address()
        port = _free_port()
        world = 1 + len(engines) * self.tp
        # Engines join first (their calls block until rank 0 creates the store); collective_rpc
        # reaches every worker of an engine, which adds its own rank within the engine.
        joins = [e.collective_rpc.remote("init_weight_group",
                                         {"host": host, "port": port, "rank_offset": 1 + i * self.tp,
                                          "world_size": world})
                 for i, e in enumerate(engines)]
        pg = StatelessProcessGroup.create(host=host, port=port, rank=0, world_size=world)
        self.comm = PyNcclCommunicator(pg, device=torch.cuda.current_device())
        ray.get(joins)

    def push(self, named_tensors, version: int) -> None:
        items = [(n, t.detach().to(self.dtype)) for n, t in named_tensors]
        meta = {"names": [n for n, _ in items], "dtype": str(self.dtype).split(".")[-1],
                "shapes": [list(t.shape) for _, t in items]}
        done = [e.collective_rpc.remote("receive_weights", meta, version) for e in self.engines]
        stream = torch.cuda.current_stream()
        for _, t in items:
            self.comm.broadcast(t.cuda().contiguous(), src=0, stream=stream)
        stream.synchronize()
        ray.get(done)


    def close(self) -> None:
        self.comm = None
        self.engines = []


class EngineWorkerExtension:
    """Mixed into each vLLM GPU worker via `worker_extension_cls`."""

    def init_weight_group(self, host: str, port: int, rank_offset: int, world_size: int) -> None:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        # self.rank: this worker's rank within its engine (0 with one GPU per engine)
        pg = StatelessProcessGroup.create(host=host, port=port, rank=rank_offset + self.rank,
                                          world_size=world_size)
        self.weight_comm = PyNcclCommunicator(pg, device=self.device)

    def receive_weights(self, names: list[str], dtype: str, shapes: list[list[int]]) -> None:
        weights = []
        stream = torch.cuda.current_stream()
        for name, shape in zip(names, shapes):
            buf = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            self.weight_comm.broadcast(buf, src=0, stream=stream)
            weights.append((name, buf))
        stream.synchronize()
        self.model_runner.model.load_weights(weights=weights)
        if getattr(self, "rltf_hold", False):  # Bi-NAC's reference actor needs a host copy
            self.rltf_held["current"] = [(n, w.to("cpu")) for n, w in weights]

    # Bi-NAC's reference actor on GPU (PolicyEngine with reference_every): the current and
    # the reference weights are held in host memory, so that the engine's GPU memory stays
    # the KV cache's. Untested here: this machine has no GPU.

    def hold_weights(self, on: bool) -> None:
        self.rltf_hold = on
        self.rltf_held = {"current": None, "reference": None}  # None: the model on disk

    def hold_reference(self) -> None:
        self.rltf_held["reference"] = self.rltf_held["current"]

    def load_held(self, which: str) -> None:
        held = self.rltf_held[which]
        if held is None:
            self.model_runner.reload_weights()  # from the checkpoint the engine started with
        else:
            # one tensor on the GPU at a time, not a second copy of the model
            self.model_runner.model.load_weights(weights=((n, w.to(self.device)) for n, w in held))

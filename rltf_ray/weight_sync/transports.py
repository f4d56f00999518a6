"""The channel a collective weight sync broadcasts over: NCCL between GPUs, gloo between
CPU processes. The protocol (weight_sync/collective.py) is the same over both, so the gloo
transport runs it end to end on a CPU machine; only `NcclTransport` is GPU-only code.

A transport builds one group of `world` ranks (trainer rank 0 and every engine worker)
from a host and port that rank 0 listens on, and broadcasts from rank 0 in place."""
from __future__ import annotations

import datetime

import torch

TIMEOUT = datetime.timedelta(minutes=10)  # a rank that never joins fails the run, not hangs it


class GlooTransport:
    """torch's gloo process group over a TCPStore of its own: independent of the default
    process group that Ray Train (the trainer) and vLLM (each engine) already set up."""

    name = "gloo"

    def device(self, worker_device=None) -> torch.device:
        return torch.device("cpu")

    def group(self, host: str, port: int, rank: int, world: int, device=None):
        import torch.distributed as dist

        store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=TIMEOUT)
        return dist.ProcessGroupGloo(dist.PrefixStore("rltf_weights", store), rank, world, TIMEOUT)

    def broadcast(self, group, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        group.broadcast([tensor], opts).wait()

    def synchronize(self) -> None:
        pass


class NcclTransport:
    """vLLM's PyNccl communicator over a StatelessProcessGroup (the OpenRLHF and vLLM RLHF
    example pattern). GPU only; NOT run on the CPU build machine."""

    name = "nccl"

    def device(self, worker_device=None) -> torch.device:
        return worker_device if worker_device is not None else torch.device("cuda", torch.cuda.current_device())

    def group(self, host: str, port: int, rank: int, world: int, device=None):
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        pg = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world)
        return PyNcclCommunicator(pg, device=device if device is not None else torch.cuda.current_device())

    def broadcast(self, group, tensor: torch.Tensor) -> None:
        group.broadcast(tensor, src=0, stream=torch.cuda.current_stream())

    def synchronize(self) -> None:
        torch.cuda.current_stream().synchronize()


TRANSPORTS = {"gloo": GlooTransport, "nccl": NcclTransport}

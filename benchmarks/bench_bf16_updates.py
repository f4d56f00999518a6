"""How much of the model a few small optimizer steps move, with the learner in fp32 against
bf16 (DeepSpeed's bf16 mode: fp32 master weights, bf16 module weights that the forward, the
backward and the weight sync use) (docs/benchmarks.md, "What a bf16 learner's steps move").

    .venv/bin/python benchmarks/bench_bf16_updates.py [--model smollm2] [--steps 3] [--lr 1e-5]

For each learner precision: the model as `rltf_ray.learner.build_model` makes it (fp32 LM head
in bf16), DeepSpeed ZeRO-2 on one gloo rank, `--steps` AdamW steps of two micro-batches of
language-model loss on fixed random tokens. Printed: the share of module weights that changed,
their mean |change|, and (bf16) the fp32 master weights' mean |change|."""
from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def run(path: str, dtype: str, steps: int, lr: float, ids) -> str:
    import deepspeed
    import torch

    from rltf_ray.config import Config, ModelConfig, TrainerConfig
    from rltf_ray.learner import build_model, deepspeed_config

    cfg = Config(model=ModelConfig(path=path, dtype=dtype, head_dtype="float32"),
                 trainer=TrainerConfig(zero_stage=2, lr=lr, micro_batch_size=4))
    model = build_model(path, cfg)
    before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    eng, *_ = deepspeed.initialize(model=model, optimizer=opt, config=deepspeed_config(cfg),
                                   dist_init_required=False)
    for _ in range(steps):
        for i in range(2):
            eng.set_gradient_accumulation_boundary(i == 1)
            batch = ids[i * 4:(i + 1) * 4]
            eng.backward(eng(input_ids=batch, labels=batch).loss, scale_wrt_gas=False)
        eng.step()
    changed = total = 0
    moved = 0.0
    for n, p in eng.module.named_parameters():
        d = p.detach().float() - before[n]
        changed, total, moved = changed + int((d != 0).sum()), total + d.numel(), moved + float(d.abs().sum())
    line = f"| {dtype} | {changed / total:.4f} | {moved / total:.2e} |"
    if dtype == "bfloat16":  # ZeRO-2's fp32 partition, in the module's parameter order (one rank)
        master = torch.cat([g.float() for g in eng.optimizer.single_partition_of_fp32_groups])
        start = torch.cat([before[n].flatten() for n, _ in eng.module.named_parameters()])
        line += f" {float((master[:start.numel()] - start).abs().mean()):.2e} |"
    else:
        line += " (the weights themselves) |"
    return line


def main(argv=None) -> int:
    import deepspeed
    import torch
    import torch.distributed as dist

    from rltf_ray.models import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-5)
    a = ap.parse_args(argv)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    ids = torch.randint(0, 400, (8, 48))
    path = resolve_model(a.model)
    print(f"{a.model}: {a.steps} AdamW steps at lr {a.lr:g}, ZeRO-2, one rank")
    print("| learner | module weights changed | mean \\|change\\| | fp32 master mean \\|change\\| |")
    print("| --- | --- | --- | --- |")
    for dtype in ("float32", "bfloat16"):
        print(run(path, dtype, a.steps, a.lr, ids), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU smoke check of the learner's device handling (run on a CUDA machine).

    RLTF_TINY=<tiny model folder> python benchmarks/gpu_check.py

Runs every SD weighting and the KL path of `objectives.micro_loss` with the tiny model on
CUDA and on CPU and compares loss values and gradients, then an NCCL all-reduce (world 1).
It does not exercise vLLM or the NCCL weight broadcast (those need the CUDA vLLM build)."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rltf_ray.config import Config, LossConfig  # noqa: E402
from rltf_ray.examples import Example, step_normalisers  # noqa: E402
from rltf_ray.forward import sequence_logprobs  # noqa: E402
from rltf_ray.objectives import micro_loss  # noqa: E402


def run(device: str, weight: str, kl: float):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(os.environ["RLTF_TINY"], dtype=torch.float32).to(device)
    ex = [Example([1, 7, 8, 9, 10], 2, "sd", 0.6, x1_ids=[1, 7, 30, 31]),
          Example([1, 7, 11, 12], 2, "rl0", -0.3, 0.7, behav_logp=[-6.0, -6.1]),
          Example([1, 5, 6, 7, 8], 3, "fm")]
    sd = [e for e in ex if e.term == "sd"]
    for e, lp in zip(sd, sequence_logprobs(model, [(e.x1_ids + e.ids[e.start:], len(e.x1_ids)) for e in sd],
                                              [1.0] * len(sd), 0, 4)):
        e.logp_x1 = lp
    if kl:
        for e, lp in zip(ex[1:2], sequence_logprobs(model, [(ex[1].ids, ex[1].start)], [0.7], 0, 4)):
            e.ref_logp = [v - 0.1 for v in lp]
    cfg = Config(loss=LossConfig(sd_weight=weight, kl_coef=kl, turn1_rl=True))
    loss, sums = micro_loss(model, ex, step_normalisers(ex, cfg), cfg, 0)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).cpu()
    return loss.item(), grad, sums


def main() -> int:
    assert torch.cuda.is_available(), "no CUDA device"
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    print("| sd_weight | kl | loss cpu | loss cuda | max grad diff |")
    print("| --- | --- | --- | --- | --- |")
    ok = True
    for weight, kl in [("none", 0.0), ("is", 0.0), ("clip", 0.0), ("cispo", 0.0), ("none", 0.05)]:
        lc, gc, _ = run("cpu", weight, kl)
        lg, gg, _ = run("cuda", weight, kl)
        diff = (gc - gg).abs().max().item()
        ok &= abs(lc - lg) < 1e-4 and diff < 1e-4
        print(f"| {weight} | {kl} | {lc:.6f} | {lg:.6f} | {diff:.2e} |")
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    t = torch.tensor([1.5, 2.5], device="cuda", dtype=torch.float64)
    t0 = time.perf_counter()
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print(f"nccl all_reduce world=1: {t.tolist()} in {1000 * (time.perf_counter() - t0):.1f} ms")
    dist.destroy_process_group()
    print("GPU CHECK", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Forward+backward time of the loss functions on a step-sized batch (no model).

    .venv/bin/python benchmarks/bench_losses.py"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rltf_ray import losses as L  # noqa: E402


def bench(name, fn, B=64, T=256, V=8192, reps=5):
    logits = torch.randn(B, T, V, requires_grad=True)
    ids = torch.randint(0, V, (B, T))
    adv = torch.randn(B)
    mask = torch.ones(B, T - 1)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        logp = L.token_logprobs(logits, ids, 0.7)
        L.token_sum(fn(logp, adv, mask), mask, float(mask.sum())).backward()
        times.append(time.perf_counter() - t)
        logits.grad = None
    times.sort()
    print(f"| {name} | {B}x{T}x{V} | {1000 * times[len(times) // 2]:.0f} |")


def main() -> int:
    torch.manual_seed(0)
    print("| loss | batch x tokens x vocab | median ms (fwd+bwd incl. log-softmax at T=0.7) |")
    print("| --- | --- | --- |")
    bench("rl (importance sampling vs sampler)", lambda lp, a, m: L.policy_token_loss(lp, lp.detach() - 0.01, a))
    bench("rl (ppo clip vs sampler)", lambda lp, a, m: L.policy_token_loss(lp, lp.detach() - 0.01, a, "ppo_clip"))
    bench("sd (tau=-5)", lambda lp, a, m: L.sd_token_loss(lp, a) * L.sd_keep_mask(lp, -5.0))
    bench("sd_clip (sequence)", lambda lp, a, m: L.sd_token_loss(lp, a, "clip", lp.detach() - 0.01, m))
    bench("fm (cross-entropy)", lambda lp, a, m: -lp)
    return 0


if __name__ == "__main__":
    sys.exit(main())

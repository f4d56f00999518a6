"""LoRA against full fine-tuning: the same `grpo_single` steps as `make bench-compare`
(demo task, the same prompts and seeds), once training every weight and once only rank-r
adapters on every projection (the paper trained rank-32 LoRA).

    .venv/bin/python benchmarks/bench_lora.py [--model smollm2] [--steps 3] [--rank 32] [key=value ...]

Prints seconds per step (split), trained tokens/s and peak resident memory of the learner
(rank 0) and the engine; the first step is a warm-up and is not counted. Under LoRA the
merged weights (base + B @ A) are synced, so the sync moves as many bytes as full training.
"""
from __future__ import annotations

import sys

from bench_compare import bench_pipeline, parse_sized, runs_table, sized_parser


def main() -> int:
    ap = sized_parser(__doc__, steps=3)
    ap.add_argument("--rank", type=int, default=32)
    a = parse_sized(ap)
    full = bench_pipeline(a.model, "grpo_single", a, "full")
    a.overrides = [*a.overrides, f"trainer.lora={{rank: {a.rank}, alpha: {2 * a.rank}}}"]
    lora = bench_pipeline(a.model, "grpo_single", a, "lora")
    print(runs_table(a, "training", [("full", full), (f"LoRA rank {a.rank}", lora)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-step cost of the machinery: everything except generation and the optimizer work.

    .venv/bin/python benchmarks/bench_step.py [--config pipelines/configs/tiny.yaml] [--steps 4]

Runs the real pipeline (local Ray, vLLM, Serve, Train+DeepSpeed) and prints, per step, the
wall time split into engine generation, learner compute, weight sync and the rest
(Ray Data scheduling, Serve calls, hand-off, metrics, parquet)."""
from __future__ import annotations

import sys

from common import config_args, run_pipeline


def main() -> int:
    a = config_args(__doc__, steps=4).parse_args()
    rows = run_pipeline(a.config, [f"run.steps={a.steps}", *a.overrides])
    print(f"\nconfig {a.config} {' '.join(a.overrides)}")
    print("| step | total s | generate s | train s | sync s | machinery s | gen tok/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for m in rows:
        gen = m["generate_tokens"] / m["generate_tokens_per_s"] if m["generate_tokens_per_s"] else 0.0
        other = m["seconds_step"] - gen - m["seconds_train"] - m["seconds_sync"]
        print(f"| {m['step'] + 1} | {m['seconds_step']:.1f} | {gen:.1f} | {m['seconds_train']:.1f} | "
              f"{m['seconds_sync']:.2f} | {other:.1f} | {m['generate_tokens_per_s']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-step cost of the machinery: everything except generation and the optimizer work.

    .venv/bin/python benchmarks/bench_step.py [--config pipelines/configs/tiny.yaml] [--steps 4]

Runs the real pipeline (local Ray, vLLM, Serve, Train+DeepSpeed) and prints, per step, the
wall time split into engine generation, learner compute, weight sync and the rest
(Ray Data scheduling, Serve calls, hand-off, metrics, parquet)."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rltf_ray.config import load_config  # noqa: E402
from rltf_ray.runner import run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="pipelines/configs/tiny.yaml")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    out = tempfile.mkdtemp(prefix="rltf_bench_")
    cfg = load_config(a.config, [f"run.output_dir={out}", f"run.steps={a.steps}",
                                 "run.eval_before_after=false", *a.overrides])
    run(cfg)
    rows = [json.loads(x) for x in Path(out, "metrics.jsonl").read_text().splitlines()]
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

"""Evaluate a model or a checkpoint on a task's held-out problems.

    python pipelines/eval.py --config pipelines/configs/demo.yaml \\
        [--model outputs/demo/checkpoints/step_6] [--prompts 64] [--pass-k 1,4,8] [--samples 8] \\
        [--feedback-rounds 2] [--self-feedback-rounds 1] [--output eval.json] [key=value ...]

Measures (rltf_ray/evaluation.py): greedy single-turn accuracy, sampled pass@k, accuracy
after each round with the task's critic in the loop, and accuracy after each round of
test-time self-feedback (the model critiques its own answer with the FM prompt, then
revises). Every number comes with its standard error over distinct held-out problems.
Starts a local Ray in-process (or joins RAY_ADDRESS), one engine and the critic app; no trainer.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rltf_ray.config import ConfigError, load_config  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Held-out evaluation of a model or checkpoint.")
    ap.add_argument("--config", required=True)
    ap.add_argument("--model", help="an HF folder or checkpoint (default: the config's model.path)")
    ap.add_argument("--prompts", type=int, help="distinct held-out problems")
    ap.add_argument("--pass-k", help="comma-separated k for sampled pass@k, e.g. 1,4,8")
    ap.add_argument("--samples", type=int, help="samples per problem for pass@k")
    ap.add_argument("--feedback-rounds", type=int)
    ap.add_argument("--self-feedback-rounds", type=int)
    ap.add_argument("--output", help="write the results as JSON here")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    overrides = list(args.overrides)
    for flag, key in (("model", "model.path"), ("prompts", "eval.prompts"), ("samples", "eval.samples"),
                      ("feedback_rounds", "eval.feedback_rounds"),
                      ("self_feedback_rounds", "eval.self_feedback_rounds")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    if args.pass_k:
        overrides.append(f"eval.pass_k=[{args.pass_k}]")
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from rltf_ray.metrics import eval_line
    from rltf_ray.runner import Pipeline

    pipe = Pipeline(cfg)
    pipe.start(train=False)
    try:
        result = pipe.evaluate()
    finally:
        pipe.stop()
    result.update(model=pipe.model_path, task=cfg.task.name)
    print(eval_line(result))
    for k, v in result.items():
        if isinstance(v, float):
            print(f"  {k:32s} {v:.4f}")
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

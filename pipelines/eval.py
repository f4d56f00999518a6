"""Evaluate a model or a checkpoint on a task's held-out problems; the same as `rltf-ray eval`.

    python pipelines/eval.py --config pipelines/configs/demo.yaml \\
        [--model outputs/demo/checkpoints/step_6] [--prompts 64] [--pass-k 1,4,8] [--samples 8] \\
        [--feedback-rounds 2] [--self-feedback-rounds 1] [--held-out my_test.jsonl] \\
        [--output eval.json] [--plugin my_task.py] [key=value ...]

    # an actor checkpoint with a learned-critic checkpoint, as one system, the critic greedy
    python pipelines/eval.py --config pipelines/configs/expansion.yaml --preset fixed_critic \\
        --model RUN/checkpoints/step_12 --critic RUN/checkpoints/step_12/critic --critic-temperature 0 \\
        --feedback-rounds 1 [--split calibration]

Measures (rltf_ray/evaluation.py): greedy single-turn accuracy, sampled pass@k, accuracy
after each round with the task's critic in the loop, and accuracy after each round of
test-time self-feedback (the model critiques its own answer with the FM prompt, then
revises). Every number comes with its standard error over distinct held-out problems.
`--split calibration` scores the calibration problems instead, which no evaluation of the
held-out problems sees: a setting (a critic's temperature) is chosen on them.
Starts a local Ray in-process (or joins RAY_ADDRESS), one engine and the critic app; no trainer.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rltf_ray.cli import eval_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(eval_main())

"""`rltf-ray check`: before any training, can this model use these critiques?

    rltf-ray check --config pipelines/configs/tiny.yaml [--problems 64] [--preset ...] [key=value ...]

On N held-out problems, with the run's own config: p0, the greedy first try, and p1, the answer
after one round of the configured critic's feedback (a wrong first answer is critiqued and
revised greedily; a right one stands). RLTF-SD learns from the revisions that the critique
made right, so the gap p1 - p0 is what it has to distill; recent work reports that the
self-distillation gain grows with this gap. A problem whose critique request failed counts as
not fixed (and the failures are reported)."""
from __future__ import annotations

import argparse
import math
import sys

from rltf_ray.errors import ConfigError

MIN_GAP = 0.10  # below this the revisions add little to learn from, whatever the SE


def gap_se(gap: float, n: int) -> float:
    """SE of the mean per-problem difference c1 - c0: each is 0 or 1 (an answer right at first
    stays right), so its variance is gap (1 - gap) n / (n - 1)."""
    return math.sqrt(max(gap * (1 - gap), 0.0) / (n - 1)) if n > 1 else math.nan


def verdict(p0: float, p1: float, n: int) -> str:
    """What the gap says, and what to do when it is small."""
    gap, se = p1 - p0, gap_se(p1 - p0, n)
    if p0 >= 0.8:
        return (f"little room: the first try is already right {p0:.0%} of the time, so few answers get a "
                "critique to learn from. A harder task (or split) shows more.")
    if gap >= MIN_GAP and gap >= 2 * se:
        return (f"yes: one critique lifts accuracy from {p0:.3f} to {p1:.3f} (+{gap:.3f}, SE {se:.3f}). "
                "RLTF-SD has right revisions to distill into the first try: the regime where it beat "
                "single-turn GRPO here (docs/results.md).")
    return (f"not yet: one critique moves accuracy by {gap:+.3f} (SE {se:.3f}), so training on revisions has "
            "little to distill. Options: a short revision warm start on the task's critiques "
            "(rltf-ray warmstart --revision-demos N), a more specific critic (a programmatic critique "
            "that names the mistake, or a stronger judge model), or a bigger model.")


def check_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rltf-ray check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--preset")
    ap.add_argument("--problems", type=int, default=64, help="distinct held-out problems (default 64)")
    ap.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_FILE")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, as for a run")
    args = ap.parse_args(argv)
    if args.problems < 2:
        print("--problems: at least 2 (a standard error needs two)", file=sys.stderr)
        return 2
    from rltf_ray.loading import load_config

    overrides = [*args.overrides, f"eval.prompts={args.problems}", "eval.feedback_rounds=1", "eval.greedy=true",
                 "eval.pass_k=[]", "eval.self_feedback_rounds=0"]
    try:
        cfg = load_config(args.config, overrides, preset=args.preset, plugins=args.plugin)
        from rltf_ray.runner import evaluate_only

        pipe, ev = evaluate_only(cfg)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    n, critic = ev["problems"], pipe.critic_params.critic
    print(f"feedback gap on {n} held-out problems (model {pipe.model_path}, task {cfg.task.name}, critic {critic})")
    print(f"  p0  first try (greedy)         {ev['greedy_accuracy']:.3f} ± {ev['greedy_accuracy_se']:.3f}")
    if "feedback_accuracy_1" not in ev:
        print(f"  p1  NOT MEASURED: {ev.get('feedback_unmeasured')}")
        return 1
    p0, p1 = ev["greedy_accuracy"], ev["feedback_accuracy_1"]
    print(f"  p1  after one critique         {p1:.3f} ± {ev['feedback_accuracy_1_se']:.3f}")
    print(f"  p1 - p0                        {p1 - p0:+.3f} ± {gap_se(p1 - p0, n):.3f}")
    if ev.get("feedback_critique_failed"):
        print(f"  ({ev['feedback_critique_failed']} critique requests failed and count as not fixed: "
              f"{ev.get('feedback_critique_error')})")
    print("can this model use these critiques? " + verdict(p0, p1, n))
    return 0

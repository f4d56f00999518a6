"""A short supervised warm start before RL (see rltf_ray/warmstart.py).

    python pipelines/warmstart.py --config pipelines/configs/demo.yaml --out outputs/warm \\
        [--format-demos 0] [--revision-demos 200] [--epochs 2] [--lr 1e-5] [key=value ...]

Revision demonstrations are built from the configured model's own wrong first answers on
training problems (a vLLM engine samples them at the first turn's temperature) and the
task's programmatic critique; format demonstrations are the task's own solutions. The
warm-started model is saved to --out (an HF folder: use it as `model.path`), with
`warmstart.json` beside it. Demonstrations come from training problems numbered from
--first-problem on, away from the prompt streams of RL runs (seed s reads from s x 100,000;
generators with a small problem space, and file tasks, can still repeat a problem).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rltf_ray.config import ConfigError  # noqa: E402
from rltf_ray.loading import load_config  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Supervised warm start on task and revision demonstrations.")
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--format-demos", type=int, default=0)
    ap.add_argument("--revision-demos", type=int, default=200)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--first-problem", type=int, default=900_000)
    ap.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_FILE",
                    help="a module (import name or .py path) with your task; repeatable")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides, plugins=args.plugin)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    import ray

    from rltf_ray.graph import node_params
    from rltf_ray.models import resolve_dtype, resolve_model
    from rltf_ray.services import init_ray
    from rltf_ray.stages.engine import start_engines
    from rltf_ray.tasks import get_task
    from rltf_ray.warmstart import format_demos, revision_demos, sft

    task = get_task(cfg.task)
    model = resolve_model(cfg.model.path)
    gen, rev = node_params(cfg.node("generate")), node_params(cfg.node("revise"))
    start = args.first_problem
    pairs = format_demos(task, start, args.format_demos)
    stats: dict = {"base_model": model, "format_demos": len(pairs), "first_problem": start}
    if args.revision_demos > 0:
        init_ray(cfg)
        try:
            engines = start_engines(model, cfg.engine, resolve_dtype(cfg.model.dtype, False), cfg.run.seed)
            demos, sampled = revision_demos(engines, model, task, rev.template, start + args.format_demos,
                                            args.revision_demos, gen.temperature, gen.max_tokens)
        finally:
            ray.shutdown()
        pairs += demos
        stats.update(revision_demos=len(demos), **{f"before_{k}": v for k, v in sampled.items()})
    print(f"[warmstart] {len(pairs)} demonstrations; training {args.epochs} epoch(s)", flush=True)
    stats.update(sft(model, pairs, args.out, lr=args.lr, epochs=args.epochs, batch_size=args.batch_size,
                     seed=cfg.run.seed))
    stats.update(epochs=args.epochs, lr=args.lr, config=args.config, overrides=args.overrides)
    (Path(args.out) / "warmstart.json").write_text(json.dumps(stats, indent=2))
    print(json.dumps(stats, indent=2))
    return 0 if stats["finite"] else 1


if __name__ == "__main__":
    sys.exit(main())

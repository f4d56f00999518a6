"""A short supervised warm start before RL (see rltf_ray/warmstart.py).

    rltf-ray warmstart --config pipelines/configs/demo.yaml --out outputs/warm \\
        [--format-demos 0] [--revision-demos 200] [--epochs 2] [--lr 1e-5] [key=value ...]
    rltf-ray warmstart --critic --config ... --out outputs/critic [--critic-demos 300] \\
        [--informative-share 0.8]

(`python pipelines/warmstart.py` in a checkout.)

Revision demonstrations are built from the configured model's own wrong first answers on
training problems (a vLLM engine samples them at the first turn's temperature) and the
task's programmatic critique; format demonstrations are the task's own solutions. The
warm-started model is saved to --out (an HF folder: use it as `model.path`), with
`warmstart.json` beside it. With --critic, Bi-NAC's learned critic is warm-started instead on
critiques of the actor's own wrong answers, each ending with the verdict line: for an
--informative-share of them (default 1.0) the task's programmatic critique, for the rest a vague
one that says only that the answer is wrong; its verdict-line rate is measured before and after
on later problems.
Demonstrations come from training problems numbered from --first-problem on, away from the prompt streams of RL runs (seed s reads from s x 100,000;
generators with a small problem space, and file tasks, can still repeat a problem).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rltf_ray.config import ConfigError
from rltf_ray.loading import load_config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rltf-ray warmstart",
                                 description="Supervised warm start on task and revision demonstrations.")
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--format-demos", type=int, default=0)
    ap.add_argument("--revision-demos", type=int, default=200)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--first-problem", type=int, default=900_000)
    ap.add_argument("--critic", action="store_true",
                    help="warm-start Bi-NAC's learned critic (binac.critic_model, default the actor's "
                         "base) on the task's programmatic critiques of the actor's wrong answers")
    ap.add_argument("--critic-demos", type=int, default=300)
    ap.add_argument("--informative-share", type=float, default=1.0,
                    help="--critic: the share of demonstrations whose target is the task's critique; the "
                         "rest say only that the answer is wrong (a critic with room to learn)")
    ap.add_argument("--probe", type=int, default=64,
                    help="--critic: wrong answers (from later problems) on which the critic's verdict-line "
                         "rate is measured before and after")
    ap.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_FILE",
                    help="a module (import name or .py path) with your task; repeatable")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    if not 0.0 <= args.informative_share <= 1.0:
        print(f"--informative-share: a fraction in [0, 1], got {args.informative_share}", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.overrides, plugins=args.plugin)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    import ray

    from rltf_ray.graph import node_params
    from rltf_ray.models import resolve_dtype, resolve_model
    from rltf_ray.ray_start import init_ray
    from rltf_ray.stages.engine import start_engines
    from rltf_ray.tasks import get_task
    from rltf_ray.warmstart import format_demos, revision_demos, sft

    task = get_task(cfg.task)
    model = resolve_model(cfg.model.path)
    gen, rev = node_params(cfg.node("generate")), node_params(cfg.node("revise"))
    start = args.first_problem
    if args.critic:
        return warm_start_critic(cfg, args, task, model, gen)
    pairs = format_demos(task, start, args.format_demos)
    stats: dict = {"base_model": model, "format_demos": len(pairs), "first_problem": start}
    if args.revision_demos > 0:
        init_ray(cfg)
        try:
            engines = start_engines(model, cfg.engine, resolve_dtype(cfg.model.dtype, False), cfg.run.seed)
            demos, sampled = revision_demos(engines, model, task, rev.template or task.revision_template, start + args.format_demos,
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


def warm_start_critic(cfg, args, task, model: str, gen) -> int:
    """The critic's warm start, with its verdict-line rate before and after (the same probe)."""
    import ray

    from rltf_ray.models import resolve_dtype, resolve_model
    from rltf_ray.ray_start import init_ray
    from rltf_ray.stages.engine import start_engines
    from rltf_ray.warmstart import VAGUE_CRITIQUES, critic_demos, sft, verdict_line_rate, wrong_attempts

    import dataclasses

    b = cfg.binac
    critic = resolve_model(b.critic_model or cfg.model.path)
    dtype = resolve_dtype(cfg.model.dtype, False)
    one = dataclasses.replace(cfg.engine, num_engines=1)  # each model in turn, one engine each
    stats: dict = {"actor_model": model, "critic_base_model": critic, "first_problem": args.first_problem}
    init_ray(cfg)
    try:
        actor = start_engines(model, one, dtype, cfg.run.seed)[0]
        demos, sampled = wrong_attempts(actor, model, task, args.first_problem, args.critic_demos,
                                        gen.temperature, gen.max_tokens)
        probe, _ = wrong_attempts(actor, model, task, sampled.pop("next_problem"), args.probe,
                                  gen.temperature, gen.max_tokens)
        ray.kill(actor)
        stats.update(critic_demos=len(demos), probe_attempts=len(probe), **{f"actor_{k}": v for k, v in sampled.items()})
        base = start_engines(critic, one, dtype, cfg.run.seed)[0]
        stats["before"] = verdict_line_rate(base, critic, b, probe)
        ray.kill(base)
        print(f"[warmstart] critic: {len(demos)} demonstrations; verdict line before: "
              f"{stats['before']['verdict_line_rate']:.3f}; training {args.epochs} epoch(s)", flush=True)
        pairs = critic_demos(task, b, demos, args.informative_share, cfg.run.seed)
        stats.update(informative_share=args.informative_share, informative_demos=sum(
            not target.startswith(VAGUE_CRITIQUES) for _, target in pairs))
        stats.update(sft(critic, pairs, args.out, lr=args.lr, epochs=args.epochs,
                         batch_size=args.batch_size, seed=cfg.run.seed))
        after = start_engines(args.out, one, dtype, cfg.run.seed)[0]
        stats["after"] = verdict_line_rate(after, args.out, b, probe)
    finally:
        ray.shutdown()
    stats.update(epochs=args.epochs, lr=args.lr, config=args.config, overrides=args.overrides)
    (Path(args.out) / "warmstart.json").write_text(json.dumps(stats, indent=2))
    print(json.dumps(stats, indent=2))
    print(f"[warmstart] critic saved to {args.out} (use it as binac.critic_model); it writes the verdict "
          f"line in {stats['after']['verdict_line_rate']:.1%} of {stats['after']['critiques']} critiques "
          f"(before: {stats['before']['verdict_line_rate']:.1%})")
    return 0 if stats["finite"] else 1

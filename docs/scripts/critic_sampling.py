"""How often a learned critic's K critiques of one attempt are identical, by sampling
temperature (docs/results.md, "Pre-registered: the Bi-NAC comparison on rebuilt warm starts").

    python docs/scripts/critic_sampling.py --critic outputs/exp/critic_conv --out results/critic_sampling.json

The actor (the config's model) answers held-out problems at its sampling temperature; its
wrong answers are critiqued K times each by the critic at every temperature given, as a
Bi-NAC run samples them. Prints and writes, per temperature: the identical-pair share and
the verdict-line rate."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="pipelines/configs/expansion.yaml")
    ap.add_argument("--critic", required=True, help="the critic's HF folder")
    ap.add_argument("--temperatures", default="0.7,1.0,1.3")
    ap.add_argument("--k", type=int, default=2, help="critiques per attempt")
    ap.add_argument("--attempts", type=int, default=64, help="wrong first answers to critique")
    ap.add_argument("--first-problem", type=int, default=950_000, help="problems no warm start or run used")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import ray

    from rltf_ray.graph import node_params
    from rltf_ray.loading import load_config
    from rltf_ray.models import resolve_dtype, resolve_model
    from rltf_ray.ray_start import init_ray
    from rltf_ray.stages.engine import start_engines
    from rltf_ray.tasks import get_task
    from rltf_ray.warmstart import verdict_line_rate, wrong_attempts

    cfg = load_config(args.config, [f"binac.critic_model={args.critic}"])
    task, gen = get_task(cfg.task), node_params(cfg.node("generate"))
    model, dtype = resolve_model(cfg.model.path), resolve_dtype(cfg.model.dtype, False)
    one = dataclasses.replace(cfg.engine, num_engines=1)
    init_ray(cfg)
    out = {"critic": args.critic, "actor": model, "k": args.k, "dtype": dtype, "by_temperature": {}}
    try:
        actor = start_engines(model, one, dtype, cfg.run.seed)[0]
        attempts, sampled = wrong_attempts(actor, model, task, args.first_problem, args.attempts,
                                           gen.temperature, gen.max_tokens)
        ray.kill(actor)
        out.update(attempts=len(attempts), actor_first_turn_accuracy=sampled["first_turn_accuracy"])
        critic = start_engines(str(Path(args.critic).resolve()), one, dtype, cfg.run.seed)[0]
        for t in (float(x) for x in args.temperatures.split(",")):
            b = dataclasses.replace(cfg.binac, temperature=t, critiques_per_attempt=args.k)
            got = verdict_line_rate(critic, args.critic, b, attempts)
            out["by_temperature"][str(t)] = got
            print(f"[critic_sampling] T={t}: identical pairs {got['identical_pair_fraction']:.3f}, "
                  f"verdict line {got['verdict_line_rate']:.3f} ({got['critiques']} critiques)", flush=True)
    finally:
        ray.shutdown()
    Path(args.out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

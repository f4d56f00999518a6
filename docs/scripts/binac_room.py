"""Is there room for a learned critic to learn, and a signal to learn from? The check that
gates a Bi-NAC comparison (docs/results.md, "Pre-registered: Bi-NAC where the critic has room
to learn" and "...: room and a signal").

    python docs/scripts/binac_room.py --critic outputs/exp/critic_mixed \\
        --out results/binac_learnable/room.json [--problems 128] [key=value ...]

On calibration problems (`room_problems`: the task's test split after the problems that the
evaluation scores, so never trained on and never scored; `eval.calibration_path` for a task
whose problems come from files) the actor (the config's model) answers greedily, as the
held-out evaluation does. Each wrong answer is critiqued by the task's programmatic critique (the best
feedback known) and K times by the frozen critic, sampled as a run samples it; the actor
revises greedily from each critique. The critic sees what it sees in a run: the question, the
attempt and the verifier's verdict ("incorrect"), never the answer.

Prints and writes: the fix rate of the programmatic critique and the frozen critic's (the
mean over its K critiques), each with its SE over problems, and their difference paired by
problem; the share of attempts whose K critiques fix differently (groups where the critic's
GRPO has a non-zero advantage); identical critique pairs; verdict-line rate; the share of
critiques that state the task's rule. Exits 3, with the numbers, when fewer than 64 first
answers are wrong, or the frozen critic's fix rate is within 2 SE of the programmatic
critique's (or closer than --min-room): no room, so no comparison may start; and, with
--min-differing, when fewer attempts than that share have
critiques that fix differently: too little signal for the critic's GRPO update (its
zero-advantage share would be high), so no comparison may start either.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def room_problems(cfg, task) -> list[dict]:
    """The problems the room check measures on: `eval.calibration_prompts` calibration problems
    (`rltf_ray.sources.calibration_rows`), none of them scored by any evaluation of the test split.
    (Checks registered before the calibration split existed used the first held-out problems.)"""
    from rltf_ray.graph import node_params
    from rltf_ray.sources import calibration_rows

    return calibration_rows(task, cfg.eval, node_params(cfg.node("source")))


def revise_fixed(actor, model: str, task, rows, attempts, critiques, template, max_tokens) -> list[bool]:
    """Whether the actor's greedy revision from each (row, attempt, critique) is correct."""
    from rltf_ray.chat import encode, load_tokenizer, revision_messages
    from rltf_ray.evaluation import generate

    tok = load_tokenizer(model)
    prompts = [encode(tok, revision_messages(r, [(a, c)], template)) for r, a, c in zip(rows, attempts, critiques)]
    outs = generate([actor], prompts, 1, 0.0, max_tokens)
    return [task.score(g[0].text, json.loads(r["meta"])).correct for r, g in zip(rows, outs)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="pipelines/configs/expansion.yaml")
    ap.add_argument("--critic", required=True, help="the critic's HF folder (frozen)")
    ap.add_argument("--problems", type=int, default=128,
                    help="calibration problems (eval.calibration_prompts): never scored by an evaluation")
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-room", type=float, default=0.0,
                    help="the least room (programmatic minus frozen fix rate) that passes, besides 2 SE")
    ap.add_argument("--min-differing", type=float, default=0.0,
                    help="the least share of attempts whose K critiques fix differently that passes")
    ap.add_argument("overrides", nargs="*", help="key=value, as for the runs (binac.temperature, ...)")
    args = ap.parse_args(argv)

    import ray

    from rltf_ray.chat import encode, first_turn_messages, load_tokenizer
    from rltf_ray.critics.judges import parse_verdict
    from rltf_ray.critics.learned import critic_messages
    from rltf_ray.evaluation import generate, mean_se
    from rltf_ray.graph import node_params
    from rltf_ray.loading import load_config
    from rltf_ray.metrics import identical_pair_fraction
    from rltf_ray.models import resolve_dtype, resolve_model
    from rltf_ray.ray_start import init_ray
    from rltf_ray.stages.engine import start_engines
    from rltf_ray.tasks import get_task
    from rltf_ray.tasks.convention import RULES

    cfg = load_config(args.config, [*args.overrides, f"binac.critic_model={args.critic}",
                                    f"eval.calibration_prompts={args.problems}"])
    b, task = cfg.binac, get_task(cfg.task)
    rows = room_problems(cfg, task)
    gen, rev = node_params(cfg.node("generate")), node_params(cfg.node("revise"))
    template = rev.template or task.revision_template
    model, dtype = resolve_model(cfg.model.path), resolve_dtype(cfg.model.dtype, False)
    critic_path = str(Path(args.critic).resolve())
    one = dataclasses.replace(cfg.engine, num_engines=1)
    init_ray(cfg)
    try:
        actor = start_engines(model, one, dtype, cfg.run.seed)[0]
        tok = load_tokenizer(model)
        first = [g[0].text for g in generate([actor], [encode(tok, first_turn_messages(r)) for r in rows],
                                             1, 0.0, gen.max_tokens)]
        wrong = [i for i, r in enumerate(rows) if not task.score(first[i], json.loads(r["meta"])).correct]
        w_rows, w_first = [rows[i] for i in wrong], [first[i] for i in wrong]
        best = revise_fixed(actor, model, task, w_rows, w_first,
                            [task.critique(a, json.loads(r["meta"])) for r, a in zip(w_rows, w_first)],
                            template, rev.max_tokens)
        critic = start_engines(critic_path, one, dtype, cfg.run.seed)[0]
        ctok = load_tokenizer(critic_path)
        prompts = [encode(ctok, critic_messages(b.prompt, r["prompt"], a, False if b.verdict_aware else None))
                   for r, a in zip(w_rows, w_first)]
        groups = generate([critic], prompts, b.critiques_per_attempt, b.temperature, b.max_tokens)
        k = b.critiques_per_attempt
        fixed = revise_fixed(actor, model, task, [r for r in w_rows for _ in range(k)],
                             [a for a in w_first for _ in range(k)], [g.text.strip() for gr in groups for g in gr],
                             template, rev.max_tokens)
    finally:
        ray.shutdown()
    per_problem = [sum(fixed[i * k:(i + 1) * k]) / k for i in range(len(wrong))]
    texts = [g.text for gr in groups for g in gr]
    rules = [json.loads(r["meta"])["rule"] for r in w_rows for _ in range(k)]
    best_m, best_se = mean_se([float(x) for x in best])
    crit_m, crit_se = mean_se(per_problem)
    diff_m, diff_se = mean_se([float(x) - y for x, y in zip(best, per_problem)])
    out = {
        "actor": model, "critic": critic_path, "problems": len(rows), "wrong_first_answers": len(wrong),
        "split": "calibration", "scored_problems_skipped": None if cfg.eval.calibration_path else cfg.eval.prompts,
        "calibration_path": cfg.eval.calibration_path,
        "greedy_first_try": 1 - len(wrong) / max(len(rows), 1),
        "critic_temperature": b.temperature, "critiques_per_attempt": k, "verdict_aware": b.verdict_aware,
        "programmatic_fix_rate": best_m, "programmatic_fix_rate_se": best_se,
        "frozen_critic_fix_rate": crit_m, "frozen_critic_fix_rate_se": crit_se,
        "room": diff_m, "room_se": diff_se,
        "frozen_critic_first_critique_fix_rate": mean_se([float(fixed[i * k]) for i in range(len(wrong))])[0],
        "groups_with_differing_fixes": sum(0 < p < 1 for p in per_problem) / max(len(per_problem), 1),
        "identical_pair_fraction": identical_pair_fraction([[g.token_ids for g in gr] for gr in groups]),
        "verdict_line_rate": sum(parse_verdict(t) is not None for t in texts) / max(len(texts), 1),
        "states_rule_rate": sum(RULES[r][1] in t for r, t in zip(rules, texts)) / max(len(texts), 1)
        if task.name == "convention" else None,
        "example_critiques": texts[:k],
    }
    out["has_room"] = len(wrong) >= 64 and diff_m > 2 * diff_se and diff_m >= args.min_room
    out["min_room"], out["min_differing"] = args.min_room, args.min_differing
    out["has_signal"] = out["groups_with_differing_fixes"] >= args.min_differing
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps({k_: v for k_, v in out.items() if k_ != "example_critiques"}, indent=2))
    print(f"[room] programmatic critique fixes {best_m:.3f} (SE {best_se:.3f}) of {len(wrong)} wrong first "
          f"answers; the frozen critic {crit_m:.3f} (SE {crit_se:.3f}); room {diff_m:+.3f} (paired SE {diff_se:.3f})")
    print(f"[room] {out['groups_with_differing_fixes']:.3f} of the attempts have critiques that fix differently")
    if not out["has_room"]:
        why = (f"only {len(wrong)} wrong first answers (need >= 64)" if len(wrong) < 64 else
               f"the frozen critic's fix rate is within 2 SE of the programmatic critique's "
               f"({diff_m:+.3f} <= 2 x {diff_se:.3f})" if diff_m <= 2 * diff_se else
               f"the room {diff_m:+.3f} is below --min-room {args.min_room}")
        print(f"[room] NO ROOM: {why}. A learned critic has nothing measurable to learn here; "
              "do not start the comparison.", file=sys.stderr)
        return 3
    if not out["has_signal"]:
        print(f"[room] TOO LITTLE SIGNAL: only {out['groups_with_differing_fixes']:.3f} of the attempts have "
              f"critiques that fix differently (--min-differing {args.min_differing}); most of the critic's "
              "update groups would have no advantage. Do not start the comparison.", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())

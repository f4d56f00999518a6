"""Step metrics from rollout tables, the per-step progress line, and held-out evaluation."""
from __future__ import annotations

import math

import pyarrow as pa
import ray

from rltf_ray.config import RunConfig
from rltf_ray.graph import round_col


def _mean(xs) -> float:
    """Mean over the finite values (a reward the critic could not give is NaN)."""
    xs = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return float(sum(xs) / len(xs)) if xs else 0.0


def rollout_metrics(table: pa.Table, run: RunConfig = RunConfig()) -> dict:
    c = {name: table.column(name).to_pylist() for name in table.column_names}
    rounds = run.rounds
    revised = [i for i, r in enumerate(c["revised"]) if r]
    tokens, seconds = sum(c["gen_tokens"]), sum(c["gen_seconds"])
    acc1 = _mean(c["correct_first"])
    acc2 = _mean(c["correct_second"])

    def per_round(name: str) -> list:
        return [x for k in range(1, rounds + 1) for x in c[round_col(name, k)]]

    out = {
        "rows": table.num_rows,
        "reward_first_mean": _mean(c["reward_first"]),
        "reward_second_mean": _mean(c["reward_second"]),
        "first_turn_accuracy": acc1,
        "second_turn_accuracy": acc2,
        "revision_gain": acc2 - acc1,
        "format_first_rate": _mean(c["format_first"]),
        "format_second_rate": _mean(c["format_second"]),
        "revised_rows": len(revised),
        "revised_accuracy": _mean(c["correct_second"][i] for i in revised),
        "critique_failed": int(sum(per_round("critique_failed"))),
        "critic_disagreements": int(sum(per_round("critic_disagrees"))),
        "unscored_rows": sum(not math.isfinite(x) for x in c["reward_first"]),
        "unscored_revisions": int(sum(per_round("reward_failed"))),
        "response_tokens_mean": _mean(len(x) for x in c["response_ids"]),
        "truncated_fraction": _mean(f == "length" for f in c["finish_reason"]),
        "generate_tokens": int(tokens),
        "generate_tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "policy_version_rollout": int(min(c["policy_version"])),
    }
    for k in range(2, rounds + 1):  # turn k = after critique round k
        out[f"turn_{k}_accuracy"] = _mean(c[round_col("correct_second", k)])
        out[f"revised_rows_{k}"] = int(sum(c[round_col("revised", k)]))
    out["final_accuracy"] = _mean(c[round_col("correct_second", rounds)]) if run.turns > 1 else acc1
    return out


def step_line(m: dict, total: int) -> str:
    return (f"step {m['step'] + 1}/{total} v{m['policy_version']} | loss {m['loss']:+.4f} "
            f"(grpo {m['loss_grpo']:+.4f} sd {m['loss_sd']:+.4f} fm {m['loss_fm']:.4f}) | "
            f"acc1 {m['first_turn_accuracy']:.3f} acc2 {m['second_turn_accuracy']:.3f} "
            + (f"final {m['final_accuracy']:.3f} " if "turn_2_accuracy" in m else "") +
            f"r0 {m['reward_first_mean']:+.3f} r1 {m['reward_second_mean']:+.3f} | "
            f"gen {m['generate_tokens_per_s']:.0f} tok/s | {m['seconds_step']:.1f}s "
            f"(rollout {m['seconds_rollout']:.1f}, train {m['seconds_train']:.1f}, "
            f"sync {m['seconds_sync']:.2f})")


def evaluate(engines: list, model_path: str, task, n: int, max_tokens: int, score) -> dict:
    """Greedy first-turn accuracy on distinct problems of the task's held-out split, with no
    feedback (`n` in the result is the distinct count, at most the split's size).

    `score(rows, texts)` gives (reward, correct, format_ok) per text: the verifier, or the
    critic for a task without one (then "accuracy" is the pass rate at its pass score)."""
    from rltf_ray.chat import encode, first_turn_messages, load_tokenizer

    tok = load_tokenizer(model_path)
    rows = task.held_out(n)
    prompts = [encode(tok, first_turn_messages(r["prompt"])) for r in rows]
    shards = [prompts[i::len(engines)] for i in range(len(engines))]
    outs = ray.get([e.generate.remote(s, n=1, temperature=0.0, top_p=1.0, max_tokens=max_tokens)
                    for e, s in zip(engines, shards) if s])
    texts: list[str] = [""] * len(rows)
    for k, res in enumerate(outs):
        for j, group in enumerate(res["outputs"]):
            texts[k + j * len(engines)] = group[0].text
    scores = score(rows, texts)
    return {"n": len(rows), "requested": n, "accuracy": _mean(s[1] for s in scores),
            "reward_mean": _mean(s[0] for s in scores), "format_rate": _mean(s[2] for s in scores),
            "unscored": sum(not math.isfinite(s[0]) for s in scores),
            "version": int(outs[0]["version"]), "samples": texts[:3]}

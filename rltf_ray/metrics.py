"""Step metrics from rollout tables, the per-step progress line, and held-out evaluation."""
from __future__ import annotations

import json

import pyarrow as pa
import ray


def _mean(xs) -> float:
    xs = list(xs)
    return float(sum(xs) / len(xs)) if xs else 0.0


def rollout_metrics(table: pa.Table) -> dict:
    c = {name: table.column(name).to_pylist() for name in table.column_names}
    revised = [i for i, r in enumerate(c["revised"]) if r]
    tokens, seconds = sum(c["gen_tokens"]), sum(c["gen_seconds"])
    acc1 = _mean(c["correct_first"])
    acc2 = _mean(c["correct_second"])
    return {
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
        "critique_failed": int(sum(c["critique_failed"])),
        "critic_disagreements": int(sum(c["critic_disagrees"])),
        "response_tokens_mean": _mean(len(x) for x in c["response_ids"]),
        "truncated_fraction": _mean(f == "length" for f in c["finish_reason"]),
        "generate_tokens": int(tokens),
        "generate_tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "policy_version_rollout": int(min(c["policy_version"])),
    }


def step_line(m: dict, total: int) -> str:
    return (f"step {m['step'] + 1}/{total} v{m['policy_version']} | loss {m['loss']:+.4f} "
            f"(grpo {m['loss_grpo']:+.4f} sd {m['loss_sd']:+.4f} fm {m['loss_fm']:.4f}) | "
            f"acc1 {m['first_turn_accuracy']:.3f} acc2 {m['second_turn_accuracy']:.3f} "
            f"r0 {m['reward_first_mean']:+.3f} r1 {m['reward_second_mean']:+.3f} | "
            f"gen {m['generate_tokens_per_s']:.0f} tok/s | {m['seconds_step']:.1f}s "
            f"(rollout {m['seconds_rollout']:.1f}, train {m['seconds_train']:.1f}, "
            f"sync {m['seconds_sync']:.2f})")


def evaluate(engines: list, model_path: str, task, n: int, max_tokens: int) -> dict:
    """Greedy first-turn accuracy on the task's held-out split, with no feedback."""
    from rltf_ray.chat import encode, first_turn_messages, load_tokenizer

    tok = load_tokenizer(model_path)
    rows = list(task.rows("test", 0, n))
    prompts = [encode(tok, first_turn_messages(r["prompt"])) for r in rows]
    shards = [prompts[i::len(engines)] for i in range(len(engines))]
    outs = ray.get([e.generate.remote(s, n=1, temperature=0.0, top_p=1.0, max_tokens=max_tokens)
                    for e, s in zip(engines, shards) if s])
    texts: list[str] = [""] * len(rows)
    for k, res in enumerate(outs):
        for j, group in enumerate(res["outputs"]):
            texts[k + j * len(engines)] = group[0].text
    scores = [task.score(t, json.loads(r["meta"])) for t, r in zip(texts, rows)]
    return {"n": len(rows), "accuracy": _mean(s.correct for s in scores),
            "format_rate": _mean(s.format_ok for s in scores),
            "version": int(outs[0]["version"]), "samples": texts[:3]}

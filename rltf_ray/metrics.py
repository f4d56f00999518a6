"""Step metrics from rollout tables and the per-step progress line."""
from __future__ import annotations

import math

import pyarrow as pa

from rltf_ray.config import RunConfig
from rltf_ray.graph import round_col


def _mean(xs) -> float:
    """Mean over the finite values (a reward the critic could not give is NaN)."""
    xs = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return float(sum(xs) / len(xs)) if xs else 0.0


def critic_metrics(rows: list[dict], b) -> dict:
    """The learned critic's step: its mean reward (and the reference actor's term of it), how
    many critiques kept the format, agree with the verifier's verdict, how often the current
    actor's revisions from them fix a wrong first answer (`critic_fix_rate`), their length,
    the groups whose format penalty was waived, the critiques whose x1 did not fit, the
    attempts whose critic prompt did not fit, and the version that wrote them."""
    from rltf_ray.critic_examples import critic_reference_utilities, critic_row_rewards, format_waived

    overflowed = sum(bool(r.get("critic_context_overflow")) for r in rows)
    rows = [r for r in rows if r.get("critic_critiques")]
    rewards = [x for r in rows for x in critic_row_rewards(r, b)]
    fmt = [f for r in rows for f in r["critic_format_ok"]]
    agree = [v == r["correct_first"] for r in rows for v in r["critic_verdicts"] if v is not None]
    fixes = [c for r in rows if not r["correct_first"] for c in r.get("critic_revision_correct") or []
             if c is not None]  # None: the revision could not be made
    reference = [u for r in rows for u in critic_reference_utilities(r, b)]
    return {"critic_reward_mean": _mean(rewards),
            "critic_reward_reference_mean": _mean(reference) if reference else None,
            "critic_fix_rate": _mean(fixes) if fixes else None, "critic_fix_revisions": len(fixes),
            "critic_format_ok": _mean(fmt),
            "critic_format_waived_groups": sum(format_waived(r["critic_format_ok"], b) for r in rows),
            "critic_revisions_overflowed": sum(t is None for r in rows for t in r.get("critic_revisions") or []),
            "critic_verdict_agreement": _mean(agree) if agree else None,
            "critique_tokens_mean": _mean(len(ids) for r in rows for ids in r["critic_critique_ids"]),
            "critic_identical_pair_fraction": identical_pair_fraction([r["critic_critique_ids"] for r in rows]),
            "critiques": len(fmt),
            # attempts whose critic prompt did not fit the critic's context: never sent
            "critic_context_overflow": overflowed,
            "critic_version_rollout": min((r["critic_version"] for r in rows), default=-1)}


def identical_pair_fraction(groups: list[list]) -> float | None:
    """The share of pairs of critiques of one attempt that are token for token the same: a
    critic whose K samples agree gives GRPO nothing to compare (None: no group has two)."""
    pairs = same = 0
    for g in groups:
        for i in range(len(g)):
            for j in range(i + 1, len(g)):
                pairs, same = pairs + 1, same + (list(g[i]) == list(g[j]))
    return same / pairs if pairs else None


def dead_critic_update(m: dict) -> str | None:
    """Why a step's critic update trained on nothing (every advantage 0), or None when it
    trained on something, no critic update ran, or there was nothing to critique (every
    first answer correct: the actor's success, not a dead critic)."""
    if not m.get("critic_trained"):
        return None
    zero = m.get("critic_zero_advantage_fraction")
    if zero is not None and zero < 1.0:
        return None
    same = m.get("critic_identical_pair_fraction")
    if zero is None:
        if m.get("critic_unscored_groups"):
            return (f"every critiqued attempt ({m['critic_unscored_groups']}) had a critique or a revision "
                    "that failed (no finite reward): the critic has no group to learn from")
        if m.get("critic_context_overflow"):
            return (f"every critic prompt to send ({m['critic_context_overflow']}) was too long for the critic's "
                    "context: raise engine.max_model_len, or lower binac.max_tokens or the actor's max_tokens")
        return None
    if same is not None and same >= 0.5:
        return (f"the K critiques of an attempt were identical ({same:.0%} of pairs): raise "
                "binac.temperature, or check that the critic samples (top_p, a greedy critic)")
    return (f"the critiques differ ({same or 0:.0%} of pairs identical) but their rewards do not: the "
            "critic's reward is saturated (every revision scores the same whatever the feedback); use a "
            "task the actor cannot already fix, binac.revisions_per_critique > 1, or binac.verdict_bonus")


def rollout_metrics(table: pa.Table, run: RunConfig = RunConfig(), binac=None) -> dict:
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
        "context_overflow": int(sum(per_round("context_overflow"))),
        "critic_disagreements": int(sum(per_round("critic_disagrees"))),
        "unscored_rows": sum(not math.isfinite(x) for x in c["reward_first"]),
        "unscored_revisions": int(sum(per_round("reward_failed"))),
        "response_tokens_mean": _mean(len(x) for x in c["response_ids"]),
        "truncated_fraction": _mean(f == "length" for f in c["finish_reason"]),
        "generate_tokens": int(tokens),
        "generate_tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "policy_version_rollout": int(min(c["policy_version"])),
        "rows_per_engine": {str(e): c["engine"].count(e) for e in sorted(set(c["engine"]))},
    }
    prompt_tokens = sum(len(x) for x in per_round("revision_prompt_ids"))
    out["revision_prompt_tokens"] = prompt_tokens  # the revisions' prefill, and the share of it
    out["revision_cached_fraction"] = (sum(per_round("revision_cached_tokens")) / prompt_tokens
                                       if prompt_tokens else None)  # vLLM's prefix cache served
    for k in range(2, rounds + 1):  # turn k = after critique round k
        out[f"turn_{k}_accuracy"] = _mean(c[round_col("correct_second", k)])
        out[f"revised_rows_{k}"] = int(sum(c[round_col("revised", k)]))
    out["final_accuracy"] = _mean(c[round_col("correct_second", rounds)]) if run.turns > 1 else acc1
    if binac is not None:
        out.update(critic_metrics(table.to_pylist(), binac))
    return out


def mismatch_warning(m: dict, threshold: float, engine_dtype: str, learner_dtype: str) -> str | None:
    """The warning for a step whose sampler_kl_k3 (the actor's, or the learned critic's)
    exceeds `threshold`, naming the likely cause and the settings that fix it (None when
    neither does)."""
    over = [(who, prefix, m.get(f"{prefix}sampler_kl_k3")) for who, prefix in (("actor", ""), ("critic", "critic_"))]
    over = [o for o in over if o[2] is not None and o[2] > threshold]
    if not over:
        return None
    who, prefix, kl = over[0]
    mean, top = m.get(f"{prefix}logprob_abs_diff_mean"), m.get(f"{prefix}logprob_abs_diff_max")
    cause = (f"the engine samples in {engine_dtype} while the learner computes in {learner_dtype}: "
             "leave trainer.bf16 unset, so that the learner follows model.dtype"
             if engine_dtype != learner_dtype else
             "engine and learner run at one precision, so look for different kernels, a weight sync "
             "that did not reach the engines, or asynchronous rollouts (run.max_staleness)")
    return (f"WARNING step {m['step'] + 1}: the {who}'s sampler and trainer disagree: {prefix}sampler_kl_k3 {kl:.2e} "
            f"> loss.sampler_kl_warn {threshold:g} (mean |log-prob diff| {mean or 0:.3f}, "
            f"max {top or 0:.2f} nats). Likely cause: {cause}. "
            f"loss.rollout_correction bounds the weights meanwhile ('{m.get('rollout_correction')}' now).")


def step_line(m: dict, total: int) -> str:
    loss = (f"loss {m['loss']:+.4f} (grpo {m['loss_grpo']:+.4f} sd {m['loss_sd']:+.4f} fm {m['loss_fm']:.4f})"
            if "loss" in m else "actor idle")
    if "critic_version" in m:
        loss += (f" | critic v{m['critic_version']} reward {m['critic_reward_mean']:+.3f}"
                 + (f" loss {m['loss_critic']:+.4f}" if "loss_critic" in m else ""))
    return (f"step {m['step'] + 1}/{total} v{m['policy_version']} | {loss} | "
            f"acc1 {m['first_turn_accuracy']:.3f} acc2 {m['second_turn_accuracy']:.3f} "
            + (f"final {m['final_accuracy']:.3f} " if "turn_2_accuracy" in m else "") +
            f"r0 {m['reward_first_mean']:+.3f} r1 {m['reward_second_mean']:+.3f} | "
            f"gen {m['generate_tokens_per_s']:.0f} tok/s | {m['seconds_step']:.1f}s "
            f"(rollout {m['seconds_rollout']:.1f}, train {m['seconds_train']:.1f}, "
            f"sync {m['seconds_sync']:.2f}"
            + (f", checkpoint {m['seconds_checkpoint']:.1f}" if m.get("seconds_checkpoint") else "") + ")")


def gain_line(before: dict, after: dict) -> str:
    """The held-out greedy first try before and after training, and the gain with its SE:
    paired by problem when both evaluations scored the same problems (the per-problem
    differences' SE), else from the two SEs as if independent."""
    b, a = before["greedy_accuracy"], after["greedy_accuracy"]
    cb, ca = before.get("greedy_correct"), after.get("greedy_correct")
    if cb and ca and len(cb) == len(ca) > 1:
        d = [y - x for x, y in zip(cb, ca)]
        m = sum(d) / len(d)
        se, how = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1) / len(d)), "paired by problem"
    else:
        se, how = math.hypot(before["greedy_accuracy_se"], after["greedy_accuracy_se"]), "unpaired"
    verdict = "more than 2 SE" if a - b > 2 * se else "within 2 SE"
    return (f"held-out greedy first try: {b:.3f} before, {a:.3f} after training: {a - b:+.3f} "
            f"(SE {se:.3f}, {how}; {verdict})")


def eval_line(e: dict) -> str:
    """One held-out evaluation as a log line (each number ± one standard error)."""
    parts = []
    if "greedy_accuracy" in e:
        parts.append(f"greedy first-turn accuracy {e['greedy_accuracy']:.3f} ± {e['greedy_accuracy_se']:.3f}")
    parts += [f"{k} {e[k]:.3f} ± {e[k + '_se']:.3f}" for k in e
              if (k.startswith("pass@") or "feedback_accuracy_" in k) and not k.endswith("_se")]
    if e.get("feedback_unmeasured"):
        parts.append(f"feedback accuracy NOT MEASURED: {e['feedback_unmeasured']}")
    elif e.get("feedback_critique_failed"):
        parts.append(f"feedback accuracy over {e['feedback_problems_1']} problems ({e['feedback_critique_failed']} "
                     f"critique requests failed: {e['feedback_critique_error']})")
    short = e["problems"] < e.get("requested", e["problems"])
    return (", ".join(parts) + f" on {e['problems']} distinct held-out problems"
            + (f" (the test split has only {e['problems']} of the {e['requested']} asked for)" if short else ""))

"""Bi-NAC: the learned critic's rewards and examples. Each of the K critiques of one attempt
is rewarded by what the actor's M revisions from it score (`critic_rewards`, with the
bilevel term against the reference actor) and trained by GRPO over the K critiques of that
attempt (`build_critic_examples`); `metrics` reports the same rewards.
"""
from __future__ import annotations

import math

import torch

from rltf_ray import losses
from rltf_ray.config import Config
from rltf_ray.examples import Example


def _utility(rewards: list[float], k: int, m: int, r0: float, b) -> float:
    """u_k: `improvement` mean_m r1_km - r0, or `outcome` mean_m r1_km."""
    r1 = sum(rewards[k * m:(k + 1) * m]) / m
    return r1 - r0 if b.critic_reward == "improvement" else r1


def format_waived(format_ok: list[bool], b) -> bool:
    """No critique of the attempt has the verdict line: the format penalty would give all K
    the same reward, and GRPO over them no signal, so it is not applied to that group."""
    return b.format_penalty is not None and bool(format_ok) and not any(format_ok)


def critic_rewards(r0: float, correct0: bool, revision_rewards: list[float], verdicts: list,
                   format_ok: list[bool], b, reference_rewards: list[float] = ()) -> list[float]:
    """The reward of each of the K critiques of one attempt y0 (reward r0, verdict correct0),
    from its M revisions by the current actor: u_k (`_utility`); with the bilevel term
    (bilevel_lambda > 0 and the reference actor's M revisions of the same critique)
    (1 + lambda) * u_k - lambda * u_ref_k; plus `verdict_bonus` when its verdict line agrees
    with the verifier; `format_penalty` instead of all that when it has no verdict line,
    unless no critique of the attempt has one (`format_waived`)."""
    k_n = len(format_ok)
    m = len(revision_rewards) // k_n if k_n else 0
    lam = b.bilevel_lambda if reference_rewards else 0.0
    penalise = b.format_penalty is not None and not format_waived(format_ok, b)
    out = []
    for k in range(k_n):
        if not format_ok[k] and penalise:
            out.append(b.format_penalty)
            continue
        u = _utility(revision_rewards, k, m, r0, b)
        if lam:
            u = (1 + lam) * u - lam * _utility(reference_rewards, k, m, r0, b)
        out.append(u + (b.verdict_bonus if verdicts[k] == correct0 else 0.0))
    return out


def critic_row_rewards(row: dict, b) -> list[float]:
    """`critic_rewards` of a rollout row the learned critic critiqued ([] otherwise)."""
    if not row.get("critic_critiques") or not row.get("critic_revision_rewards"):
        return []
    return critic_rewards(float(row["reward_first"]), bool(row["correct_first"]), row["critic_revision_rewards"],
                          row["critic_verdicts"], row["critic_format_ok"], b,
                          row.get("critic_reference_rewards") or [])


def critic_reference_utilities(row: dict, b) -> list[float]:
    """u_ref_k of each critique of a row: the reference actor's improvement (or outcome)."""
    ref, k_n = row.get("critic_reference_rewards") or [], len(row.get("critic_critiques") or [])
    if not ref or not k_n:
        return []
    return [_utility(ref, k, len(ref) // k_n, float(row["reward_first"]), b) for k in range(k_n)]


def build_critic_examples(rows: list[dict], cfg: Config) -> tuple[list[Example], dict]:
    """GRPO examples for the critic: each of the K critiques of one attempt, on
    (critic prompt, critique), with its reward centred on the K critiques of that attempt,
    at the critic's sampling temperature and against its sampler's log-probs."""
    b = cfg.binac
    out: list[Example] = []
    groups = dead = unscored = 0
    for r in rows:
        rewards = critic_row_rewards(r, b)
        if not rewards:
            continue
        if not all(math.isfinite(x) for x in rewards):  # a critique or a revision failed
            unscored += 1
            continue
        rw = torch.tensor(rewards)
        one = torch.zeros(len(rw), dtype=torch.long)
        adv = losses.normalize_advantages(losses.centred(rw, one).float(), one, cfg.loss.adv_norm)
        groups, dead = groups + 1, dead + bool((adv == 0).all())
        x = list(r["critic_prompt_ids"])
        for a, ids, lps in zip(adv.tolist(), r["critic_critique_ids"], r["critic_critique_logprobs"]):
            out.append(Example(x + list(ids), len(x), "rl0", a, b.temperature,
                               [float(v) for v in lps]))
    # the share of attempts whose K critiques all got the same reward: they train on nothing
    return out, {"examples_critic": len(out), "critic_groups": groups, "critic_unscored_groups": unscored,
                 "critic_zero_advantage_fraction": dead / groups if groups else None}

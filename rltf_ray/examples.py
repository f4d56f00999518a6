"""From a step's rollout rows to token examples: which sequence each loss term trains on,
with which advantage, at which temperature and against which behaviour log-probs; which of
them a step forwards (`trained_examples`) and each term's step-global normaliser
(`step_normalisers`). The formulas live in `losses`; `objectives` assembles the loss, and
the learned critic's examples are built in `critic_examples`.

Terms and their sequences (k = 1..turns-1 over the revisions an episode produced):
  rl0  (x0, y0)   advantage G0 - mean_group(G0); G0 = r0, or sum_k gamma^k r_k if turn1_rl
                  (first_turn_return final: every G_k = the last attempt's reward)
  rl1  (x_k, y_k) advantage G_k - mean over the group's rows that reached turn k (turn1_rl)
  sd   (x0, y_k)  advantage r_k - baseline (first: mean_group r0; second: mean of r_k)
  fm   (f_fm(x0, y_{k-1}), c_{k-1})   cross-entropy
  sft  (x0, y_final) for episodes whose revised final answer is correct, cross-entropy

Temperatures: rl0 and sd are scored at the first turn's sampling temperature (sd trains the
policy pi(.|x0) that samples first turns), rl1 at the revision's, fm and sft at 1. The
behaviour log-probs of rl0/rl1 are the sampler's own (vLLM, same temperature).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rltf_ray import losses
from rltf_ray.chat import encode, fm_messages
from rltf_ray.config import Config
from rltf_ray.graph import node_params
from rltf_ray.rounds import revisions

TERMS = ("rl0", "rl1", "sd", "fm", "sft")
RL_TERMS = ("rl0", "rl1")


@dataclass
class Example:
    ids: list[int]
    start: int  # index of the first trained token in `ids`
    term: str
    adv: float = 1.0
    temperature: float = 1.0
    # Sampler log-probs of the trained tokens (rl0/rl1): the behaviour policy.
    behav_logp: list[float] | None = None
    # Filled by the trainer's no-grad pre-pass before the step's first optimizer step:
    # log pi_old(y_k | x_k) at the revision temperature for SD importance weights, the frozen
    # reference's log-probs for KL, and pi_old of the trained tokens (RL terms, when the step
    # takes several optimizer steps): the trust region's centre.
    logp_x1: list[float] | None = None
    ref_logp: list[float] | None = None
    old_logp: list[float] | None = None
    x1_ids: list[int] = field(default_factory=list)  # the x_k prompt, for SD weights
    x1_temperature: float = 1.0

    @property
    def n_tokens(self) -> int:
        return len(self.ids) - self.start


def _centred(values: torch.Tensor, gid: torch.Tensor, include: torch.Tensor, mode: str) -> torch.Tensor:
    """Advantages of the included rows: centred on their group's included rows, normalised
    among them; 0 for the others."""
    out = torch.zeros_like(values)
    if include.any():
        v, g = values[include], gid[include]
        out[include] = losses.normalize_advantages(losses.centred(v, g).float(), g, mode)
    return out


def _behaviour(row: dict, column: str, n_tokens: int) -> list[float]:
    lps = row.get(column)
    if lps is None or len(lps) != n_tokens:
        got = "missing" if lps is None else f"{len(lps)} values for {n_tokens} tokens"
        raise ValueError(f"rollout row {row.get('prompt_id')!r}: sampler log-probs '{column}' "
                         f"{got}; the RL terms need the sampler's log-prob of every token")
    return [float(x) for x in lps]


def is_scored(row: dict, rounds: int) -> bool:
    """Every turn the episode reached has a finite reward (a judge that failed gives NaN)."""
    return math.isfinite(float(row["reward_first"])) and all(
        math.isfinite(v.reward) for v in revisions(row, rounds))


def build_examples(rows: list[dict], cfg: Config, tokenizer) -> tuple[list[Example], dict]:
    L = cfg.loss
    rounds = cfg.run.rounds
    t_gen = node_params(cfg.node("generate")).temperature
    t_rev = node_params(cfg.node("revise")).temperature
    # A row with an unscored turn trains nothing and joins no group statistic.
    scored = [r for r in rows if is_scored(r, rounds)]
    unscored, rows = len(rows) - len(scored), scored
    groups = {pid: i for i, pid in enumerate(dict.fromkeys(r["prompt_id"] for r in rows))}
    gid = torch.tensor([groups[r["prompt_id"]] for r in rows], dtype=torch.long)
    revs = [revisions(r, rounds) for r in rows]
    # Turn k's reward and whether the episode reached it; unreached turns add 0 to returns.
    R = torch.zeros(len(rows), rounds + 1)
    taken = torch.zeros(len(rows), rounds + 1, dtype=torch.bool)
    for i, r in enumerate(rows):
        R[i, 0], taken[i, 0] = float(r["reward_first"]), True
        for v in revs[i]:
            R[i, v.k], taken[i, v.k] = v.reward, True
    G = (losses.final_returns(R, taken) if L.first_turn_return == "final"
         else losses.discounted_returns(R, L.gamma))
    a0 = _centred(G[:, 0] if L.turn1_rl or L.first_turn_return == "final" else R[:, 0], gid,
                  taken[:, 0], L.adv_norm)
    a_rl = {k: _centred(G[:, k], gid, taken[:, k], L.adv_norm) for k in range(1, rounds + 1)}
    first_base, first_scale = losses.group_means(R[:, 0], gid), losses.group_abs_max(R[:, 0], gid)
    # r_k - baseline, 0 where they differ by float rounding only (losses.snap_zero)
    a_sd = {k: losses.snap_zero(R[:, k].double() - (first_base if L.sd_baseline == "first" else
                                losses.subset_group_means(R[:, k], gid, taken[:, k])),
                                torch.maximum(R[:, k].double().abs(), first_scale)).float()
            for k in range(1, rounds + 1)}
    out: list[Example] = []
    for i, r in enumerate(rows):
        x0, y0 = list(r["prompt_ids"]), list(r["response_ids"])
        out.append(Example(x0 + y0, len(x0), "rl0", float(a0[i]), t_gen,
                           _behaviour(r, "response_logprobs", len(y0))))
        for v in revs[i]:
            if L.turn1_rl:
                out.append(Example(v.prompt_ids + v.ids, len(v.prompt_ids), "rl1", float(a_rl[v.k][i]),
                                   t_rev, _behaviour(r, v.logprobs_column, len(v.ids))))
            if L.lambda_sd > 0:
                out.append(Example(x0 + v.ids, len(x0), "sd", float(a_sd[v.k][i]), t_gen,
                                   x1_ids=v.prompt_ids, x1_temperature=t_rev))
            if L.lambda_fm > 0 and v.critique:
                fm = encode(tokenizer, fm_messages(r["prompt"], v.judged))
                c = tokenizer(v.critique, add_special_tokens=False, split_special_tokens=True)["input_ids"]
                out.append(Example(fm + list(c) + [tokenizer.eos_token_id], len(fm), "fm"))
        # The reference distils only correct *revised* answers: a one-turn episode gives none.
        if L.lambda_sft > 0 and revs[i] and revs[i][-1].correct:
            out.append(Example(x0 + revs[i][-1].ids, len(x0), "sft"))
    later = [(k, i) for k in range(1, rounds + 1) for i in range(len(rows)) if taken[i, k]]
    stats = {"adv_abs_mean_rl0": float(a0.abs().mean()) if rows else 0.0,
             "adv_abs_mean_rl1": _abs_mean([a_rl[k][i] for k, i in later]),
             "adv_abs_mean_sd": _abs_mean([a_sd[k][i] for k, i in later]),
             "zero_adv_group_fraction": _zero_adv_fraction(a0, gid),
             "unscored_rows": unscored}
    return out, stats


def _abs_mean(xs: list[torch.Tensor]) -> float:
    return float(torch.stack(xs).abs().mean()) if xs else 0.0


def _zero_adv_fraction(adv: torch.Tensor, gid: torch.Tensor) -> float:
    n = int(gid.max()) + 1 if gid.numel() else 0
    if n == 0:
        return 0.0
    nonzero = torch.zeros(n).index_add_(0, gid, (adv != 0).float())
    return float((nonzero == 0).float().mean())


def trained_examples(examples: list[Example], cfg: Config) -> list[Example]:
    """The examples a step forwards. A zero-advantage sequence adds nothing to the policy and
    SD terms (it still counts in their normalisers) and is skipped, except an RL one under a
    KL penalty, which covers every RL token."""
    kl = cfg.loss.kl_coef > 0
    return [e for e in examples if e.term in ("fm", "sft") or e.adv != 0.0 or (kl and e.term in RL_TERMS)]


def step_normalisers(examples: list[Example], cfg: Config) -> dict[str, float]:
    """Each term's step-global denominator (all workers, all micro-batches).

    shared_token_mean gives every term the same one -- the step's RL tokens -- so that the
    lambdas are exact per-token weights relative to an RL token; the others give each term
    its own (tokens, sequences, or sequences x a constant)."""
    tokens = {t: float(sum(e.n_tokens for e in examples if e.term == t)) for t in TERMS}
    seqs = {t: float(sum(e.term == t for e in examples)) for t in TERMS}
    mode = cfg.loss.aggregation
    if mode == "shared_token_mean":
        shared = sum(tokens[t] for t in RL_TERMS) or sum(tokens.values())
        return {t: shared for t in TERMS}
    if mode == "token_mean":
        return tokens
    if mode == "seq_mean_token_sum":
        return seqs
    return {t: seqs[t] * cfg.loss.aggregation_constant for t in TERMS}

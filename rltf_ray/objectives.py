"""From a step's rollout rows to token examples, and from a micro-batch of examples to its
share of the step loss. The formulas live in `losses`; this module decides which sequence
each term trains on, with which advantage, at which temperature and against which
behaviour log-probs.

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


# -- Bi-NAC: the learned critic's rewards and examples ----------------------------------------

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


def _device(model) -> torch.device:
    return next(model.parameters()).device


@dataclass
class Batch:
    """A micro-batch as padded tensors; per-token tensors are aligned with `mask`."""
    ids: torch.Tensor
    attn: torch.Tensor
    mask: torch.Tensor  # [B, T-1], 1 on trained tokens
    adv: torch.Tensor
    temperature: torch.Tensor
    term: torch.Tensor  # [B, 1] index into TERMS
    behav_logp: torch.Tensor
    logp_x1: torch.Tensor
    ref_logp: torch.Tensor
    old_logp: torch.Tensor
    old_known: torch.Tensor  # [B, 1]: 1 where old_logp was filled by the pre-pass


def _aligned(examples: list[Example], attr: str, like: torch.Tensor) -> torch.Tensor:
    """Per-token side values (stored for trained tokens only) placed on the mask positions."""
    out = torch.zeros_like(like)
    for i, e in enumerate(examples):
        vals = getattr(e, attr)
        if vals is not None:
            out[i, e.start - 1:e.start - 1 + len(vals)] = torch.tensor(vals, dtype=out.dtype)
    return out


def collate(examples: list[Example], pad_id: int, device: torch.device | str = "cpu") -> Batch:
    """Right-padded ids and every per-example value as tensors on `device`."""
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    mask = torch.zeros((len(examples), width - 1))
    for i, e in enumerate(examples):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        attn[i, :len(e.ids)] = 1
        mask[i, e.start - 1:len(e.ids) - 1] = 1.0  # position t predicts token t+1
    b = Batch(ids, attn, mask, torch.tensor([e.adv for e in examples]),
              torch.tensor([e.temperature for e in examples]),
              torch.tensor([[TERMS.index(e.term) if e.term in TERMS else -1] for e in examples]),
              _aligned(examples, "behav_logp", mask), _aligned(examples, "logp_x1", mask),
              _aligned(examples, "ref_logp", mask), _aligned(examples, "old_logp", mask),
              torch.tensor([[float(e.old_logp is not None)] for e in examples]))
    return Batch(*(t.to(device) for t in vars(b).values()))


def trained_logprobs(model, b: Batch, first: int, temperature: torch.Tensor | float) -> torch.Tensor:
    """`losses.token_logprobs` of the batch, [B, T-1], with the vocabulary projection made only
    from position `first - 1` on (`first`: the earliest trained token of any row), and zeros
    before it, where every mask is 0. The prompt's logits were never used; projecting a
    250-token critic prompt onto a 49k vocabulary cost time and activation memory (critic
    steps trained 12-23% faster without it, docs/benchmarks.md). A model whose forward takes
    no `logits_to_keep` gets all positions."""
    t = b.ids.shape[1]
    if first <= 1 or not _keeps_logits(model):
        return losses.token_logprobs(model(input_ids=b.ids, attention_mask=b.attn).logits, b.ids, temperature)
    logits = model(input_ids=b.ids, attention_mask=b.attn, logits_to_keep=t - first + 1).logits
    return torch.nn.functional.pad(losses.token_logprobs(logits, b.ids[:, first - 1:], temperature),
                                   (first - 1, 0))


def _keeps_logits(model) -> bool:
    """Whether the HF model under a DeepSpeed engine or a PEFT wrapper takes `logits_to_keep`."""
    import inspect

    m = getattr(model, "module", model)
    m = m.get_base_model() if hasattr(m, "get_base_model") else m
    return "logits_to_keep" in inspect.signature(m.forward).parameters


def sequence_logprobs(model, seqs: list[tuple[list[int], int]], temperatures: list[float],
                      pad_id: int, micro_batch: int, n_batches: int | None = None) -> list[list[float]]:
    """No-grad log-probs of each sequence's tokens from `start` on, at its temperature (SD
    weights, KL reference). `n_batches` pads the loop with dummy forwards so that every
    rank runs the same number (under ZeRO-3 each forward is a collective)."""
    out: list[list[float]] = []
    todo = range(0, len(seqs), micro_batch)
    with torch.no_grad():
        for k in todo:
            chunk = [Example(ids, start, "aux") for ids, start in seqs[k:k + micro_batch]]
            b = collate(chunk, pad_id, _device(model))
            temps = torch.tensor(temperatures[k:k + micro_batch])
            logp = trained_logprobs(model, b, min(e.start for e in chunk), temps).cpu()
            for i, e in enumerate(chunk):
                out.append(logp[i, e.start - 1:len(e.ids) - 1].tolist())
        for _ in range(len(todo), n_batches or 0):
            model(input_ids=torch.tensor([[pad_id, pad_id]], device=_device(model)))
    return out


# The per-micro-batch sums that make up a step's metrics (summed over ranks).
SUM_KEYS = tuple(f"loss_{t}" for t in TERMS) + (
    "kl_sum", "rl_tokens", "mismatch_tokens", "logprob_abs_diff_sum", "mismatch_kl_sum",
    "drift_kl_sum", "clipped_tokens", "corrected_tokens", "sd_tokens", "sd_tokens_masked", "is_w_sum",
    "is_w_sq_sum", "train_tokens")
MAX_KEYS = ("logprob_abs_diff_max", "is_w_max")


def loss_terms(logp: torch.Tensor, b: Batch, norms: dict[str, float], cfg: Config,
               lambda_sd: float) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the step loss from the trainer's per-token log-probs
    `logp` (already at each row's temperature), and the sums for the step's metrics."""
    L = cfg.loss
    m = {t: (b.term == k).float() * b.mask for k, t in enumerate(TERMS)}
    m_rl = m["rl0"] + m["rl1"]
    # pi_old: the pre-pass's log-probs where it ran (a step of several optimizer steps), else
    # this forward's own, which are pi_old when the step takes one optimizer step
    old = torch.where(b.old_known > 0, b.old_logp, logp.detach())
    weight, corrected = None, torch.zeros_like(m_rl)
    if L.rollout_correction != "none":
        weight, corrected = losses.rollout_weights(old, b.behav_logp, m_rl, L.rollout_correction,
                                                   L.rollout_cap, (L.rollout_mask_low, L.rollout_mask_high))
    rl_tok = losses.policy_token_loss(logp, b.behav_logp, b.adv, L.policy_loss, L.clip_eps, weight, old)
    kl_tok = losses.kl_k3(logp, b.ref_logp, m_rl) if L.kl_coef > 0 else torch.zeros_like(logp)
    rl_tok = rl_tok + L.kl_coef * kl_tok
    keep = losses.sd_keep_mask(logp, L.sd_mask_tau)
    m_sd = m["sd"] * keep
    sd_tok = losses.sd_token_loss(logp, b.adv, L.sd_weight, b.logp_x1, m_sd, L.sd_weight_level,
                                  L.sd_clip_low, L.sd_clip_high)
    parts = {"rl0": losses.token_sum(rl_tok, m["rl0"], norms["rl0"]),
             "rl1": losses.token_sum(rl_tok, m["rl1"], norms["rl1"]),
             "sd": losses.token_sum(sd_tok, m_sd, norms["sd"]),
             "fm": losses.token_sum(-logp, m["fm"], norms["fm"]),
             "sft": losses.token_sum(-logp, m["sft"], norms["sft"])}
    total = (parts["rl0"] + parts["rl1"] + lambda_sd * parts["sd"] + L.lambda_fm * parts["fm"]
             + L.lambda_sft * parts["sft"])
    with torch.no_grad():
        # the sampler-trainer mismatch, log(pi_old / pi_sampler): the same in every mini-batch
        diff = old - b.behav_logp
        ratio = torch.exp(diff)
        # the policy's move within the step, log(pi_theta / pi_old), and the surrogate's own rho
        drift = logp - old
        rho = torch.exp(logp - b.behav_logp if weight is None else drift)
        sel_rl = m_rl > 0
        w = (losses.importance_weights(logp, b.logp_x1, m_sd, L.sd_weight_level)
             if L.sd_weight != "none" else torch.ones_like(logp))
        sel_sd = m_sd > 0
        sums = torch.stack([*(parts[t].detach() for t in TERMS),
                            (kl_tok * m_rl).sum(), m_rl.sum(), m_rl.sum(),
                            (diff.abs() * m_rl).sum(), ((ratio - 1 - diff) * m_rl).sum(),
                            ((torch.exp(drift) - 1 - drift) * m_rl).sum(),
                            (((rho - 1).abs() > L.clip_eps).float() * m_rl).sum(),
                            corrected.sum(),
                            m_sd.sum(), (m["sd"] * (1 - keep)).sum(),
                            (w * m_sd).sum(), (w ** 2 * m_sd).sum(),
                            m_rl.sum() + m_sd.sum() + m["fm"].sum() + m["sft"].sum()])
        maxes = [diff.abs()[sel_rl].max() if sel_rl.any() else torch.zeros(()),
                 w[sel_sd].max() if sel_sd.any() else torch.zeros(())]
        values = torch.cat([sums.float(), torch.stack(maxes).float()]).tolist()  # one sync
    return total, dict(zip(SUM_KEYS + MAX_KEYS, values))


def mismatch_sums(examples: list[Example], logps: list[list[float]]) -> dict[str, float]:
    """Trainer-vs-sampler agreement of RL examples scored in a no-grad pass (the monitor for
    steps in which no RL sequence was trained); the same keys `loss_terms` fills."""
    d = torch.tensor([t - b for e, lp in zip(examples, logps) for t, b in zip(lp, e.behav_logp)])
    if d.numel() == 0:
        return {}
    return {"mismatch_tokens": float(d.numel()), "logprob_abs_diff_sum": float(d.abs().sum()),
            "mismatch_kl_sum": float((torch.exp(d) - 1 - d).sum()),
            "logprob_abs_diff_max": float(d.abs().max())}


def micro_loss(model, examples: list[Example], norms: dict[str, float], cfg: Config, pad_id: int,
               lambda_sd: float | None = None):
    """Forward one micro-batch and return its share of the step loss and its metric sums."""
    lambda_sd = cfg.loss.lambda_sd if lambda_sd is None else lambda_sd
    b = collate(examples, pad_id, _device(model))
    logp = trained_logprobs(model, b, min(e.start for e in examples), b.temperature)
    return loss_terms(logp, b, norms, cfg, lambda_sd)

"""From a step's rollout rows to token examples, and from a micro-batch of examples to its
share of the step loss. The formulas live in `losses`; this module decides which sequence
each term trains on and with which advantage.

Terms and their sequences (k = 1..turns-1 over the revisions an episode produced):
  rl0  (x0, y0)   advantage G0 - mean_group(G0); G0 = r0, or sum_k gamma^k r_k if turn1_rl
  rl1  (x_k, y_k) advantage G_k - mean over the group's rows that reached turn k (turn1_rl)
  sd   (x0, y_k)  advantage r_k - baseline (first: mean_group r0; second: mean of r_k)
  fm   (f_fm(x0, y_{k-1}), c_{k-1})   cross-entropy
  sft  (x0, y_final) for correct final answers, cross-entropy
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rltf_ray import losses
from rltf_ray.chat import encode, fm_messages
from rltf_ray.config import Config
from rltf_ray.rounds import revisions

TERMS = ("rl0", "rl1", "sd", "fm", "sft")


@dataclass
class Example:
    ids: list[int]
    start: int  # index of the first trained token in `ids`
    term: str
    adv: float = 1.0
    # Per trained token: log pi(y1_t | x1, ...) for SD importance weights, and the frozen
    # reference's log-probs for the KL penalty. Filled by the trainer's no-grad pre-pass.
    logp_x1: list[float] | None = None
    ref_logp: list[float] | None = None
    x1_ids: list[int] = field(default_factory=list)  # the x1 prompt, for SD weights

    @property
    def n_tokens(self) -> int:
        return len(self.ids) - self.start


def _centred(values: torch.Tensor, gid: torch.Tensor, include: torch.Tensor, mode: str) -> torch.Tensor:
    """Advantages of the included rows: centred on their group's included rows, normalised
    among them; 0 for the others."""
    out = torch.zeros_like(values)
    if include.any():
        v, g = values[include], gid[include]
        out[include] = losses.normalize_advantages(v - losses.group_means(v, g), g, mode)
    return out


def build_examples(rows: list[dict], cfg: Config, tokenizer) -> tuple[list[Example], dict]:
    L = cfg.loss
    rounds = cfg.run.rounds
    # A row the critic could not score (no verifier) has a NaN reward: it trains nothing.
    scored = [r for r in rows if math.isfinite(float(r["reward_first"]))]
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
    G = losses.discounted_returns(R, L.gamma)
    a0 = _centred(G[:, 0] if L.turn1_rl else R[:, 0], gid, taken[:, 0], L.adv_norm)
    a_rl = {k: _centred(G[:, k], gid, taken[:, k], L.adv_norm) for k in range(1, rounds + 1)}
    first_base = losses.group_means(R[:, 0], gid)
    a_sd = {k: R[:, k] - (first_base if L.sd_baseline == "first"
                          else losses.subset_group_means(R[:, k], gid, taken[:, k]))
            for k in range(1, rounds + 1)}
    out: list[Example] = []
    for i, r in enumerate(rows):
        x0, y0 = list(r["prompt_ids"]), list(r["response_ids"])
        out.append(Example(x0 + y0, len(x0), "rl0", float(a0[i])))
        for v in revs[i]:
            if L.turn1_rl:
                out.append(Example(v.prompt_ids + v.ids, len(v.prompt_ids), "rl1", float(a_rl[v.k][i])))
            if L.lambda_sd > 0:
                out.append(Example(x0 + v.ids, len(x0), "sd", float(a_sd[v.k][i]), x1_ids=v.prompt_ids))
            if L.lambda_fm > 0 and v.critique:
                fm = encode(tokenizer, fm_messages(r["prompt"], v.judged))
                c = tokenizer(v.critique, add_special_tokens=False)["input_ids"]
                out.append(Example(fm + list(c) + [tokenizer.eos_token_id], len(fm), "fm"))
        if L.lambda_sft > 0 and (revs[i][-1].correct if revs[i] else r.get("correct_first", False)):
            out.append(Example(x0 + (revs[i][-1].ids if revs[i] else y0), len(x0), "sft"))
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


def step_normalisers(examples: list[Example], cfg: Config) -> dict[str, float]:
    """Each term's step-global denominator (all workers, all micro-batches)."""
    out = {}
    for term in TERMS:
        ex = [e for e in examples if e.term == term]
        tokens, seqs = float(sum(e.n_tokens for e in ex)), float(len(ex))
        out[term] = {"token_mean": tokens, "seq_mean_token_sum": seqs,
                     "constant": seqs * cfg.loss.aggregation_constant}[cfg.loss.aggregation]
    return out


def _device(model) -> torch.device:
    return next(model.parameters()).device


def pad(batch: list[Example], pad_id: int, device: torch.device | str = "cpu"):
    """Right-padded ids, attention mask, the trained-token mask and advantages on `device`."""
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width - 1))
    for i, e in enumerate(batch):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        attn[i, :len(e.ids)] = 1
        mask[i, e.start - 1:len(e.ids) - 1] = 1.0  # position t predicts token t+1
    adv = torch.tensor([e.adv for e in batch])
    return ids.to(device), attn.to(device), mask.to(device), adv.to(device)


def _aligned(batch: list[Example], attr: str, like: torch.Tensor) -> torch.Tensor:
    """Per-token side values (stored for trained tokens only) placed on the mask positions."""
    out = torch.zeros_like(like)
    for i, e in enumerate(batch):
        vals = getattr(e, attr)
        if vals is not None:
            out[i, e.start - 1:e.start - 1 + len(vals)] = torch.tensor(vals, dtype=out.dtype,
                                                                         device=out.device)
    return out


def sequence_logprobs(model, seqs: list[tuple[list[int], int]], pad_id: int,
                      micro_batch: int) -> list[list[float]]:
    """No-grad log-probs of each sequence's tokens from `start` on (SD weights, KL ref)."""
    out: list[list[float]] = []
    with torch.no_grad():
        for k in range(0, len(seqs), micro_batch):
            chunk = [Example(ids, start, "aux") for ids, start in seqs[k:k + micro_batch]]
            ids, attn, mask, _ = pad(chunk, pad_id, _device(model))
            logp = losses.token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids).cpu()
            for i, e in enumerate(chunk):
                out.append(logp[i, e.start - 1:len(e.ids) - 1].tolist())
    return out


def micro_loss(model, batch: list[Example], norms: dict[str, float], cfg: Config, pad_id: int,
               lambda_sd: float | None = None):
    """This micro-batch's share of the step loss, and sums for the step's metrics."""
    L = cfg.loss
    lambda_sd = L.lambda_sd if lambda_sd is None else lambda_sd
    ids, attn, mask, adv = pad(batch, pad_id, _device(model))
    logp = losses.token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids)
    term_id = torch.tensor([TERMS.index(e.term) for e in batch], device=ids.device).unsqueeze(-1)
    m = {t: (term_id == k).float() * mask for k, t in enumerate(TERMS)}
    rl_tok = losses.grpo_token_loss(logp, logp.detach(), adv, L.clip_eps)
    kl_tok = torch.zeros_like(logp)
    if L.kl_coef > 0:
        kl_tok = losses.kl_k3(logp, _aligned(batch, "ref_logp", logp))
    sd_tok, keep = losses.sd_token_loss(logp, adv, L.sd_mask_tau)
    m_sd = m["sd"] * keep
    if L.sd_weight == "none":
        w = torch.ones_like(logp)
    else:
        lx1 = _aligned(batch, "logp_x1", logp)
        fn = {"is": losses.sd_is_token_loss, "clip": losses.sd_clip_token_loss,
              "cispo": losses.sd_cispo_token_loss}[L.sd_weight]
        kw = {} if L.sd_weight == "is" else {"low": L.sd_clip_low, "high": L.sd_clip_high}
        sd_tok = fn(logp, lx1, adv, m["sd"], L.sd_weight_level, **kw)
        w = losses.importance_weights(logp, lx1, m["sd"], L.sd_weight_level).detach()
    parts = {
        "rl0": losses.token_sum(rl_tok + L.kl_coef * kl_tok, m["rl0"], norms["rl0"]),
        "rl1": losses.token_sum(rl_tok + L.kl_coef * kl_tok, m["rl1"], norms["rl1"]),
        "sd": losses.token_sum(sd_tok, m_sd, norms["sd"]),
        "fm": losses.token_sum(-logp, m["fm"], norms["fm"]),
        "sft": losses.token_sum(-logp, m["sft"], norms["sft"]),
    }
    total = (parts["rl0"] + parts["rl1"] + lambda_sd * parts["sd"] + L.lambda_fm * parts["fm"]
             + L.lambda_sft * parts["sft"])
    sd_sel = m["sd"] > 0
    sums = {f"loss_{k}": v.item() for k, v in parts.items()}
    sums.update({"kl_sum": float((kl_tok.detach() * (m["rl0"] + m["rl1"])).sum()),
                 "rl_tokens": float((m["rl0"] + m["rl1"]).sum()),
                 "sd_tokens_masked": float(((1 - keep) * m["sd"]).sum()),
                 "is_w_sum": float(w[sd_sel].sum()), "is_w_sq_sum": float((w[sd_sel] ** 2).sum()),
                 "is_w_max": float(w[sd_sel].max()) if sd_sel.any() else 0.0,
                 "sd_tokens": float(sd_sel.sum())})
    return total, sums

"""Loss assembly: from a micro-batch of examples to its share of the step loss. `loss_terms`
combines the per-token formulas of `losses` from the trainer's log-probs, `micro_loss`
forwards one micro-batch and calls it, and `SUM_KEYS` / `MAX_KEYS` name the metric sums
it returns.

The data flows through: `examples` (rollout rows -> token examples per term, their
normalisers; the term/sequence table and temperatures) and `critic_examples` (the learned
critic's rewards and examples) -> `forward` (collation, the trainer's log-probs) -> here.
`mismatch` is the sampler-trainer monitor for steps that train no RL sequence.
"""
from __future__ import annotations

import torch

from rltf_ray import losses
from rltf_ray.config import Config
from rltf_ray.examples import TERMS, Example
from rltf_ray.forward import Batch, _device, collate, trained_logprobs


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


def micro_loss(model, examples: list[Example], norms: dict[str, float], cfg: Config, pad_id: int,
               lambda_sd: float | None = None):
    """Forward one micro-batch and return its share of the step loss and its metric sums."""
    lambda_sd = cfg.loss.lambda_sd if lambda_sd is None else lambda_sd
    b = collate(examples, pad_id, _device(model))
    logp = trained_logprobs(model, b, min(e.start for e in examples), b.temperature)
    return loss_terms(logp, b, norms, cfg, lambda_sd)

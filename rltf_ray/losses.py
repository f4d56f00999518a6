"""RLTF losses as pure torch functions.

Shapes: per-token tensors are [B, T] aligned with the *predicted* token (position t holds
log pi(tok_t | tok_<t)); `mask` is 1.0 on the tokens a term trains on. Advantages are
[B] and carry no gradient.

Aggregation (documented choice): each term is a token mean over all of *its* tokens in the
whole RL step, `sum(loss_t * mask_t) / sum(mask_t)`; the total is
`L = L_grpo + lambda_sd * L_sd + lambda_fm * L_fm`. The trainer splits a step into
micro-batches and workers, so it sums token losses and divides by the step-global token
count of each term (see `token_sum`), which gives exactly the same value.
"""
from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log pi(input_ids[:, t+1] | input_ids[:, :t+1]) for t in 0..T-2, shape [B, T-1].

    Uses the fused cross-entropy so that no extra [B, T, V] float copy is kept for backward
    (with a 49k vocabulary that copy dominates a micro-batch's memory)."""
    b, t, v = logits.shape
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, v).float(),
                                            input_ids[:, 1:].reshape(-1), reduction="none")
    return -nll.view(b, t - 1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    denom = mask.sum()
    if denom == 0:
        return values.sum() * 0.0
    return (values * mask).sum() / denom


def token_sum(values: torch.Tensor, mask: torch.Tensor, global_count: float) -> torch.Tensor:
    """A micro-batch's share of a step-level token mean whose denominator is global_count."""
    if global_count <= 0:
        return values.sum() * 0.0
    return (values * mask).sum() / global_count


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, std_norm: bool = False,
                     eps: float = 1e-6) -> torch.Tensor:
    """A_j = r_j - mean_{k in group(j)} r_k (optionally / group std)."""
    adv = rewards.float() - group_means(rewards, group_ids)
    return normalize_advantages(adv, group_ids, "group" if std_norm else "none", eps)


def group_means(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """mean_k r_k of each row's group, per row."""
    return subset_group_means(rewards, group_ids, torch.ones_like(group_ids, dtype=torch.bool))


def sd_advantages(r1: torch.Tensor, r0: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """RLTF-SD advantage with the FIRST-turn baseline: A_j = r1_j - mean_k r0_k."""
    return (r1.float() - group_means(r0, group_ids)).detach()


def grpo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                    clip_eps: float = 0.2) -> torch.Tensor:
    """PPO-clipped surrogate per token: -min(rho*A, clip(rho, 1-eps, 1+eps)*A)."""
    ratio = torch.exp(logp - old_logp.detach())
    a = adv.detach().unsqueeze(-1)
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * a
    return -torch.minimum(unclipped, clipped)


def sd_token_loss(logp_x0: torch.Tensor, adv: torch.Tensor,
                  tau: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """-A * log pi(y1_t | x0, y1_<t), no importance weight.

    Returns (per-token loss, keep mask). With tau set, tokens whose log-prob under x0 is
    below tau are masked out (they are tokens the policy would never produce from x0).
    """
    keep = torch.ones_like(logp_x0)
    if tau is not None:
        keep = (logp_x0.detach() >= tau).to(logp_x0.dtype)
    return -adv.detach().unsqueeze(-1) * logp_x0 * keep, keep


def fm_token_loss(logp_critique: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the critique tokens c0 given f_fm(x0, y0)."""
    return -logp_critique


def grpo_loss(logp, old_logp, adv, mask, clip_eps: float = 0.2) -> torch.Tensor:
    return masked_mean(grpo_token_loss(logp, old_logp, adv, clip_eps), mask)


def sd_loss(logp_x0, adv, mask, tau: float | None = None) -> torch.Tensor:
    per_tok, keep = sd_token_loss(logp_x0, adv, tau)
    return masked_mean(per_tok, mask * keep)


def fm_loss(logp_critique, mask) -> torch.Tensor:
    return masked_mean(fm_token_loss(logp_critique), mask)


def rltf_loss(l_grpo: torch.Tensor, l_sd: torch.Tensor, l_fm: torch.Tensor,
              lambda_sd: float = 0.1, lambda_fm: float = 0.1) -> torch.Tensor:
    return l_grpo + lambda_sd * l_sd + lambda_fm * l_fm


# ---------------------------------------------------------------------------------------
# The objectives the RLTF paper compares (selected by preset; see docs/objectives.md).
# ---------------------------------------------------------------------------------------

def discounted_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = sum_{k>=t} gamma^(k-t) r_k over the turn axis (last dim)."""
    out = torch.zeros_like(rewards, dtype=torch.float32)
    running = torch.zeros(rewards.shape[:-1])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = rewards[..., t].float() + gamma * running
        out[..., t] = running
    return out


def normalize_advantages(adv: torch.Tensor, group_ids: torch.Tensor, mode: str,
                         eps: float = 1e-6) -> torch.Tensor:
    """Centred advantages, then 'none' | 'group' (group std) | 'batch' (whole-batch std)."""
    if mode == "none":
        return adv.detach()
    if mode == "group":
        _, inv = torch.unique(group_ids, return_inverse=True)
        n = int(inv.max()) + 1 if inv.numel() else 0
        counts = torch.zeros(n).index_add_(0, inv, torch.ones_like(adv))
        sq = torch.zeros(n).index_add_(0, inv, adv ** 2)
        std = torch.sqrt(sq / (counts - 1).clamp(min=1))
        return (adv / (std[inv] + eps)).detach()
    if mode == "batch":
        return (adv / (adv.std() + eps)).detach() if adv.numel() > 1 else adv.detach()
    raise ValueError(f"advantage normalisation must be none, group or batch, got {mode!r}")


def subset_group_means(values: torch.Tensor, group_ids: torch.Tensor,
                       include: torch.Tensor) -> torch.Tensor:
    """Per row: mean of `values` over the rows of its group where `include` is true
    (0 where the group has none)."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    n = int(inv.max()) + 1 if inv.numel() else 0
    w = include.float()
    sums = torch.zeros(n).index_add_(0, inv, values.float() * w)
    counts = torch.zeros(n).index_add_(0, inv, w)
    return (sums / counts.clamp(min=1))[inv].detach()


def importance_weights(logp_x0: torch.Tensor, logp_x1: torch.Tensor, mask: torch.Tensor,
                       level: str) -> torch.Tensor:
    """w = pi(y1|x0) / pi(y1|x1), per token ('token') or as the product over the sequence in
    log space ('sequence'), broadcast to tokens. Gradient flows through pi(y1|x0) only.

    The sequence weight is applied per token as sg(w_seq) * pi_t / sg(pi_t): its value is
    w_seq and its gradient w_seq * dlog pi_t, so under token-mean aggregation it reduces to
    plain SD when w_seq = 1 (a bare w_seq per token would multiply the gradient by T)."""
    log_ratio = (logp_x0 - logp_x1.detach()) * mask
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        w_seq = torch.exp(log_ratio.sum(-1, keepdim=True)).detach()
        return w_seq * torch.exp(logp_x0 - logp_x0.detach())
    raise ValueError(f"importance weight level must be token or sequence, got {level!r}")


def sd_is_token_loss(logp_x0, logp_x1, adv, mask, level: str = "sequence") -> torch.Tensor:
    """SD with the importance weight: -A * w (d/dtheta = -A * w * dlog pi)."""
    return -adv.detach().unsqueeze(-1) * importance_weights(logp_x0, logp_x1, mask, level)


def sd_clip_token_loss(logp_x0, logp_x1, adv, mask, level: str = "sequence",
                       low: float = 0.8, high: float = 1.2) -> torch.Tensor:
    """PPO-style: -min(w*A, clip(w, low, high)*A)."""
    w = importance_weights(logp_x0, logp_x1, mask, level)
    a = adv.detach().unsqueeze(-1)
    return -torch.minimum(w * a, torch.clamp(w, low, high) * a)


def sd_cispo_token_loss(logp_x0, logp_x1, adv, mask, level: str = "sequence",
                        low: float = 0.8, high: float = 1.2) -> torch.Tensor:
    """CISPO-style: -sg(clip(w)) * A * log pi(y1|x0)."""
    w = torch.clamp(importance_weights(logp_x0, logp_x1, mask, level), low, high).detach()
    return -w * adv.detach().unsqueeze(-1) * logp_x0


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    d = ref_logp.detach() - logp
    return torch.exp(d) - d - 1.0


def normaliser(mask: torch.Tensor, mode: str, constant: float = 1.0) -> float:
    """Denominator of a term's aggregate: 'token_mean' (its tokens), 'seq_mean_token_sum'
    (its sequences) or 'constant' (sequences x a fixed length, Dr.GRPO)."""
    seqs = float((mask.sum(-1) > 0).sum())
    if mode == "token_mean":
        return float(mask.sum())
    if mode == "seq_mean_token_sum":
        return seqs
    if mode == "constant":
        return seqs * constant
    raise ValueError(f"loss aggregation must be token_mean, seq_mean_token_sum or constant, got {mode!r}")


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean",
              constant: float = 1.0) -> torch.Tensor:
    return token_sum(values, mask, normaliser(mask, mode, constant))

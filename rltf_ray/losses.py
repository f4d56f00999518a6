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
    """log pi(input_ids[:, t+1] | input_ids[:, :t+1]) for t in 0..T-2, shape [B, T-1]."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


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
    rewards = rewards.float()
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    counts = torch.zeros(n_groups).index_add_(0, inv, torch.ones_like(rewards))
    means = torch.zeros(n_groups).index_add_(0, inv, rewards) / counts
    adv = rewards - means[inv]
    if std_norm:
        sq = torch.zeros(n_groups).index_add_(0, inv, adv ** 2)
        std = torch.sqrt(sq / (counts - 1).clamp(min=1))
        adv = adv / (std[inv] + eps)
    return adv.detach()


def group_means(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """mean_k r_k of each row's group, per row."""
    return (rewards.float() - group_advantages(rewards, group_ids)).detach()


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

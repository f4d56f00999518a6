"""RLTF losses as pure torch functions. Every function here is on the trainer's code path
(`objectives.loss_terms`); the tests call the same functions.

Shapes: per-token tensors are [B, T] aligned with the *predicted* token (position t holds
log pi(tok_{t+1} | tok_<=t)); `mask` is 1.0 on the tokens a term trains on. Advantages are
[B] and carry no gradient.
"""
from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor,
                   temperature: torch.Tensor | float = 1.0) -> torch.Tensor:
    """log pi_T(input_ids[:, t+1] | input_ids[:, :t+1]) for t in 0..T-2, shape [B, T-1], where
    pi_T is the softmax of logits / T -- the distribution the sampler drew from at
    temperature T (a float, or one value per row).

    Uses the fused cross-entropy so that no extra [B, T, V] float copy is kept for backward
    (with a 49k vocabulary that copy dominates a micro-batch's memory)."""
    b, t, v = logits.shape
    scaled = logits[:, :-1].float()
    if isinstance(temperature, torch.Tensor):
        scaled = scaled / temperature.to(scaled.device).view(-1, 1, 1)
    elif temperature != 1.0:
        scaled = scaled / temperature
    nll = torch.nn.functional.cross_entropy(scaled.reshape(-1, v), input_ids[:, 1:].reshape(-1),
                                            reduction="none")
    return -nll.view(b, t - 1)


def token_sum(values: torch.Tensor, mask: torch.Tensor, normaliser: float) -> torch.Tensor:
    """A micro-batch's share of a step-level aggregate whose denominator is `normaliser`."""
    if normaliser <= 0:
        return values.sum() * 0.0
    return (values * mask).sum() / normaliser


# -- advantages -------------------------------------------------------------------------

def discounted_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = sum_{k>=t} gamma^(k-t) r_k over the turn axis (last dim)."""
    out = torch.zeros_like(rewards, dtype=torch.float32)
    running = torch.zeros(rewards.shape[:-1])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = rewards[..., t].float() + gamma * running
        out[..., t] = running
    return out


def final_returns(rewards: torch.Tensor, taken: torch.Tensor) -> torch.Tensor:
    """G_t = the reward of the episode's last taken turn, for every turn (Bi-NAC's actor
    maximises the final answer's reward R(x, y_last) through each of its turns)."""
    turns = torch.arange(rewards.shape[-1]).expand_as(taken)
    last = torch.where(taken, turns, torch.full_like(turns, -1)).max(dim=-1).values.clamp(min=0)
    final = rewards.float().gather(-1, last.unsqueeze(-1))
    return final.expand_as(rewards).clone()


def subset_group_means(values: torch.Tensor, group_ids: torch.Tensor,
                       include: torch.Tensor) -> torch.Tensor:
    """Per row: mean of `values` over the rows of its group where `include` is true
    (0 where the group has none), computed in float64 so that equal rewards give their own
    value back as closely as the rewards' precision allows."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    n = int(inv.max()) + 1 if inv.numel() else 0
    w = include.double()
    sums = torch.zeros(n, dtype=torch.float64).index_add_(0, inv, values.double() * w)
    counts = torch.zeros(n, dtype=torch.float64).index_add_(0, inv, w)
    return (sums / counts.clamp(min=1))[inv].detach()


def group_means(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """mean_k v_k of each row's group, per row (float64)."""
    return subset_group_means(values, group_ids, torch.ones_like(group_ids, dtype=torch.bool))


def group_abs_max(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """max_k |v_k| of each row's group, per row: the scale of the group's rewards."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    n = int(inv.max()) + 1 if inv.numel() else 0
    top = torch.zeros(n, dtype=torch.float64).scatter_reduce_(0, inv, values.double().abs(), reduce="amax")
    return top[inv]


# A deviation within this fraction of the rewards' scale is float rounding, not signal.
ZERO_RTOL = 1e-6


def snap_zero(adv: torch.Tensor, scale: torch.Tensor, rtol: float = ZERO_RTOL) -> torch.Tensor:
    """`adv` with exact zeros where |adv| <= rtol * scale. A difference of equal rewards can
    come out nonzero (8 rewards of -0.1 leave 7.45e-9 in float32; group normalisation would
    blow that up to ~0.0074): it carries no signal and must count, and train, as none."""
    return torch.where(adv.abs() <= rtol * scale, torch.zeros_like(adv), adv)


def centred(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """values - their group's mean (float64), snapped to 0 within ZERO_RTOL of the group's
    reward scale (`snap_zero`)."""
    return snap_zero(values.double() - group_means(values, group_ids), group_abs_max(values, group_ids))


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


# -- per-token losses ---------------------------------------------------------------------

ROLLOUT_CORRECTIONS = ("none", "tis_token", "tis_sequence", "mis_token", "mis_sequence")


def rollout_weights(old_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, mode: str,
                    cap: float = 2.0, band: tuple[float, float] = (0.5, 2.0)
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Detached rollout-correction weights for the sampler–trainer mismatch, and a 0/1 tensor
    marking the tokens (in `mask`) whose weight was truncated or masked.

    w = pi_old / pi_sampler of each sampled token ('*_token'), or the product over the
    sequence's tokens in `mask` ('*_sequence', broadcast to its tokens), where pi_old is the
    trainer's policy at the start of the RL step (verl's old_log_prob).
    tis_*: truncated IS, min(w, cap).
    mis_*: masked IS, w where band[0] <= w <= band[1], else 0 (the token or sequence is dropped).
    The log-ratio is clamped to +-60 before exp so that an extreme mismatch compares as a huge
    weight instead of overflowing to inf (inf * 0 would turn a masked token into NaN)."""
    d = (old_logp.detach() - behav_logp.detach()) * mask
    if mode.endswith("_sequence"):
        d = d.sum(-1, keepdim=True).expand_as(d)
    elif not mode.endswith("_token"):
        raise ValueError(f"rollout correction must be one of {', '.join(ROLLOUT_CORRECTIONS[1:])}, got {mode!r}")
    w = torch.exp(d.clamp(-60.0, 60.0))
    if mode.startswith("tis_"):
        hit = w > cap
        w = torch.clamp(w, max=cap)
    elif mode.startswith("mis_"):
        hit = (w < band[0]) | (w > band[1])
        w = torch.where(hit, torch.zeros_like(w), w)
    else:
        raise ValueError(f"rollout correction must be one of {', '.join(ROLLOUT_CORRECTIONS[1:])}, got {mode!r}")
    return w * mask, hit.to(mask.dtype) * mask


def policy_token_loss(logp: torch.Tensor, behav_logp: torch.Tensor, adv: torch.Tensor,
                      kind: str = "importance_sampling", clip_eps: float = 0.2,
                      weight: torch.Tensor | None = None,
                      old_logp: torch.Tensor | None = None) -> torch.Tensor:
    """The RL surrogate per token.

    Without `weight` (rollout correction 'none'), rho = pi_theta / pi_behav against the
    sampler's log-probs `behav_logp`, unbounded: the reference recipe, whose sampler is the
    step's old policy.
    With a detached rollout-correction `weight` (`rollout_weights` of pi_old / pi_behav),
    rho = pi_theta / pi_old, where `old_logp` is the trainer's log-prob at the start of the
    RL step (a no-grad pass before its first optimizer step; None: `logp` itself, exact when
    the step takes one optimizer step). The sampler mismatch then enters only through the
    bounded weight, and the clip bounds the policy's drift within the step: the decoupled
    form of verl and SkyRL.

    'importance_sampling': -w * rho * A (the reference recipe's loss).
    'ppo_clip':            -w * min(rho * A, clip(rho, 1 - eps, 1 + eps) * A)."""
    a = adv.detach().unsqueeze(-1)
    if weight is None:
        ratio, weight = torch.exp(logp - behav_logp.detach()), 1.0
    else:
        old = logp.detach() if old_logp is None else old_logp.detach()
        ratio, weight = torch.exp(logp - old), weight.detach()
    if kind == "importance_sampling":
        return -weight * ratio * a
    if kind == "ppo_clip":
        clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * a
        return -weight * torch.minimum(ratio * a, clipped)
    raise ValueError(f"policy loss must be importance_sampling or ppo_clip, got {kind!r}")


def sd_keep_mask(logp_x0: torch.Tensor, tau: float | None) -> torch.Tensor:
    """1 where log pi(y1_t | x0, y1_<t) >= tau: tokens the x0-policy could plausibly produce.
    The rest are left out of SD (and of its importance weights)."""
    if tau is None:
        return torch.ones_like(logp_x0)
    return (logp_x0.detach() >= tau).to(logp_x0.dtype)


def importance_weights(logp_x0: torch.Tensor, logp_x1: torch.Tensor, mask: torch.Tensor,
                       level: str) -> torch.Tensor:
    """w = pi(y1|x0) / pi(y1|x1) over the tokens in `mask`, per token ('token') or as the
    product over the sequence in log space ('sequence'), broadcast to tokens. Gradient flows
    through pi(y1|x0) only.

    The sequence weight is applied per token as sg(w_seq) * pi_t / sg(pi_t): its value is
    w_seq and its gradient w_seq * dlog pi_t, so it reduces to plain SD when w_seq = 1 (a bare
    w_seq per token would multiply the gradient by the sequence length)."""
    log_ratio = (logp_x0 - logp_x1.detach()) * mask
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        w_seq = torch.exp(log_ratio.sum(-1, keepdim=True)).detach()
        return w_seq * torch.exp(logp_x0 - logp_x0.detach())
    raise ValueError(f"importance weight level must be token or sequence, got {level!r}")


def sd_token_loss(logp_x0: torch.Tensor, adv: torch.Tensor, weight: str = "none",
                  logp_x1: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                  level: str = "sequence", low: float = 0.8, high: float = 1.2) -> torch.Tensor:
    """Self-distillation of y1 into pi(.|x0). `mask` must already exclude tau-masked tokens.

    none:  -A * log pi(y1|x0)                  (RLTF-SD: no importance weight)
    is:    -A * w                              (d/dtheta = -A w dlog pi)
    clip:  -min(w A, clip(w, low, high) A)
    cispo: -sg(clip(w, low, high)) A log pi(y1|x0)"""
    a = adv.detach().unsqueeze(-1)
    if weight == "none":
        return -a * logp_x0
    w = importance_weights(logp_x0, logp_x1, mask, level)
    if weight == "is":
        return -a * w
    if weight == "clip":
        return -torch.minimum(w * a, torch.clamp(w, low, high) * a)
    if weight == "cispo":
        return -torch.clamp(w, low, high).detach() * a * logp_x0
    raise ValueError(f"sd weight must be none, is, clip or cispo, got {weight!r}")


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref) on samples of pi: exp(ref - logp) - (ref - logp) - 1.
    Outside `mask` it is 0: ref_logp is 0 there, and exp(0 - logp) overflows to inf for a
    token the policy finds unlikely, which a later `* mask` would turn into NaN (inf * 0)."""
    d = ref_logp.detach() - logp
    if mask is not None:
        d = torch.where(mask > 0, d, torch.zeros_like(d))
    return torch.exp(d) - d - 1.0

"""The `loss` section of the run configuration: which terms train, with which weights, and
how the sampler-trainer mismatch is corrected (docs/objectives.md)."""
from __future__ import annotations

from dataclasses import dataclass

from rltf_ray.errors import ConfigError


@dataclass(frozen=True)
class LossConfig:
    """L = L_rl0 + L_rl1 + lambda_sd*L_sd + lambda_fm*L_fm + lambda_sft*L_sft (+ kl_coef*KL).

    The defaults are RLTF-SD as in the paper's reference recipe (the `rltf_sd` preset); the
    presets in rltf_ray/presets/ select the other objectives. docs/objectives.md
    gives every formula and says where an option departs from the reference."""

    # Multi-turn RL: also train turn 1 on (x1, y1); turn 0 then gets G0 = r0 + gamma * r1,
    # or with first_turn_return "final" the episode's final reward R(x, y_last) (Bi-NAC's actor).
    turn1_rl: bool = True
    gamma: float = 0.1  # discount of later turns' rewards in the RL returns
    first_turn_return: str = "discounted"  # discounted: G0 = r0 + gamma r1; final: the last attempt's reward
    # The RL surrogate, with the ratio against the sampler's log-probs:
    # importance_sampling (-rho*A, the reference) | ppo_clip (-min(rho*A, clip(rho)*A)).
    policy_loss: str = "importance_sampling"
    clip_eps: float = 0.2  # ppo_clip's epsilon
    # Rollout correction for the sampler-trainer mismatch (docs/objectives.md): w = pi_trainer /
    # pi_sampler per sampled token (*_token) or per sequence (*_sequence).
    # tis_*: truncated IS, weight min(w, rollout_cap) (verl, SkyRL: C = 2);
    # mis_*: masked IS, tokens or sequences whose w leaves [rollout_mask_low, rollout_mask_high]
    # are dropped; none: the bare ratio, unbounded (the reference recipe, which samples and
    # trains at one precision).
    rollout_correction: str = "tis_token"
    rollout_cap: float = 2.0  # tis_* modes: the largest weight (> 1)
    rollout_mask_low: float = 0.5  # mis_* modes: tokens or sequences with a weight below this are dropped
    rollout_mask_high: float = 2.0  # mis_* modes: tokens or sequences with a weight above this are dropped
    # A warning names the cause when a step's sampler_kl_k3 (mean k3 KL between the sampler's
    # and the trainer's token distributions) exceeds this: above matched bf16 with fp32 heads
    # (steps up to 2.8e-3), below a learner at another precision than its engine (>= 5e-2).
    sampler_kl_warn: float = 1e-2
    adv_norm: str = "none"  # none | group | batch
    # shared_token_mean: every term summed over the step and divided by ONE count (the RL
    # tokens), so lambda_sd = 0.1 means an SD token weighs 0.1 of an RL token (the reference).
    # token_mean | seq_mean_token_sum | constant: each term over its own count (per term).
    aggregation: str = "shared_token_mean"
    aggregation_constant: float = 512.0  # aggregation 'constant': tokens per sequence in the normaliser
    lambda_sd: float = 0.1  # weight of the self-distillation (RLTF-SD) term per token
    sd_warmup_steps: int = 0  # linear 0 -> lambda_sd over this many steps
    sd_baseline: str = "first"  # first: mean_j r0_j ; second: mean_j r1_j (ablation)
    sd_weight: str = "none"  # none | is | clip | cispo: pi(y1|x0)/pi(y1|x1)
    sd_weight_level: str = "sequence"  # sequence | token
    sd_clip_low: float = 0.8  # sd_weight clip / cispo: the weight's lower bound
    sd_clip_high: float = 1.2  # sd_weight clip / cispo: the weight's upper bound
    # Mask SD tokens whose log pi(y1_t | x0, ...) is below tau; None disables the mask.
    sd_mask_tau: float | None = -5.0
    lambda_fm: float = 0.0  # weight of feedback modelling (RLTF-FM: cross-entropy on critiques) per token
    lambda_sft: float = 0.0  # weight of cross-entropy on correct revised answers per token
    kl_coef: float = 0.0  # weight of the k3 KL penalty against the frozen starting model (0 = none loaded)

    def __post_init__(self):
        choices = {"adv_norm": ("none", "group", "batch"),
                   "policy_loss": ("importance_sampling", "ppo_clip"),
                   "rollout_correction": ("none", "tis_token", "tis_sequence", "mis_token", "mis_sequence"),
                   "aggregation": ("shared_token_mean", "token_mean", "seq_mean_token_sum", "constant"),
                   "sd_baseline": ("first", "second"),
                   "first_turn_return": ("discounted", "final"),
                   "sd_weight": ("none", "is", "clip", "cispo"),
                   "sd_weight_level": ("sequence", "token")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ConfigError(f"loss.{key}: expected one of {', '.join(allowed)}, "
                                  f"got {getattr(self, key)!r}")
        for key in ("lambda_sd", "lambda_fm", "lambda_sft", "kl_coef", "gamma", "clip_eps"):
            if getattr(self, key) < 0:
                raise ConfigError(f"loss.{key}: must be >= 0")
        if not self.rollout_cap > 1.0:
            raise ConfigError(f"loss.rollout_cap: must be > 1 (a cap at or below 1 scales every "
                              f"on-policy token down), got {self.rollout_cap}")
        if not 0.0 <= self.rollout_mask_low < self.rollout_mask_high:
            raise ConfigError(f"loss.rollout_mask_low/rollout_mask_high: need 0 <= low < high, got "
                              f"[{self.rollout_mask_low}, {self.rollout_mask_high}]")
        if not 1.0 <= self.rollout_mask_high or self.rollout_mask_low > 1.0:
            raise ConfigError(f"loss.rollout_mask_low/rollout_mask_high: the band must contain 1 (an "
                              f"on-policy token's weight), got [{self.rollout_mask_low}, {self.rollout_mask_high}]")
        if not self.sampler_kl_warn > 0:
            raise ConfigError(f"loss.sampler_kl_warn: must be > 0, got {self.sampler_kl_warn}")

    def lambda_sd_at(self, step: int) -> float:
        if self.sd_warmup_steps <= 0:
            return self.lambda_sd
        return self.lambda_sd * min(1.0, step / self.sd_warmup_steps)

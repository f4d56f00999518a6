"""The `binac` section of the run configuration: Bi-NAC's learned critic, its reward and its
schedule against the actor (docs/objectives.md)."""
from __future__ import annotations

from dataclasses import dataclass

from rltf_ray.errors import ConfigError


DEFAULT_CRITIC_PROMPT = (
    "You are a critic. Read the question and a student's attempt. Explain specifically what is "
    "wrong in the attempt and how to fix it, without giving the final answer. End with exactly "
    "one line: 'Your previous attempt was correct.' or 'Your previous attempt was incorrect.'")


@dataclass(frozen=True)
class BinacConfig:
    """Bi-NAC: a learned critic (critique node `critic: learned`) trained so that its
    critiques raise the actor's reward, alongside the actor (docs/objectives.md)."""

    # The critic's own HF folder; None = a copy of the actor's base model.
    critic_model: str | None = None
    prompt: str = DEFAULT_CRITIC_PROMPT  # the critic's system message
    verdict_aware: bool = True  # the critic is told the verifier's verdict r0
    critiques_per_attempt: int = 2  # K: the critic's GRPO group is the K critiques of one attempt
    revisions_per_critique: int = 1  # M: revisions whose rewards are averaged per critique
    # The critic's sampling temperature for its K critiques (0 = greedy), in training and, unless
    # eval.critic_temperature says otherwise, in evaluations.
    temperature: float = 1.0
    max_tokens: int = 96  # the longest critique the critic may write
    num_engines: int = 1  # vLLM engines that serve the critic
    # The critic's reward for a critique c of attempt y0: improvement r1 - r0, or outcome r1;
    # plus verdict_bonus when its verdict line agrees with the verifier; format_penalty
    # (instead of the rest) when it has no verdict line; None drops the format requirement
    # (for a critic model too small to write the verdict line, whose rewards would all be the
    # penalty, so that GRPO over its critiques gets no signal at all).
    critic_reward: str = "improvement"
    verdict_bonus: float = 0.0  # added to a critique's reward when its verdict line agrees with the verifier
    # A critique's reward when it lacks the verdict line; None = no requirement.
    format_penalty: float | None = -1.0
    critique_correct: bool = False  # also critique (for the critic only) correct first answers
    # The bilevel term (docs/objectives.md): the critic's reward is (1 + lambda) * u(current
    # actor) - lambda * u(reference actor), both revising from the same critique; the
    # reference is the actor's weights at the last policy version divisible by reference_every.
    bilevel_lambda: float = 0.0
    # The reference actor is the actor's weights at the last version divisible by this.
    reference_every: int = 20
    # Schedule. overlap: a cycle of max(actor_steps, critic_steps) RL steps; the actor trains
    # on its first actor_steps, the critic on its last critic_steps (1:1 = both every step).
    # alternate (the paper's): a cycle of actor_steps + critic_steps; the actor trains on the
    # first actor_steps, then the critic alone on the next critic_steps.
    # critic_steps 0 = a frozen critic, the fixed_critic baseline.
    schedule: str = "overlap"
    actor_steps: int = 5  # actor updates per schedule cycle
    critic_steps: int = 1  # critic updates per schedule cycle (0 = a frozen critic)
    lr: float = 1e-5  # the critic's AdamW learning rate
    zero_stage: int | None = None  # None: the trainer's
    # A critic update whose advantages are all zero trains on nothing; after this many in a
    # row the run stops with the cause (identical critiques, a saturated reward).
    max_dead_updates: int = 3

    def __post_init__(self):
        if self.max_dead_updates < 1:
            raise ConfigError(f"binac.max_dead_updates: must be >= 1, got {self.max_dead_updates}")
        if self.critiques_per_attempt < 2 and self.critic_steps > 0:
            raise ConfigError(f"binac.critiques_per_attempt={self.critiques_per_attempt} with binac.critic_steps="
                              f"{self.critic_steps}: the learned critic's GRPO group is the K critiques of one "
                              "attempt, so with K < 2 every advantage is 0 and the critic never learns. Set "
                              "critiques_per_attempt >= 2, or critic_steps=0 for a frozen critic")
        if self.critic_reward not in ("improvement", "outcome"):
            raise ConfigError(f"binac.critic_reward: expected improvement or outcome, got {self.critic_reward!r}")
        if self.critiques_per_attempt < 1 or self.revisions_per_critique < 1 or self.num_engines < 1:
            raise ConfigError("binac.critiques_per_attempt, revisions_per_critique and num_engines: must be >= 1")
        if self.actor_steps < 1 or self.critic_steps < 0:
            raise ConfigError("binac.actor_steps must be >= 1 and binac.critic_steps >= 0")
        if self.schedule not in ("overlap", "alternate"):
            raise ConfigError(f"binac.schedule: expected overlap or alternate, got {self.schedule!r}")
        if not self.bilevel_lambda >= 0:  # also refuses NaN
            raise ConfigError(f"binac.bilevel_lambda: must be >= 0 (0 = no bilevel term), got {self.bilevel_lambda}")
        if not self.temperature >= 0:  # also refuses NaN
            raise ConfigError(f"binac.temperature: the critic's sampling temperature, >= 0 (0 = greedy), "
                              f"got {self.temperature}")
        if self.reference_every < 1:
            raise ConfigError(f"binac.reference_every: the reference actor is refreshed every this many "
                              f"policy versions; must be >= 1, got {self.reference_every}")

    @property
    def cycle(self) -> int:
        if self.schedule == "alternate":
            return self.actor_steps + self.critic_steps
        return max(self.actor_steps, self.critic_steps)

    def actor_trains(self, step: int) -> bool:
        return step % self.cycle < self.actor_steps

    def critic_trains(self, step: int) -> bool:
        return step % self.cycle >= self.cycle - self.critic_steps

"""The sampler-trainer mismatch monitor for steps that train no RL sequence: the trainer
scores the RL examples in a no-grad pass (`forward.sequence_logprobs`) and `mismatch_sums`
gives the sums `objectives.loss_terms` fills for trained ones."""
from __future__ import annotations

import torch

from rltf_ray.examples import Example


def mismatch_sums(examples: list[Example], logps: list[list[float]]) -> dict[str, float]:
    """Trainer-vs-sampler agreement of RL examples scored in a no-grad pass (the monitor for
    steps in which no RL sequence was trained); the same keys `loss_terms` fills."""
    d = torch.tensor([t - b for e, lp in zip(examples, logps) for t, b in zip(lp, e.behav_logp)])
    if d.numel() == 0:
        return {}
    return {"mismatch_tokens": float(d.numel()), "logprob_abs_diff_sum": float(d.abs().sum()),
            "mismatch_kl_sum": float((torch.exp(d) - 1 - d).sum()),
            "logprob_abs_diff_max": float(d.abs().max())}

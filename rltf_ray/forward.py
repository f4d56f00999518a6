"""Collation and forwards: examples as right-padded tensors (`Batch`, `collate`), the
trainer's per-token log-probs of the trained tokens (`trained_logprobs`), and the no-grad
log-probs of whole sequences (`sequence_logprobs`: SD importance weights, the KL
reference, pi_old, the mismatch monitor).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rltf_ray import losses
from rltf_ray.examples import TERMS, Example


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
